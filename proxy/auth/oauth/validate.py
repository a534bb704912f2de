"""Token validation and the grants a valid token carries (docs/oauth.md).

How this works
--------------
``Validator.validate(token)`` returns a ``TokenGrant`` or raises
``TokenRefused(reason, detail)``. Cheap checks come first, so a hostile token
costs little: the size cap (``MAX_TOKEN_BYTES``) before any parsing, the
header's ``alg`` against RS256/ES256/EdDSA (``none`` and HMAC never reach a
verifier), the ``kid`` against the key set, the key's type against ``alg``;
only then PyJWT checks the signature, ``exp`` (required), ``nbf``, ``iat``,
``iss`` and ``aud`` with ``leeway``, with ``algorithms=`` naming that one
algorithm. Every refusal is counted by reason (``refused``) for ``/metrics``.

Grants: the ``scope_claim`` values with ``scope_prefix`` (``send:<pattern>``,
``receive:<pattern>``, ``admin``, ``read``) and the ``[[oauth.map]]``
entries whose claim holds their value. They become one ``AclEntry`` for the
token's user, checked together with the node's ``[[acl]]`` entries
(``TokenGrant.acl``): with no grant, a token user may do nothing.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa

from proxy.auth.acl import Acl, AclEntry
from routing import compile_pattern
from routing.errors import RuleError

log = logging.getLogger("fedgate.oauth")

MAX_TOKEN_BYTES = 16 * 1024
# a SASL frame carrying a token: the token, PLAIN's user name or OAUTHBEARER's
# gs2 header and key-value pairs, the frame's own encoding
OAUTH_SASL_MAX_FRAME = MAX_TOKEN_BYTES + 1024
ALGORITHMS = ("RS256", "ES256", "EdDSA")
REASONS = ("too_large", "malformed", "bad_algorithm", "unknown_key", "bad_signature", "expired",
           "not_yet_valid", "bad_issuer", "bad_audience", "no_subject", "wrong_user")


class TokenRefused(Exception):
    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class TokenGrant:
    """What a valid token says: who, until when, and what it may do."""

    subject: str
    expires_at: float  # the token's exp (seconds since the epoch)
    scopes: tuple[str, ...] = ()  # the grants, as scope strings (for the admin API's view)
    send: tuple[str, ...] = ()
    receive: tuple[str, ...] = ()
    admin: bool = False
    read: bool = False
    groups: tuple[str, ...] = ()
    acl: Acl | None = field(default=None, compare=False, repr=False)
    leeway: float = 0.0  # [oauth] leeway: a connection closes this long after exp

    @property
    def closes_at(self) -> float:
        """When a connection on this token is closed (seconds since the epoch): exp + leeway,
        the last instant the token would still be accepted."""
        return self.expires_at + self.leeway

    def allows(self, identity, address: str | None, direction: str) -> bool:
        return self.acl.allows(identity, address, direction) if self.acl is not None else False

    def describe(self) -> dict:
        return {"sub": self.subject, "expires_at": self.expires_at, "scopes": list(self.scopes),
                "groups": list(self.groups)}

    def to_json(self) -> dict:  # handed to another worker with the connection (proxy.workers)
        return {"subject": self.subject, "expires_at": self.expires_at, "scopes": list(self.scopes),
                "send": list(self.send), "receive": list(self.receive), "admin": self.admin,
                "read": self.read, "groups": list(self.groups)}


CBS_ADDRESS = "$cbs"  # token renewal in band (proxy.amqp.cbs)


def token_authorizer(acl: Acl):
    """The broker's authorize hook with ``[oauth]``: a token login by its grant (which holds
    the ``[[acl]]`` entries too), others by ``acl``; ``$cbs`` for token logins only."""

    def authorize(identity, address: str | None, direction: str) -> bool:
        grant = getattr(identity, "token", None)
        if address == CBS_ADDRESS:
            return grant is not None
        if grant is not None:
            return grant.allows(identity, address, direction)
        return acl.allows(identity, address, direction)

    return authorize


def looks_like_jwt(text: str) -> bool:
    """Worth validating as a token (PLAIN tries the users file first, then this)."""
    return text.count(".") == 2 and len(text) > 16


def _key_fits(key, alg: str) -> bool:
    if alg == "RS256":
        return isinstance(key, rsa.RSAPublicKey) and key.key_size >= 2048
    if alg == "ES256":
        return isinstance(key, ec.EllipticCurvePublicKey) and key.curve.name == "secp256r1"
    return isinstance(key, (ed25519.Ed25519PublicKey, ed448.Ed448PublicKey))


def _claim(claims: dict, path: str):
    value = claims
    for part in path.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def _values(value) -> list[str]:
    if isinstance(value, str):
        return value.split()
    if isinstance(value, list):
        return [v for v in value if isinstance(v, str)]
    return []


class Validator:
    def __init__(self, section, keys, acl_entries=()) -> None:
        self.section = section
        self.keys = keys
        self.acl_entries = tuple(acl_entries)  # the node's [[acl]], checked with each token's grants
        self.refused: Counter = Counter()  # reason -> count (SASL and admin API)

    def refuse(self, reason: str, detail: str, where: str) -> TokenRefused:
        """Count and log one refusal; the caller raises or returns what it gives back."""
        self.refused[reason] += 1
        log.warning("token refused (%s): %s: %s", where, reason, detail)
        return TokenRefused(reason, detail)

    def check(self, token: str | bytes, where: str = "") -> TokenGrant:
        """``validate`` that counts and logs a refusal (``where``: the peer or "admin API")."""
        try:
            return self.validate(token)
        except TokenRefused as exc:
            raise self.refuse(exc.reason, exc.detail, where) from None

    def validate(self, token: str | bytes) -> TokenGrant:
        if len(token) > MAX_TOKEN_BYTES:
            raise TokenRefused("too_large", f"{len(token)} bytes (at most {MAX_TOKEN_BYTES})")
        if isinstance(token, bytes):
            try:
                token = token.decode("ascii")
            except UnicodeDecodeError:
                raise TokenRefused("malformed", "not ASCII") from None
        if token.count(".") != 2:
            raise TokenRefused("malformed", "not three dot-separated parts")
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as exc:
            raise TokenRefused("malformed", f"header: {exc}") from None
        alg = header.get("alg")
        if alg not in ALGORITHMS:
            raise TokenRefused("bad_algorithm", f"alg {str(alg)[:20]!r} not one of {', '.join(ALGORITHMS)}")
        kid = header.get("kid")
        if kid is not None and not isinstance(kid, str):
            raise TokenRefused("malformed", "kid is not a string")
        candidates = self.keys.candidates(kid)
        if not candidates:
            raise TokenRefused("unknown_key", f"kid {str(kid)[:64]!r}" if kid else "no kid and not one key")
        key = candidates[0]
        if not _key_fits(key, alg):
            raise TokenRefused("bad_algorithm", f"alg {alg} does not fit the key {str(kid)[:64]!r}")
        section = self.section
        try:
            claims = jwt.decode(
                token, key, algorithms=[alg], audience=section.audience, issuer=section.issuer,
                leeway=section.leeway,
                options={"require": ["exp", "iss", "aud"], "verify_signature": True})
        except jwt.ExpiredSignatureError:
            raise TokenRefused("expired", "exp has passed") from None
        except (jwt.ImmatureSignatureError, jwt.InvalidIssuedAtError) as exc:
            raise TokenRefused("not_yet_valid", str(exc)) from None
        except jwt.InvalidIssuerError:
            raise TokenRefused("bad_issuer", "iss is not the configured issuer") from None
        except jwt.InvalidAudienceError:
            raise TokenRefused("bad_audience", "aud does not name the configured audience") from None
        except jwt.InvalidSignatureError:
            raise TokenRefused("bad_signature", "signature does not verify") from None
        except jwt.MissingRequiredClaimError as exc:
            reason = "expired" if exc.claim == "exp" else "bad_issuer" if exc.claim == "iss" else "bad_audience"
            raise TokenRefused(reason, f"no {exc.claim} claim") from None
        except jwt.PyJWTError as exc:
            raise TokenRefused("malformed", str(exc)[:200]) from None
        return self.grant(claims)

    def grant(self, claims: dict) -> TokenGrant:
        section = self.section
        subject = _claim(claims, section.user_claim)
        if not isinstance(subject, str) or not subject or subject == "anonymous" or len(subject) > 255:
            raise TokenRefused("no_subject", f"no usable {section.user_claim!r} claim")
        exp = claims.get("exp")
        if not isinstance(exp, (int, float)) or isinstance(exp, bool):
            raise TokenRefused("expired", "exp is not a number")
        scopes, send, receive, groups = [], [], [], []
        admin = read = False
        prefix = section.scope_prefix
        for value in _values(_claim(claims, section.scope_claim)):
            if not value.startswith(prefix):
                continue
            rest = value[len(prefix):]
            kind, _, pattern = rest.partition(":")
            if kind in ("send", "receive") and pattern and _pattern_ok(pattern):
                (send if kind == "send" else receive).append(pattern)
            elif rest == "admin":
                admin = True
            elif rest == "read":
                read = True
            else:
                continue  # not ours, or a pattern that does not compile: no grant
            scopes.append(value)
        for entry in section.map:
            if entry["value"] in _values(_claim(claims, entry["claim"])):
                send += entry.get("send", ())
                receive += entry.get("receive", ())
                groups += entry.get("groups", ())
                admin = admin or entry.get("admin", False)
                read = read or entry.get("read", False)
                scopes += [f"{prefix}send:{p}" for p in entry.get("send", ())]
                scopes += [f"{prefix}receive:{p}" for p in entry.get("receive", ())]
                scopes += [f"{prefix}{r}" for r in ("admin", "read") if entry.get(r)]
        return self.make_grant(subject, float(exp), tuple(dict.fromkeys(scopes)), tuple(send),
                               tuple(receive), admin, read, tuple(dict.fromkeys(groups)))

    def make_grant(self, subject, expires_at, scopes=(), send=(), receive=(), admin=False, read=False,
                   groups=()) -> TokenGrant:
        entry = AclEntry(user=subject, send=tuple(dict.fromkeys(send)),
                         receive=tuple(dict.fromkeys(receive)))
        return TokenGrant(subject, expires_at, tuple(scopes), entry.send, entry.receive, admin, read,
                          tuple(groups), Acl(self.acl_entries + (entry,)), self.section.leeway)

    def from_json(self, data: dict) -> TokenGrant:
        """A grant handed over by another worker (``TokenGrant.to_json``)."""
        return self.make_grant(str(data["subject"]), float(data["expires_at"]), data.get("scopes", ()),
                               data.get("send", ()), data.get("receive", ()), bool(data.get("admin")),
                               bool(data.get("read")), data.get("groups", ()))

    def admin_role(self, token: str, where: str = "admin API") -> str | None:
        """The admin API role of a bearer token: "admin", "read", "" (valid, no such grant) or None."""
        try:
            grant = self.check(token, where)
        except TokenRefused:
            return None
        return "admin" if grant.admin else "read" if grant.read else ""


def _pattern_ok(pattern: str) -> bool:
    try:
        compile_pattern(pattern)
    except RuleError:
        return False
    return True
