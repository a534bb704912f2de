"""Client-facing listener side: one ``AmqpProtocol`` per accepted socket.

The byte and timer plumbing is ``proxy.net.engine_protocol.EngineProtocol``; this class adds
what is specific to clients: admission (connection limits) before any state
exists, a ``ClientHandler`` for the broker, and write-side backpressure
(while the socket is paused, that connection's consumers report no credit, so
queues stop handing them messages).

Containment: an unexpected exception while handling one connection's input
or timers is logged with its traceback and closes only that connection, with
``amqp:internal-error`` (§2.8.15); the node goes on serving everyone else.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import struct
import sys

from proxy.amqp import engine
from proxy.amqp.connection import ConnectionSettings, ServerConnection
from proxy.auth.mechanisms import certificate_identity
from proxy.broker.broker import Broker
from proxy.broker.handler import ClientHandler
from proxy.net.engine_protocol import EngineProtocol

INTERNAL_ERROR = "amqp:internal-error"
FORCED = "amqp:connection:forced"

log = logging.getLogger("fedgate.server")


class AmqpProtocol(EngineProtocol):
    __slots__ = ("node", "broker", "handler", "peer", "ip", "_failed", "_tls", "_early", "internal",
                 "_ws", "_read_while_blocked", "_sent_seen", "_moved_at", "_handed", "reads")

    def __init__(self, node, *, internal: bool = False, handed=None) -> None:
        super().__init__(node.run_pending)  # one bound method for all connections
        self.node = node
        # internal: another worker of this node forwarding its clients' links
        # (proxy.workers): no TLS, no SASL, no limits, no ACL (applied where they connected)
        self.internal = internal
        self.broker: Broker = node.broker
        self.handler: ClientHandler | None = None
        self.peer = ""
        self.ip = ""
        self._failed = False  # an internal error closed this connection: ignore its input
        self._tls = None  # the task starting TLS on this connection (TLS listeners)
        self._early = b""  # bytes TLS handed us before start_tls returned (see data_received)
        # WebSocket binding (proxy.net.websocket): None until the first input tells,
        # then False (AMQP straight on the socket) or the WebSocketTransport
        self._ws = None if node.websocket is not None and not internal else False
        # bytes of input still to read while output is blocked (None: output is not blocked)
        self._read_while_blocked: int | None = None
        # output progress (check_output): bytes the client had taken at the last check, and
        # when its output last moved or had nothing waiting
        self._sent_seen = 0
        self._moved_at = 0.0
        # a connection another worker began and handed to us (proxy.workers.placement):
        # (identity, the client's frames after its AMQP header, what it was answered,
        # whether its user is counted, the fragmented-queue balance it was placed by)
        self._handed = handed
        # reads so far: whether a peer node was heard meanwhile (proxy.replication: a primary
        # that hears none of its peers is the one cut off). A count, not a clock: no call
        self.reads = 0

    def connection_made(self, transport) -> None:
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.ip = sys.intern(str(peer[0])) if peer else "?"  # one string per client address
        if self.internal:
            self._start(transport, None)
            return
        if self.node.tls_context is not None and self._tls is None:
            # TLS listener: the limits first, then the handshake (no TLS work for a refused one)
            refusal = self.node.admission.admit(self)
            if refusal is None:
                refusal = self.node.admission.begin_handshake()
                if refusal is not None:
                    self.node.release(self)  # admitted, but no handshake: forget it again
            if refusal:
                log.warning("connection from %s refused before TLS: %s", self.peer, refusal)
                transport.abort()
                return
            transport.pause_reading()  # the ClientHello is for TLS, not for us (start_tls resumes)
            self._tls = self.loop.create_task(self._start_tls(transport))  # held: not collected early
            return
        refusal = None if self._tls is not None else self.node.admission.admit(self)
        self._start(transport, refusal)

    async def _start_tls(self, transport) -> None:
        timeout = self.node.config.limits.handshake_timeout or None
        try:
            tls = await self.loop.start_tls(transport, self, self.node.tls_context, server_side=True,
                                            ssl_handshake_timeout=timeout)
        except Exception as exc:  # handshake failed, timed out, or the client went away
            log.info("connection from %s: TLS handshake failed: %r", self.peer, exc)
            self.node.admission.end_handshake()
            transport.abort()
            self.node.release(self)
            return
        self.node.admission.end_handshake()
        if self._closed:  # the client went away just after the handshake
            self.node.release(self)
            return
        self._start(tls, None)
        if self._early:
            early, self._early = self._early, b""
            self.data_received(early)

    def _start(self, transport, refusal: str | None) -> None:
        """Admitted (or refused with ``refusal``): the AMQP connection's state begins."""
        super().connection_made(transport)
        settings: ConnectionSettings = self.node.connection_settings
        max_links = self.node.config.limits.max_links_per_connection
        if self.internal:
            settings, max_links, self.peer = self.node.internal_settings, 0, "worker"
        self.handler = ClientHandler(self.broker, peer=self.peer, output=self, max_links=max_links,
                                     trusted=self.internal)
        cert_identity = None
        if self.node.tls_context is not None and not self.internal:
            cert_identity = certificate_identity(transport.get_extra_info("peercert"),
                                                 self.node.config.sasl.external_identity)
        self.conn = ServerConnection(
            settings, self.node.authenticator, self.handler, self.loop.time(),
            cert_identity=cert_identity,
            admit=self._admit_user,
            failure_delay=self._sasl_failed,
        )
        if refusal:
            log.warning("connection from %s refused: %s", self.peer, refusal)
            self.conn.failure = refusal
            transport.abort()
            return
        (self.node.internal_connections if self.internal else self.node.connections).add(self)
        handed, self._handed = self._handed, None
        if handed is not None:
            identity, frames, answered, counted, balance = handed
            self.node.placement.adopted(self, identity.user if counted else None, balance)
            self.conn.resume_handed_over(identity, frames, answered)
            self.run_pending()
            self.flush()
        elif not self.internal and self.node.placement.active:
            self.conn.placing = True  # hold the first frames for the first attach (_place)
        self._schedule(self.conn.tick(self.loop.time()))

    def _admit_user(self, identity):
        return self.node.admission.admit_user(self, identity)

    def _sasl_failed(self) -> float:
        return self.node.admission.sasl_failed(self.ip, self.loop.time())

    def data_received(self, data: bytes) -> None:
        if self.conn is None:  # TLS is up but start_tls has not returned to us yet
            self._early += data
            return
        if self._failed:
            return
        self.reads += 1
        budget = self._read_while_blocked
        if budget is not None:  # output blocked: read on within the budget (pause_writing)
            budget -= len(data)
            self._read_while_blocked = budget
            if budget <= 0:
                self.transport.pause_reading()
        ws = self._ws
        if ws is not False:
            if ws is None:
                ws = self._sniff(data)
            if ws:
                data = ws.receive(data)
                if ws.ended:
                    self._websocket_ended(data)
                    return
                if not data:  # handshake, control frames, or refused (the socket is closing)
                    return
        try:
            super().data_received(data)
            if self.conn is not None and self.conn.first_attach is not None:
                self._place()
        except Exception:
            self._contain("reading input")

    def _place(self) -> None:
        """The first attach is read (proxy.amqp.first_attach): hand the connection to the
        worker that owns its queue, or serve it here."""
        conn = self.conn
        attach = conn.first_attach
        if attach is None:
            return
        where = self.node.placement.where(attach)
        fileno = getattr(self.transport, "fileno", None)
        handover = conn.handover() if where is not None else None
        if (handover is not None and fileno is not None and not self._closed
                and not self.transport.get_write_buffer_size()
                and self.node.placement.hand_over(self, where, fileno(), *handover)):
            self._closed = True  # nothing more from us: the socket lives on in another worker
            self.transport.abort()  # our descriptor only; connection_lost tells nobody
            return
        conn.serve_here()
        self.run_pending()
        self.flush()

    def _sniff(self, data: bytes):
        """First input: ``GET`` is a WebSocket upgrade (an AMQP header starts with ``A``)."""
        if data[:1] != b"G":
            self._ws = False
            return False
        from proxy.net.websocket import WebSocketTransport

        self._ws = self.transport = WebSocketTransport(self.transport, self.node.websocket, self.peer)
        self.conn.placing = False  # its framing lives here: a WebSocket stays where it is
        return self._ws

    def _websocket_ended(self, data: bytes) -> None:
        """The client closed the WebSocket (or broke it): what came before the close is
        read, then it is the end of the input (the AMQP connection ends without its close)."""
        try:
            if data:
                super().data_received(data)
            if not self._closed:
                super().eof_received()
        except Exception:
            self._contain("reading input")
        if not self._closed:
            self._closed = True
            self.transport.close()  # the close frame (ours, or the echo of theirs) goes first

    @property
    def transport_kind(self) -> str:
        """How the client reached us: ``tcp`` or ``websocket`` (over TLS or not: ``tls``)."""
        return "websocket" if self._ws else "tcp"

    def eof_received(self) -> bool:
        if self.conn is None:
            return False
        if self._failed:
            return True
        try:
            return super().eof_received()
        except Exception:
            self._contain("end of input")
            return True

    def _on_timer(self) -> None:
        try:
            super()._on_timer()
        except Exception:
            self._contain("timer")

    def _contain(self, where: str) -> None:
        """One connection's unexpected error closes that connection only."""
        log.exception("connection %s from %s (user %s): internal error while %s; closing it "
                      "with amqp:internal-error", self.handler.connection_id, self.peer,
                      getattr(self.conn.identity, "user", "?"), where)
        self._failed = True
        self.conn.failure = self.conn.failure or f"internal error while {where}"
        try:
            self.conn.close(INTERNAL_ERROR, "internal error in the node; see its log")
            self.flush()
        except Exception:
            log.exception("connection %s from %s: close after internal error failed; aborting",
                          self.handler.connection_id, self.peer)
            self.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.node.release(self)
        self._tls = None
        conn = self.conn
        if conn is None:
            self.transport = None
            return
        if conn.failure:
            log.info("connection %s from %s closed: %s", self.handler.connection_id, self.peer, conn.failure)
        self.handler.release_all()
        conn.release()
        self.broker.run_pending()
        self._unlink()

    def _unlink(self) -> None:
        """Break the reference cycles of a closed connection (protocol, handler, proton
        connection, TLS objects): freed at once, not at the garbage collector's next full
        pass. Waiting for it, 5,000 TLS connections took the node from 44 to 274 MB of RSS,
        which it kept (issue #21)."""
        self.handler.output = None
        self.handler.server_connection = None
        self.conn = None
        self.transport = None
        if self._ws:
            self._ws.release()

    # -- output bound (issue #21) ---------------------------------------------
    # The socket's write buffer past its high-water mark: the client is not reading.
    # Its consumers get nothing more (the queue keeps it). Its input is read on for
    # READ_WHILE_BLOCKED bytes, then no more: enough for a client that is leaving to
    # be heard (its detach or close: what it held goes back to the queue, issue #33),
    # while what more input would make us write (dispositions, flow, attach answers)
    # stays bounded. Both resume once the buffer is down to the low-water mark.
    READ_WHILE_BLOCKED = 64 * 1024

    def pause_writing(self) -> None:
        self.handler.pause()
        self._read_while_blocked = self.READ_WHILE_BLOCKED

    def resume_writing(self) -> None:
        self._read_while_blocked = None
        if not self._closed:
            self.transport.resume_reading()
        self.handler.writable = True
        self._resume_output()

    def _resume_output(self) -> None:
        if self._closed:
            return
        self.handler.resume()  # does nothing while the socket is paused
        try:
            self.broker.run_pending()
        except Exception:
            self._contain("resuming output")

    # -- output progress (issue #33) ----------------------------------------------------
    # A connection whose output waits and does not move is stuck (a client that stopped
    # reading, or never opens its session window): the node checks every connection
    # now and then (Node._check_output) and the admin API and /metrics show how long.
    def output_pending(self) -> int:
        """Bytes for this client not taken yet: the socket's buffer, and what proton holds."""
        transport, server = self.transport, self.handler.server_connection if self.handler else None
        buffered = transport.get_write_buffer_size() if transport is not None and not self._closed else 0
        held = engine.session_bytes(server.connection_ptr) if server is not None else 0
        return buffered + held

    def check_output(self, now: float) -> None:
        transport = self.transport
        if transport is None or self._closed:
            return
        sent = self.written - transport.get_write_buffer_size()
        if sent != self._sent_seen or not self.output_pending():
            self._sent_seen = sent
            self._moved_at = now

    def output_stalled_s(self, now: float) -> float:
        """Seconds this client's output has waited without moving (0: moving or nothing waits)."""
        if not self._moved_at or not self.output_pending():
            return 0.0
        return max(0.0, now - self._moved_at)

    def flush(self) -> None:
        super().flush()
        handler = self.handler
        if handler is not None and handler.blocked and handler.output_drained():
            # what a full session held went out: its consumers go on, after others had a turn
            self.loop.call_soon(self._resume_output)

    def close(self, condition: str | None = None, description: str | None = None, *,
              reset: bool = False) -> None:
        """Node-initiated close (shutdown, admin).

        ``reset`` with ``amqp:connection:forced`` (go to another node: this one stops, or can
        no longer serve the client) resets the socket instead of sending a close frame: after
        a close frame python-qpid-proton's Container (0.40) stops reading and waits for good,
        even for ``amqp:connection:forced`` and a reset after it, so it never fails over;
        every client (proton, Qpid JMS, rhea) fails over on a broken connection (issue #42).
        An administrator's close keeps the frame: the client learns why."""
        if self._closed:
            return
        if condition == FORCED and reset:
            log.info("connection %s from %s: reset (%s): the client fails over",
                     self.handler.connection_id, self.peer, description)
            self.reset()
            return
        self.conn.close(condition, description)
        self.flush()

    def reset(self) -> None:
        """Abort with a TCP reset (SO_LINGER 0): the peer sees the connection broken."""
        fileno = getattr(self.transport, "fileno", None)
        if fileno is not None:
            with contextlib.suppress(OSError, ValueError):
                sock = socket.socket(fileno=fileno())
                try:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                finally:
                    sock.detach()
        self.abort()
