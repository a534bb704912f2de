"""The node's own SASL server layer (AMQP 1.0 §5.3), sans-I/O.

How this works
--------------
Proton's built-in SASL cannot verify a password on the server side, so the
node runs the SASL exchange itself, in front of a proton transport that never
sees SASL. ``SaslServer`` takes bytes that follow the client's SASL protocol
header and returns bytes to send back. Frames are decoded with proton's
``Data`` codec; every frame is bounded by the 512-byte limit that holds before
any negotiation (§5.3.1, MIN-MAX-FRAME-SIZE).

    server                         client
    AMQP 3.1.0.0 + sasl-mechanisms  ->
                                   <-  sasl-init(mechanism, initial-response)
    [sasl-challenge               <-> sasl-response]*       (multi-step mechs)
    sasl-outcome(code)              ->

After a successful outcome ``result`` is a ``SaslSuccess`` and ``leftover``
holds any bytes the client pipelined after its last SASL frame (normally the
AMQP protocol header); they belong to the AMQP layer.

Mechanisms: ANONYMOUS, PLAIN (RFC 4616), EXTERNAL (RFC 4422 appendix A: the
identity is a field of the TLS client certificate the listener verified, see
``certificate_identity``) and SCRAM-SHA-256 (RFC 5802 / RFC 7677, in
``proxy.scram``). SCRAM's server-final message travels in the success
outcome's ``additional-data`` (§5.3.3.6). With ``[oauth]``, OAUTHBEARER
(RFC 7628) and PLAIN with a JWT as password (``proxy.auth.oauth``); frames
may then be up to ``OAUTH_SASL_MAX_FRAME`` bytes, to carry a token.
"""

from __future__ import annotations

import logging
import struct
from typing import Sequence

from proton import Data, DataException, symbol, ulong

from proxy.auth.mechanisms import (
    AUTH,
    OK,
    AnonymousMechanism,
    Authenticator,
    Challenge,
    ExternalMechanism,
    Mechanism,
    PlainMechanism,
    SaslFailure,
    SaslSuccess,
    Wait,
)
from proxy.auth.oauth import OAUTH_SASL_MAX_FRAME
from proxy.auth.oauth.bearer import OAuthBearerMechanism
from proxy.auth.scram import ScramSha256Mechanism

log = logging.getLogger("fedgate.sasl")

SASL_HEADER = b"AMQP\x03\x01\x00\x00"
SASL_FRAME_TYPE = 0x01
SASL_MAX_FRAME = 512

MECHANISMS = 0x40
INIT = 0x41
CHALLENGE = 0x42
RESPONSE = 0x43
OUTCOME = 0x44



class SaslProtocolError(Exception):
    """The peer sent something that is not a valid SASL exchange."""


def make_mechanism(name: str, authenticator: Authenticator, cert_identity: str | None = None) -> Mechanism:
    if name == "ANONYMOUS":
        return AnonymousMechanism()
    if name == "PLAIN":
        return PlainMechanism(authenticator)
    if name == "EXTERNAL":
        return ExternalMechanism(authenticator, cert_identity)
    if name == "SCRAM-SHA-256":
        return ScramSha256Mechanism(authenticator)
    if name == "OAUTHBEARER":
        return OAuthBearerMechanism(authenticator)
    raise ValueError(f"unsupported SASL mechanism {name!r}")


SUPPORTED_MECHANISMS = ("ANONYMOUS", "PLAIN", "EXTERNAL", "SCRAM-SHA-256", "OAUTHBEARER")


# -- frame codec -----------------------------------------------------------
def encode_frame(code: int, fields: Sequence[tuple[str, object]]) -> bytes:
    """Encode a SASL performative; fields are (type, value) in order."""
    data = Data()
    data.put_described()
    data.enter()
    data.put_ulong(ulong(code))
    data.put_list()
    data.enter()
    for kind, value in fields:
        if value is None:
            data.put_null()
        elif kind == "symbols":
            data.put_array(False, Data.SYMBOL)
            data.enter()
            for item in value:  # type: ignore[union-attr]
                data.put_symbol(symbol(item))
            data.exit()
        elif kind == "symbol":
            data.put_symbol(symbol(value))  # type: ignore[arg-type]
        elif kind == "ubyte":
            data.put_ubyte(value)  # type: ignore[arg-type]
        elif kind == "binary":
            data.put_binary(value)  # type: ignore[arg-type]
        else:
            raise ValueError(kind)
    data.exit()
    data.exit()
    body = bytes(data.encode())
    return struct.pack(">IBBH", 8 + len(body), 2, SASL_FRAME_TYPE, 0) + body


def decode_body(body: bytes) -> tuple[int, list]:
    """Decode a SASL frame body into (descriptor code, [field values])."""
    try:
        return _decode_body(body)
    except (DataException, ValueError, TypeError, KeyError, OverflowError) as exc:
        # proton's decoder accepts what its value getters then reject (e.g. a
        # string that is not UTF-8): a protocol error, not a node error
        raise SaslProtocolError(f"undecodable SASL frame: {exc!r}") from exc


def _decode_body(body: bytes) -> tuple[int, list]:
    data = Data()
    consumed = data.decode(body)
    if consumed != len(body):
        raise SaslProtocolError("trailing bytes in SASL frame")
    data.rewind()
    if data.next() != Data.DESCRIBED:
        raise SaslProtocolError("SASL frame body is not a described type")
    data.enter()
    data.next()
    if data.type() not in (Data.ULONG, Data.SYMBOL):
        raise SaslProtocolError("bad SASL descriptor")
    code = data.get_object()
    if not isinstance(code, int):
        code = {"amqp:sasl-init:list": INIT, "amqp:sasl-response:list": RESPONSE}.get(str(code), -1)
    if data.next() != Data.LIST:
        raise SaslProtocolError("SASL performative is not a list")
    data.enter()
    fields = []
    while data.next() is not None:
        value = data.get_object()
        if isinstance(value, memoryview):  # points into proton memory: copy it
            value = bytes(value)
        fields.append(value)
    return int(code), fields


def _as_bytes(value: object) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise SaslProtocolError("expected binary")


class SaslServer:
    """One server-side SASL exchange. Feed bytes with ``receive``."""

    def __init__(self, mechanisms: Sequence[str], authenticator: Authenticator,
                 cert_identity: str | None = None) -> None:
        self.offered = tuple(mechanisms)
        self.authenticator = authenticator
        self.cert_identity = cert_identity  # for EXTERNAL
        self.mechanism: Mechanism | None = None
        self.result: SaslSuccess | SaslFailure | None = None
        self.leftover = b""
        self._buffer = b""
        self.waiting: Wait | None = None  # a step waiting for something (see ``resume``)
        # a token (PLAIN's password, OAUTHBEARER) does not fit in 512 bytes: with [oauth],
        # frames up to the token cap and a little more (docs/oauth.md, cost)
        self.max_frame = SASL_MAX_FRAME
        if getattr(authenticator, "oauth", None) is not None and (
                "PLAIN" in self.offered or "OAUTHBEARER" in self.offered):
            self.max_frame = OAUTH_SASL_MAX_FRAME

    def start(self) -> bytes:
        """The server's opening: SASL protocol header and sasl-mechanisms."""
        return SASL_HEADER + encode_frame(MECHANISMS, [("symbols", self.offered)])

    def receive(self, data: bytes) -> bytes:
        """Consume client bytes; return bytes to send. Sets ``result`` when done."""
        if self.result is not None:
            self.leftover += data
            return b""
        self._buffer += data
        return self._process()

    def _process(self) -> bytes:
        output = b""
        while self.result is None and self.waiting is None:  # waiting: bytes stay buffered
            frame = self._next_frame()
            if frame is None:
                break
            output += self._handle(*frame)
        if self.result is not None:
            self.leftover, self._buffer = self._buffer, b""
        return output

    def resume(self) -> bytes:
        """A step that waited (``Wait``: a JWKS refetch for a token's new kid) is ready: its
        answer, then whatever the client sent meanwhile. Nothing while it is not ready."""
        if self.waiting is None or not self.waiting.ready():
            return b""
        step, self.waiting = self.waiting.then(), None
        return self._answer(step) + self._process()

    def _next_frame(self) -> tuple[int, list] | None:
        buf = self._buffer
        if len(buf) < 8:
            return None
        size, doff, ftype, _channel = struct.unpack_from(">IBBH", buf)
        if size > self.max_frame:
            raise SaslProtocolError(f"SASL frame of {size} bytes exceeds {self.max_frame}")
        if size < 8 or doff < 2 or doff * 4 > size:
            raise SaslProtocolError(f"malformed SASL frame header (size={size}, doff={doff})")
        if ftype != SASL_FRAME_TYPE:
            raise SaslProtocolError(f"frame type {ftype} during SASL negotiation")
        if len(buf) < size:
            return None
        body = buf[doff * 4 : size]
        self._buffer = buf[size:]
        if not body:
            raise SaslProtocolError("empty SASL frame")  # no heartbeats in SASL
        return decode_body(body)

    def _handle(self, code: int, fields: list) -> bytes:
        if self.mechanism is None:
            if code != INIT:
                raise SaslProtocolError(f"expected sasl-init, got performative 0x{code:x}")
            name = str(fields[0]) if fields and fields[0] is not None else ""
            if name not in self.offered:
                return self._finish(SaslFailure(AUTH, f"mechanism {name!r} not offered"))
            self.mechanism = make_mechanism(name, self.authenticator, self.cert_identity)
            initial = _as_bytes(fields[1]) if len(fields) > 1 else None
            step = self.mechanism.start(initial)
        else:
            if code != RESPONSE:
                raise SaslProtocolError(f"expected sasl-response, got performative 0x{code:x}")
            step = self.mechanism.respond(_as_bytes(fields[0] if fields else None) or b"")
        return self._answer(step)

    def _answer(self, step) -> bytes:
        if isinstance(step, Wait):
            self.waiting = step
            return b""
        if isinstance(step, Challenge):
            return encode_frame(CHALLENGE, [("binary", step.data)])
        return self._finish(step)

    def _finish(self, result: SaslSuccess | SaslFailure) -> bytes:
        self.result = result
        if isinstance(result, SaslSuccess):
            fields = [("ubyte", OK)]
            if result.additional_data is not None:
                fields.append(("binary", result.additional_data))
            return encode_frame(OUTCOME, fields)
        return encode_frame(OUTCOME, [("ubyte", result.code)])
