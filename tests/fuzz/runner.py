"""Drive a live node with fuzz streams from many concurrent sockets.

How this works
--------------
``run(...)`` takes streams from a ``Fuzzer`` until ``cases`` mutated frames
have been sent. Streams go out in batches over ``concurrency`` concurrent
connections (asyncio, real TCP sockets); each connection writes its stream,
half-closes, and reads until the node closes it (every wait bounded: a
connection the node leaves open past ``close_timeout`` counts as ``hung``).
Between batches a canary client (a proton BlockingConnection with a link kept
open all along) sends and receives one message, and the node's resident
memory (``/proc/PID/status`` VmRSS) is sampled.
"""

from __future__ import annotations

import asyncio
import collections
import time
from dataclasses import dataclass, field

from proton import Message
from proton.utils import BlockingConnection

from .frames import Fuzzer


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


@dataclass
class Report:
    seed: int
    cases: int = 0
    connections: int = 0
    by_kind: collections.Counter = field(default_factory=collections.Counter)
    hung: int = 0
    refused_connects: int = 0
    canary_checks: int = 0
    seconds: float = 0.0
    rss_before_kib: int = 0
    rss_after_kib: int = 0
    rss_peak_kib: int = 0

    def summary(self) -> str:
        return (f"seed {self.seed}: {self.cases} cases on {self.connections} connections "
                f"({dict(self.by_kind)}) in {self.seconds:.1f}s; hung {self.hung}; "
                f"canary checks {self.canary_checks}; RSS {self.rss_before_kib} -> "
                f"{self.rss_after_kib} KiB (peak {self.rss_peak_kib})")


class Canary:
    def __init__(self, url: str) -> None:
        self.conn = BlockingConnection(url, timeout=10)
        self.receiver = self.conn.create_receiver("canary", credit=10)
        self.sender = self.conn.create_sender("canary")
        self.sent = 0

    def check(self) -> None:
        self.sent += 1
        marker = f"canary-{self.sent}"
        self.sender.send(Message(id=marker, body=marker))
        got = self.receiver.receive(timeout=10)
        self.receiver.accept()
        assert got.id == marker, f"canary got {got.id!r}, expected {marker!r}"

    def close(self) -> None:
        self.conn.close()


async def _one(host: str, port: int, data: bytes, close_timeout: float, report: Report) -> None:
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 10)
    except (OSError, asyncio.TimeoutError):
        report.refused_connects += 1
        return
    try:
        try:
            writer.write(data)
            await asyncio.wait_for(writer.drain(), close_timeout)
            writer.write_eof()
        except (ConnectionError, asyncio.TimeoutError, OSError):
            pass  # the node closed first: fine
        deadline = time.monotonic() + close_timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                report.hung += 1
                break
            try:
                chunk = await asyncio.wait_for(reader.read(65536), remaining)
            except (ConnectionError, OSError):
                break
            except asyncio.TimeoutError:
                report.hung += 1
                break
            if not chunk:
                break
    finally:
        writer.close()
        try:
            await asyncio.wait_for(writer.wait_closed(), 5)
        except (ConnectionError, OSError, asyncio.TimeoutError):
            pass


async def _batch(host: str, port: int, streams, concurrency: int, close_timeout: float, report: Report) -> None:
    semaphore = asyncio.Semaphore(concurrency)

    async def guarded(data: bytes) -> None:
        async with semaphore:
            await _one(host, port, data, close_timeout, report)

    await asyncio.gather(*(guarded(s.data) for s in streams))


def run(*, host: str, port: int, pid: int, url: str, seed: int, cases: int, concurrency: int = 16,
        batch_cases: int = 500, close_timeout: float = 15.0, check=None, tokens=()) -> Report:
    """Send at least ``cases`` fuzz cases; ``check()`` runs after every batch (node alive, ...).
    ``tokens``: valid JWTs, for streams on the token path too (``fuzz.tokens``)."""
    fuzzer = Fuzzer(seed, tokens=tokens)
    report = Report(seed=seed)
    canary = Canary(url)
    loop = asyncio.new_event_loop()
    start = time.monotonic()
    try:
        canary.check()
        warmed = False
        while report.cases < cases:
            streams = []
            batch = 0
            while batch < batch_cases and report.cases + batch < cases:
                stream = fuzzer.connection()
                streams.append(stream)
                batch += stream.cases
                report.by_kind[stream.kind] += 1
            loop.run_until_complete(_batch(host, port, streams, concurrency, close_timeout, report))
            report.cases += batch
            report.connections += len(streams)
            if check is not None:
                check(report)
            canary.check()
            report.canary_checks += 1
            rss = rss_kib(pid)
            report.rss_peak_kib = max(report.rss_peak_kib, rss)
            if not warmed:  # memory after the first batch: allocator and caches warmed up
                report.rss_before_kib = rss
                warmed = True
        report.rss_after_kib = rss_kib(pid)
    finally:
        report.seconds = time.monotonic() - start
        loop.close()
        canary.close()
    return report
