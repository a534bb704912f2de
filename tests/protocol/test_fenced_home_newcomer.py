"""A client that comes to a fragment's home while the home is cut off from etcd and from its
peers (an `isolate`) is sent to its failover list too (issue #42, docs/nemesis.md finding 32),
on a virtual clock.

The home's clients are reset when no peer answers its relay (half a lease after the fence);
its gate turns new clients away once a look of the silent peers found one silent, up to a
relay limit later. A client that came back in between (its failover list starts with its own
node) attached a producer to the fragmented queue, and the group held it for "this node's
claim of its own fragment", which a node cut off from etcd cannot make: it was on no pool the
looks send away, and waited for the heal (long seed 17, `isolate` of n1: `p-nem.f-n1` 8.11 s,
allowed 8.0). A node cut off claims nothing: its links go where a node without a fragment
sends them (another member's fragment), and are sent away with that member's pool.
"""

from __future__ import annotations

import asyncio

import pytest

from playbook import World, run
from test_failover_links import Numbered
from test_replication_playbooks import FRAGMENTED, TTL, etcd_cluster, view

pytestmark = pytest.mark.timeout(60)
FRAGMENTS = "jobs"


def test_a_client_that_comes_to_an_isolated_fragment_home_is_sent_away_too(tmp_path):
    async def play():
        world = World(tmp_path)
        etcd, nodes = await etcd_cluster(world, rule=FRAGMENTED)
        first_client = await world.client("a", "producer-1")
        first = Numbered(first_client.sender(FRAGMENTS))
        await world.until(lambda: first.upto(5), timeout=10, what="accepted")
        await world.until(lambda: len(view(nodes["a"], f"{FRAGMENTS}@a").get("in_sync", [])) == 1,
                          timeout=10, what="a's fragment in sync")

        loop = asyncio.get_running_loop()
        began = loop.time()
        nodes["a"].coordinator.store.partition()  # an isolate: etcd and every peer
        for other in "bc":
            world.network.partition("a", other)
        while not first_client.lost:
            first.upto(first.sent + 1)
            await asyncio.sleep(0.05)
            assert loop.time() - began <= 2 * TTL, "the first client still connected"
        reset = loop.time() - began

        # a client comes back (its failover list starts with its own node) before the gate closes
        client = await world.client("a", "producer-2")
        came = loop.time()
        producer = Numbered(client.sender(FRAGMENTS), base=1000)
        while not client.lost:
            producer.upto(producer.sent + 1)
            await asyncio.sleep(0.05)
            assert loop.time() - came <= 2 * TTL, (reset, "the newcomer still connected")
        # the next look of the silent peers (a relay limit); it waited for the heal before
        assert loop.time() - came <= TTL, (reset, came - began, loop.time() - began)
        await world.close()

    run(play)
