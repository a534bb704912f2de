"""One client-mode AMQP connection to a primary, sans-I/O, and the asyncio protocol that moves its bytes.

``UpstreamConnection`` has the shape ``proxy.net.engine_protocol`` drives
(``receive``, ``process``, ``take_output``, ``finished``, ``tick``,
``input_closed``): proton's engine in client mode, with proton's client SASL
(ANONYMOUS or PLAIN). ``UpstreamProtocol`` tells its ``PoolMember`` when the
socket goes and when writing may go on.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from proton import Connection, Transport

from proxy.amqp import engine
from proxy.net.engine_protocol import EngineProtocol

if TYPE_CHECKING:
    from proxy.upstream.member import PoolMember
    from proxy.upstream.target import UpstreamTarget

log = logging.getLogger("fedgate.upstream")

class UpstreamConnection:
    """Client-mode proton connection to a primary, sans-I/O (same shape as ServerConnection)."""

    def __init__(self, target: UpstreamTarget, handler, container_id: str) -> None:
        transport = Transport()
        transport.max_frame_size = 65536
        if target.heartbeat:
            transport.idle_timeout = target.heartbeat * 2
        sasl = transport.sasl()
        if target.user:
            sasl.allowed_mechs("PLAIN")
            sasl.allow_insecure_mechs = True  # the URL's choice; amqps:// for TLS
        else:
            sasl.allowed_mechs("ANONYMOUS")
        connection = Connection()
        connection.container = container_id
        if target.vhost:
            connection.hostname = f"vhost:{target.vhost}"
        else:
            connection.hostname = "localhost" if target.unix_path else target.host
        if target.user:
            connection.user = target.user
            connection.password = target.password or ""
        # the member's link table: its owners get their deliveries straight from the pump
        self.pipe = engine.ProtonPipe(transport._impl, connection._impl, handler, links=handler.links)
        self.transport = transport  # the wrappers keep proton's objects alive
        self.connection = connection
        self.failure: str | None = None
        connection.open()

    def receive(self, data: bytes) -> None:
        self.pipe.push(data)

    def process(self) -> None:
        self.pipe.pump.run()

    def take_output(self) -> bytes:
        return self.pipe.output()

    @property
    def finished(self) -> bool:
        return self.pipe.finished

    def tick(self, now: float) -> float | None:
        return self.pipe.tick(now)

    def input_closed(self) -> None:
        self.pipe.close_input()


class UpstreamProtocol(EngineProtocol):
    def __init__(self, member: "PoolMember") -> None:
        super().__init__(member.upstream.run_pending)
        self.member = member
        self.conn = member.conn
        self.heard_at = 0.0  # loop time of the last bytes from the primary (a heartbeat counts)

    def data_received(self, data: bytes) -> None:
        self.heard_at = self.loop.time()  # suspects.py: proof the primary still answers
        super().data_received(data)

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self.flush()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.member.lost(str(exc) if exc else "connection closed")

    def pause_writing(self) -> None:
        self.member.writable = False

    def resume_writing(self) -> None:
        self.member.writable = True
        self.member.resume()
