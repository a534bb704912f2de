"""A primary with ``min_in_sync = 1`` that hears none of its backups: gone, or is it cut off?
(issue #42, docs/nemesis.md finding 12; docs/replication.md, 5b), on a virtual clock.

Silent backups used to be dropped after a lease, and the primary went on alone. Right when
they are gone; wrong when the primary is the one cut off from its peers but not from etcd:
every other node's clients then reached nothing for the whole cut (the nemesis: 6.2 s without
an acceptance for a 6.1 s cut). Now, at a lease and a margin of silence, backups that still
hold their leases and a primary that heard no other peer meanwhile mean this primary is cut
off: it stands aside (fenced, its claim released, its copy kept) and an in-sync backup takes
over; if none does within two leases, it claims again with what it kept.
"""

from __future__ import annotations

import asyncio

import pytest

from playbook import World, run
from test_failover_links import Numbered, new_primary
from test_replication_playbooks import (CREDIT, TTL, Consumer, etcd_cluster, make_primary,
                                        placement, service, view)

pytestmark = pytest.mark.timeout(60)
ADDRESS = "orders.x"
RULE = {"name": "orders", "match": "orders.*", "kind": "replicated", "replicas": 3,
        "catchup_timeout": 10.0}


async def read_all(world, node: str, wanted: set) -> None:
    reader = Consumer((await world.client(node, "reader")).receiver(ADDRESS, credit=CREDIT))

    def received() -> set:
        reader.step()
        return set(reader.ids())
    await world.until(lambda: received() >= wanted, timeout=10, what="every accepted id")


def test_a_primary_cut_off_from_its_peers_stands_aside_and_a_backup_serves(tmp_path):
    """The primary partitioned from both backups (both alive, both on etcd): within
    lease_ttl + 2 s a backup serves and a producer on another node is accepted again; the
    old primary's own client is sent to its failover list (a reset); nothing accepted is lost.
    (Before: the primary dropped its backups and went on alone, serving only its own
    clients, and the producer elsewhere waited for the whole cut.)"""
    async def play():
        world = World(tmp_path)
        etcd, nodes = await etcd_cluster(world, rule=RULE)
        primary = await make_primary(world, nodes, ADDRESS)
        other = next(n for n in nodes if n != primary)
        pump = Numbered((await world.client(other, "producer")).sender(ADDRESS))
        local_client = await world.client(primary, "local-producer")
        local = Numbered(local_client.sender(ADDRESS), base=1000)
        await world.until(lambda: pump.upto(20) and local.upto(5), what="accepted")

        loop = asyncio.get_running_loop()
        cut = loop.time()
        for node in nodes:
            if node != primary:
                world.network.partition(primary, node)
        local.upto(6)  # waits on the primary: no backup takes it
        await world.until(lambda: pump.upto(21) and new_primary(nodes, primary) is not None,
                          timeout=TTL + 2, what="accepted again, by a new primary")
        assert loop.time() - cut <= TTL + 2
        assert view(nodes[primary], ADDRESS)["stood_aside"] == 1
        await world.until(lambda: local_client.lost, timeout=1.0, what="the local client reset")
        assert local.sender.closed_with is None  # its connection, never its link alone
        await world.until(lambda: pump.upto(40), timeout=10, what="40 accepted")
        await read_all(world, other, pump.accepted_ids() | local.accepted_ids())
        await world.close()

    run(play)


def test_backups_that_are_gone_are_dropped_and_the_primary_goes_on_alone(tmp_path):
    """Both backups gone (cut off from everything, etcd too: their leases end, and they leave
    the replica set): the primary goes on alone within lease_ttl + 2 s (it waited for
    catchup_timeout, 10 s, before issue #42), as before this change, and never stands aside."""
    async def play():
        world = World(tmp_path)
        etcd, nodes = await etcd_cluster(world, rule=RULE)
        primary = await make_primary(world, nodes, ADDRESS)
        local = Numbered((await world.client(primary, "local-producer")).sender(ADDRESS))
        await world.until(lambda: local.upto(5), what="accepted")

        loop = asyncio.get_running_loop()
        cut = loop.time()
        backups = [n for n in nodes if n != primary]
        for node in backups:
            nodes[node].coordinator.store.partition()
            for peer in nodes:
                if peer != node:
                    world.network.partition(node, peer)
        await world.until(lambda: local.upto(6), timeout=TTL + 2, what="accepted alone")
        assert loop.time() - cut <= TTL + 2
        assert view(nodes[primary], ADDRESS)["role"] == "primary"
        assert view(nodes[primary], ADDRESS)["stood_aside"] == 0
        await read_all(world, primary, local.accepted_ids())
        await world.close()

    run(play)


def test_a_backup_cut_off_while_the_primary_hears_another_node_is_dropped(tmp_path):
    """replicas = 2 of three nodes: the only backup cut off from its peers (alive, on etcd).
    The primary hears the third node (its producer's link comes through it): the backup is
    the one cut off. It is dropped, the primary goes on, and never stands aside."""
    rule = {**RULE, "replicas": 2}

    async def play():
        world = World(tmp_path)
        etcd, nodes = await etcd_cluster(world, rule=rule)
        primary = await make_primary(world, nodes, ADDRESS)
        backup = placement(nodes, ADDRESS)[1]
        third = next(n for n in nodes if n not in (primary, backup))
        pump = Numbered((await world.client(third, "producer")).sender(ADDRESS))
        await world.until(lambda: pump.upto(10), what="accepted")

        loop = asyncio.get_running_loop()
        cut = loop.time()
        world.network.partition(backup, primary)
        world.network.partition(backup, third)
        target = 10
        while loop.time() - cut < TTL + 2:  # a steady producer: the primary keeps hearing it
            target += 1
            pump.upto(target)
            await asyncio.sleep(0.1)
        await world.until(lambda: pump.upto(target), timeout=1.0, what="accepted by the primary")
        assert view(nodes[primary], ADDRESS)["role"] == "primary"
        assert view(nodes[primary], ADDRESS)["stood_aside"] == 0
        assert view(nodes[backup], ADDRESS).get("role") != "primary"
        await world.close()

    run(play)


def test_a_primary_that_stood_aside_claims_again_with_its_copy_when_no_backup_does(tmp_path):
    """It stood aside, and no backup claimed (as when their leases outlived them a little,
    e.g. an etcd leader change): after two leases it claims the queue again with the copy it
    kept. Every message accepted before is still there."""
    async def play():
        world = World(tmp_path)
        etcd, nodes = await etcd_cluster(world, rule=RULE)
        primary = await make_primary(world, nodes, ADDRESS)
        backups = [n for n in nodes if n != primary]
        local = Numbered((await world.client(primary, "local-producer")).sender(ADDRESS))
        await world.until(lambda: local.upto(10), what="accepted")
        for node in backups:  # they will not claim
            entry = service(nodes[node]).entries["queue/" + ADDRESS]
            entry._eligible = lambda record: False

        for node in backups:
            world.network.partition(primary, node)
        local.upto(11)
        await world.until(lambda: view(nodes[primary], ADDRESS).get("stood_aside") == 1,
                          timeout=2 * TTL, what="stood aside")
        await world.until(lambda: view(nodes[primary], ADDRESS).get("role") == "primary",
                          timeout=3 * TTL, what="the same node primary again")
        for node in backups:
            world.network.heal(primary, node)
        # serving again, it lets clients in again at once (no longer stood aside)
        assert not service(nodes[primary]).silent_peers.isolated
        await read_all(world, primary, local.accepted_ids() | set(range(10)))
        await world.close()

    run(play)


@pytest.mark.parametrize("min_in_sync", [1, 2])
def test_a_primary_cut_off_with_nothing_waiting_on_it_stands_aside(tmp_path, min_in_sync):
    """The same cut, with every producer of the queue on other nodes (docs/nemesis.md, finding
    17): nothing waits on the primary, so no unanswered batch told it that its backups are
    silent, and it held the queue for the whole cut while the producers elsewhere waited
    (the nemesis: 7-9 s for a 6 s cut). Now a primary whose queue has clients sends an idle
    in-sync backup an empty batch every ``KEEPALIVE``: unanswered, the silence is seen as with
    a producer waiting, and it stands aside; a backup serves within lease_ttl + 2 s."""
    rule = {**RULE, "min_in_sync": min_in_sync}

    async def play():
        world = World(tmp_path)
        etcd, nodes = await etcd_cluster(world, rule=rule)
        primary = await make_primary(world, nodes, ADDRESS)
        others = [n for n in nodes if n != primary]
        pumps = [Numbered((await world.client(n, f"producer-{n}")).sender(ADDRESS),
                          base=1000 * i) for i, n in enumerate(others)]
        await world.until(lambda: all(p.upto(10) for p in pumps), what="accepted")
        await world.quiet(2.0)  # idle: nothing waits anywhere

        loop = asyncio.get_running_loop()
        cut = loop.time()
        for node in others:
            world.network.partition(primary, node)
        await world.until(lambda: all(p.upto(11) for p in pumps) and
                          new_primary(nodes, primary) is not None,
                          timeout=TTL + 2, what="accepted again, by a new primary")
        assert loop.time() - cut <= TTL + 2
        assert view(nodes[primary], ADDRESS)["stood_aside"] == 1
        await world.until(lambda: all(p.upto(30) for p in pumps), timeout=10, what="30 each")
        for node in others:
            world.network.heal(primary, node)
        await read_all(world, others[0], set().union(*(p.accepted_ids() for p in pumps)))
        await world.close()

    run(play)


def test_idle_queues_with_no_client_send_one_keepalive_per_backup_node_not_per_queue(tmp_path):
    """Nobody uses the queues: an idle cluster of many queues sends each backup node at most
    one empty batch a look (LAG_CHECK, 0.5 s), whatever the number of queues (finding 29: a
    backup's silence must be known before a producer comes, and it is its node's)."""
    addresses = [f"orders.q{i}" for i in range(8)]

    async def play():
        world = World(tmp_path)
        etcd, nodes = await etcd_cluster(world, rule=RULE)
        for address in addresses:
            await make_primary(world, nodes, address)
        for client in world.clients:  # make_primary's starters go
            client.connection.close()
            client.flush()
        await world.quiet(1.0)
        pairs = [(a, b) for a in nodes for b in nodes if a != b]
        before = {pair: len(world.frames(*pair, "transfer")) for pair in pairs}
        await world.quiet(5.0)
        sent = {pair: len(world.frames(*pair, "transfer")) - before[pair] for pair in pairs}
        assert all(count <= 11 for count in sent.values()), sent  # 5 s / 0.5 s, and one
        assert sum(sent.values()) <= 11 * len(pairs), sent  # not 8 queues' worth
        for address in addresses:  # and nobody was dropped or stood aside
            primary = placement(nodes, address)[0]
            state = view(nodes[primary], address)
            assert state["role"] == "primary" and state["stood_aside"] == 0
            assert len(state["in_sync"]) == 2
        await world.close()

    run(play)


def test_an_idle_queue_with_clients_keeps_its_primary_and_its_backups(tmp_path):
    """Clients attached (a consumer on each node, a producer with nothing to send), nothing
    sent for ten leases: the keepalives are answered, nobody stands aside or is dropped."""
    async def play():
        world = World(tmp_path)
        etcd, nodes = await etcd_cluster(world, rule=RULE)
        primary = await make_primary(world, nodes, ADDRESS)
        for node in nodes:
            (await world.client(node, f"consumer-{node}")).receiver(ADDRESS, credit=CREDIT)
        before = {n: len(world.frames(primary, n, "transfer")) for n in nodes if n != primary}
        await world.quiet(10 * TTL)
        after = {n: len(world.frames(primary, n, "transfer")) for n in nodes if n != primary}
        assert all(after[n] - before[n] >= 10 for n in after), (before, after)  # keepalives
        state = view(nodes[primary], ADDRESS)
        assert state["role"] == "primary" and state["stood_aside"] == 0
        assert sorted(state["in_sync"]) == sorted(n for n in nodes if n != primary)
        await world.close()

    run(play)


@pytest.mark.parametrize("busy_with", ["the same backup", "another backup"])
def test_a_backup_silent_on_one_queue_is_dropped_at_once_from_an_idle_one_that_sends(tmp_path,
                                                                                      busy_with):
    """Finding 29 (docs/nemesis.md): a node's silence is the node's, not one queue's. Two queues
    with the same primary and the same only backup; the backup is cut off from its peers (alive,
    on etcd). The busy queue drops it after a lease and a margin, as 5b says. The other queue
    had no client, so it sent the backup nothing and owed nothing: when a producer came to it
    later, its silence began only with that first batch, and the producer waited another
    lease and margin (the nemesis: 6.1 s without an acceptance for a 6 s cut, allowed 5). Now
    the backup's silence on the node's other queues counts: it is dropped within a look or two.
    With "another backup" the primary's busy queue is backed up by the third node, so nothing
    of the primary's had dropped the silent one: its keepalive per backup node (sent though
    the idle queue has no client) shows the silence, and the primary hears the third node.)"""
    rule = {**RULE, "replicas": 2}

    async def play():
        world = World(tmp_path)
        etcd, nodes = await etcd_cluster(world, rule=rule)
        primary, backup = placement(nodes, ADDRESS)
        idle = next(a for a in (f"orders.y{i}" for i in range(100))
                    if placement(nodes, a) == [primary, backup])
        third = next(n for n in nodes if n not in (primary, backup))
        busy = ADDRESS if busy_with == "the same backup" else next(
            a for a in (f"orders.z{i}" for i in range(100)) if placement(nodes, a) == [primary, third])
        await make_primary(world, nodes, busy)
        starter = await world.client(primary, "idle-starter")
        link = starter.receiver(idle)
        await world.until(lambda: view(nodes[primary], idle).get("role") == "primary"
                          and view(nodes[primary], idle).get("in_sync") == [backup],
                          what="the idle queue's primary, its backup in sync")
        link.link.close()  # the idle queue has no client now
        starter.flush()
        pump = Numbered((await world.client(third, "producer")).sender(busy))
        await world.until(lambda: pump.upto(10), what="accepted")

        loop = asyncio.get_running_loop()
        cut = loop.time()
        world.network.partition(backup, primary)
        world.network.partition(backup, third)
        target = 10
        while loop.time() - cut < TTL + 2:  # the busy queue goes on (drops its silent backup)
            target += 1
            pump.upto(target)
            await asyncio.sleep(0.1)
        await world.until(lambda: pump.upto(target), timeout=1.0, what="accepted by the primary")
        assert view(nodes[primary], idle)["in_sync"] == [backup]  # nothing waited on it so far

        late = Numbered((await world.client(third, "late-producer")).sender(idle), base=1000)
        came = loop.time()
        while not late.upto(5):  # the busy queue's producer goes on: the third node is heard
            assert loop.time() - came <= TTL, "the idle queue accepted nothing"
            target += 1
            pump.upto(target)
            await asyncio.sleep(0.1)
        assert loop.time() - came <= 1.5, f"waited {loop.time() - came:.2f} s"
        assert view(nodes[primary], idle)["role"] == "primary"
        assert view(nodes[primary], idle)["stood_aside"] == 0
        await world.close()

    run(play)
