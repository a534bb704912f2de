"""A primary fenced because its lease ran out keeps what it held (issue #42, docs/nemesis.md
finding 24), on a virtual clock.

The nemesis's combined seed 6: the primary of a queue with two replicas was paused past its
lease while its only backup was killed (not durable: it came back empty and stepped out of the
record). The primary woke fenced and threw its copy away ("a backup again: the new primary's
catch-up refills it"), though no other copy existed: then it claimed the queue again, empty.
Whatever it held was lost, with one node killed. Now a node fenced for its lease keeps its copy
as a journal's recovery is kept and, still named primary in the record, claims again with it.
"""

from __future__ import annotations

import pytest

from playbook import World, run
from test_replication_playbooks import (TTL, Consumer, etcd_cluster, lose_node, service,
                                        three_roles, view)

pytestmark = pytest.mark.timeout(60)
ADDRESS = "orders.x"
RULE = {"name": "orders", "match": "orders.*", "kind": "replicated", "replicas": 2,
        "catchup_timeout": 10.0}


def test_a_primary_paused_past_its_lease_while_its_backup_died_keeps_what_it_held(tmp_path):
    async def play():
        world = World(tmp_path)
        etcd, nodes = await etcd_cluster(world, rule=RULE)
        primary, backup, third = await three_roles(world, nodes, ADDRESS)
        # the producer is on the third node, proxied to the primary
        sender = (await world.client(third, "producer")).sender(ADDRESS)
        await world.until(lambda: sender.credit >= 20, what="credit")
        for i in range(20):
            sender.send(f"m{i}", message_id=i)
        await world.until(lambda: sender.accepted() == 20, what="20 accepted, the backup in sync")

        # the primary "pauses": cut off from etcd, and none of its timers that would notice
        # its silent backup run (a paused process wakes and fences for its lease first; a node
        # that stands aside, cut off from every peer, keeps its copy already)
        nodes[primary].coordinator.store.partition()
        service(nodes[primary]).entry(ADDRESS, nodes[primary].routing.resolve(ADDRESS).rule) \
            .stand_aside = lambda why: None
        # meanwhile its backup is killed and comes back empty (not durable)
        await lose_node(world, nodes, backup)
        world.network.reboot(backup)
        nodes[backup] = await world.node(backup, etcd=etcd, rules=[RULE],
                                         cluster={"etcd": ["http://memory:2379"], "lease_ttl": TTL})
        await world.quiet(2 * TTL)

        # etcd again: the fenced primary claims the queue again with what it held
        nodes[primary].coordinator.store.heal()
        await world.until(lambda: view(nodes[primary], ADDRESS).get("role") == "primary"
                          and view(nodes[primary], ADDRESS).get("depth", 0) > 0,
                          timeout=4 * TTL, what="the paused node primary again, with its copy")
        consumer = Consumer((await world.client(third, "consumer")).receiver(ADDRESS, credit=50))

        def received():
            consumer.step()
            return len(consumer.link.received) >= 20

        await world.until(received, timeout=TTL + 2, what="all 20 received")
        ids = [m.id for m, _ in consumer.link.received]
        assert sorted(ids) == list(range(20)), ids
        await world.close()

    run(play)
