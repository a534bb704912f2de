#!/usr/bin/env python3
"""Node memory under churn and abuse (issue #21): RSS of a real node process over TCP.

    .venv/bin/python bench/memory.py [--cycles 10000] [--idle 2000] [--queued-mb 50]
                                     [--attack-mb 200] [--flood 5000] [--refused-links 6000]
                                     [--temp-connections 20] [--temp-links 200]
                                     [--sasl-attempts 2000] [--sasl-seconds 20]
                                     [--max-memory-mb 64] [--partial-links 200]
                                     [--partial-kb 1024] [--steps NAME,...] [--skip-dmz]
                                     [--json PATH]

Two node configurations, each a fresh ``fedgate serve`` process:

* **standard**: plain TCP, SASL ANONYMOUS;
* **dmz**: TLS and SASL PLAIN against a users file (``deploy/dmz.toml``'s
  kind), a throwaway certificate made with ``openssl``.

Measured, RSS read from ``/proc/PID/status`` (VmRSS) of the node process:

* **churn**: ``--cycles`` connections, 32 at a time, each opening a session and
  a receiver, waiting for the node's attach, then closing. RSS after a warm-up
  of 1,000 cycles, after all of them, and the difference per 1,000 cycles
  (issue #21's requirement: back within 5 MB of where it started).
* **idle connections** (standard): ``--idle`` connections held open with one
  receiver each: RSS per idle connection.
* **queued KB** (standard): ``--queued-mb`` of 1 KB messages in a queue: RSS
  per queued KB.
* **attacks** (standard), peak RSS over their start: a receiver that grants
  1,000,000 credit and never reads its socket, on a queue holding
  ``--attack-mb`` of 10 KB messages (issue #21 saw 3 GiB buffered); a sender
  that ignores credit and writes 300,000 transfers (the queue had a 100,000
  message limit).
* **handshake flood** (dmz): ``--flood`` sockets to the TLS listener that never
  send a ClientHello (issue #21 saw 4.1 GB): peak RSS over its start.
* **refused links** (standard): one connection attaching ``--refused-links``
  receivers the node refuses (no source address) and never detaching them
  (issue #21 saw 5,850 kept with ``max_links_per_connection`` 1024).
* **temporary queues** (standard): ``--temp-connections`` connections, each
  asking for ``--temp-links`` dynamic receivers (a temporary queue each) and
  holding them (``max_temp_queues_per_connection``, default 64).
* **SASL flood** (dmz): PLAIN with a wrong password from one address,
  ``--sasl-attempts`` at most, 50 at a time, for at most ``--sasl-seconds``
  (issue #21: 200 attempts/s): attempts per second and peak RSS.
* **capped** nodes (``[limits] max_memory = --max-memory-mb``, a fresh one
  per step): **partial transfers**, one connection with ``--partial-links``
  senders each sending ``--partial-kb`` of a message it never finishes
  (buffered up to ``max_message_size`` per link, issue #21); **max_memory
  fill**, a publisher sending twice ``max_memory`` of 10 KB messages as credit
  allows: RSS should stay near the cap (plus the credit given before it was
  reached: ``credit_window`` messages), the node withholding credit.

Each attack step reports RSS before, the peak while it runs (and a few seconds
after), and the difference. ``--steps`` runs only the named steps (churn,
queued, idle, slow_reader, credit_ignored, refused_links, temp_queues,
handshake_flood, sasl_flood, partial_transfers, max_memory_fill); a node whose
steps are all left out is not started.

Clients are proton engine objects driven by this process's asyncio loop (no
reactor; ``bench/memory_client.py``). Progress lines go to stderr as the steps run; the results are one
JSON object on stdout (and in ``--json``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from proton import Endpoint, Message

sys.path.insert(0, str(Path(__file__).resolve().parent))
from charts import save_bars  # noqa: E402
from harness import free_port, machine_info, start_fedgate_node, stop_process  # noqa: E402
from memory_client import (  # noqa: E402
    HOST,
    PLAIN_PASSWORD,
    PLAIN_USER,
    WRONG_PASSWORD,
    Client,
    attach_receiver,
    peak_during,
    peak_result,
    progress,
    read_for,
    remote_closed,
    rss_kb,
)


# -- measurements -------------------------------------------------------------------------
def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def churn(port: int, tls, user, cycles: int, pid: int) -> dict:
    async def one_cycle() -> None:
        client = await Client.open(port, tls, user)
        await attach_receiver(client, "churn", 1)
        await client.close()

    async def run(count: int) -> None:
        todo = iter(range(count))

        async def worker():
            for _ in todo:
                await one_cycle()
        await asyncio.gather(*(worker() for _ in range(32)))

    async def node_quiet(fds: int) -> None:
        # the client's close does not wait for the node's last bytes: a loaded machine can
        # leave the node dozens of TLS connections behind, whose buffers are not a leak.
        # Measure once the node has closed them (its open descriptors are back), bounded.
        deadline = time.monotonic() + 15.0
        while open_fds(pid) > fds and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.0)

    warm = min(1000, cycles // 10)
    fds = open_fds(pid)
    await run(warm)
    await node_quiet(fds)
    start = rss_kb(pid)
    started = time.monotonic()
    done = 0
    marks = []
    while done < cycles:
        step = min(cycles // 5 or cycles, cycles - done)
        await run(step)
        done += step
        marks.append(rss_kb(pid))
        progress(f"churn: {done}/{cycles} cycles, node RSS {marks[-1] / 1024:.1f} MB")
    seconds = time.monotonic() - started
    await node_quiet(fds)
    end = rss_kb(pid)
    return {"cycles": cycles, "warm_up_cycles": warm, "rss_start_mb": round(start / 1024, 1),
            "rss_end_mb": round(end / 1024, 1), "rss_marks_mb": [round(m / 1024, 1) for m in marks],
            "growth_mb": round((end - start) / 1024, 2),
            "bytes_per_cycle": round((end - start) * 1024 / cycles, 1),
            "cycles_per_s": round(cycles / seconds)}


async def idle(port: int, count: int, pid: int) -> dict:
    before = rss_kb(pid)
    clients = []
    for start in range(0, count, 200):
        batch = await asyncio.gather(*(Client.open(port, None, None) for _ in range(min(200, count - start))))
        await asyncio.gather(*(attach_receiver(c, "idle", 1) for c in batch))
        clients += batch
    await asyncio.sleep(1.0)
    after = rss_kb(pid)
    progress(f"idle: {count} connections, node RSS {before / 1024:.1f} -> {after / 1024:.1f} MB")
    await asyncio.gather(*(c.close() for c in clients))
    return {"connections": count, "rss_before_mb": round(before / 1024, 1),
            "rss_after_mb": round(after / 1024, 1),
            "kb_per_connection": round((after - before) / count, 2)}


async def fill(port: int, address: str, count: int, size: int) -> None:
    client = await Client.open(port, None, None)
    link = client.session.sender(f"s-{address}")
    link.target.address = address
    link.open()
    body = b"q" * size
    sent = 0
    while sent < count:
        await client.pump(lambda: link.credit > 0)
        while link.credit > 0 and sent < count:
            delivery = link.delivery(str(sent).encode())
            link.send(Message(id=sent, body=body).encode())
            link.advance()
            delivery.settle()  # pre-settled: the bench needs only the bytes in the queue
            sent += 1
    await client.pump(lambda: link.queued == 0)  # all written
    await client.close()


async def queued(port: int, megabytes: int, pid: int) -> dict:
    count = megabytes * 1024
    before = rss_kb(pid)
    await fill(port, "queued", count, 1000)
    await asyncio.sleep(1.0)
    after = rss_kb(pid)
    progress(f"queued: {count} x 1 KB, node RSS {before / 1024:.1f} -> {after / 1024:.1f} MB")
    return {"messages": count, "message_bytes": 1000, "rss_before_mb": round(before / 1024, 1),
            "rss_after_mb": round(after / 1024, 1),
            "rss_kb_per_queued_kb": round((after - before) / count, 2)}


async def slow_reader(port: int, megabytes: int, pid: int) -> dict:
    count = megabytes * 1024 // 10
    await fill(port, "slow", count, 10_000)
    await asyncio.sleep(1.0)
    client = await Client.open(port, None, None)
    link = client.session.receiver("never-reads")
    link.source.address = "slow"
    link.open()
    await client.pump(lambda: link.state & Endpoint.REMOTE_ACTIVE)  # SASL, open, attach: read
    link.flow(1_000_000)  # then credit for everything, and the client reads no more
    client.flush()
    await client.writer.drain()

    async def stall():  # the attach and the credit are written; nothing is ever read
        await asyncio.sleep(5.0)
    before, peak = await peak_during(pid, 5.0, stall)
    progress(f"slow reader: queue of {megabytes} MB, node RSS {before / 1024:.1f} MB, "
             f"peak {peak / 1024:.1f} MB")
    client.writer.transport.abort()
    return {"queue_mb": megabytes, "rss_before_mb": round(before / 1024, 1),
            "rss_peak_mb": round(peak / 1024, 1), "growth_mb": round((peak - before) / 1024, 1)}


async def credit_ignored(port: int, pid: int) -> dict:
    client = await Client.open(port, None, None)
    link = client.session.sender("flood")
    link.target.address = "flooded"
    link.open()
    await client.pump(lambda: link.state & Endpoint.REMOTE_ACTIVE)
    # proton will not send beyond credit: the frames are built by a second engine whose
    # sender was given plenty of credit by a fake peer... simpler: raw transfer frames
    from proton import Data

    def transfer(delivery_id: int) -> bytes:
        payload = Message(body=b"f" * 100).encode()
        data = Data()
        data.put_described()
        data.enter()
        data.put_ulong(0x14)
        data.put_list()
        data.enter()
        data.put_uint(0)  # handle: our first link
        data.put_uint(delivery_id)
        data.put_binary(str(delivery_id).encode())
        data.put_uint(0)
        data.put_bool(True)  # settled
        data.exit()
        data.exit()
        body = data.encode() + payload
        return (8 + len(body)).to_bytes(4, "big") + b"\x02\x00\x00\x00" + body

    async def flood():
        chunk = b"".join(transfer(i) for i in range(1000))
        for _ in range(300):
            if client.writer.is_closing():
                return
            client.writer.write(chunk)
            try:
                await asyncio.wait_for(client.writer.drain(), 10)
            except (ConnectionError, TimeoutError):
                return

    before, peak = await peak_during(pid, 3.0, flood)
    progress(f"credit ignored: 300,000 transfers, node RSS {before / 1024:.1f} -> peak {peak / 1024:.1f} MB")
    client.writer.transport.abort()
    return {"transfers": 300_000, "rss_before_mb": round(before / 1024, 1),
            "rss_peak_mb": round(peak / 1024, 1), "growth_mb": round((peak - before) / 1024, 1)}


async def handshake_flood(port: int, count: int, pid: int) -> dict:
    """``count`` sockets to the TLS listener that start no handshake (issue #21 saw 4.1 GB)."""
    sockets = []

    async def flood():
        for _ in range(count):
            try:
                sockets.append(await asyncio.open_connection(HOST, port))
            except OSError:
                break
        await asyncio.sleep(3.0)
    before, peak = await peak_during(pid, 3.0, flood)
    for _, writer in sockets:
        writer.transport.abort()
    progress(f"handshake flood: {len(sockets)} sockets, node RSS {before / 1024:.1f} -> peak {peak / 1024:.1f} MB")
    return {"sockets": len(sockets), "rss_before_mb": round(before / 1024, 1),
            "rss_peak_mb": round(peak / 1024, 1), "growth_mb": round((peak - before) / 1024, 1)}


async def refused_links(port: int, count: int, pid: int) -> dict:
    """One connection attaching ``count`` receivers with no source address (each refused) and
    never detaching them: the node closes the connection once it holds max_links of them."""
    client = await Client.open(port, None, None)
    await client.pump(lambda: client.connection.state & Endpoint.REMOTE_ACTIVE)
    links = []

    async def flood():
        for start in range(0, count, 500):
            if remote_closed(client.connection) or client.writer.is_closing():
                break
            for i in range(start, min(count, start + 500)):
                link = client.session.receiver(f"refused-{i}")  # no address: refused
                link.open()
                links.append(link)
            await read_for(client, 0.2)
        await read_for(client, 10.0, lambda: remote_closed(client.connection)
                        or all(remote_closed(link) for link in links))
    before, peak = await peak_during(pid, 3.0, flood)
    refused = sum(1 for link in links if remote_closed(link))
    closed = client.connection.remote_condition
    client.writer.transport.abort()
    return peak_result("refused links", before, peak, attached=len(links), refused=refused,
                 connection_closed_with=closed.name if closed else None)


async def temp_queues(port: int, connections: int, per_connection: int, pid: int) -> dict:
    """``connections`` clients, each asking for ``per_connection`` temporary queues (dynamic
    receivers) and holding what it got while the peak is read."""
    clients = []

    async def one() -> Client:
        client = await Client.open(port, None, None)
        links = []
        for i in range(per_connection):
            link = client.session.receiver(f"tmp-{i}")
            link.source.dynamic = True
            link.open()
            links.append(link)
        client.links = links
        await read_for(client, 30.0, lambda: all(
            link.state & (Endpoint.REMOTE_ACTIVE | Endpoint.REMOTE_CLOSED) for link in links))
        return client

    async def flood():
        for start in range(0, connections, 10):
            clients.extend(await asyncio.gather(*(one() for _ in range(min(10, connections - start)))))
        await asyncio.sleep(2.0)
    before, peak = await peak_during(pid, 3.0, flood)
    made = sum(1 for c in clients for link in c.links
               if not remote_closed(link) and link.remote_source.address)
    refused = sum(1 for c in clients for link in c.links if remote_closed(link))
    await asyncio.gather(*(c.close() for c in clients))
    return peak_result("temporary queues", before, peak, connections=connections,
                 asked=connections * per_connection, made=made, refused=refused)


async def sasl_flood(port: int, tls, attempts: int, seconds: float, pid: int) -> dict:
    """SASL PLAIN with a wrong password from one address, 50 connections at a time, until
    ``attempts`` are done or ``seconds`` have passed (issue #21: 200 attempts/s, unthrottled)."""
    counts = {"refused": 0, "accepted": 0, "closed_or_timed_out": 0}
    todo = iter(range(attempts))
    started = time.monotonic()

    async def one() -> None:
        try:
            client = await Client.open(port, tls, PLAIN_USER, WRONG_PASSWORD)
        except OSError:  # refused at accept, or the TLS handshake failed
            counts["closed_or_timed_out"] += 1
            return
        sasl = client.transport.sasl()
        try:  # the node closes after the outcome: a write may fail once it is read
            await client.pump(lambda: sasl.outcome is not None, timeout=15.0)
        except (ConnectionError, TimeoutError, OSError):
            pass
        finally:
            client.writer.transport.abort()
        outcome = sasl.outcome
        counts["closed_or_timed_out" if outcome is None else
               "accepted" if outcome == 0 else "refused"] += 1

    async def worker():
        for _ in todo:
            if time.monotonic() - started > seconds:
                return
            await one()

    async def flood():
        await asyncio.gather(*(worker() for _ in range(50)))
    before, peak = await peak_during(pid, 1.0, flood)
    elapsed = time.monotonic() - started
    done = sum(counts.values())
    return peak_result("SASL flood", before, peak, attempts=done, seconds=round(elapsed, 1),
                 attempts_per_s=round(done / elapsed, 1), **counts)


async def partial_transfers(port: int, links_count: int, kb: int, cap_mb: int, pid: int) -> dict:
    """One connection, ``links_count`` senders, each sending ``kb`` KB of a message it never
    finishes (transfers with more=true); against a node with ``max_memory`` they count there."""
    client = await Client.open(port, None, None)
    senders = []
    for i in range(links_count):
        link = client.session.sender(f"partial-{i}")
        link.target.address = f"partial-{i}"
        link.open()
        senders.append(link)
    await client.pump(lambda: all(link.credit > 0 for link in senders))
    size = kb * 1024
    head = Message(body=b"p" * (2 * size)).encode()[:size]  # the message is twice as long

    async def flood():
        for link in senders:
            if remote_closed(link) or client.writer.is_closing():
                continue
            link.delivery(b"0")
            link.send(head)  # never advanced: the node keeps waiting for the rest
            client.flush()
            try:
                await client.writer.drain()
            except ConnectionError:
                break
        await read_for(client, 5.0)
    before, peak = await peak_during(pid, 3.0, flood)
    refused = sum(1 for link in senders if remote_closed(link))
    client.writer.transport.abort()
    return peak_result("partial transfers", before, peak, links=links_count, kb_each=kb,
                 attempted_mb=round(links_count * size / 2**20, 1), refused_links=refused,
                 max_memory_mb=cap_mb)


async def max_memory_fill(port: int, cap_mb: int, pid: int) -> dict:
    """A publisher sending twice ``max_memory`` of 10 KB messages (pre-settled) as credit
    allows; it stops when the node has given no credit for 3 s."""
    client = await Client.open(port, None, None)
    link = client.session.sender("capped")
    link.target.address = "capped"
    link.open()
    body = b"m" * 10_000
    target = 2 * cap_mb * 2**20 // len(body)
    sent = 0

    async def flood():
        nonlocal sent
        while sent < target:
            try:
                await client.pump(lambda: link.credit > 0, timeout=3.0)
            except TimeoutError:
                return  # no credit: the node is above max_memory
            while link.credit > 0 and sent < target:
                delivery = link.delivery(str(sent).encode())
                link.send(Message(id=sent, body=body).encode())
                link.advance()
                delivery.settle()
                sent += 1
    before, peak = await peak_during(pid, 3.0, flood)
    await client.close()
    return peak_result("max_memory fill", before, peak, max_memory_mb=cap_mb,
                 offered_mb=round(target * len(body) / 2**20, 1),
                 sent_mb=round(sent * len(body) / 2**20, 1), withheld=sent < target)


# -- nodes ----------------------------------------------------------------------------------
def dmz_files(workdir: Path) -> list[str]:
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
                    "-keyout", str(workdir / "key.pem"), "-out", str(workdir / "cert.pem")],
                   check=True, capture_output=True, timeout=60)
    users = workdir / "users.json"
    subprocess.run([sys.executable, "-m", "proxy", "users", "add", PLAIN_USER, "--file", str(users),
                    "--password-stdin"], input=PLAIN_PASSWORD.encode() + b"\n", check=True,
                   capture_output=True, cwd=str(Path(__file__).resolve().parent.parent), timeout=60)
    config = workdir / "dmz.toml"
    config.write_text(
        f'[tls]\ncert = "{workdir / "cert.pem"}"\nkey = "{workdir / "key.pem"}"\n'
        f'[sasl]\nmechanisms = ["PLAIN"]\nusers_file = "{users}"\nrequire = true\n')
    return ["--config", str(config)]


def client_tls(workdir: Path) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(workdir / "cert.pem"))
    return context


STEPS = {
    "standard": ("churn", "queued", "idle", "slow_reader", "credit_ignored", "refused_links",
                 "temp_queues"),
    "dmz": ("churn", "handshake_flood", "sasl_flood"),
    # a fresh node each: RSS freed by one step stays with the process and would hide the next
    "capped_partial": ("partial_transfers",),
    "capped_fill": ("max_memory_fill",),
}


def step_runs(args, port: int, pid: int, tls, user) -> dict:
    """Each step: a function making its coroutine."""
    return {
        "churn": lambda: churn(port, tls, user, args.cycles, pid),
        "queued": lambda: queued(port, args.queued_mb, pid),  # before memory is freed
        "idle": lambda: idle(port, args.idle, pid),
        "slow_reader": lambda: slow_reader(port, args.attack_mb, pid),
        "credit_ignored": lambda: credit_ignored(port, pid),
        "refused_links": lambda: refused_links(port, args.refused_links, pid),
        "temp_queues": lambda: temp_queues(port, args.temp_connections, args.temp_links, pid),
        "handshake_flood": lambda: handshake_flood(port, args.flood, pid),
        "sasl_flood": lambda: sasl_flood(port, tls, args.sasl_attempts, args.sasl_seconds, pid),
        "partial_transfers": lambda: partial_transfers(port, args.partial_links, args.partial_kb,
                                                       args.max_memory_mb, pid),
        "max_memory_fill": lambda: max_memory_fill(port, args.max_memory_mb, pid),
    }


def capped_files(workdir: Path, megabytes: int) -> list[str]:
    config = workdir / "capped.toml"
    config.write_text(f"[limits]\nmax_memory = {megabytes * 2**20}\n")
    return ["--config", str(config)]


async def measure(args, workdir: Path) -> dict:
    results = {"machine": machine_info(), "args": vars(args)}
    wanted = set(args.steps.split(",")) if args.steps else None
    known = {step for steps in STEPS.values() for step in steps}
    if wanted and wanted - known:
        raise SystemExit(f"unknown steps {sorted(wanted - known)}; known: {sorted(known)}")
    for kind, steps in STEPS.items():
        steps = [step for step in steps if wanted is None or step in wanted]
        if not steps or (kind == "dmz" and args.skip_dmz):
            continue
        port = free_port()
        extra = dmz_files(workdir) if kind == "dmz" else \
            capped_files(workdir, args.max_memory_mb) if kind.startswith("capped") else []
        node = start_fedgate_node(port, workdir / f"data-{kind}", extra_args=extra,
                                  log_path=workdir / f"{kind}.log")
        try:
            pid = node.pid
            progress(f"{kind}: node {pid} on {port}, RSS {rss_kb(pid) / 1024:.1f} MB")
            tls = client_tls(workdir) if kind == "dmz" else None
            user = PLAIN_USER if kind == "dmz" else None
            runs = step_runs(args, port, pid, tls, user)
            section = {}
            for step in steps:
                section[step] = await runs[step]()
            results[kind] = section
        finally:
            stop_process(node)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=10_000)
    parser.add_argument("--idle", type=int, default=2000)
    parser.add_argument("--queued-mb", type=int, default=50)
    parser.add_argument("--attack-mb", type=int, default=200)
    parser.add_argument("--flood", type=int, default=5000, help="sockets of the TLS handshake flood")
    parser.add_argument("--refused-links", type=int, default=6000,
                        help="refused links attached on one connection")
    parser.add_argument("--temp-connections", type=int, default=20)
    parser.add_argument("--temp-links", type=int, default=200,
                        help="dynamic receivers asked for per connection")
    parser.add_argument("--sasl-attempts", type=int, default=2000,
                        help="SASL PLAIN attempts with a wrong password, at most")
    parser.add_argument("--sasl-seconds", type=float, default=20.0,
                        help="the SASL flood stops starting attempts after this")
    parser.add_argument("--max-memory-mb", type=int, default=64,
                        help="[limits] max_memory of the capped node")
    parser.add_argument("--partial-links", type=int, default=200)
    parser.add_argument("--partial-kb", type=int, default=1024,
                        help="KB of an unfinished message sent on each partial-transfer link")
    parser.add_argument("--steps", help="comma-separated steps to run (default: all)")
    parser.add_argument("--skip-dmz", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fedgate-memory-") as tmp:
        results = asyncio.run(measure(args, Path(tmp)))
    text = json.dumps(results, indent=2, default=str)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
        steps = [(kind, step, figures) for kind in STEPS if kind in results
                 for step, figures in results[kind].items()]
        chart = save_bars(args.json.with_suffix(".png"), "node RSS per step (MB)",
                          [f"{kind} {step}" for kind, step, _ in steps],
                          {"before": [f.get("rss_start_mb", f.get("rss_before_mb")) for _, _, f in steps],
                           "after / peak": [f.get("rss_end_mb", f.get("rss_peak_mb", f.get("rss_after_mb")))
                                            for _, _, f in steps]},
                          "RSS (MB)")
        if chart:
            progress(f"chart written to {chart}")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
