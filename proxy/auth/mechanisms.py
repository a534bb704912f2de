"""SASL mechanisms the node verifies itself (§5.3), and what a step of one returns.

``Authenticator`` checks PLAIN passwords and certificate identities against
the users file; a mechanism answers each client response with
``SaslSuccess``, ``SaslFailure`` (a sasl-code) or a ``Challenge``. The
exchange itself (frames, order, outcome) is ``proxy.auth.sasl.SaslServer``;
SCRAM-SHA-256 is ``proxy.auth.scram``.
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass
from typing import Callable, Protocol

from proxy.auth.oauth.validate import TokenRefused, looks_like_jwt
from proxy.auth.users import DEFAULT_ITERATIONS, UsersFile, make_record

log = logging.getLogger("fedgate.sasl")

# sasl-code (§5.3.3.6)
OK, AUTH, SYS, SYS_PERM, SYS_TEMP = 0, 1, 2, 3, 4


@dataclass(frozen=True)
class SaslSuccess:
    identity: str
    mechanism: str
    groups: tuple[str, ...] = ()
    additional_data: bytes | None = None  # sasl-outcome additional-data (§5.3.3.6)
    token: object = None  # a token login's grant (proxy.auth.oauth.TokenGrant)


@dataclass(frozen=True)
class SaslFailure:
    code: int
    reason: str  # for our logs; the client only learns the code


@dataclass(frozen=True)
class Challenge:
    data: bytes


@dataclass(frozen=True)
class Wait:
    """No answer yet: ``then()`` gives the step once ``ready()`` (the connection polls it)."""

    ready: Callable[[], bool]
    then: Callable[[], "Step"]


Step = SaslSuccess | SaslFailure | Challenge | Wait


class Mechanism(Protocol):
    name: str

    def start(self, initial_response: bytes | None) -> Step: ...

    def respond(self, response: bytes) -> Step: ...


class Authenticator:
    """Holds what mechanisms need to check credentials (the users file, the token validator)."""

    def __init__(self, users: UsersFile | None, oauth=None) -> None:
        self.users = users
        self.oauth = oauth  # proxy.auth.oauth.Validator with [oauth]: PLAIN takes a token too
        # per-process secret for SCRAM's answers about unknown users (RFC 5802 §5.1)
        self.secret = secrets.token_bytes(32)
        # an unknown user's password is checked too, against a record nobody has, so
        # PLAIN takes as long for a name that does not exist as for one that does
        self._dummy = make_record("unknown", secrets.token_urlsafe(16),
                                  iterations=self._usual_iterations(users))

    @staticmethod
    def _usual_iterations(users: UsersFile | None) -> int:
        counts = [record.iterations for record in users.users.values()] if users else []
        return max(set(counts), key=counts.count) if counts else DEFAULT_ITERATIONS

    def groups_of(self, name: str) -> tuple[str, ...]:
        record = self.users.get(name) if self.users else None
        return record.groups if record else ()

    def check_plain(self, name: str, password: str) -> Step:
        """The users file first, then ([oauth]) the password as a token (RabbitMQ's convention).

        Without a users file there is no user name to hide: a token goes straight to the validator."""
        token = self.oauth is not None and looks_like_jwt(password)
        if token and self.users is None:
            return token_step(self.oauth, password, "PLAIN")
        step = self._check_password(name, password)
        if isinstance(step, SaslFailure) and token:
            return token_step(self.oauth, password, "PLAIN")
        return step

    def _check_password(self, name: str, password: str) -> Step:
        record = self.users.get(name) if self.users else None
        if record is None:
            self._dummy.check_password(password)  # same work, answer thrown away
            return SaslFailure(AUTH, f"unknown user {name!r}")
        if not record.check_password(password):
            return SaslFailure(AUTH, f"wrong password for user {name!r}")
        return SaslSuccess(name, "PLAIN", record.groups)


def token_step(validator, token: str | bytes, mechanism: str, authzid: str = "", wait: bool = True) -> Step:
    """A token login (proxy.auth.oauth): success carrying the token's grant, or ``auth``.

    A token whose ``kid`` is not known while the JWKS document is being fetched again (the
    miss started it, or one was under way) waits for that fetch once (``Wait``), then is
    checked again. The refusal's reason is logged here; the server's next line names the peer."""
    try:
        grant = validator.validate(token)
    except TokenRefused as exc:
        keys = validator.keys
        if wait and exc.reason == "unknown_key" and getattr(keys, "fetching", False):
            return Wait(lambda: not keys.fetching,
                        lambda: token_step(validator, token, mechanism, authzid, wait=False))
        validator.refuse(exc.reason, exc.detail, f"SASL {mechanism}")
        return SaslFailure(AUTH, f"token refused: {exc.reason}")
    if authzid and authzid != grant.subject:
        validator.refuse("wrong_user", f"{grant.subject!r} may not act as {authzid!r}", f"SASL {mechanism}")
        return SaslFailure(AUTH, f"token user {grant.subject!r} may not act as {authzid!r}")
    return SaslSuccess(grant.subject, mechanism, grant.groups, token=grant)


class AnonymousMechanism:
    name = "ANONYMOUS"

    def start(self, initial_response: bytes | None) -> Step:
        return SaslSuccess("anonymous", self.name)

    def respond(self, response: bytes) -> Step:
        return SaslFailure(AUTH, "ANONYMOUS takes no response")


class PlainMechanism:
    """RFC 4616: ``[authzid] NUL authcid NUL passwd``."""

    name = "PLAIN"

    def __init__(self, authenticator: Authenticator) -> None:
        self.authenticator = authenticator

    def start(self, initial_response: bytes | None) -> Step:
        if initial_response is None:
            return Challenge(b"")  # ask for the credentials (RFC 4616 §2)
        return self.respond(initial_response)

    def respond(self, response: bytes) -> Step:
        parts = response.split(b"\x00")
        if len(parts) != 3:
            return SaslFailure(AUTH, "malformed PLAIN response")
        try:
            authzid, authcid, password = (p.decode("utf-8") for p in parts)
        except UnicodeDecodeError:
            return SaslFailure(AUTH, "PLAIN response is not UTF-8")
        if authzid and authzid != authcid:
            return SaslFailure(AUTH, f"user {authcid!r} may not act as {authzid!r}")
        return self.authenticator.check_plain(authcid, password)


class ExternalMechanism:
    """RFC 4422 appendix A: the identity comes from the verified TLS client certificate.

    The initial response is an authorization identity: empty (act as the
    certificate's identity) or exactly that identity.
    """

    name = "EXTERNAL"

    def __init__(self, authenticator: Authenticator, cert_identity: str | None) -> None:
        self.authenticator = authenticator
        self.cert_identity = cert_identity

    def start(self, initial_response: bytes | None) -> Step:
        identity = self.cert_identity
        if not identity:
            return SaslFailure(AUTH, "EXTERNAL without a verified client certificate identity")
        if identity == RESERVED_ANONYMOUS:
            return SaslFailure(AUTH, "certificate identity 'anonymous' is reserved")
        if initial_response:
            try:
                authzid = initial_response.decode("utf-8")
            except UnicodeDecodeError:
                return SaslFailure(AUTH, "EXTERNAL authorization identity is not UTF-8")
            if authzid != identity:
                return SaslFailure(AUTH, f"certificate {identity!r} may not act as {authzid!r}")
        return SaslSuccess(identity, self.name, self.authenticator.groups_of(identity))

    def respond(self, response: bytes) -> Step:
        return self.start(response)


RESERVED_ANONYMOUS = "anonymous"

# Short names for certificate subject attributes, as Python's ssl module spells them.
SUBJECT_FIELDS = {
    "CN": "commonName",
    "UID": "userId",
    "emailAddress": "emailAddress",
    "E": "emailAddress",
    "OU": "organizationalUnitName",
    "O": "organizationName",
    "serialNumber": "serialNumber",
}


def certificate_identity(peercert: dict | None, field: str = "CN") -> str | None:
    """The value of one subject field of a verified peer certificate, or None.

    ``peercert`` is ``ssl.SSLSocket.getpeercert()``: empty when the certificate
    was not verified, so an unverified certificate never yields an identity.
    """
    if not peercert:
        return None
    wanted = SUBJECT_FIELDS.get(field, field)
    for rdn in peercert.get("subject", ()):
        for name, value in rdn:
            if name == wanted and value:
                return value
    return None
