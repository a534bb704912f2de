"""AMQP over WebSocket on the AMQP listener (OASIS AMQP WebSocket Binding 1.0).

How this works
--------------
A client that speaks HTTP first (``GET ...``) instead of an AMQP or SASL
protocol header wants the WebSocket binding. ``AmqpProtocol`` looks at the
first byte of a connection's input: ``G`` (``GET``) cannot start an AMQP
header (``A``, ``AMQP...``), so one listener serves both, and inside TLS the
same (``wss://``). From then on a ``WebSocketTransport`` stands between the
socket's transport and the AMQP connection:

* **Input**: bytes go to ``websockets``' sans-I/O ``ServerProtocol``. Until
  the upgrade is done they are the HTTP request: checked (method, version,
  key: the library; path, ``Origin`` and subprotocol ``amqp``: here) and
  answered with ``101 Switching Protocols`` and ``Sec-WebSocket-Protocol:
  amqp``, or with a 4xx and its reason, after which the socket closes and
  nothing has reached the AMQP layer. After it, the payload of each binary
  message is the AMQP byte stream (protocol headers, SASL, frames: the
  binding's section 2), handed on unchanged, whatever the message boundaries.
  Pings are answered; a text frame closes with 1003 (unsupported data), a
  message over ``max_message_size`` with 1009 (message too big), a protocol
  error with 1002; a close frame from the client is the end of input.
* **Output**: each ``write`` of the AMQP connection (a whole flush: many
  frames) becomes one binary message; ``close`` sends a close frame (1000)
  before the socket closes, as the binding's section 2.4 says.
* Everything else passes through to the socket's transport: backpressure
  (``pause_reading``, write buffer limits), ``get_extra_info`` (peer address,
  TLS certificate for EXTERNAL), ``abort``. The AMQP connection's handshake
  deadline started at accept, so it covers the HTTP upgrade too.

The WebSocket frames are made and parsed by ``websockets`` (a C helper
unmasks client frames); this module only moves bytes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from websockets.exceptions import InvalidOrigin
from websockets.frames import CloseCode, Opcode
from websockets.http11 import Request, Response
from websockets.protocol import State
from websockets.server import ServerProtocol

log = logging.getLogger("fedgate.websocket")

SUBPROTOCOL = "amqp"  # the binding's registered subprotocol name (section 2.1)


@dataclass(frozen=True)
class WebSocketSettings:
    """What the ``[websocket]`` section allows (see ``proxy.config.settings``)."""

    paths: tuple[str, ...] = ()  # request paths accepted; empty: any
    origins: tuple[str, ...] = ()  # Origin header values accepted; empty: any (none: always)
    max_message_size: int = 1024 * 1024

    def check_request(self, request: Request) -> tuple[int, str] | None:
        """Our part of checking an upgrade request: ``(status, reason)`` to refuse it."""
        path = request.path.split("?", 1)[0]
        if self.paths and path not in self.paths:
            return 404, f"no WebSocket endpoint at {path} (this node serves {', '.join(self.paths)})"
        offered = [p.strip() for value in request.headers.get_all("Sec-WebSocket-Protocol")
                   for p in value.split(",")]
        if SUBPROTOCOL not in offered:
            return 400, "AMQP over WebSocket needs the subprotocol 'amqp' (Sec-WebSocket-Protocol: amqp)"
        return None


class WebSocketTransport:
    """The socket's transport seen through the WebSocket binding (module note)."""

    __slots__ = ("_raw", "_ws", "_settings", "upgraded", "refused", "peer", "ended")

    def __init__(self, raw, settings: WebSocketSettings, peer: str) -> None:
        self._raw = raw
        self._settings = settings
        # browsers always send Origin; other clients (rhea on Node.js, Qpid JMS) do not, and
        # the check is against cross-site pages in browsers: no Origin passes
        origins = [*settings.origins, None] if settings.origins else None
        self._ws = ServerProtocol(subprotocols=[SUBPROTOCOL], origins=origins,
                                  max_size=settings.max_message_size or None, logger=log)
        self.upgraded = False  # 101 sent: the AMQP byte stream flows
        self.refused = False  # the upgrade was answered with an error: nothing more comes
        self.ended = False  # the client closed the WebSocket (or broke its protocol)
        self.peer = peer

    # -- input ---------------------------------------------------------------------------
    def receive(self, data: bytes) -> bytes:
        """The AMQP bytes ``data`` carries (b"" when none); answers what WebSocket asks
        (handshake, pong, close) itself."""
        ws = self._ws
        if self.refused or self.ended:
            return b""
        ws.receive_data(data)
        out = []
        events = ws.events_received()
        if not self.upgraded and not events and ws.handshake_exc is not None:
            self._malformed()
            return b""
        for event in events:
            if isinstance(event, Request):
                self._upgrade(event)
            elif event.opcode is Opcode.BINARY or event.opcode is Opcode.CONT:
                out.append(event.data)
            elif event.opcode is Opcode.TEXT:
                log.info("WebSocket client %s sent a text frame; closing with 1003", self.peer)
                ws.send_close(CloseCode.UNSUPPORTED_DATA, "AMQP is carried in binary messages")
                self.ended = True
                break
            elif event.opcode is Opcode.CLOSE:
                self.ended = True
            # PING: the library queued the PONG; PONG: nothing to do
        if self.upgraded and ws.state is not State.OPEN:
            self.ended = True  # a close frame either way (theirs, or ours for a protocol error)
        elif not self.upgraded and ws.state is State.CLOSED:
            self.refused = True  # the library answered a malformed request with a 400 itself
        self._send_pending()
        return b"".join(out)

    def _upgrade(self, request: Request) -> None:
        ws = self._ws
        response = ws.accept(request)  # the library's checks: method, Upgrade, key, version, Origin
        refusal = self._settings.check_request(request)  # ours: path, subprotocol
        if response.status_code != 101:
            reason = _reason(response, ws)
            if refusal is None or "subprotocol" not in reason:  # ours says it more plainly
                refusal = (response.status_code, reason)
        if refusal is None:
            ws.send_response(response)
            self.upgraded = True
            return
        status, reason = refusal
        log.info("WebSocket upgrade from %s refused: %d %s", self.peer, status, reason)
        ws.send_response(ws.reject(status, reason + "\n"))
        self.refused = True

    def _malformed(self) -> None:
        """Not an HTTP request the library could parse: it would close without a word."""
        ws = self._ws
        ws.data_to_send()  # its end-of-stream marker: we answer first
        reason = f"malformed HTTP request ({ws.handshake_exc})"
        log.info("WebSocket upgrade from %s refused: 400 %s", self.peer, reason)
        self._raw.write(ws.reject(400, reason + "\n").serialize())
        self._raw.close()
        self.refused = True

    # -- output ------------------------------------------------------------------------
    def write(self, data) -> None:
        if not self.upgraded or self.ended or not data:
            return  # nothing AMQP goes out before the upgrade or after a close
        ws = self._ws
        if ws.state is not State.OPEN:
            return
        ws.send_binary(data)
        self._send_pending()

    def _send_pending(self) -> None:
        raw = self._raw
        for chunk in self._ws.data_to_send():
            if chunk:
                raw.write(chunk)
            else:  # b"": the library's sign to close the TCP connection
                raw.close()
                return

    def close(self) -> None:
        ws = self._ws
        if self.upgraded and ws.state is State.OPEN:
            ws.send_close(CloseCode.NORMAL_CLOSURE)
            for chunk in ws.data_to_send():
                if chunk:
                    self._raw.write(chunk)
        self._raw.close()

    def release(self) -> None:
        """The connection is gone: let go of the socket's transport and the protocol state."""
        self._raw = None
        self._ws = None

    # -- the rest is the socket's ----------------------------------------------------------
    def abort(self) -> None:
        self._raw.abort()

    def get_extra_info(self, name: str, default=None):
        return self._raw.get_extra_info(name, default)

    def set_write_buffer_limits(self, high=None, low=None) -> None:
        self._raw.set_write_buffer_limits(high, low)

    def get_write_buffer_size(self) -> int:
        return self._raw.get_write_buffer_size()

    def is_closing(self) -> bool:
        return self._raw.is_closing()

    def pause_reading(self) -> None:
        self._raw.pause_reading()

    def resume_reading(self) -> None:
        self._raw.resume_reading()

    def is_reading(self) -> bool:
        return self._raw.is_reading()


def _reason(response: Response, ws: ServerProtocol) -> str:
    """The library's reason for refusing a request, without its boilerplate."""
    exc = ws.handshake_exc
    if isinstance(exc, InvalidOrigin):
        return f"Origin {exc.value!r} is not allowed" if exc.value else "an Origin header is required"
    if exc is not None:
        return str(exc)
    return response.body.decode(errors="replace").strip() or response.reason_phrase
