#!/usr/bin/env python3
"""The proxy hop's own cost, in one process: gateway -> fedgate primary on an in-memory network.

    .venv/bin/python bench/proxy_hop.py [--messages 50000] [--pairs 1] [--rounds 3] [--profile]
                                        [--output bench/results/proxy_hop.json | -]

No sockets and no other process: a gateway node (rule ``rq.* -> primary``) and a
primary node, built by ``proxy.node.build_node`` on ``proxy.net.memory``, and
lean proton clients (a sender that sends while it has credit, a receiver that
accepts each message and tops its credit up at half its window). The network
times each host's handling of its input (``MemoryNetwork.busy``), so the
figures are the Python and proton work of each node per message, without the
system calls and without a machine's noise: what an optimisation of the hop
changes shows here first, then in ``bench/proxy.py`` against real brokers.

Runs, side by side, per round:
- ``direct``: the clients on the primary;
- ``proxy``: the clients on the gateway (both hops of every message cross it).
Modes: ``concurrent`` (sender and receiver at once) and ``phased`` (all sent,
then all received). Printed: gateway µs per message per hop (a message sent
and received through the proxy crosses it twice: in and out), the primary's
µs per message through the proxy against direct, medians over the rounds.
``--profile`` prints cProfile's top functions of the gateway alone in one proxy run.
A line per run as it ends; the results go to ``--output`` (JSON, every run and the
medians) with a PNG bar chart next to it (``bench/charts.py``), as the other scripts do.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import datetime as _dt
import io
import json
import pstats
import statistics
import sys
import tempfile
from pathlib import Path

# the checkout first (bench/proxy.py would hide the proxy package), then bench/ (charts, harness)
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(1, str(Path(__file__).resolve().parent))

from charts import save_bars  # noqa: E402
from harness import REPO_ROOT, machine_info, rel  # noqa: E402
from proton import Collector, Connection, Delivery, Event, Message, Transport  # noqa: E402

from proxy.config import settings as config_mod  # noqa: E402
from proxy.net.memory import MemoryNetwork  # noqa: E402
from proxy.node import build_node  # noqa: E402

WINDOW = 100


class BenchClient(asyncio.Protocol):
    """A sender or receiver of ``count`` messages on one link, proton engine only."""

    def __init__(self, name: str, role: str, address: str, count: int, payload: bytes,
                 done: asyncio.Future) -> None:
        self.role, self.count, self.payload, self.done = role, count, payload, done
        self.connection = Connection()
        self.connection.container = name
        self.engine = Transport()
        self.engine.bind(self.connection)
        self.collector = Collector()
        self.connection.collect(self.collector)
        self.connection.open()
        session = self.connection.session()
        session.open()
        if role == "send":
            self.link = session.sender(f"{name}-s")
            self.link.target.address = address
        else:
            self.link = session.receiver(f"{name}-r")
            self.link.source.address = address
        self.link.open()
        self.sent = self.settled = self.received = 0
        self.io = None

    def start_receiving(self) -> None:
        self.link.flow(WINDOW)
        self.flush()

    def connection_made(self, transport) -> None:
        self.io = transport
        self.flush()

    def data_received(self, data: bytes) -> None:
        view = memoryview(data)
        while view:  # proton takes at most its capacity at a time
            room = self.engine.capacity()
            self.engine.push(bytes(view[:room]))
            view = view[room:]
            self._events()
        self._send()
        self.flush()

    def _events(self) -> None:
        link = self.link
        while (event := self.collector.peek()) is not None:
            if event.type == Event.DELIVERY:
                delivery = event.delivery
                if self.role == "receive" and delivery.readable and not delivery.partial:
                    link.recv(delivery.pending)
                    link.advance()
                    delivery.update(Delivery.ACCEPTED)
                    delivery.settle()
                    self.received += 1
                    if link.credit < WINDOW // 2 and self.received < self.count:
                        link.flow(WINDOW - link.credit)
                    if self.received == self.count and not self.done.done():
                        self.done.set_result(None)
                elif self.role == "send" and delivery.remote_state:
                    delivery.settle()
                    self.settled += 1
                    if self.settled == self.count and not self.done.done():
                        self.done.set_result(None)
            self.collector.pop()

    def _send(self) -> None:
        link = self.link
        if self.role == "send":
            while link.credit > 0 and self.sent < self.count:
                link.delivery(str(self.sent).encode())
                link.send(self.payload)
                link.advance()
                self.sent += 1

    def flush(self) -> None:
        pending = self.engine.pending()
        if pending > 0 and self.io is not None:
            out = self.engine.peek(pending)
            self.engine.pop(pending)
            self.io.write(out)

    def eof_received(self):
        return False

    def connection_lost(self, exc) -> None:
        pass


class ProfiledNetwork(MemoryNetwork):
    """cProfile on while one host handles its input, off otherwise (clients and primary)."""

    def __init__(self, host: str, profile: cProfile.Profile) -> None:
        super().__init__()
        self.profiled, self.profile = host, profile
        self.on = False

    def _deliver(self, receiver, pipe, source, target, data) -> None:
        if self.on and target == self.profiled:
            self.profile.enable()
            try:
                super()._deliver(receiver, pipe, source, target, data)
            finally:
                self.profile.disable()
        else:
            super()._deliver(receiver, pipe, source, target, data)


async def one_run(target: str, mode: str, messages: int, pairs: int, tag: str,
                  profile: cProfile.Profile | None = None) -> dict:
    network = ProfiledNetwork("gw", profile) if profile is not None else MemoryNetwork()
    tmp = Path(tempfile.mkdtemp(prefix="fedgate-hop-"))

    def config(name, **extra):
        return config_mod.from_dict({"node": {"id": name, "listen": f"{name}:5672",
                                              "data_dir": str(tmp / name)},
                                     "admin": {"enabled": False}, **extra})

    primary = build_node(config("primary"), network=network.host("primary"), services=())
    gateway = build_node(config("gw", rules=[{"name": "px", "match": "rq.*", "kind": "proxy",
                                              "primary": "amqp://primary:5672"}]),
                         network=network.host("gw"), services=())
    await primary.start()
    await gateway.start()
    host = "gw" if target == "proxy" else "primary"
    loop = asyncio.get_running_loop()
    payload = Message(body="x" * 100).encode()
    per_pair = messages // pairs
    senders, receivers = [], []
    for i in range(pairs):
        address = f"rq.{tag}-{i}"
        for role, group in (("send", senders), ("receive", receivers)):
            done = loop.create_future()
            name = f"{role}{i}"
            _, client = await network.host(name).connect(
                lambda: BenchClient(name, role, address, per_pair, payload, done), host, 5672)
            group.append(client)
    await asyncio.sleep(0.2)  # attached, upstream links too
    network.busy.clear()
    if profile is not None:
        network.on = True
    started = loop.time()
    if mode == "concurrent":
        for receiver in receivers:
            receiver.start_receiving()
        await asyncio.wait_for(asyncio.gather(*(c.done for c in senders + receivers)), 120)
    else:
        await asyncio.wait_for(asyncio.gather(*(c.done for c in senders)), 120)
        for receiver in receivers:
            receiver.start_receiving()
        await asyncio.wait_for(asyncio.gather(*(c.done for c in receivers)), 120)
    elapsed = loop.time() - started
    if profile is not None:
        network.on = False
    busy = dict(network.busy)
    total = per_pair * pairs
    await gateway.stop()
    await primary.stop()
    return {"target": target, "mode": mode, "messages": total, "elapsed_s": elapsed,
            "gateway_us_per_msg": busy.get("gw", 0.0) * 1e6 / total,
            "primary_us_per_msg": busy.get("primary", 0.0) * 1e6 / total}


def write_results(out: Path, result: dict) -> None:
    """The JSON results and, beside them, µs per message by mode: gateway per hop, primary
    through the proxy and direct (medians over the rounds)."""
    if not out.is_absolute():
        out = REPO_ROOT / out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    modes = list(result["summary"])
    chart = save_bars(out.with_suffix(".png"), "proxy hop (in memory): µs per message, medians",
                      modes, {
                          "gateway per hop": [result["summary"][m]["gateway_us_per_msg_per_hop"] for m in modes],
                          "primary through the proxy": [result["summary"][m]["primary_us_per_msg_through_proxy"]
                                                        for m in modes],
                          "primary direct": [result["summary"][m]["primary_us_per_msg_direct"] for m in modes],
                      }, "µs / message")
    print(f"wrote {rel(out)}" + (f" and {rel(chart)}" if chart else ""), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--pairs", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--modes", default="concurrent,phased")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--output", default=str(Path("bench") / "results" / "proxy_hop.json"),
                        help="JSON results (a PNG chart beside it); - for none")
    args = parser.parse_args()
    started_at = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    runs, summary = [], {}
    for mode in args.modes.split(","):
        rows = {"direct": [], "proxy": []}
        for r in range(args.rounds):
            for target in ("direct", "proxy") if r % 2 == 0 else ("proxy", "direct"):
                run = asyncio.run(one_run(target, mode, args.messages, args.pairs, f"{mode}{r}"))
                run["round"] = r + 1
                rows[target].append(run)
                runs.append(run)
                print(f"  {mode} round {r + 1}/{args.rounds} {target:6}: {run['messages']:,} messages "
                      f"in {run['elapsed_s']:.2f}s, gateway {run['gateway_us_per_msg']:.1f} µs/msg, "
                      f"primary {run['primary_us_per_msg']:.1f} µs/msg", flush=True)
        direct_primary = statistics.median(x["primary_us_per_msg"] for x in rows["direct"])
        proxy_primary = statistics.median(x["primary_us_per_msg"] for x in rows["proxy"])
        gateway = statistics.median(x["gateway_us_per_msg"] for x in rows["proxy"])
        summary[mode] = {"gateway_us_per_msg_per_hop": round(gateway / 2, 2),
                         "gateway_us_per_msg_both_hops": round(gateway, 2),
                         "primary_us_per_msg_through_proxy": round(proxy_primary, 2),
                         "primary_us_per_msg_direct": round(direct_primary, 2),
                         "primary_ratio": round(proxy_primary / direct_primary, 3) if direct_primary else None}
        print(f"{mode:10} pairs {args.pairs}  gateway {gateway / 2:5.1f} µs/msg per hop "
              f"({gateway:5.1f} both)  primary through the proxy {proxy_primary:5.1f} µs/msg, "
              f"direct {direct_primary:5.1f} ({proxy_primary / direct_primary:.2f}x)  "
              f"rounds: {', '.join(format(x['gateway_us_per_msg'], '.1f') for x in rows['proxy'])}",
              flush=True)
    if args.output != "-":
        write_results(Path(args.output), {
            "benchmark": "proxy_hop",
            "date_utc": started_at,
            "params": {"messages": args.messages, "pairs": args.pairs, "rounds": args.rounds,
                       "modes": args.modes.split(","), "window": WINDOW, "body_bytes": 100,
                       "network": "in-memory (proxy.net.memory), time per host's input handling"},
            "machine": machine_info(),
            "summary": summary,
            "runs": runs,
        })
    if args.profile:
        profile = cProfile.Profile()
        asyncio.run(one_run("proxy", "concurrent", args.messages, args.pairs, "profile", profile))
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(25)
        print(out.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
