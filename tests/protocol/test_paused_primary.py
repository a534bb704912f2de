"""A primary whose lease ran out while it was paused settles nothing it reads on waking
(issue #42, docs/nemesis.md finding 20), on a virtual clock.

A paused process wakes with its clients' transfers waiting in its sockets, and the event loop
reads them before it runs the timer that fences it. A primary alone in its in-sync set (its
backup gone) accepted them at once, though its lease had ended while it slept and etcd had
given its claim away: the long nemesis seed 6 lost 12 messages of a fragment that way. The
lease's clock decides whether a node may act, not the timer that tells it: a primary asks it
before it settles anything.
"""

from __future__ import annotations

import asyncio

import pytest
from proton import Delivery

from playbook import World, run
from test_replication_playbooks import TTL, etcd_cluster, make_primary, view

pytestmark = pytest.mark.timeout(60)
ADDRESS = "orders.x"
RULE = {"name": "orders", "match": "orders.*", "kind": "replicated", "replicas": 2}


def test_a_primary_past_its_lease_accepts_nothing_before_its_fence_comes(tmp_path):
    async def play():
        world = World(tmp_path)
        etcd, nodes = await etcd_cluster(world, rule=RULE)
        primary = await make_primary(world, nodes, ADDRESS)
        backup = view(nodes[primary], ADDRESS)["in_sync"][0]
        sender = (await world.client(primary, "producer")).sender(ADDRESS)
        await world.until(lambda: sender.credit > 0, what="credit")
        sender.send("with the backup", message_id=0)
        await world.until(lambda: sender.accepted() == 1, what="accepted")
        # the backup goes: the primary goes on alone (its in-sync set written empty)
        world.network.kill(backup)
        nodes[backup].coordinator.store.partition()
        await world.until(lambda: view(nodes[primary], ADDRESS).get("in_sync") == [],
                          timeout=3 * TTL, what="alone")
        sender.send("alone", message_id=1)
        await world.until(lambda: sender.accepted() == 2, what="accepted alone")

        # paused: no renewal reaches etcd, and the timer that fences it does not run
        coordinator = nodes[primary].coordinator
        coordinator.store.partition()
        coordinator._fenced = lambda fenced: None  # the callbacks that fence it never run
        await asyncio.sleep(TTL + 0.5)
        assert not coordinator.acting()  # the lease's clock: past its lease
        assert view(nodes[primary], ADDRESS)["role"] == "primary"  # not told yet
        delivery = sender.send("after its lease", message_id=2)
        await world.quiet(1.0)
        assert sender.outcomes.get(delivery) != Delivery.ACCEPTED
        await world.close()

    run(play)
