"""After every node lost power, each fragment is served again (issue #42, docs/nemesis.md
finding 26), on a virtual clock.

The nemesis (combined seed 6, `power-loss`): every node killed and started again, nothing
durable. At its start each node steps out of the ISR records that name it (it holds no copy),
each by a compare-and-swap on the record as it read it. A fragment's home member and its
backup came back at the same moment and stepped out of that fragment's record together: the
backup's swap lost the race, and a lost swap was dropped without a word. The record kept
naming the backup's copy, which did not exist, its home member could not claim the fragment,
and a producer on another node waited 46 s, until a rolling restart started the backup once
more. Now a start that loses the swap reads the record again and tries again.
"""

from __future__ import annotations

import asyncio

import pytest

from playbook import World, run
from proxy.cluster.etcd import EtcdCoordinator
from proxy.replication.service import STATE
from test_replication_playbooks import (FRAGMENTED, TTL, backups_ready, etcd_cluster,
                                        lose_node, view)

pytestmark = pytest.mark.timeout(60)
ADDRESS = "jobs"
CLUSTER = {"etcd": ["http://memory:2379"], "lease_ttl": TTL}


def test_every_fragment_is_served_again_after_every_node_lost_power(tmp_path, monkeypatch):
    async def play():
        world = World(tmp_path)
        etcd, nodes = await etcd_cluster(world, rule=FRAGMENTED)
        for name in nodes:  # every fragment served, with a backup in sync
            client = await world.client(name, f"starter-{name}")
            client.sender(ADDRESS)
        for name in nodes:
            fragment = f"{ADDRESS}@{name}"
            await world.until(lambda: len(view(nodes[name], fragment).get("in_sync", [])) == 1,
                              what=f"{fragment} in sync")
            await backups_ready(world, nodes, view(nodes[name], fragment)["in_sync"], fragment)

        for name in list(nodes):  # power loss: every node at once
            await lose_node(world, nodes, name)
        await world.quiet(2 * TTL)  # every lease gone
        # the nodes start together: each reads the records, then each steps out of those
        # naming it (compare and swap on the record as it read it): two members of one
        # fragment's record step out of it at the same moment, and the second swap fails
        readers, everyone_read = [], asyncio.Event()
        get_state = EtcdCoordinator.get_state

        async def read_together(coordinator, prefix):
            records = await get_state(coordinator, prefix)
            if prefix == STATE and len(readers) < len(nodes):
                readers.append(coordinator.node_id)
                if len(readers) == len(nodes):
                    everyone_read.set()
                await everyone_read.wait()
            return records
        monkeypatch.setattr(EtcdCoordinator, "get_state", read_together)
        for name in list(nodes):
            world.network.reboot(name)
            nodes[name] = await world.node(name, etcd=etcd, rules=[FRAGMENTED], cluster=CLUSTER)

        await world.until(lambda: everyone_read.is_set(), what="the records read")
        await world.quiet(1.0)  # the starts' passes done; the clients come back now
        producers = {}  # a producer and a consumer on every node, as the nemesis has
        for name in nodes:
            client = await world.client(name, f"client-{name}")
            producers[name] = client.sender(ADDRESS)
            client.receiver(ADDRESS, credit=10)
        for name in nodes:
            fragment = f"{ADDRESS}@{name}"
            await world.until(lambda: view(nodes[name], fragment).get("role") == "primary",
                              timeout=4 * TTL, what=f"{fragment} served by its member again")
        await world.until(lambda: all(p.credit > 0 for p in producers.values()), timeout=TTL,
                          what="credit everywhere")
        for name, producer in producers.items():
            producer.send(f"from {name}", message_id=name)
        await world.until(lambda: all(p.accepted() == 1 for p in producers.values()),
                          timeout=TTL, what="accepted on every node")
        await world.close()

    run(play)
