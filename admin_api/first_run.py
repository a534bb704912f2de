"""A first run is usable: an admin token made for a loopback-only admin API (issue #23).

With no ``[admin] tokens`` configured every call answered 401 and nothing said
how to get in. Now, when the admin API listens on a loopback address only and
no token is configured, the node uses the token in ``<data_dir>/admin-token``,
made on first use (random, 256 bits, owner-only permissions), and logs the
console URL with where the token is; ``fedgate admin-token`` prints it, and the
admin commands (``fedgate status``, ``fedgate rules``) read it when
``$FEDGATE_TOKEN`` is not set. An admin API on any other address still needs a
token in the config: remote access is never opened by default.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
from pathlib import Path

TOKEN_FILE = "admin-token"


def token_path(data_dir: str | os.PathLike) -> Path:
    return Path(data_dir) / TOKEN_FILE


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def read_token(data_dir: str | os.PathLike) -> str | None:
    try:
        return token_path(data_dir).read_text().strip() or None
    except FileNotFoundError:
        return None


def load_or_create(data_dir: str | os.PathLike) -> tuple[str, bool]:
    """The data dir's admin token, and whether it was made now (0600, never overwritten)."""
    existing = read_token(data_dir)
    if existing:
        return existing, False
    path = token_path(data_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process made it meanwhile: use theirs
        return read_token(data_dir) or token, False
    with os.fdopen(fd, "w") as out:
        out.write(token + "\n")
    return token, True
