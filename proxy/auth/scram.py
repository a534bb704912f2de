"""SCRAM-SHA-256, server side (RFC 5802, RFC 7677), over the node's SASL layer.

How this works
--------------
A two-round exchange checked against the verifiers of the users file
(``salt``, ``iterations``, ``stored_key``, ``server_key``; ``proxy.users``):
the node never sees or stores the password.

    client                                   server
    sasl-init  n,,n=alice,r=CNONCE       ->
                                         <-  sasl-challenge  r=CNONCE+SNONCE,s=SALT,i=4096
    sasl-response c=biws,r=...,p=PROOF   ->
                                         <-  sasl-outcome ok, additional-data v=SIGNATURE

Checks (RFC 5802 §5 and §7):

* the GS2 header is ``n`` or ``y`` (no channel binding: the node does not
  offer SCRAM-SHA-256-PLUS, so ``y`` is no downgrade) with no or the same
  authorization identity; ``p=`` is refused; a mandatory extension (``m=``)
  is refused;
* the final message repeats the GS2 header (``c=``) and the full nonce;
* ``H(proof XOR HMAC(StoredKey, AuthMessage)) == StoredKey``.

An unknown user gets a believable challenge (salt derived from a per-process
secret, §5.1) and fails at the proof, so the exchange does not reveal which
names exist. Names are compared exactly after ``=2C``/``=3D`` decoding
(no SASLprep).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets

from proxy.auth.mechanisms import AUTH, Authenticator, Challenge, SaslFailure, SaslSuccess, Step
from proxy.auth.users import DEFAULT_ITERATIONS

NONCE_BYTES = 18


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _hmac(key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, hashlib.sha256).digest()


def _decode_saslname(text: str) -> str | None:
    """RFC 5802 §5.1: ``=2C`` is ``,`` and ``=3D`` is ``=``; any other ``=`` is an error."""
    out = []
    i = 0
    while i < len(text):
        char = text[i]
        if char == "=":
            code = text[i + 1 : i + 3]
            if code == "2C":
                out.append(",")
            elif code == "3D":
                out.append("=")
            else:
                return None
            i += 3
        else:
            out.append(char)
            i += 1
    return "".join(out)


def _valid_nonce(nonce: str) -> bool:
    return bool(nonce) and all(0x21 <= ord(c) <= 0x7E and c != "," for c in nonce)


def _attributes(message: str) -> list[tuple[str, str]] | None:
    """``a=x,b=y`` -> [("a", "x"), ("b", "y")]; None when malformed."""
    pairs = []
    for part in message.split(","):
        if len(part) < 2 or part[1] != "=" or not part[0].isalpha():
            return None
        pairs.append((part[0], part[2:]))
    return pairs


class ScramSha256Mechanism:
    name = "SCRAM-SHA-256"

    def __init__(self, authenticator: Authenticator, server_nonce=None) -> None:
        self.authenticator = authenticator
        # () -> str, the server's part of the nonce; random unless a test fixes it
        self._server_nonce = server_nonce or (
            lambda: base64.b64encode(secrets.token_bytes(NONCE_BYTES)).decode())
        self._user: str | None = None
        self._record = None
        self._gs2_header = ""
        self._client_first_bare = ""
        self._server_first = ""
        self._nonce = ""
        self._done = False

    # -- round 1 -------------------------------------------------------------
    def start(self, initial_response: bytes | None) -> Step:
        if initial_response is None:
            return Challenge(b"")  # RFC 4422 §5: the client sends its first message next
        return self._client_first(initial_response)

    def _client_first(self, data: bytes) -> Step:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            return SaslFailure(AUTH, "SCRAM client-first-message is not UTF-8")
        parts = text.split(",", 2)
        if len(parts) != 3:
            return SaslFailure(AUTH, "malformed SCRAM client-first-message")
        cbind, authzid_part, bare = parts
        if cbind.startswith("p="):
            return SaslFailure(AUTH, "SCRAM channel binding requested but not offered")
        if cbind not in ("n", "y"):
            return SaslFailure(AUTH, "malformed SCRAM GS2 header")
        authzid = None
        if authzid_part:
            if not authzid_part.startswith("a="):
                return SaslFailure(AUTH, "malformed SCRAM authorization identity")
            authzid = _decode_saslname(authzid_part[2:])
        attributes = _attributes(bare)
        if not attributes or len(attributes) < 2:
            return SaslFailure(AUTH, "malformed SCRAM client-first-message")
        if attributes[0][0] == "m":
            return SaslFailure(AUTH, "SCRAM mandatory extension not supported")
        (n_key, raw_user), (r_key, client_nonce) = attributes[0], attributes[1]
        if n_key != "n" or r_key != "r":
            return SaslFailure(AUTH, "SCRAM client-first-message needs n= then r=")
        user = _decode_saslname(raw_user)
        if not user:
            return SaslFailure(AUTH, "malformed SCRAM user name")
        if authzid and authzid != user:
            return SaslFailure(AUTH, f"user {user!r} may not act as {authzid!r}")
        if not _valid_nonce(client_nonce):
            return SaslFailure(AUTH, "malformed SCRAM client nonce")

        users = self.authenticator.users
        self._record = users.get(user) if users else None
        self._user = user
        if self._record is not None:
            salt, iterations = self._record.salt, self._record.iterations
        else:  # RFC 5802 §5.1: answer as if the user existed, fail at the proof
            salt = _hmac(self.authenticator.secret, user.encode("utf-8"))[:16]
            iterations = DEFAULT_ITERATIONS
        self._gs2_header = f"{cbind},{authzid_part},"
        self._client_first_bare = bare
        self._nonce = client_nonce + self._server_nonce()
        self._server_first = f"r={self._nonce},s={_b64(salt)},i={iterations}"
        return Challenge(self._server_first.encode("ascii"))

    # -- round 2 -------------------------------------------------------------
    def respond(self, response: bytes) -> Step:
        if self._done:
            return SaslFailure(AUTH, "SCRAM exchange already finished")
        if self._user is None:
            return self._client_first(response)
        self._done = True
        try:
            text = response.decode("utf-8")
        except UnicodeDecodeError:
            return SaslFailure(AUTH, "SCRAM client-final-message is not UTF-8")
        without_proof, sep, proof_part = text.rpartition(",p=")
        attributes = _attributes(without_proof) if sep else None
        if not attributes or len(attributes) < 2:
            return SaslFailure(AUTH, "malformed SCRAM client-final-message")
        (c_key, channel_binding), (r_key, nonce) = attributes[0], attributes[1]
        if c_key != "c" or r_key != "r":
            return SaslFailure(AUTH, "SCRAM client-final-message needs c= then r=")
        try:
            cbind_input = base64.b64decode(channel_binding, validate=True)
            proof = base64.b64decode(proof_part, validate=True)
        except (binascii.Error, ValueError):
            return SaslFailure(AUTH, "SCRAM client-final-message: bad base64")
        if cbind_input != self._gs2_header.encode("utf-8"):
            return SaslFailure(AUTH, "SCRAM channel-binding data does not match the GS2 header")
        if not hmac.compare_digest(nonce.encode(), self._nonce.encode()):
            return SaslFailure(AUTH, "SCRAM nonce mismatch")
        record = self._record
        if record is None:
            return SaslFailure(AUTH, f"unknown user {self._user!r}")
        auth_message = ",".join((self._client_first_bare, self._server_first, without_proof)).encode("utf-8")
        client_signature = _hmac(record.stored_key, auth_message)
        if len(proof) != len(client_signature):
            return SaslFailure(AUTH, f"wrong password for user {self._user!r}")
        client_key = bytes(a ^ b for a, b in zip(proof, client_signature, strict=True))
        if not hmac.compare_digest(hashlib.sha256(client_key).digest(), record.stored_key):
            return SaslFailure(AUTH, f"wrong password for user {self._user!r}")
        server_signature = _hmac(record.server_key, auth_message)
        return SaslSuccess(self._user, self.name, record.groups,
                           additional_data=f"v={_b64(server_signature)}".encode("ascii"))
