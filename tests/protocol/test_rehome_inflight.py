"""What a proxied producer had in flight when its queue moved goes to the new primary at once
(issue #42, docs/nemesis.md finding 16), on a virtual clock.

The long nemesis seed 6 paused a primary for 7.5 s: the queue had a new primary 3.1 s later,
yet no producer anywhere was accepted until the old primary woke (7.7 s). Each proxied
producer's transfers the silent primary had not answered were sent to the new one as
*suspects*: one at a time, each waiting for its outcome, all the producers of a node through
one connection, and each producer sending nothing new meanwhile. Hundreds of them at a
round trip each. Suspects are for messages whose connection ended while they were in flight
(one may be what ended it); a queue that moved ended nothing. Now they are sent again first,
in order, on the producer's own new link, as a window.
"""

from __future__ import annotations

import asyncio

import pytest

from playbook import World, run
from test_failover_links import Numbered, new_primary
from test_replication_playbooks import TTL, etcd_cluster, make_primary

pytestmark = pytest.mark.timeout(60)
ADDRESS = "orders.x"
LATENCY = 0.005  # every write between two nodes, each way


def test_a_paused_primarys_unanswered_transfers_go_to_the_new_one_as_a_window(tmp_path):
    async def play():
        world = World(tmp_path)
        etcd, nodes = await etcd_cluster(world)
        primary = await make_primary(world, nodes, ADDRESS)
        for a in nodes:
            for b in nodes:
                world.network.slow(a, b, LATENCY)
        producers = {}
        for node in nodes:
            if node != primary:
                client = await world.client(node, f"producer-{node}")
                producers[node] = Numbered(client.sender(ADDRESS), base=len(producers) * 10_000)
        await world.until(lambda: all(p.upto(20) for p in producers.values()), what="accepted")

        # the primary freezes: nothing from it, nothing to it, no reset (a SIGSTOP)
        for node in nodes:
            if node != primary:
                world.network.partition(primary, node)
        nodes[primary].coordinator.store.partition()
        for p in producers.values():
            p.upto(220)  # 200 each in flight to the silent primary
        await world.until(lambda: new_primary(nodes, primary) is not None, timeout=2 * TTL,
                          what="a new primary")
        loop = asyncio.get_running_loop()
        moved = loop.time()
        await world.until(lambda: all(p.upto(220) for p in producers.values()), timeout=10,
                          what="what was in flight accepted by the new primary")
        took = loop.time() - moved
        # a window of round trips, not 400 of them one after the other (8 s before)
        assert took <= 1.0, took
        await world.close()

    run(play)
