"""The I/O boundary: asyncio moves bytes and timers, nothing else.

How this works
--------------
``AmqpProtocol`` is an ``asyncio.Protocol`` per accepted socket. It feeds what
it reads into a ``ServerConnection`` (protocol state, sans-I/O), asks the
broker to run what became pending (queue dispatch, other connections'
output), and writes what the connection produced. Timers: the connection
reports its next deadline (handshake deadline, proton's idle-timeout ticks,
§2.4.5) and the protocol keeps one ``call_at`` handle for it.

Backpressure: when the socket's write buffer is over the high-water mark
asyncio calls ``pause_writing``; consumers on that connection then report no
credit, so queues stop handing them messages until ``resume_writing``.
Reading is bounded by proton's input capacity and by the credit we grant.
"""

from __future__ import annotations

import asyncio
import logging

from .broker import Broker, ClientHandler
from .connection import ConnectionSettings, ServerConnection

log = logging.getLogger("fedgate.server")


class AmqpProtocol(asyncio.Protocol):
    def __init__(self, node) -> None:
        self.node = node
        self.broker: Broker = node.broker
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.conn: ServerConnection | None = None
        self.handler: ClientHandler | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._closed = False
        self.peer = ""

    # -- asyncio callbacks -------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        refusal = self.node.admit(self)
        settings: ConnectionSettings = self.node.connection_settings
        self.handler = ClientHandler(self.broker, peer=self.peer,
                                     max_links=self.node.config.limits.max_links_per_connection)
        self.handler.flush = self.flush
        self.conn = ServerConnection(settings, self.node.authenticator, self.handler, self.loop.time())
        transport.set_write_buffer_limits(high=256 * 1024)
        if refusal:
            log.warning("connection from %s refused: %s", self.peer, refusal)
            self.conn.failure = refusal
            transport.abort()
            return
        self.node.connections.add(self)
        self._schedule(self.conn.tick(self.loop.time()))

    def data_received(self, data: bytes) -> None:
        conn = self.conn
        conn.receive(data)
        self.broker.run_pending()
        self.flush()

    def eof_received(self) -> bool:
        self.conn.input_closed()
        self.broker.run_pending()
        self.flush()
        return True  # keep our side open until our close frames are written

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        self.node.connections.discard(self)
        conn = self.conn
        if conn is None:
            return
        if conn.failure:
            log.info("connection %s from %s closed: %s", self.handler.connection_id, self.peer, conn.failure)
        self.handler.release_all()
        self.broker.run_pending()

    def pause_writing(self) -> None:
        self.handler.pause()

    def resume_writing(self) -> None:
        self.handler.resume()
        self.broker.run_pending()

    # -- output and timers ---------------------------------------------------
    def flush(self) -> None:
        if self._closed:
            return
        conn = self.conn
        conn.process()
        out = conn.take_output()
        if out:
            self.transport.write(out)
        if conn.finished:
            self._closed = True
            self.transport.close()  # flushes what is buffered, then closes
            return
        if self._timer is None and conn.transport is not None:
            # first output of the AMQP phase, or the last timer was consumed
            self._schedule(conn.tick(self.loop.time()))

    def _schedule(self, deadline: float | None) -> None:
        if not deadline:
            return
        if self._timer is not None:
            if self._timer_at is not None and self._timer_at <= deadline:
                return
            self._timer.cancel()
        self._timer_at = deadline
        self._timer = self.loop.call_at(deadline, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = None
        if self._closed:
            return
        deadline = self.conn.tick(self.loop.time())
        self.broker.run_pending()
        self.flush()
        self._schedule(deadline)

    # -- node-initiated close --------------------------------------------------
    def close(self, condition: str | None = None, description: str | None = None) -> None:
        if self._closed:
            return
        self.conn.close(condition, description)
        self.flush()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()
