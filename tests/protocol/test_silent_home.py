"""A node in a one-way partition also sends away the clients whose links reach its own queue
through its own listener (issue #42, docs/nemesis.md finding 22), on a virtual clock.

A proxy whose queue came to this node follows it home through the node's own listener (a
replicated queue's proxies follow their owner; a fragmented queue's producers forwarded while
the node's fragment was away come home marked for it). Cut off one way, the node fences
itself and sends away the clients of its silent peers' pools; its own listener turns new
connections away meanwhile, the proxy's own connection to it among them. Those clients were
on no peer's pool: they waited for the whole cut (the long seed 6's `p-nem.f-n1`: 8.05-8.22 s
against 8.0 allowed, in one-way, pause and kill episodes).
"""

from __future__ import annotations

import asyncio

import pytest

from playbook import World, run
from test_failover_links import Numbered, new_primary
from test_forwarded_home import FRAGMENTS, a_back_without_its_fragment, forwarded_to
from test_replication_playbooks import TTL, etcd_cluster, lose_node, make_primary, view
from test_silent_peers import deafen

pytestmark = pytest.mark.timeout(60)
ADDRESS = "orders.x"


def test_a_cut_node_sends_away_the_clients_proxied_home_through_its_own_listener(tmp_path):
    async def play():
        world = World(tmp_path)
        etcd, nodes = await etcd_cluster(world, names="abcd")
        primary = await make_primary(world, nodes, ADDRESS)
        clients, producers = {}, {}
        for base, node in enumerate(n for n in nodes if n != primary):
            clients[node] = await world.client(node, f"producer-{node}")
            producers[node] = Numbered(clients[node].sender(ADDRESS), base=1000 * base)
        await world.until(lambda: all(p.upto(10) for p in producers.values()),
                          what="accepted through the proxies")

        # the primary dies: a backup takes over, and its own client's proxy comes home
        await lose_node(world, nodes, primary)
        await world.until(lambda: new_primary(nodes, primary) is not None, timeout=3 * TTL,
                          what="a new primary")
        home = new_primary(nodes, primary)
        await world.until(lambda: all(p.upto(20) for n, p in producers.items()),
                          timeout=2 * TTL, what="accepted by the new primary")

        loop = asyncio.get_running_loop()
        began = loop.time()
        deafen(world, nodes, home)
        producer, client = producers[home], clients[home]
        while not client.lost:
            producer.upto(producer.sent + 1)  # it keeps sending
            await asyncio.sleep(0.1)
            assert loop.time() - began <= 2.5 * TTL, "the cut node's own client still connected"
        waited = loop.time() - began
        assert waited <= 2 * TTL + 0.5, waited  # fenced, then two looks (relay limits)
        assert producer.sender.closed_with is None  # a reset: its link never ended alone
        await world.close()

    run(play)


def test_a_cut_node_sends_away_a_fragment_producer_brought_home(tmp_path):
    """The nemesis's path: a producer forwarded while its node's fragment was away, brought
    home through the node's own listener when the fragment came back; then the node is cut
    off one way."""
    async def play():
        world, etcd, nodes = await a_back_without_its_fragment(tmp_path)
        client = await world.client("a", "producer-a2")
        producer = Numbered(client.sender(FRAGMENTS))
        await world.until(lambda: producer.upto(5), timeout=10, what="accepted (forwarded)")
        await world.until(lambda: view(nodes["a"], f"{FRAGMENTS}@a").get("role") == "primary",
                          timeout=30, what="a's fragment handed back to it")
        await world.until(lambda: forwarded_to(nodes["a"]) == "a", timeout=TTL,
                          what="the producer brought home through a's own listener")
        await world.until(lambda: producer.upto(10), timeout=TTL, what="accepted at home")

        loop = asyncio.get_running_loop()
        began = loop.time()
        deafen(world, nodes, "a")
        while not client.lost:
            producer.upto(producer.sent + 1)
            await asyncio.sleep(0.1)
            assert loop.time() - began <= 2.5 * TTL, "the producer brought home still connected"
        waited = loop.time() - began
        assert waited <= 2 * TTL + 0.5, waited
        assert producer.sender.closed_with is None
        await world.close()

    run(play)
