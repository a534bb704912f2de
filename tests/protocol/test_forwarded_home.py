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
ADDRESS = FRAGMENTS = "jobs"
CLUSTER = {"etcd": ["http://memory:2379"], "lease_ttl": TTL}


def forwarded_to(node) -> str | None:
    """The host a producer of the node's fragment group goes to through a pool, if any."""
    for pool in node.broker.upstreams.pools.values():
        for member in [*pool.members, pool.alone]:
            if any(type(e).__name__ == "ProxyProducer" and not e.closed for e in member.endpoints):
                return pool.target.host
    return None


async def a_back_without_its_fragment(tmp_path):
    """Three members; a's fragment in sync, then a lost: its backup serves a's fragment, and a
    is started again, as a backup of it (no fragment of its own until it is handed back)."""
    world = World(tmp_path)
    etcd, nodes = await etcd_cluster(world, rule=FRAGMENTED)
    first = (await world.client("a", "producer-a")).sender(ADDRESS)
    await world.until(lambda: first.credit > 0, what="credit on a")
    await world.until(lambda: len(view(nodes["a"], f"{ADDRESS}@a").get("in_sync", [])) == 1,
                      what="a's fragment in sync")
    await backups_ready(world, nodes, view(nodes["a"], f"{ADDRESS}@a")["in_sync"], f"{ADDRESS}@a")
    await lose_node(world, nodes, "a")
    await world.until(lambda: any(view(nodes[n], f"{ADDRESS}@a").get("role") == "primary"
                                  for n in "bc"), timeout=2 * TTL, what="a's fragment adopted")
    world.network.reboot("a")
    nodes["a"] = await world.node("a", etcd=etcd, rules=[FRAGMENTED], cluster=CLUSTER)
    return world, etcd, nodes


def test_a_producer_forwarded_while_its_fragment_was_away_comes_home(tmp_path):
    async def play():
        # a lost: its backup serves its fragment; a started again, as a backup of it
        world, etcd, nodes = await a_back_without_its_fragment(tmp_path)

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


def test_a_producer_brought_home_that_follows_its_fragment_away_again_comes_home_again(tmp_path):
    """The rest of finding 22: a producer brought home had its marked link refused when its
    node lost the fragment again (cut off from etcd: its backup took it), and followed it to
    another member. It stayed there after the fragment came back a second time, and a pause,
    then a kill, of that member stopped it while its own node served its fragment (8.05 s and
    8.22 s, in the long seed 6)."""
    async def play():
        world, etcd, nodes = await a_back_without_its_fragment(tmp_path)
        producer = (await world.client("a", "producer-a2")).sender(ADDRESS)
        await world.until(lambda: producer.credit > 0, timeout=10, what="credit (forwarded)")
        await world.until(lambda: view(nodes["a"], f"{ADDRESS}@a").get("role") == "primary",
                          timeout=30, what="a's fragment handed back to it")
        await world.until(lambda: forwarded_to(nodes["a"]) == "a", timeout=TTL,
                          what="brought home through a's own listener")
        await world.until(lambda: len(view(nodes["a"], f"{ADDRESS}@a").get("in_sync", [])) == 1,
                          what="a's fragment in sync again")

        # a cut off from etcd: fenced, its fragment adopted by its backup; then etcd again,
        # and the fragment handed back to it a second time
        nodes["a"].coordinator.store.partition()
        await world.until(lambda: any(view(nodes[n], f"{ADDRESS}@a").get("role") == "primary"
                                      for n in "bc"), timeout=3 * TTL, what="adopted again")
        # its proxy's connection to its own listener reset meanwhile (in the nemesis: its
        # admission gate, cut off one way): attached again, the marked link is refused (the
        # fragment is served by another member) and the producer follows it away
        assert world.network.cut("a", "a") >= 1
        await world.until(lambda: forwarded_to(nodes["a"]) in ("b", "c"), timeout=TTL,
                          what="the producer followed its fragment away")
        nodes["a"].coordinator.store.heal()
        await world.until(lambda: view(nodes["a"], f"{ADDRESS}@a").get("role") == "primary",
                          timeout=30, what="handed back to a again")
        await world.until(lambda: forwarded_to(nodes["a"]) == "a", timeout=TTL,
                          what="brought home again")

        # every other member cut off from a: its producer goes on into a's own fragment
        for other in "bc":
            world.network.partition("a", other)
        for i in range(10):
            producer.send(f"y-{i}", message_id=f"y-{i}")
        await world.until(lambda: producer.accepted() >= 10, timeout=TTL + 2,
                          what="accepted by a's own fragment")
        await world.close()

    run(play)
