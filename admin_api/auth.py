"""Bearer tokens and roles for the admin API.

How this works
--------------
``[admin] tokens`` lists tokens as plain text (``token``) or as the hex
sha256 of the token (``token_sha256``), each with a role: ``read`` may use
GET/HEAD, ``admin`` may use everything. Only digests are kept in memory.
A presented token is hashed once and compared with *every* configured
digest with ``hmac.compare_digest`` (no early exit), so the time taken does
not tell how much of a token was right nor which entry matched.

With ``[oauth]`` (docs/oauth.md) a JWT from the identity provider works
too (``role_for``): a configured token is tried first, then a bearer value
that looks like a JWT is validated as the SASL layer does; the
``fedgate.admin`` scope (or an ``[[oauth.map]]`` entry with ``admin``) is
``admin``, ``fedgate.read`` (or ``read``) is ``read``; a valid token with
neither gets 403, a refused one 401 (the reason logged and counted).

``/healthz``, ``/readyz`` and the web console's static files (no data in
them: the console calls the API with a token the user types in) need no
token; everything else does.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

READ = "read"
ADMIN = "admin"
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


@dataclass(frozen=True)
class TokenEntry:
    digest: bytes
    role: str


class Tokens:
    def __init__(self, entries: list[TokenEntry], names: dict[bytes, str] | None = None) -> None:
        self.entries = tuple(entries)
        self.names = names or {}  # digest -> the entry's ``name`` (the audit log's who)

    @classmethod
    def from_config(cls, raw: tuple[dict, ...]) -> "Tokens":
        """Entries already checked by ``proxy.config.AdminSection.check``."""
        entries, names = [], {}
        for entry in raw:
            if "token" in entry:
                digest = hashlib.sha256(entry["token"].encode()).digest()
            else:
                digest = bytes.fromhex(entry["token_sha256"])
            entries.append(TokenEntry(digest, entry["role"]))
            if entry.get("name"):
                names[digest] = entry["name"]
        return cls(entries, names)

    def role_of(self, token: str) -> str | None:
        presented = hashlib.sha256(token.encode()).digest()
        role = None
        for entry in self.entries:
            if hmac.compare_digest(presented, entry.digest) and role != ADMIN:
                role = entry.role
        return role


NO_ROLE = ""  # a valid JWT that grants no admin API role: 403, not 401


def role_for(tokens: Tokens, oauth, token: str) -> str | None:
    """The role of a bearer token: configured tokens, then ([oauth]) a JWT; None: unknown."""
    role = tokens.role_of(token)
    if role is None and oauth is not None:
        from proxy.auth.oauth import looks_like_jwt

        if looks_like_jwt(token):
            role = oauth.admin_role(token)
    return role


def bearer_token(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


def allowed(role: str, method: str) -> bool:
    return role == ADMIN or (role == READ and method in READ_METHODS)
