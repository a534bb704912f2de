"""Users file: salted password verifiers, never plaintext.

Each user is stored as SCRAM-SHA-256 verifiers (RFC 5802 / RFC 7677):
``salt``, ``iterations``, ``stored_key = H(HMAC(SaltedPassword, "Client Key"))``
and ``server_key = HMAC(SaltedPassword, "Server Key")``. PLAIN is checked by
recomputing the stored key from the offered password; the same record serves
SCRAM-SHA-256 without ever knowing the password.

The file is JSON (``{"users": {name: {...}}}``), written atomically (temp file,
fsync, rename) with mode 0600.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import orjson

DEFAULT_ITERATIONS = 4096  # RFC 7677 minimum for SCRAM-SHA-256
NAME_MAX = 255


class UsersFileError(Exception):
    pass


@dataclass(frozen=True)
class UserRecord:
    name: str
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes
    groups: tuple[str, ...] = field(default=())

    def check_password(self, password: str) -> bool:
        salted = _salted_password(password, self.salt, self.iterations)
        client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
        return hmac.compare_digest(hashlib.sha256(client_key).digest(), self.stored_key)

    def to_json(self) -> dict:
        return {
            "mechanism": "SCRAM-SHA-256",
            "salt": base64.b64encode(self.salt).decode(),
            "iterations": self.iterations,
            "stored_key": base64.b64encode(self.stored_key).decode(),
            "server_key": base64.b64encode(self.server_key).decode(),
            "groups": list(self.groups),
        }

    @classmethod
    def from_json(cls, name: str, data: dict) -> "UserRecord":
        try:
            return cls(
                name=name,
                salt=base64.b64decode(data["salt"]),
                iterations=int(data["iterations"]),
                stored_key=base64.b64decode(data["stored_key"]),
                server_key=base64.b64decode(data["server_key"]),
                groups=tuple(data.get("groups", ())),
            )
        except (KeyError, ValueError, TypeError) as exc:
            raise UsersFileError(f"user {name!r}: malformed record ({exc})") from exc


def _salted_password(password: str, salt: bytes, iterations: int) -> bytes:
    return hashlib.pbkdf2_hmac("sha256", password.encode("utf-8"), salt, iterations)


def make_record(name: str, password: str, *, iterations: int = DEFAULT_ITERATIONS,
                groups: tuple[str, ...] = ()) -> UserRecord:
    validate_name(name)
    if not password:
        raise UsersFileError("empty password")
    salt = secrets.token_bytes(16)
    salted = _salted_password(password, salt, iterations)
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    return UserRecord(
        name=name,
        salt=salt,
        iterations=iterations,
        stored_key=hashlib.sha256(client_key).digest(),
        server_key=hmac.new(salted, b"Server Key", hashlib.sha256).digest(),
        groups=tuple(groups),
    )


def validate_name(name: str) -> None:
    if not name or len(name) > NAME_MAX or any(c in name for c in "\x00\n\r"):
        raise UsersFileError(f"invalid user name {name!r}")
    if name == "anonymous":
        raise UsersFileError("'anonymous' is reserved for SASL ANONYMOUS clients")


class UsersFile:
    """In-memory view of a users file; ``save`` writes it back atomically."""

    def __init__(self, path: Path, users: dict[str, UserRecord] | None = None) -> None:
        self.path = Path(path)
        self.users: dict[str, UserRecord] = users or {}

    @classmethod
    def load(cls, path: str | os.PathLike, *, missing_ok: bool = False) -> "UsersFile":
        path = Path(path)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            if missing_ok:
                return cls(path)
            raise UsersFileError(f"users file {path} does not exist") from None
        try:
            data = orjson.loads(raw)
            entries = data["users"]
            if not isinstance(entries, dict):
                raise TypeError("'users' must be an object")
        except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
            raise UsersFileError(f"users file {path}: {exc}") from exc
        return cls(path, {name: UserRecord.from_json(name, rec) for name, rec in entries.items()})

    def get(self, name: str) -> UserRecord | None:
        return self.users.get(name)

    def add(self, record: UserRecord) -> None:
        self.users[record.name] = record

    def remove(self, name: str) -> bool:
        return self.users.pop(name, None) is not None

    def save(self) -> None:
        payload = orjson.dumps(
            {"users": {n: r.to_json() for n, r in sorted(self.users.items())}},
            option=orjson.OPT_INDENT_2,
        )
        directory = self.path.parent
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".users-", dir=directory)
        try:
            os.fchmod(fd, 0o600)
            with os.fdopen(fd, "wb") as handle:
                handle.write(payload)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
