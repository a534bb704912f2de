#!/usr/bin/env python3
"""Open many idle AMQP 1.0 connections, one link each, from one process.

    python bench/idle_clients.py --host H --port P --address A --count 10000
                                 [--link receiver|sender] [--credit 10] [--batch 200]

Each connection is a proton engine ``Transport`` + ``Connection`` + ``Collector``
driven by one asyncio loop (no reactor, no thread per connection): SASL
ANONYMOUS, open, one session, one link attached to ``--address``
(a receiver granting ``--credit``, or a sender). Connections are opened in
batches of ``--batch`` at a time. Heartbeats: every connection's transport is
ticked every few seconds, so the node's idle timeout never closes them.

Prints JSON lines: ``{"opening": n}`` progress, then ``{"ready": n, "failed": f,
"seconds": s}`` once every link is attached (or failed); then stays connected
until stdin closes or says ``close``, and prints ``{"closed": n}``.
The soft RLIMIT_NOFILE is raised to the hard limit.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import time

from proton import Collector, Connection, Endpoint, Event, Transport


def emit(obj) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


class IdleClient(asyncio.Protocol):
    def __init__(self, index: int, args, done: asyncio.Future) -> None:
        self.args = args
        self.done = done
        self.pn = Transport()
        sasl = self.pn.sasl()
        sasl.allowed_mechs("ANONYMOUS")
        self.conn = Connection()
        self.conn.container = f"idle-{index}"
        self.conn.hostname = args.host
        self.collector = Collector()
        self.conn.collect(self.collector)
        self.pn.bind(self.conn)
        self.conn.open()
        session = self.conn.session()
        session.open()
        if args.link == "receiver":
            self.link = session.receiver(f"idle-r-{index}")
            self.link.source.address = args.address
            self.link.flow(args.credit)
        else:
            self.link = session.sender(f"idle-s-{index}")
            self.link.target.address = args.address
        self.link.open()
        self.sock = None

    # -- asyncio ---------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.sock = transport
        self.flush()

    def data_received(self, data: bytes) -> None:
        while data:
            capacity = self.pn.capacity()
            if capacity <= 0:
                break
            chunk, data = data[:capacity], data[capacity:]
            self.pn.push(chunk)
        self.events()
        self.flush()

    def connection_lost(self, exc) -> None:
        self.sock = None
        self.finish(False)

    # -- proton ------------------------------------------------------------------------
    def events(self) -> None:
        collector = self.collector
        while True:
            event = collector.peek()
            if event is None:
                return
            if event.type == Event.LINK_REMOTE_OPEN:
                remote = self.link.remote_source if self.args.link == "receiver" \
                    else self.link.remote_target
                self.finish(remote.address is not None)
            elif event.type in (Event.LINK_REMOTE_CLOSE, Event.CONNECTION_REMOTE_CLOSE,
                                Event.TRANSPORT_CLOSED):
                self.finish(False)
            collector.pop()

    def finish(self, ok: bool) -> None:
        if not self.done.done():
            self.done.set_result(ok)

    def flush(self) -> None:
        if self.sock is None:
            return
        pending = self.pn.pending()
        if pending > 0:
            self.sock.write(self.pn.peek(pending))
            self.pn.pop(pending)

    def tick(self, now: float) -> None:
        self.pn.tick(now)
        self.flush()

    def close(self) -> None:
        if self.conn.state & Endpoint.LOCAL_ACTIVE:
            self.conn.close()
        self.flush()


async def main(args) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    loop = asyncio.get_running_loop()
    clients: list[IdleClient] = []
    results: list[asyncio.Future] = []
    started = time.monotonic()

    async def open_one(index: int) -> None:
        done = loop.create_future()
        client = IdleClient(index, args, done)
        clients.append(client)
        results.append(done)
        try:
            await loop.create_connection(lambda: client, args.host, args.port)
        except OSError:
            client.finish(False)

    for first in range(0, args.count, args.batch):
        batch = range(first, min(args.count, first + args.batch))
        await asyncio.gather(*(open_one(i) for i in batch))
        await asyncio.wait(results[first:], timeout=args.timeout)
        emit({"opening": len(clients)})

    async def ticker() -> None:
        while True:
            await asyncio.sleep(5)
            now = time.monotonic()
            for client in clients:
                client.tick(now)

    tick_task = loop.create_task(ticker())
    await asyncio.wait(results, timeout=args.timeout)
    ok = sum(1 for r in results if r.done() and r.result())
    emit({"ready": ok, "failed": len(results) - ok, "seconds": round(time.monotonic() - started, 2)})

    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while True:
        line = await reader.readline()
        if not line or line.strip() == b"close":
            break
    tick_task.cancel()
    for client in clients:
        client.close()
    await asyncio.sleep(0.5)
    emit({"closed": len(clients)})


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--address", required=True)
    parser.add_argument("--count", type=int, default=10000)
    parser.add_argument("--link", choices=("receiver", "sender"), default="receiver")
    parser.add_argument("--credit", type=int, default=10)
    parser.add_argument("--batch", type=int, default=200)
    parser.add_argument("--timeout", type=float, default=120.0)
    asyncio.run(main(parser.parse_args()))
