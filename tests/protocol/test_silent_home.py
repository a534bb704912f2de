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
from test_replication_playbooks import (CREDIT, FRAGMENTED, TTL, Consumer, etcd_cluster, lose_node,
                                        make_primary, view)
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


def test_a_fragment_home_that_stands_aside_sends_its_producer_brought_home_away_at_once(tmp_path):
    """docs/nemesis.md finding 31 (long seed 17, `peers-cut` of n1: `nem.f` 5.58 s without an
    acceptance, allowed 5.0): the producer brought home through the node's own listener, then
    the node cut off from its peers (not from etcd). Its fragment stands aside (the node knows
    itself cut off from every peer): the fragment's own clients are sent to their failover
    lists at once, but this one is two links, and only the inner one (the node's proxy
    connection to itself) was parked; the client waited for the next look of the silent
    peers, a relay limit (1.5 s) later."""
    async def play():
        world, etcd, nodes = await a_back_without_its_fragment(tmp_path)
        client = await world.client("a", "producer-a2")
        producer = Numbered(client.sender(FRAGMENTS))
        await world.until(lambda: producer.upto(5), timeout=10, what="accepted (forwarded)")
        await world.until(lambda: view(nodes["a"], f"{FRAGMENTS}@a").get("role") == "primary",
                          timeout=30, what="a's fragment handed back to it")
        await world.until(lambda: forwarded_to(nodes["a"]) == "a", timeout=TTL,
                          what="the producer brought home through a's own listener")
        await world.until(lambda: len(view(nodes["a"], f"{FRAGMENTS}@a").get("in_sync", [])) == 1,
                          timeout=10, what="a's fragment in sync again")
        await world.until(lambda: producer.upto(10), timeout=TTL, what="accepted at home")

        loop = asyncio.get_running_loop()
        began, aside = loop.time(), None
        for other in "bc":  # a peers-cut: etcd still answers a
            world.network.partition("a", other)
        while not client.lost:
            producer.upto(producer.sent + 1)
            await asyncio.sleep(0.05)
            if aside is None and view(nodes["a"], f"{FRAGMENTS}@a").get("stood_aside"):
                aside = loop.time()
            assert loop.time() - began <= 2.5 * TTL, "the producer brought home still connected"
        assert aside is not None, "a's fragment did not stand aside"
        waited = loop.time() - began
        assert loop.time() - aside <= 0.5, (aside - began, waited)  # was a relay limit later
        assert waited <= TTL + 1.5, waited
        assert producer.sender.closed_with is None  # a reset: its link never ended alone
        await world.close()

    run(play)


def test_a_fragment_home_that_stands_aside_sends_away_clients_whose_proxies_followed_it_home(
        tmp_path):
    """docs/nemesis.md finding 31, the run that showed it (long seed 17, `peers-cut` of n1 right
    after an `etcd-cut` of n1): the fragment's clients on its home were parked at the etcd cut
    and went on to the member that adopted the fragment; when it was handed back their proxies
    followed it home, through the node's own listener. Cut off from its peers then, the home
    stood aside: the proxies' links were parked, the proxies followed the fragment to the
    member that claimed it, through a peer that answers nothing, and only the (gone) parked
    links were looked at 0.1 s later: the clients waited for the next look of the silent
    peers (1.5 s: 5.78 s without an acceptance, allowed 5.0)."""
    async def play():
        world = World(tmp_path)
        etcd, nodes = await etcd_cluster(world, rule=FRAGMENTED)
        clients = [await world.client("a", f"producer-{i}") for i in range(3)]
        producers = [Numbered(c.sender(FRAGMENTS), base=1000 * i) for i, c in enumerate(clients)]
        clients.append(await world.client("a", "consumer"))
        consumer = Consumer(clients[-1].receiver(FRAGMENTS, credit=CREDIT))
        await world.until(lambda: all(p.upto(5) for p in producers), timeout=10, what="accepted")
        await world.until(lambda: len(view(nodes["a"], f"{FRAGMENTS}@a").get("in_sync", [])) == 1,
                          timeout=10, what="a's fragment in sync")

        # a cut off from etcd: its clients' links go on to the member that adopts its fragment;
        # etcd again: the fragment handed back, and their proxies follow it home
        nodes["a"].coordinator.store.partition()
        await world.until(lambda: any(view(nodes[n], f"{FRAGMENTS}@a").get("role") == "primary"
                                      for n in "bc"), timeout=3 * TTL, what="a's fragment adopted")
        nodes["a"].coordinator.store.heal()
        await world.until(lambda: view(nodes["a"], f"{FRAGMENTS}@a").get("role") == "primary",
                          timeout=30, what="a's fragment handed back to it")
        await world.until(lambda: len(view(nodes["a"], f"{FRAGMENTS}@a").get("in_sync", [])) == 1,
                          timeout=10, what="a's fragment in sync again")
        await world.until(lambda: forwarded_to(nodes["a"]) == "a", timeout=TTL,
                          what="the clients' proxies home, through a's own listener")
        targets = [p.sent + 5 for p in producers]
        await world.until(lambda: all(p.upto(n) for p, n in zip(producers, targets)),
                          timeout=TTL, what="accepted at home")
        assert not any(c.lost for c in clients)

        loop = asyncio.get_running_loop()
        began, aside = loop.time(), None
        for other in "bc":  # a peers-cut: etcd still answers a
            world.network.partition("a", other)
        while not all(c.lost for c in clients):
            for producer in producers:
                producer.upto(producer.sent + 1)
            consumer.step()
            await asyncio.sleep(0.05)
            if aside is None and view(nodes["a"], f"{FRAGMENTS}@a").get("stood_aside"):
                aside = loop.time()
            assert loop.time() - began <= 2.5 * TTL, "a client of the cut home still connected"
        assert aside is not None, "a's fragment did not stand aside"
        waited = loop.time() - began
        assert loop.time() - aside <= 0.5, (aside - began, waited)  # was a relay limit later
        assert waited <= TTL + 1.5, waited
        assert all(p.sender.closed_with is None for p in producers)  # resets, never a link alone
        await world.close()

    run(play)
