"""Throwaway X.509 material for TLS tests, made with the openssl command line."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Certs:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    rogue_cert: Path  # signed by a CA the node does not trust
    rogue_key: Path


def _run(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _issue(directory: Path, name: str, cn: str, ca: str, ca_key: str, san: str | None) -> None:
    _run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
         "-subj", f"/CN={cn}", cwd=directory)
    ext = directory / f"{name}.ext"
    ext.write_text(f"subjectAltName={san}\n" if san else "basicConstraints=CA:FALSE\n")
    _run("x509", "-req", "-in", f"{name}.csr", "-CA", ca, "-CAkey", ca_key, "-CAcreateserial",
         "-out", f"{name}.crt", "-days", "2", "-extfile", ext.name, cwd=directory)


def make_certs(directory: Path) -> Certs:
    if shutil.which("openssl") is None:
        raise FileNotFoundError("openssl")
    directory.mkdir(parents=True, exist_ok=True)
    for ca in ("ca", "rogue-ca"):
        _run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{ca}.key",
             "-out", f"{ca}.crt", "-days", "2", "-subj", f"/CN=fedgate test {ca}", cwd=directory)
    _issue(directory, "server", "localhost", "ca.crt", "ca.key", "DNS:localhost,IP:127.0.0.1")
    _issue(directory, "client", "alice", "ca.crt", "ca.key", None)
    _issue(directory, "rogue", "mallory", "rogue-ca.crt", "rogue-ca.key", None)
    d = directory
    return Certs(d / "ca.crt", d / "server.crt", d / "server.key", d / "client.crt",
                 d / "client.key", d / "rogue.crt", d / "rogue.key")
