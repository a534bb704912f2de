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
from test_failover_links import Numbered
from test_replication_playbooks import CREDIT, TTL, Consumer, etcd_cluster, make_primary, placement

pytestmark = pytest.mark.timeout(60)
ADDRESS = "orders.x"


def deafen(world, nodes: dict, name: str) -> None:
    """A one-way partition of node ``name``: what it sends arrives (to etcd and to its peers),
    nothing comes back."""
    nodes[name].coordinator.store.deafen()
    for node in nodes:
        if node != name:
            world.network.deafen(name, node)


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
        deafen(world, nodes, deaf)
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
        deafen(world, nodes, deaf)
        while not producing.lost:
            producer.upto(producer.sent + 1)
            await asyncio.sleep(0.1)
            assert loop.time() - began <= 2.5 * TTL, "the producer still connected"
        reset = loop.time()
        await world.until(lambda: consuming.lost, timeout=0.1, what="the consumer reset with it")
        assert reset - began <= TTL + TTL / 2 + 0.5
        await world.close()

    run(play)
