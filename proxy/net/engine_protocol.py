"""asyncio side of an AMQP connection: bytes and timers only.

How this works
--------------
``EngineProtocol`` is an ``asyncio.Protocol`` driving any sans-I/O connection
object with this shape (``ServerConnection`` for clients, ``UpstreamConnection``
for primaries): ``receive(bytes)``, ``process()``, ``take_output() -> bytes``,
``finished``, ``tick(now) -> deadline``, ``input_closed()``.

After each read the protocol calls ``run_pending`` (the broker's cycle: queue
dispatch and output of every connection touched), then writes its own output.
Timers: the connection is ticked after every read and write and at the next
deadline it reports (handshake deadline, proton's idle timeout and heartbeats,
AMQP 1.0 §2.4.5); the protocol keeps one ``call_at`` handle for it. When the
socket's write buffer passes the high-water mark asyncio calls
``pause_writing``: subclasses stop feeding that connection.
"""

from __future__ import annotations

import asyncio
from typing import Callable


class EngineProtocol(asyncio.Protocol):
    # one per socket: slots keep idle connections small
    __slots__ = ("_closed", "_input", "_timer", "_timer_at", "conn", "loop", "run_pending",
                 "transport", "written")
    write_high_water = 256 * 1024

    def __init__(self, run_pending: Callable[[], None]) -> None:
        self.run_pending = run_pending
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.conn = None  # the sans-I/O connection, set by the subclass
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._closed = False
        self._input = False  # bytes arrived since proton's last tick
        self.written = 0  # bytes handed to the transport, in all

    # -- asyncio callbacks -------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        transport.set_write_buffer_limits(high=self.write_high_water)

    def data_received(self, data: bytes) -> None:
        self._input = True
        self.conn.receive(data)
        self.run_pending()
        self.flush()

    def eof_received(self) -> bool:
        self.conn.input_closed()
        self.run_pending()
        self.flush()
        return True  # keep our side open until our close frames are written

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # -- output and timers ---------------------------------------------------
    def flush(self) -> None:
        if self._closed:
            return
        conn = self.conn
        conn.process()
        out = conn.take_output()
        if out or self._input or self._timer is None:
            # proton's idle clocks (the peer's silence, our heartbeats: §2.4.5) start at
            # the tick that sees the bytes move, so tick after every read and write, as
            # proton's own drivers do: ticking only at its deadlines sent no heartbeat
            # before the first deadline and detected a silent peer up to 2x late
            self._input = False
            self._schedule(conn.tick(self.loop.time()))
            out += conn.take_output()  # a heartbeat or close frame the tick wrote
        if out:
            self.written += len(out)
            self.transport.write(out)
        if conn.finished:
            self._closed = True
            self.transport.close()  # flushes what is buffered, then closes
            return

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
        self.run_pending()
        self.flush()
        self._schedule(deadline)

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()
