#!/usr/bin/env python3
"""A replicated queue's cost on its primary, in one process: two nodes on the memory network.

    .venv/bin/python bench/replication_hop.py [--messages 30000] [--rounds 2] [--profile]

No sockets and no etcd process: nodes ``a`` and ``b`` built by ``proxy.node.build_node``
on ``proxy.net.memory``, their coordinator ``EtcdCoordinator`` on the in-memory etcd of
the tests (``tests/support/memory_etcd.py``); the rule ``r2.*`` is replicated with 2
copies, primary ``a``. A lean proton receiver (accepts each message, tops its credit up
at half its window) and then a sender of ``--messages`` on ``a``, against a local queue
``lq.*`` on the same node, alternating. Printed: CPU µs per message of each host's input
handling (``MemoryNetwork.busy``: ``a`` the primary, ``b`` the backup, ``sc``/``rc`` the
clients). ``--profile`` prints cProfile's top functions of the primary alone in one
replicated run (``--sort cumtime`` for cumulative). What ``bench/replication.py`` measures
with real processes shows here first, without a machine's noise (bench/README.md).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import pstats
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(ROOT / "bench"))
sys.path.insert(2, str(ROOT / "tests" / "support"))

from memory_etcd import MemoryEtcd  # noqa: E402
from proton import Message  # noqa: E402
from proxy_hop import BenchClient, ProfiledNetwork  # noqa: E402

from proxy.cluster.etcd import EtcdCoordinator  # noqa: E402
from proxy.config import settings as config_mod  # noqa: E402
from proxy.net.memory import MemoryNetwork  # noqa: E402
from proxy.node import build_node  # noqa: E402

RULE = {"name": "r2", "match": "r2.*", "kind": "replicated", "replicas": 2, "nodes": ["a", "b"]}


async def one_run(address: str, messages: int, profile: cProfile.Profile | None = None) -> dict:
    network = ProfiledNetwork("a", profile) if profile is not None else MemoryNetwork()
    tmp = Path(tempfile.mkdtemp(prefix="fedgate-replication-hop-"))
    etcd = MemoryEtcd()
    nodes = []
    for name in "ab":
        store = etcd.client(name)
        coordinator = EtcdCoordinator(
            name="hop", node_id=name, amqp=f"amqp://{name}:5672", admin=None, workers=1,
            version="bench", store=store, endpoints=[store.endpoint], lease_ttl=3.0, wall=time.time)
        config = config_mod.from_dict({
            "node": {"id": name, "listen": f"{name}:5672", "data_dir": str(tmp / name)},
            "admin": {"enabled": False}, "rules": [RULE],
            "cluster": {"etcd": ["http://memory:2379"], "lease_ttl": 3.0}})
        node = build_node(config, network=network.host(name), services=("fragments", "replication"),
                          coordinator=coordinator)
        await node.start()
        nodes.append(node)
    loop = asyncio.get_running_loop()
    payload = Message(body="x" * 100).encode()
    sent, received = loop.create_future(), loop.create_future()
    _, receiver = await network.host("rc").connect(
        lambda: BenchClient("rc", "receive", address, messages, payload, received), "a", 5672)
    await asyncio.sleep(1.0)  # the primary claimed, the backup attached and caught up
    receiver.start_receiving()
    await asyncio.sleep(0.3)
    network.busy.clear()
    if profile is not None:
        network.on = True
    await network.host("sc").connect(
        lambda: BenchClient("sc", "send", address, messages, payload, sent), "a", 5672)
    await asyncio.wait_for(asyncio.gather(sent, received), 120)
    if profile is not None:
        network.on = False
    busy = {host: round(seconds * 1e6 / messages, 2) for host, seconds in sorted(network.busy.items())}
    for node in nodes:
        await node.stop()
    return busy


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=30_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--sort", default="tottime")
    args = parser.parse_args()
    for r in range(args.rounds):
        for prefix in ("lq", "r2") if r % 2 == 0 else ("r2", "lq"):
            busy = asyncio.run(one_run(f"{prefix}.hop{r}", args.messages))
            print(f"round {r + 1} {'local queue' if prefix == 'lq' else '2 copies':12} µs/msg per host: "
                  + "  ".join(f"{host} {us:.1f}" for host, us in busy.items()), flush=True)
    if args.profile:
        profile = cProfile.Profile()
        asyncio.run(one_run("r2.profile", args.messages, profile))
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats(args.sort).print_stats(r"proxy/|fastpath", 40)
        print(out.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
