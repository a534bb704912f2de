"""A producer forwarded to another member's fragment while its own node's fragment was served
elsewhere comes home when the fragment is handed back (issue #42, docs/nemesis.md finding
22), on a virtual clock.

A member that comes back after a failure catches up as a backup of its own fragment; until
the member holding it hands it back, the node has no fragment of its own, and its producers
are forwarded to another member's. They stayed there: long seed 6 cut that other member off
from its peers later, and a producer whose own node was serving its fragment again waited
8 s for the cut to heal.
"""

from __future__ import annotations

import pytest

from playbook import World, run
from test_replication_playbooks import (FRAGMENTED, TTL, backups_ready, etcd_cluster,
                                        fragments_view, lose_node, view)

pytestmark = pytest.mark.timeout(60)
ADDRESS = "jobs"
CLUSTER = {"etcd": ["http://memory:2379"], "lease_ttl": TTL}


def forwarded_to(node) -> str | None:
    """The host a producer of the node's fragment group goes to through a pool, if any."""
    for pool in node.broker.upstreams.pools.values():
        for member in [*pool.members, pool.alone]:
            if any(type(e).__name__ == "ProxyProducer" and not e.closed for e in member.endpoints):
                return pool.target.host
    return None


def test_a_producer_forwarded_while_its_fragment_was_away_comes_home(tmp_path):
    async def play():
        world = World(tmp_path)
        etcd, nodes = await etcd_cluster(world, rule=FRAGMENTED)
        first = (await world.client("a", "producer-a")).sender(ADDRESS)
        await world.until(lambda: first.credit > 0, what="credit on a")
        await world.until(lambda: len(view(nodes["a"], f"{ADDRESS}@a").get("in_sync", [])) == 1,
                          what="a's fragment in sync")
        await backups_ready(world, nodes, view(nodes["a"], f"{ADDRESS}@a")["in_sync"], f"{ADDRESS}@a")

        # a lost: its backup serves its fragment; a started again, as a backup of it
        await lose_node(world, nodes, "a")
        await world.until(lambda: any(view(nodes[n], f"{ADDRESS}@a").get("role") == "primary"
                                      for n in "bc"), timeout=2 * TTL, what="a's fragment adopted")
        world.network.reboot("a")
        nodes["a"] = await world.node("a", etcd=etcd, rules=[FRAGMENTED], cluster=CLUSTER)

        # a producer on a before the hand-back: forwarded to another member's fragment
        producer = (await world.client("a", "producer-a2")).sender(ADDRESS)
        await world.until(lambda: producer.credit > 0, timeout=10, what="credit (forwarded)")
        assert fragments_view(nodes["a"])["forwarded_producers"] >= 1
        target = forwarded_to(nodes["a"])
        assert target in ("b", "c"), target
        await world.until(lambda: view(nodes["a"], f"{ADDRESS}@a").get("role") == "primary",
                          timeout=30, what="a's fragment handed back to it")

        # the member it was forwarded to cut off from a: it goes on, into a's own fragment
        # (within a lease and a margin: that member may be the fragment's backup, dropped then)
        world.network.partition("a", target)
        for i in range(10):
            producer.send(f"x-{i}", message_id=f"x-{i}")
        await world.until(lambda: producer.accepted() >= 10, timeout=TTL + 2,
                          what="accepted by a's own fragment")
        assert fragments_view(nodes["a"])["enqueued"] >= 10
        await world.close()

    run(play)
