"""SASL OAUTHBEARER (RFC 7628); PLAIN's token path is ``proxy.auth.mechanisms.token_step``.

The client's (initial) response is ``gs2-header \\x01 kvpairs \\x01``:
``n,,\\x01auth=Bearer <token>\\x01\\x01`` (``n,a=<authzid>,`` names an
authorization identity, which must then be the token's user; channel binding
``p=`` is refused). A bad token ends the exchange with the outcome ``auth``
at once: the node does not send RFC 7628's JSON error challenge (§3.2.2),
which would tell the client why and cost a round trip.
"""

from __future__ import annotations

from proxy.auth.mechanisms import AUTH, Challenge, SaslFailure, token_step


def parse_gs2(response: bytes) -> tuple[str, dict[str, bytes]]:
    """(authzid, {key: value}) of an OAUTHBEARER client response; ValueError if malformed."""
    head, sep, rest = response.partition(b"\x01")
    if not sep or not rest.endswith(b"\x01"):
        raise ValueError("no \\x01 separators")
    parts = head.split(b",")
    if len(parts) != 3 or parts[0] not in (b"n", b"y") or parts[2] != b"":
        raise ValueError("malformed gs2 header (channel binding is not supported)")
    authzid = b""
    if parts[1]:
        if not parts[1].startswith(b"a="):
            raise ValueError("malformed gs2 authzid")
        authzid = parts[1][2:].replace(b"=2C", b",").replace(b"=3D", b"=")
    pairs = {}
    for item in rest[:-1].split(b"\x01"):
        if not item:
            continue
        key, eq, value = item.partition(b"=")
        if not eq:
            raise ValueError("a key-value pair without '='")
        pairs[key.decode("ascii", "replace")] = value
    return authzid.decode("utf-8"), pairs


class OAuthBearerMechanism:
    name = "OAUTHBEARER"

    where = "SASL OAUTHBEARER"

    def __init__(self, authenticator) -> None:
        self.authenticator = authenticator

    def start(self, initial_response: bytes | None):
        if initial_response is None:
            return Challenge(b"")  # ask for the client's response
        return self.respond(initial_response)

    def respond(self, response: bytes):
        validator = self.authenticator.oauth
        if validator is None:
            return SaslFailure(AUTH, "OAUTHBEARER without [oauth]")
        try:
            authzid, pairs = parse_gs2(response)
        except (ValueError, UnicodeDecodeError) as exc:
            validator.refuse("malformed", f"OAUTHBEARER response: {exc}", self.where)
            return SaslFailure(AUTH, f"malformed OAUTHBEARER response: {exc}")
        scheme, _, token = pairs.get("auth", b"").partition(b" ")
        if scheme.lower() != b"bearer" or not token.strip():
            validator.refuse("malformed", "no auth=Bearer pair", self.where)
            return SaslFailure(AUTH, "OAUTHBEARER response without auth=Bearer")
        return token_step(validator, token.strip(), self.name, authzid)
