"""A backup caught up and written into the in-sync set, whose primary died before telling it
(the ``S`` event): it holds the queue, and must not throw it away (issue #42, docs/nemesis.md
finding 18; docs/replication.md, failover), on a virtual clock.

The primary writes a caught-up backup into the in-sync set in etcd, then tells it. Killed in
between, the backup is named in the record but was never told it may take over. It used to
step out of the record as a node started without a copy does, and when the primary did not
come back with its copy the queue was made again, empty: every message accepted was lost,
though the backup held them all. Now it waits a moment for a copy that was told (one would
claim at once), then claims with what it holds, when the record names no other backup.
"""

from __future__ import annotations

import asyncio

import pytest

from playbook import World, run
from test_failover_links import Numbered
from test_replication_playbooks import (CREDIT, TTL, Consumer, etcd_cluster, lose_node,
                                        service, three_roles, view)

pytestmark = pytest.mark.timeout(60)
ADDRESS = "orders.x"
# the replica set is a and b only: with the third node in it, it would be made a backup while
# b is away and kept in sync until b is (make before break, finding 28), and the record would
# name it too, a copy that was told, which claims at once
RULE = {"name": "orders", "match": "orders.*", "kind": "replicated", "replicas": 2,
        "catchup_timeout": 10.0, "nodes": ["a", "b"]}
CLUSTER = {"etcd": ["http://memory:2379"], "lease_ttl": TTL}


def entry_of(node):
    return next(e for e in service(node).entries.values() if e.address == ADDRESS)


@pytest.mark.parametrize("primary_back", [False, True])
def test_a_backup_in_the_record_but_never_told_claims_with_what_it_holds(tmp_path, primary_back):
    """replicas = 2, min_in_sync = 1. The backup is killed; the primary goes on alone; the
    backup, started again, catches up; the primary writes it into the in-sync set and dies
    before it tells it. The backup serves the queue within a lease and a moment, and a
    consumer on the third node gets every accepted message. ``primary_back``: the old
    primary is started again meanwhile, without its copy (not durable); it steps out, and
    does not make the queue again, empty. (Before: the backup stepped out too, and the queue
    was unserved until the old primary came back, then made again, empty.)"""
    async def play():
        world = World(tmp_path)
        etcd, nodes = await etcd_cluster(world, rule=RULE)
        primary, backup, third = await three_roles(world, nodes, ADDRESS)
        pump = Numbered((await world.client(primary, "producer")).sender(ADDRESS))
        await world.until(lambda: pump.upto(10), what="10 accepted with the backup in sync")

        await lose_node(world, nodes, backup)
        await world.until(lambda: pump.upto(20), timeout=TTL + 5, what="10 more, alone")
        assert view(nodes[primary], ADDRESS)["in_sync"] == []

        # the primary dies right after its record names the backup, before it tells it
        copy = entry_of(nodes[primary]).primary
        written = copy.isr_written
        killed = []

        def isr_written(isr):
            if isr and backup in isr and not killed:
                killed.append(asyncio.get_running_loop().time())
                world.network.kill(primary)
                nodes[primary].coordinator.store.partition()
                return  # the S event is never sent
            written(isr)
        copy.isr_written = isr_written

        world.network.reboot(backup)
        nodes[backup] = await world.node(backup, etcd=etcd, rules=[RULE], cluster=CLUSTER)
        await world.until(lambda: killed, timeout=10, what="the backup written into the record")
        await nodes[primary].stop()
        assert view(nodes[backup], ADDRESS).get("role") != "ready"  # never told

        if primary_back:
            world.network.reboot(primary)
            nodes[primary] = await world.node(primary, etcd=etcd, rules=[RULE], cluster=CLUSTER)
        await world.until(lambda: view(nodes[backup], ADDRESS).get("role") == "primary",
                          timeout=TTL + 3, what="the backup serving the queue")
        assert asyncio.get_running_loop().time() - killed[0] <= TTL + 3

        reader = Consumer((await world.client(third, "reader")).receiver(ADDRESS, credit=CREDIT))

        def received() -> set:
            reader.step()
            return set(reader.ids())
        accepted = pump.accepted_ids()
        assert len(accepted) == 20
        await world.until(lambda: received() >= accepted, timeout=10, what="every accepted message")
        await world.quiet(1.0)
        assert view(nodes[backup], ADDRESS)["role"] == "primary"
        await world.close()

    run(play)
