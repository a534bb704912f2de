"""Client-facing listener side: one ``AmqpProtocol`` per accepted socket.

The byte and timer plumbing is ``proxy.io.EngineProtocol``; this class adds
what is specific to clients: admission (connection limits) before any state
exists, a ``ClientHandler`` for the broker, and write-side backpressure
(while the socket is paused, that connection's consumers report no credit, so
queues stop handing them messages).
"""

from __future__ import annotations

import logging

from .broker import Broker, ClientHandler
from .connection import ConnectionSettings, ServerConnection
from .io import EngineProtocol

log = logging.getLogger("fedgate.server")


class AmqpProtocol(EngineProtocol):
    def __init__(self, node) -> None:
        super().__init__(node.broker.run_pending)
        self.node = node
        self.broker: Broker = node.broker
        self.handler: ClientHandler | None = None
        self.peer = ""

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        refusal = self.node.admit(self)
        settings: ConnectionSettings = self.node.connection_settings
        self.handler = ClientHandler(self.broker, peer=self.peer,
                                     max_links=self.node.config.limits.max_links_per_connection)
        self.handler.flush = self.flush
        self.conn = ServerConnection(settings, self.node.authenticator, self.handler, self.loop.time())
        if refusal:
            log.warning("connection from %s refused: %s", self.peer, refusal)
            self.conn.failure = refusal
            transport.abort()
            return
        self.node.connections.add(self)
        self._schedule(self.conn.tick(self.loop.time()))

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
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

    def close(self, condition: str | None = None, description: str | None = None) -> None:
        """Node-initiated close (shutdown, admin)."""
        if self._closed:
            return
        self.conn.close(condition, description)
        self.flush()
