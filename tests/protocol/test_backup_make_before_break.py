"""A backup in sync stays until the replica set's own backup is in sync (issue #42,
docs/nemesis.md finding 28), on a virtual clock.

The nemesis (long seed 7, `single`): a queue's preferred node came back after a kill. The
replica set is recomputed when the members change, and the primary dropped its in-sync
backup at once (no longer in the set) for the returning node, which had yet to catch up: for
that while the queue had no copy in sync, and a one-way cut of its primary that began then
left nobody to take over (5.7 s without an acceptance against 5.0 allowed). Now a backup in
sync is kept until every backup of the new replica set is in sync, then dropped.
"""

from __future__ import annotations

import asyncio

import pytest

from playbook import World, run
from test_replication_playbooks import TTL, etcd_cluster, lose_node, make_primary, view

pytestmark = pytest.mark.timeout(60)
ADDRESS = "orders.x"
RULE = {"name": "orders", "match": "orders.*", "kind": "replicated", "replicas": 2,
        "nodes": ["a", "b", "c"]}
CLUSTER = {"etcd": ["http://memory:2379"], "lease_ttl": TTL}


def test_the_in_sync_backup_stays_until_the_returning_member_is_in_sync(tmp_path):
    async def play():
        world = World(tmp_path)
        etcd, nodes = await etcd_cluster(world, rule=RULE)
        assert await make_primary(world, nodes, ADDRESS) == "a"
        sender = (await world.client("b", "producer")).sender(ADDRESS)
        await world.until(lambda: sender.credit > 0, what="credit")
        for i in range(50):
            sender.send(f"m{i}", message_id=i)
        await world.until(lambda: sender.accepted() == 50, what="50 accepted")

        # a dies: b serves the queue, c is its backup (the set is b, c now)
        await lose_node(world, nodes, "a")
        await world.until(lambda: view(nodes["b"], ADDRESS).get("role") == "primary"
                          and view(nodes["b"], ADDRESS).get("in_sync") == ["c"],
                          timeout=4 * TTL, what="b primary, c in sync")

        # a comes back: the set is a, b again; c, in sync, must stay until a is
        world.network.reboot("a")
        nodes["a"] = await world.node("a", etcd=etcd, rules=[RULE], cluster=CLUSTER)
        seen = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 4 * TTL
        while "a" not in view(nodes["b"], ADDRESS).get("in_sync", []):
            seen.append(tuple(view(nodes["b"], ADDRESS).get("in_sync", [])))
            assert loop.time() < deadline, f"a never in sync: {seen[-1]}"
            await asyncio.sleep(0.01)
        assert () not in seen, "the queue had no copy in sync while a caught up"
        # and then c, no longer in the set, goes
        await world.until(lambda: view(nodes["b"], ADDRESS).get("in_sync") == ["a"],
                          timeout=2 * TTL, what="c dropped once a is in sync")
        await world.close()

    run(play)
