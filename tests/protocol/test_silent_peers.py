"""A node in a one-way partition sends its proxied clients elsewhere (issue #42, finding 15).

The nemesis found producers on a node cut off one way (what it sends arrives, nothing comes
back: from etcd and from its peers) waiting 14 s for a 6 s cut, and 21-34 s for two cuts,
when the queue's primary was on another node: their links were proxied to that primary,
whose outcomes never came back, and nothing ended them before the upstream connection's idle
timeout (two heartbeats) and the heal. The node knows it is in trouble: it has fenced itself
(no answer from etcd). Now a fenced node whose upstream connection to a peer owed outcomes and
heard nothing for ``relay_limit`` ends the connections of the clients proxied through it
(``amqp:connection:forced``, a reset), and turns new clients away before the AMQP open while
that peer stays silent, so their failover lists take them to a node that hears.
A node cut off only from etcd, whose peers answer, keeps proxying.
"""

from __future__ import annotations

import asyncio

import pytest

from proton import Connection

from playbook import PlaybookClient, World, run
from test_failover_links import Numbered, new_primary
from test_replication_playbooks import (CREDIT, TTL, Consumer, etcd_cluster, make_primary,
                                        placement, service, view)

pytestmark = pytest.mark.timeout(60)
ADDRESS = "orders.x"


def test_a_node_that_hears_nothing_back_sends_its_proxied_producers_elsewhere(tmp_path):
    async def play():
        world = World(tmp_path)
        etcd, nodes = await etcd_cluster(world)
        primary = await make_primary(world, nodes, ADDRESS)
        deaf, other = [n for n in nodes if n != primary]
        cut_client = await world.client(deaf, "on-the-cut-node")
        cut = Numbered(cut_client.sender(ADDRESS))
        fine_client = await world.client(other, "elsewhere")
        fine = Numbered(fine_client.sender(ADDRESS), base=1000)
        await world.until(lambda: cut.upto(10) and fine.upto(10), what="accepted through both")

        loop = asyncio.get_running_loop()
        began = loop.time()
        nodes[deaf].coordinator.store.deafen()
        for node in nodes:
            if node != deaf:
                world.network.deafen(deaf, node)
        # the primary and the other node go on: the one-way cut node is nobody's problem
        target = 10
        while not cut_client.lost:
            target += 1
            await world.until(lambda: fine.upto(target), timeout=TTL, what="accepted elsewhere")
            assert loop.time() - began <= 2.5 * TTL, "the cut node's client still connected"
            cut.upto(cut.sent + 1)  # it keeps sending: what it sent is owed an outcome
            await asyncio.sleep(0.1)
        # fenced within a lease of the last answer, then a relay limit (half a lease) of
        # silence: the client's connection reset, its link never ended alone
        waited = loop.time() - began
        assert waited <= TTL + TTL / 2 + 0.5, waited
        assert cut.sender.closed_with is None

        # a client coming back (python-qpid-proton's Container goes back to its first URL
        # after a connection that was opened) is turned away before the AMQP open, so its
        # failover list goes on to the next URL
        _, again = await world.network.host("again").connect(lambda: PlaybookClient("again"),
                                                              deaf, 5672)
        await world.until(lambda: again.lost, timeout=1.0, what="a new client turned away")
        assert not again.connection.state & Connection.REMOTE_ACTIVE
        # healed: the node hears its peers and etcd again, and lets clients in
        nodes[deaf].coordinator.store.heal()
        for node in nodes:
            world.network.heal(deaf, node)
        await world.until(lambda: nodes[deaf].coordinator.acting(), timeout=3 * TTL,
                          what="the node acting again")
        back = await world.client(deaf, "back")
        back_producer = Numbered(back.sender(ADDRESS), base=2000)
        await world.until(lambda: back_producer.upto(5), timeout=TTL, what="accepted there again")

        accepted = cut.accepted_ids() | fine.accepted_ids() | back_producer.accepted_ids()
        assert accepted >= set(range(10)) | set(range(1000, 1010))
        reader = Consumer((await world.client(other, "reader")).receiver(ADDRESS, credit=CREDIT))

        def received() -> set:
            reader.step()
            return set(reader.ids())
        await world.until(lambda: received() >= accepted, timeout=10,
                          what="every accepted id")
        await world.close()

    run(play)


def test_a_node_cut_off_only_from_etcd_keeps_proxying_its_producers(tmp_path):
    """The same, with the node's peers answering: fenced, but its upstream connections hear
    the primary, so its clients keep their connections and their messages are accepted."""
    async def play():
        world = World(tmp_path)
        etcd, nodes = await etcd_cluster(world)
        primary = await make_primary(world, nodes, ADDRESS)
        cut_off = next(n for n in nodes if n != primary)
        client = await world.client(cut_off, "on-the-cut-node")
        producer = Numbered(client.sender(ADDRESS))
        await world.until(lambda: producer.upto(10), what="accepted")

        nodes[cut_off].coordinator.store.deafen()
        await world.until(lambda: not nodes[cut_off].coordinator.acting(), timeout=2 * TTL,
                          what="the node fenced")
        for target in range(11, 11 + int(3 * TTL / 0.25)):  # one every 0.25 s for 3 leases
            await world.until(lambda: producer.upto(target), timeout=TTL,
                              what="accepted through the fenced node")
            await asyncio.sleep(0.25)
        assert not client.lost
        await world.close()

    run(play)


def test_a_consumer_proxied_to_a_peer_that_owes_nothing_goes_too(tmp_path):
    """Four nodes; the cut node proxies a producer to one primary and a consumer (of an empty
    queue: it is owed nothing, it waits for messages) to another. The producer's primary is
    found silent; the consumer's, unheard since the fence, is taken as silent with it, and
    the consumer's connection is reset in the same look, not a relay limit later."""
    async def play():
        world = World(tmp_path)
        etcd, nodes = await etcd_cluster(world, names="abcd")
        first = f"{ADDRESS}"
        primary_1 = placement(nodes, first)[0]
        second = next(f"orders.{i}" for i in range(100)
                      if placement(nodes, f"orders.{i}")[0] != primary_1)
        await make_primary(world, nodes, first)
        primary_2 = await make_primary(world, nodes, second)
        deaf = next(n for n in nodes if n not in (primary_1, primary_2))
        producing = await world.client(deaf, "producing")
        producer = Numbered(producing.sender(first))
        consuming = await world.client(deaf, "consuming")
        consuming.receiver(second, credit=CREDIT)
        await world.until(lambda: producer.upto(5), what="accepted")
        await world.quiet(1.0)

        loop = asyncio.get_running_loop()
        began = loop.time()
        nodes[deaf].coordinator.store.deafen()
        for node in nodes:
            if node != deaf:
                world.network.deafen(deaf, node)
        while not producing.lost:
            producer.upto(producer.sent + 1)
            await asyncio.sleep(0.1)
            assert loop.time() - began <= 2.5 * TTL, "the producer still connected"
        reset = loop.time()
        await world.until(lambda: consuming.lost, timeout=0.1, what="the consumer reset with it")
        assert reset - began <= TTL + TTL / 2 + 0.5
        await world.close()

    run(play)


def test_a_node_cut_off_from_its_peers_not_from_etcd_sends_its_clients_away(tmp_path):
    """Finding 17: a node cut off from both peers, still on etcd, is not fenced. Its producer,
    proxied to the primary elsewhere, waited for the whole cut. Every other live member owing
    it an answer and none heard for a lease: it is the one cut off, and its client's
    connection is reset (new ones are refused) while the producer on another node goes on."""
    async def play():
        world = World(tmp_path)
        etcd, nodes = await etcd_cluster(world)
        primary = await make_primary(world, nodes, ADDRESS)
        cut_off, other = [n for n in nodes if n != primary]
        cut_client = await world.client(cut_off, "on-the-cut-node")
        cut = Numbered(cut_client.sender(ADDRESS))
        fine = Numbered((await world.client(other, "elsewhere")).sender(ADDRESS), base=1000)
        await world.until(lambda: cut.upto(10) and fine.upto(10), what="accepted through both")

        loop = asyncio.get_running_loop()
        began = loop.time()
        for node in nodes:
            if node != cut_off:
                world.network.partition(cut_off, node)

        async def keep_sending() -> None:  # as a producer does: what it sends is owed an answer
            while not cut_client.lost:
                cut.upto(cut.sent + 1)
                await asyncio.sleep(0.1)
        sending = asyncio.ensure_future(keep_sending())
        await world.until(lambda: cut_client.lost, timeout=3 * TTL, what="the client reset")
        assert loop.time() - began <= TTL + 1.0, loop.time() - began
        await sending
        # the primary drops the silent backup after a lease (the queue's gap), and goes on
        await world.until(lambda: fine.upto(30), timeout=TTL + 2, what="accepted elsewhere")
        assert cut.sender.closed_with is None
        assert service(nodes[cut_off]).isolation.isolations == 1
        _, again = await world.network.host("again").connect(lambda: PlaybookClient("again"),
                                                              cut_off, 5672)
        await world.until(lambda: again.lost, timeout=1.0, what="a new client turned away")
        await world.close()

    run(play)


def test_a_paused_peer_does_not_make_a_node_think_itself_cut_off(tmp_path):
    """One peer silent (the primary, paused: cut off from everything, etcd too), the other
    heard: the node keeps its clients; the queue moves by etcd and its producer goes on."""
    async def play():
        world = World(tmp_path)
        etcd, nodes = await etcd_cluster(world)
        primary = await make_primary(world, nodes, ADDRESS)
        watcher, other = [n for n in nodes if n != primary]
        client = await world.client(watcher, "producer")
        producer = Numbered(client.sender(ADDRESS))
        busy = Numbered((await world.client(other, "other")).sender(ADDRESS), base=1000)
        await world.until(lambda: producer.upto(10) and busy.upto(10), what="accepted")
        for node in nodes:
            if node != primary:
                world.network.partition(primary, node)
        nodes[primary].coordinator.store.partition()
        for target in range(11, 11 + int(3 * TTL / 0.1)):
            producer.upto(target)
            busy.upto(1000 + target)
            await asyncio.sleep(0.1)
        await world.until(lambda: producer.upto(producer.sent), timeout=TTL, what="accepted")
        assert not client.lost
        assert service(nodes[watcher]).isolation.isolations == 0
        await world.close()

    run(play)


def test_the_primary_cut_off_from_its_peers_does_not_make_the_others_think_themselves_cut_off(
        tmp_path):
    """The primary cut off from both peers (on etcd, alive), with no producer of its own: it
    has nothing waiting, so it sees nothing wrong. The two other nodes, each with a producer
    it proxies there, find it silent; each asks the other peer (a ping), which answers: the
    primary is the one cut off, not them, and they keep their clients. Each says in etcd it
    cannot reach the primary; named by every other member, the primary stands aside, a backup
    takes over, and both producers go on (docs/nemesis.md, finding 12)."""
    async def play():
        world = World(tmp_path)
        etcd, nodes = await etcd_cluster(world)
        primary = await make_primary(world, nodes, ADDRESS)
        watcher, other = [n for n in nodes if n != primary]
        client = await world.client(watcher, "producer")
        producer = Numbered(client.sender(ADDRESS))
        second_client = await world.client(other, "second")
        second = Numbered(second_client.sender(ADDRESS), base=1000)
        await world.until(lambda: producer.upto(10) and second.upto(10), what="accepted")
        loop = asyncio.get_running_loop()
        cut = loop.time()
        for node in nodes:
            if node != primary:
                world.network.partition(primary, node)
        for target in range(11, 11 + int(3 * TTL / 0.1)):
            producer.upto(target)
            second.upto(target)
            await asyncio.sleep(0.1)
            if new_primary(nodes, primary) is not None:
                break
        assert new_primary(nodes, primary) is not None
        assert loop.time() - cut <= TTL + 2
        assert view(nodes[primary], ADDRESS)["stood_aside"] == 1
        first, then = producer.sent + 5, second.sent + 5
        await world.until(lambda: producer.upto(first) and second.upto(then),
                          timeout=TTL, what="accepted by the new primary")
        assert not client.lost and not second_client.lost
        assert service(nodes[watcher]).isolation.isolations == 0
        assert service(nodes[other]).isolation.isolations == 0
        await world.close()

    run(play)
