"""A ``min_in_sync = 2`` primary cut off from its peers (not etcd) with its producers on it
(issue #42, docs/nemesis.md finding 30; docs/replication.md, 5), on a virtual clock.

Such a primary accepts nothing (its in-sync backups do not answer) and steps down after a
lease; a backup claims the queue. Its own clients' links used to wait for the new primary and
be routed to it through a link to that silent peer: nothing moved until their connection was
closed, 1.5 s after the step-down when another queue of the node had stood aside meanwhile
(the nemesis: 5.14 s without an acceptance for a 6 s cut, allowed 5), two leases after it
when none had (here: 9.55 s). When no other peer was heard either, the node knows it is the
one cut off: it stands aside, as a ``min_in_sync = 1`` primary does (5b), and its clients go
to their failover lists at once.
"""

from __future__ import annotations

import asyncio

import pytest

from playbook import World, run
from test_failover_links import Numbered
from test_replication_playbooks import (CREDIT, TTL, Consumer, etcd_cluster, make_primary,
                                        placement, view)

pytestmark = pytest.mark.timeout(60)
ADDRESS = "orders.x"
RULE = {"name": "orders", "match": "orders.*", "kind": "replicated", "replicas": 3,
        "catchup_timeout": 10.0, "min_in_sync": 2}
TICK = 0.025  # a producer sends one message a tick (40 a second, as the nemesis' clients)


class FailingOver:
    """A producer with a failover list, as the nemesis' clients: on its node until its
    connection is reset, then on the next node of its list, sending on from there."""

    def __init__(self, world: World, nodes: list, name: str, base: int) -> None:
        self.world, self.nodes, self.name, self.base = world, nodes, name, base
        self.at = 0
        self.pumps: list[Numbered] = []
        self.accepted_at: list[float] = []  # loop time of each look that saw a new acceptance
        self.moved_at: list[float] = []
        self.client, self.seen, self.due = None, 0, 0

    async def connect(self) -> None:
        node = self.nodes[self.at % len(self.nodes)]
        self.client = await self.world.client(node, f"{self.name}-{self.at}")
        self.pumps.append(Numbered(self.client.sender(ADDRESS),
                                   base=self.base + 100_000 * len(self.pumps)))
        self.seen, self.due = 0, 0

    async def tick(self, now: float) -> None:
        if self.client.lost:
            self.moved_at.append(now)
            self.at += 1
            await self.connect()
        self.due += 1
        pump = self.pumps[-1]
        pump.upto(self.due)
        accepted = pump.sender.accepted()
        if accepted > self.seen:
            self.accepted_at.append(now)
            self.seen = accepted

    def accepted_ids(self) -> set:
        return set().union(*(pump.accepted_ids() for pump in self.pumps))


async def produce(producers: list, readers: list, until: float) -> None:
    loop = asyncio.get_running_loop()
    while loop.time() < until:
        for producer in producers:
            await producer.tick(loop.time())
        for reader in readers:
            reader.step()
        await asyncio.sleep(TICK)


def test_a_primary_cut_off_with_its_producers_stands_aside_and_they_fail_over_at_once(tmp_path):
    """Every producer of the queue on its primary, the primary cut off from both backups (both
    alive, on etcd): the producers' connections are reset once it steps down, they go on at
    the next node of their lists, and the queue accepts again within lease_ttl + 2 s of the
    cut (before: 9.55 s); the primary stood aside; nothing accepted is lost."""
    async def play():
        world = World(tmp_path)
        etcd, nodes = await etcd_cluster(world, rule=RULE)
        primary = await make_primary(world, nodes, ADDRESS)
        others = [n for n in placement(nodes, ADDRESS) if n != primary]
        producers = [FailingOver(world, [primary, *others[i:], *others[:i]], f"producer{i}",
                                 1_000_000 * i) for i in range(2)]
        for producer in producers:
            await producer.connect()
        reader = Consumer((await world.client(others[0], "reader")).receiver(ADDRESS, credit=CREDIT))
        loop = asyncio.get_running_loop()
        await produce(producers, [reader], loop.time() + 2.0)
        assert all(p.accepted_at for p in producers)

        cut = loop.time()
        for node in others:
            world.network.partition(primary, node)
        await produce(producers, [reader], cut + 6.0)
        firsts = [t for p in producers for t in p.accepted_at if t > cut + 4 * TICK]
        assert firsts, "nothing accepted during the cut"
        assert min(firsts) - cut <= TTL + 2, min(firsts) - cut
        assert view(nodes[primary], ADDRESS)["stood_aside"] == 1
        assert all(p.moved_at and p.moved_at[0] - cut <= TTL + 1 for p in producers), \
            [p.moved_at for p in producers]

        for node in others:
            world.network.heal(primary, node)
        await produce(producers, [reader], loop.time() + 2.0)
        accepted = set().union(*(p.accepted_ids() for p in producers))

        def received() -> set:
            reader.step()
            return set(reader.ids())
        await world.until(lambda: received() >= accepted, timeout=10, what="every accepted id")
        await world.close()

    run(play)
