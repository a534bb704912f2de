"""The memory bench's client side (``bench/memory.py``): a proton client connection on an
asyncio stream, and how RSS is read and reported.

How this works: ``Client`` drives proton's engine objects (Transport, Connection,
Collector; no reactor) over an asyncio stream, with SASL ANONYMOUS or PLAIN, one
session, and ``pump`` to move bytes until a condition holds or the time is up. The
steps in ``bench/memory.py`` open many of them at once in the bench's own event loop.
"""

from __future__ import annotations

import asyncio
import ssl
import sys
import time
from pathlib import Path

from proton import Collector, Connection, Endpoint, Transport

HOST = "127.0.0.1"


PLAIN_USER, PLAIN_PASSWORD = "bench", "bench password 1"


WRONG_PASSWORD = "not the password"


def progress(text: str) -> None:
    print(f"[memory] {text}", file=sys.stderr, flush=True)


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


# -- one proton client over asyncio streams -------------------------------------------
class Client:
    """A proton client connection on an asyncio stream: SASL, open, one session."""

    def __init__(self, reader, writer, user: str | None, password: str = PLAIN_PASSWORD) -> None:
        self.reader, self.writer = reader, writer
        self.transport = Transport()
        sasl = self.transport.sasl()
        sasl.allowed_mechs("PLAIN" if user else "ANONYMOUS")
        sasl.allow_insecure_mechs = True  # TLS is Python's here, under proton
        self.connection = Connection()
        self.connection.container = "bench-memory"
        self.connection.hostname = "localhost"
        if user:
            self.connection.user, self.connection.password = user, password
        self.collector = Collector()
        self.connection.collect(self.collector)
        self.transport.bind(self.connection)
        self.connection.open()
        self.session = self.connection.session()
        self.session.open()

    @classmethod
    async def open(cls, port: int, tls: ssl.SSLContext | None, user: str | None,
                   password: str = PLAIN_PASSWORD) -> "Client":
        reader, writer = await asyncio.open_connection(HOST, port, ssl=tls,
                                                       server_hostname="localhost" if tls else None)
        return cls(reader, writer, user, password)

    def flush(self) -> None:
        while (pending := self.transport.pending()) > 0:  # proton hands out a buffer at a time
            self.writer.write(self.transport.peek(pending))
            self.transport.pop(pending)

    async def pump(self, done, timeout: float = 30.0, read: bool = True) -> None:
        """Write and read until ``done()`` (bounded by ``timeout``)."""
        deadline = time.monotonic() + timeout
        while True:
            while self.collector.peek() is not None:
                self.collector.pop()
            self.flush()
            await self.writer.drain()
            if done():
                return
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("bench client: no answer in time")
            data = await asyncio.wait_for(self.reader.read(65536), left)
            if not data:
                self.transport.close_tail()
                if not done():
                    raise ConnectionError("bench client: the node closed the connection")
                return
            view = memoryview(data)
            while view:
                room = self.transport.capacity()
                if room < 0:
                    break
                self.transport.push(view[:room].tobytes())
                view = view[room:]

    async def close(self) -> None:
        self.connection.close()
        try:
            await self.pump(lambda: self.connection.state & Endpoint.REMOTE_CLOSED, timeout=10)
        except (ConnectionError, TimeoutError):
            pass
        self.writer.close()


async def attach_receiver(client: Client, address: str, credit: int):
    link = client.session.receiver(f"r-{address}")
    link.source.address = address
    link.open()
    link.flow(credit)
    await client.pump(lambda: link.state & Endpoint.REMOTE_ACTIVE)
    return link


async def peak_during(pid: int, seconds: float, action) -> tuple[int, int]:
    """RSS before and the peak while ``action`` runs and ``seconds`` after."""
    before = rss_kb(pid)
    peak = before
    task = asyncio.ensure_future(action())
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline or not task.done():
        peak = max(peak, rss_kb(pid))
        await asyncio.sleep(0.1)
        if time.monotonic() > deadline + 60:
            task.cancel()
            break
    peak = max(peak, rss_kb(pid))
    if task.done() and not task.cancelled() and task.exception():
        raise task.exception()
    return before, peak


def peak_result(name: str, before: int, peak: int, **figures) -> dict:
    progress(f"{name}: node RSS {before / 1024:.1f} -> peak {peak / 1024:.1f} MB {figures}")
    return {**figures, "rss_before_mb": round(before / 1024, 1), "rss_peak_mb": round(peak / 1024, 1),
            "growth_mb": round((peak - before) / 1024, 1)}


def remote_closed(endpoint) -> bool:
    return bool(endpoint.state & Endpoint.REMOTE_CLOSED)


async def read_for(client: Client, seconds: float, done=lambda: False) -> None:
    """Answer the node for ``seconds`` (or until ``done()``); its closing is no error here."""
    try:
        await client.pump(done, timeout=seconds)
    except (ConnectionError, TimeoutError, OSError):
        pass
