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
from test_replication_playbooks import CREDIT, FRAGMENTED, TTL, Consumer, etcd_cluster, view

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


def test_an_etcd_pause_sends_no_fragment_link_around_the_members(tmp_path):
    """Every member cut off from etcd at once (an `etcd-pause`), fragment clients on each: every
    home fences its fragment and serves none until etcd answers. A first fix of finding 32 let
    a cut-off member send new links where a node without a fragment does; with every member
    cut off, each proxied the others' consumers on to the next one, and a client's connection
    reached 1,024 links in 2 s (`amqp:resource-limit-exceeded`: long seed 10, `combined`).
    The links wait, and nothing ends them."""
    async def play():
        world = World(tmp_path)
        etcd, nodes = await etcd_cluster(world, rule=FRAGMENTED)
        clients, producers, consumers = [], [], []
        for base, node in enumerate(nodes):
            client = await world.client(node, f"clients-{node}")
            clients.append(client)
            producers.append(Numbered(client.sender(FRAGMENTS), base=1000 * base))
            consumers.append(Consumer(client.receiver(FRAGMENTS, credit=CREDIT)))
        await world.until(lambda: all(p.upto(5) for p in producers), timeout=10, what="accepted")
        await world.until(lambda: all(len(view(nodes[n], f"{FRAGMENTS}@{n}").get("in_sync", [])) == 1
                                      for n in nodes), timeout=10, what="every fragment in sync")

        for node in nodes.values():
            node.coordinator.store.partition()
        for _ in range(int(3 * TTL / 0.1)):
            for producer in producers:
                producer.upto(producer.sent + 1)
            for consumer in consumers:
                consumer.step()
            await asyncio.sleep(0.1)
        for node in nodes.values():
            node.coordinator.store.heal()
        assert all(p.sender.closed_with is None for p in producers)
        assert all(c.link.closed_with is None for c in consumers)
        targets = [p.sent + 1 for p in producers]
        await world.until(lambda: all(p.upto(n) for p, n in zip(producers, targets)),
                          timeout=4 * TTL, what="accepted again after the pause")
        await world.close()

    run(play)
