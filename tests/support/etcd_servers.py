"""Real etcd for the cluster tests: the suite's shared member, and members a test starts itself.

How this works
--------------
* ``etcd_url`` (session fixture): the one-member etcd of ``.ci/install/etcd.sh`` (Debian's
  ``etcd-server`` 3.4 on 127.0.0.1:2479), started like the brokers (the script is
  idempotent; ``make test`` runs it first and ``.ci/stop-test-services.sh`` stops it at
  the end). Tests share it: each uses a cluster name of its own (``cluster_name``), so
  their keys (``/fedgate/<name>/``) never meet.
* ``EtcdMember`` / ``EtcdCluster``: etcd processes a test owns, on free ports, with their
  data under the test's temporary directory: one member it may stop and start again (an
  etcd restart), or three members whose leader it may kill. ``leader()`` asks each
  member's ``/v3/maintenance/status`` (etcd's JSON gateway) who leads. Every one is
  stopped when the test ends (``etcd_members`` fixture).

Missing ``etcd``: skipped on a developer machine, a failure under ``CI=true``
(``conftest.require``). Every wait is bounded.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
from conftest import ROOT, free_port, require

INSTALL = ROOT / ".ci" / "install" / "etcd.sh"
ETCD_PORT = int(os.environ.get("ETCD_PORT", "2479"))
START_TIMEOUT = 30.0


def health(url: str, timeout: float = 1.0) -> bool:
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/health", timeout=timeout) as response:
            return json.loads(response.read()).get("health") == "true"
    except (OSError, ValueError):
        return False


def status(url: str, timeout: float = 1.0) -> dict | None:
    """etcd's maintenance status of the member at ``url`` (member_id, leader, raftTerm...)."""
    request = urllib.request.Request(url.rstrip("/") + "/v3/maintenance/status", data=b"{}",
                                     method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())
    except (OSError, ValueError):
        return None


@pytest.fixture(scope="session")
def etcd_url() -> str:
    require(shutil.which("etcd") is not None or INSTALL.is_file(), "etcd (.ci/install/etcd.sh)")
    url = f"http://127.0.0.1:{ETCD_PORT}"
    if not health(url):
        proc = subprocess.run(["bash", str(INSTALL), "start"], cwd=ROOT, capture_output=True,
                              text=True, timeout=300, stdin=subprocess.DEVNULL)
        require(proc.returncode == 0 and health(url, 5.0),
                f"etcd (etcd.sh start exit {proc.returncode}: {proc.stderr.strip()[-600:]})")
    return url


@pytest.fixture
def cluster_name() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"


class EtcdMember:
    """One etcd process of a test: ``start``, ``kill`` (SIGKILL), ``stop`` (SIGTERM)."""

    def __init__(self, workdir: Path, name: str, *, client_port: int | None = None,
                 peer_port: int | None = None, tls=None) -> None:
        self.workdir = workdir
        self.name = name
        self.client_port = client_port or free_port()
        self.peer_port = peer_port or free_port()
        self.tls = tls  # certs.Certs: clients over TLS, with client certificates
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.client_port}"
        self.peer_url = f"http://127.0.0.1:{self.peer_port}"
        self.data_dir = workdir / f"etcd-{name}"
        self.log_path = workdir / f"etcd-{name}.log"
        self.initial_cluster = f"{name}={self.peer_url}"
        self.proc: subprocess.Popen | None = None
        self.started_once = False

    def start(self, *, wait: bool = True) -> "EtcdMember":
        require(shutil.which("etcd") is not None, "etcd (.ci/install/etcd.sh installs etcd-server)")
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            ["etcd", "--name", self.name, "--data-dir", str(self.data_dir),
             "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
             "--listen-peer-urls", self.peer_url, "--initial-advertise-peer-urls", self.peer_url,
             "--initial-cluster", self.initial_cluster,
             "--initial-cluster-state", "existing" if self.started_once else "new",
             "--initial-cluster-token", f"fedgate-{self.workdir.name}", "--log-level", "warn",
             *self._tls_args()],
            stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        log.close()
        self.started_once = True
        if wait:
            self.wait_healthy()
        return self

    def _tls_args(self) -> list[str]:
        if not self.tls:
            return []
        return ["--cert-file", str(self.tls.server_cert), "--key-file", str(self.tls.server_key),
                "--trusted-ca-file", str(self.tls.ca), "--client-cert-auth"]

    def ctl(self, *args: str) -> str:
        """``etcdctl`` against this member (with the client certificate under TLS)."""
        require(shutil.which("etcdctl") is not None, "etcdctl (.ci/install/etcd.sh installs etcd-client)")
        cmd = ["etcdctl", "--endpoints", self.url, "--command-timeout", "10s"]
        if self.tls:
            cmd += ["--cacert", str(self.tls.ca), "--cert", str(self.tls.client_cert),
                    "--key", str(self.tls.client_key)]
        proc = subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=30,
                              env=dict(os.environ, ETCDCTL_API="3"))
        if proc.returncode != 0:
            raise RuntimeError(f"etcdctl {' '.join(args)}: {proc.stderr.strip()}")
        return proc.stdout

    def healthy(self) -> bool:
        if not self.tls:
            return health(self.url)
        try:
            self.ctl("endpoint", "health")
            return True
        except RuntimeError:
            return False

    def wait_healthy(self, timeout: float = START_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while not self.healthy():
            if self.proc.poll() is not None:
                raise RuntimeError(f"etcd {self.name} exited:\n{self.log_path.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"etcd {self.name} not healthy within {timeout}s:\n"
                                   f"{self.log_path.read_text()[-2000:]}")
            time.sleep(0.1)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


class EtcdCluster:
    """``size`` members on free ports that know each other from the start."""

    def __init__(self, workdir: Path, size: int = 3) -> None:
        self.members = [EtcdMember(workdir, f"e{k}") for k in range(size)]
        initial = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
        for member in self.members:
            member.initial_cluster = initial

    @property
    def urls(self) -> list[str]:
        return [m.url for m in self.members]

    def start(self) -> "EtcdCluster":
        for member in self.members:  # a member waits for a quorum: start all, then wait
            member.start(wait=False)
        for member in self.members:
            member.wait_healthy()
        return self

    def leader(self, timeout: float = 10.0) -> EtcdMember:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ids = {}
            leader = None
            for member in self.members:
                if not member.alive():
                    continue
                answer = status(member.url)
                if answer:
                    ids[answer["header"]["member_id"]] = member
                    leader = answer.get("leader") or leader
            if leader in ids:
                return ids[leader]
            time.sleep(0.1)
        raise RuntimeError(f"no etcd leader within {timeout}s")

    def stop(self) -> None:
        for member in self.members:
            member.stop()


@pytest.fixture
def etcd_members(tmp_path):
    """Start members or clusters of one's own: ``etcd_members.member()``, ``.cluster(3)``."""
    started: list = []

    class Factory:
        @staticmethod
        def member(name: str = "solo", tls=None) -> EtcdMember:
            member = EtcdMember(tmp_path, name, tls=tls).start()
            started.append(member)
            return member

        @staticmethod
        def cluster(size: int = 3) -> EtcdCluster:
            cluster = EtcdCluster(tmp_path, size)
            started.append(cluster)
            return cluster.start()

    yield Factory
    for item in started:
        item.stop()
