"""Paging of replicated queues (issue #44, docs/paging.md): a primary pages its waiting
messages as any queue does; a backup's catch-up reads them from the page store, leaving
them there; a backup promoted with a backlog pages it as the new primary.

On the virtual clock, with the page store's I/O on the loop; checked as a user would: every
id once, in order, bodies intact, and memory for bodies near the budget.
"""

from __future__ import annotations

import os

import pytest
from memory_etcd import MemoryEtcd
from playbook import World, run
from proton import Message
from test_replication_playbooks import TTL, lose_node, make_primary, service, view

from proxy.queues.runs import RunQueue

pytestmark = pytest.mark.timeout(60)

BUDGET = 20_000
PAGING = {"io_thread": False, "read_ahead": 8, "segment_size": 16384}
RULE = {"name": "orders", "match": "orders.*", "kind": "replicated", "replicas": 3}


def in_runs(queue) -> int:
    """Messages of ``queue`` in runs on disk (no object each)."""
    return queue.messages.count if type(queue.messages) is RunQueue else 0


def body(i: int) -> str:
    return f"{i}:" + "x" * 1000


async def fill(world: World, sender, count: int) -> None:
    for i in range(count):
        await world.until(lambda: sender.credit > 0, what=f"credit for message {i}")
        sender.send(body(i), message_id=i)
    await world.until(lambda: sender.accepted() == count, what=f"{count} accepted")


async def drain(world: World, client, address: str, count: int) -> list:
    receiver = client.receiver(address)
    while len(receiver.received) < count:
        receiver.flow(10)
        got = len(receiver.received)
        await world.until(lambda: len(receiver.received) >= min(count, got + 10),
                          what=f"{min(count, got + 10)} of {count}")
        receiver.settle()
    await world.quiet(0.2)
    for message, _ in receiver.received:
        assert message.body == body(message.id), "a body came back changed"
    return [message.id for message, _ in receiver.received]


async def paging_cluster(world: World) -> dict:
    """Nodes a, b, c on an etcd in memory, each with a budget of about 20 messages."""
    etcd = MemoryEtcd()
    return {name: await world.node(name, etcd=etcd, rules=[RULE], limits={"max_memory": BUDGET},
                                   paging=PAGING,
                                   cluster={"etcd": ["http://memory:2379"], "lease_ttl": TTL})
            for name in "abc"}


def test_a_late_backup_catches_up_from_a_paged_primary_without_loading_it(tmp_path):
    rule = {**RULE, "replicas": 2, "nodes": ["a", "b"]}
    peers = {"a": "amqp://a:5672", "b": "amqp://b:5672"}

    async def play():
        world = World(tmp_path)
        a = await world.node("a", peers=peers, rules=[rule], limits={"max_memory": BUDGET},
                             paging=PAGING)
        producer = await world.client("a", "producer")
        sender = producer.sender("orders.x")
        await world.until(lambda: view(a, "orders.x").get("role") == "primary", what="primary")
        await fill(world, sender, 300)
        await world.quiet(0.05)
        queue = a.queues.get("orders.x")
        paged = queue.paged_count
        assert paged > 250
        assert in_runs(queue) > 250, "the primary's backlog is not in runs"
        assert len(service(a).addresses["orders.x"].primary.replica_set.index) < 50, \
            "the rid index names messages in runs"

        b = await world.node("b", peers=peers, rules=[rule])
        await world.until(lambda: view(b, "orders.x").get("copy", {}).get("in_sync"),
                          what="the backup in sync")
        image = service(b).addresses["orders.x"].backup.image
        assert image.depth == 300
        assert queue.paged_count == paged, "the catch-up loaded the paged messages"
        assert a.queues.memory.resident <= a.queues.memory.ceiling

        consumer = await world.client("a", "consumer")
        assert await drain(world, consumer, "orders.x", 300) == list(range(300))
        await world.until(lambda: not image.depth, what="the backup's copy emptied too")
        await world.close()

    run(play)


def test_a_backup_promoted_with_a_backlog_pages_it_and_every_id_arrives(tmp_path):
    async def play():
        world = World(tmp_path)
        nodes = await paging_cluster(world)
        primary = await make_primary(world, nodes, "orders.p")
        others = [n for n in "abc" if n != primary]
        producer = await world.client(others[0], "producer")
        await fill(world, producer.sender("orders.p"), 200)
        await world.quiet(0.05)
        assert nodes[primary].queues.get("orders.p").paged_count > 150
        assert in_runs(nodes[primary].queues.get("orders.p")) > 150, "the primary is not in runs"

        await lose_node(world, nodes, primary)
        await world.until(lambda: any(view(nodes[n], "orders.p").get("role") == "primary"
                                      for n in others), timeout=TTL + 3, what="a new primary")
        new = next(n for n in others if view(nodes[n], "orders.p").get("role") == "primary")
        await world.quiet(0.1)
        queue = nodes[new].queues.get("orders.p")
        assert queue.depth == 200 and queue.paged_count > 150, "the new primary does not page"
        assert nodes[new].queues.memory.resident <= nodes[new].queues.memory.ceiling

        consumer = await world.client(new, "consumer")
        assert await drain(world, consumer, "orders.p", 200) == list(range(200))
        await world.close()

    run(play)


def test_backups_page_their_copies_and_a_promoted_one_serves_from_disk(tmp_path, monkeypatch):
    """Every node with a small budget: the backups' copies go to disk as they come, the new
    primary's queue keeps them there in runs, not one record read at the promotion (read back
    as its consumer nears them), and every id arrives once, in order, with its body."""
    reads = []
    real = os.pread
    monkeypatch.setattr(os, "pread", lambda fd, *a: reads.append(fd) or real(fd, *a))

    async def play():
        world = World(tmp_path)
        nodes = await paging_cluster(world)
        primary = await make_primary(world, nodes, "orders.b")
        others = [n for n in "abc" if n != primary]
        producer = await world.client(primary, "producer")
        await fill(world, producer.sender("orders.b"), 300)
        await world.quiet(0.05)
        for name in others:
            image = service(nodes[name]).addresses["orders.b"].backup.image
            assert image.depth == 300
            pager = nodes[name].pager
            assert pager.image_runs_paged() > 250 * 1000, f"{name}'s copy is not in runs"
            assert len(image.messages) < 50 and image.run_count > 250
            assert pager.image_resident() <= BUDGET
        files = {segment.fd for name in others
                 for segment in nodes[name].pager.store.segments.values()}

        await lose_node(world, nodes, primary)
        await world.until(lambda: any(view(nodes[n], "orders.b").get("role") == "primary"
                                      for n in others), timeout=TTL + 3, what="a new primary")
        new = next(n for n in others if view(nodes[n], "orders.b").get("role") == "primary")
        queue = nodes[new].queues.get("orders.b")
        assert queue.depth == 300 and queue.paged_count > 250, "the promoted copy left the disk"
        assert in_runs(queue) > 250, "the new primary's backlog is not in runs"
        assert not files.intersection(reads), "the promotion read the copy's records"
        assert nodes[new].pager.image_paged == 0
        consumer = await world.client(new, "consumer")
        assert await drain(world, consumer, "orders.b", 300) == list(range(300))
        await world.until(lambda: nodes[new].pager.store.live_bytes == 0
                          and nodes[new].queues.memory.paged == 0, what="every record let go")
        await world.close()

    run(play)


def test_a_failover_with_deliveries_out_from_the_backups_runs_loses_no_id(tmp_path):
    """Every node with a small budget: the backups hold the backlog in runs; a consumer at
    the primary accepts the first 40 and holds 20 more unsettled (their acquires reach the
    backups' runs). The primary is lost: the new one serves every id not accepted once, in
    order, the 20 with their delivery-count raised; nothing else twice."""
    async def play():
        world = World(tmp_path)
        nodes = await paging_cluster(world)
        primary = await make_primary(world, nodes, "orders.r")
        others = [n for n in "abc" if n != primary]
        producer = await world.client(primary, "producer")
        await fill(world, producer.sender("orders.r"), 300)
        await world.quiet(0.05)
        for name in others:
            image = service(nodes[name]).addresses["orders.r"].backup.image
            assert image.run_count > 250, f"{name}'s copy is not in runs"

        consumer = await world.client(primary, "consumer")
        receiver = consumer.receiver("orders.r")
        receiver.flow(60)
        await world.until(lambda: len(receiver.received) == 60, what="60 delivered")
        receiver.settle(count=40)
        first = [message.id for message, _ in receiver.received]
        assert first == list(range(60))
        await world.quiet(0.2)  # the acquires and dequeues reach the backups
        for name in others:
            image = service(nodes[name]).addresses["orders.r"].backup.image
            assert image.depth == 260
            assert sum(len(run.acquired or ()) for run in image.runs) > 10, \
                "the unsettled deliveries are not marked in the runs"

        await lose_node(world, nodes, primary)
        await world.until(lambda: any(view(nodes[n], "orders.r").get("role") == "primary"
                                      for n in others), timeout=TTL + 3, what="a new primary")
        new = next(n for n in others if view(nodes[n], "orders.r").get("role") == "primary")
        queue = nodes[new].queues.get("orders.r")
        assert queue.depth == 260 and queue.paged_count > 200, "the new primary does not page"
        assert in_runs(queue) > 200, "the new primary's backlog is not in runs"
        again = await world.client(new, "again")
        receiver = again.receiver("orders.r")
        got = []
        while len(got) < 260:
            receiver.flow(10)
            await world.until(lambda: len(receiver.received) >= min(260, len(got) + 10),
                              what=f"{min(260, len(got) + 10)} of 260")
            got = [message for message, _ in receiver.received]
            receiver.settle()
        await world.quiet(0.2)
        assert [message.id for message in got] == list(range(40, 300)), "an id lost or twice"
        for message in got:
            assert message.body == body(message.id), "a body came back changed"
            assert (message.delivery_count >= 1) == (message.id < 60), message.id
        await world.until(lambda: nodes[new].pager.store.live_bytes == 0
                          and nodes[new].queues.memory.paged == 0, what="every record let go")
        await world.close()

    run(play)


def test_a_backup_dropped_and_caught_up_again_lets_its_old_runs_go(tmp_path):
    """Static pair, both with a small budget: the backup holds 300 messages in runs, is cut
    off (the primary goes on alone after catchup_timeout), then healed: its new catch-up
    lets the old runs' records go and brings all 400 back into runs, newest first; drained
    at the primary, the backup's copy and page store empty too."""
    rule = {**RULE, "replicas": 2, "nodes": ["a", "b"], "catchup_timeout": 4.0}
    peers = {"a": "amqp://a:5672", "b": "amqp://b:5672"}

    async def play():
        world = World(tmp_path)
        nodes = {n: await world.node(n, peers=peers, rules=[rule],
                                     limits={"max_memory": BUDGET}, paging=PAGING)
                 for n in "ab"}
        primary = await make_primary(world, nodes, "orders.c")
        backup = "b" if primary == "a" else "a"
        producer = await world.client(primary, "producer")
        sender = producer.sender("orders.c")
        await fill(world, sender, 300)
        await world.quiet(0.05)
        image = service(nodes[backup]).addresses["orders.c"].backup.image
        store = nodes[backup].pager.store
        assert image.run_count > 250
        before = store.live_bytes

        world.network.partition(primary, backup)
        for i in range(300, 400):
            await world.until(lambda: sender.credit > 0, timeout=10, what=f"credit for {i}")
            sender.send(body(i), message_id=i)
        await world.until(lambda: sender.accepted() == 400, timeout=15, what="accepted alone")
        world.network.heal(primary, backup)
        await world.until(lambda: view(nodes[backup], "orders.c").get("copy", {}).get("in_sync")
                          and image.depth == 400, timeout=15, what="caught up again")
        await world.quiet(0.05)
        assert image.run_count > 350, "the new catch-up is not in runs"
        assert store.live_bytes < before * 400 / 300 * 1.1, "the old runs' records stayed live"

        consumer = await world.client(primary, "consumer")
        assert await drain(world, consumer, "orders.c", 400) == list(range(400))
        await world.until(lambda: image.depth == 0 and store.live_bytes == 0,
                          what="the backup's copy and records let go")
        await world.close()

    run(play)


def test_a_backup_caught_up_from_the_primarys_runs_takes_over_and_loses_no_id(tmp_path):
    """Every node with a small budget, catchup_timeout 4 s: backup x is cut off while 150
    more messages arrive (the primary's backlog in runs, its rid index small); healed, x
    catches up from the primary's runs while a consumer accepts 50; then the other backup
    and the primary are lost: x serves every id not accepted, once, in order."""
    rule = {**RULE, "catchup_timeout": 4.0}

    async def play():
        world = World(tmp_path)
        etcd = MemoryEtcd()
        nodes = {name: await world.node(name, etcd=etcd, rules=[rule],
                                        limits={"max_memory": BUDGET}, paging=PAGING,
                                        cluster={"etcd": ["http://memory:2379"],
                                                 "lease_ttl": TTL})
                 for name in "abc"}
        primary = await make_primary(world, nodes, "orders.t")
        x, y = [n for n in "abc" if n != primary]
        producer = await world.client(primary, "producer")
        sender = producer.sender("orders.t")
        await fill(world, sender, 150)
        world.network.partition(primary, x)
        for i in range(150, 300):
            await world.until(lambda: sender.credit > 0, timeout=10, what=f"credit for {i}")
            sender.send(body(i), message_id=i)
        await world.until(lambda: sender.accepted() == 300, timeout=15, what="300 accepted")
        await world.quiet(0.05)
        queue = nodes[primary].queues.get("orders.t")
        assert in_runs(queue) > 250, "the primary's backlog is not in runs"
        replica_set = service(nodes[primary]).addresses["orders.t"].primary.replica_set
        assert len(replica_set.index) < 50, "the rid index names messages in runs"

        world.network.heal(primary, x)
        consumer = await world.client(primary, "consumer")
        receiver = consumer.receiver("orders.t")
        receiver.flow(50)
        await world.until(lambda: len(receiver.received) == 50, what="50 delivered")
        receiver.settle()
        image = service(nodes[x]).addresses["orders.t"].backup.image
        await world.until(lambda: view(nodes[x], "orders.t").get("copy", {}).get("in_sync")
                          and image.depth == 250, timeout=15, what="x caught up")
        receiver.link.close()
        consumer.flush()

        await lose_node(world, nodes, y)
        await world.until(lambda: y not in view(nodes[primary], "orders.t").get("in_sync", [y]),
                          timeout=TTL + 5, what=f"{y} out of the in-sync set")
        await lose_node(world, nodes, primary)
        await world.until(lambda: view(nodes[x], "orders.t").get("role") == "primary",
                          timeout=TTL + 5, what="x the new primary")
        again = await world.client(x, "again")
        assert await drain(world, again, "orders.t", 250) == list(range(50, 300))
        await world.close()

    run(play)


def test_a_new_primary_in_runs_is_caught_up_from_them_and_fails_over_again(tmp_path):
    """Every node with a small budget: the primary is lost and the new one keeps the copy's
    runs; the third node catches up from those runs while a consumer accepts 50 there; then
    the new primary is lost too: the third serves the other 250 from its own runs, once,
    in order."""
    async def play():
        world = World(tmp_path)
        nodes = await paging_cluster(world)
        primary = await make_primary(world, nodes, "orders.f")
        producer = await world.client(primary, "producer")
        await fill(world, producer.sender("orders.f"), 300)
        await world.quiet(0.05)
        others = [n for n in "abc" if n != primary]
        await lose_node(world, nodes, primary)
        await world.until(lambda: any(view(nodes[n], "orders.f").get("role") == "primary"
                                      for n in others), timeout=TTL + 3, what="a new primary")
        new = next(n for n in others if view(nodes[n], "orders.f").get("role") == "primary")
        third = next(n for n in others if n != new)
        queue = nodes[new].queues.get("orders.f")
        assert in_runs(queue) > 250, "the new primary's backlog is not in runs"

        consumer = await world.client(new, "consumer")
        receiver = consumer.receiver("orders.f")
        receiver.flow(50)
        await world.until(lambda: len(receiver.received) == 50, what="50 delivered")
        receiver.settle()
        image = service(nodes[third]).addresses["orders.f"].backup.image
        await world.until(lambda: view(nodes[third], "orders.f").get("copy", {}).get("in_sync")
                          and image.depth == 250, timeout=TTL + 10, what="the third caught up")
        assert image.run_count > 200, "the third's copy is not in runs"
        receiver.link.close()
        consumer.flush()
        await world.quiet(0.1)

        await lose_node(world, nodes, new)
        await world.until(lambda: view(nodes[third], "orders.f").get("role") == "primary",
                          timeout=TTL + 5, what="the third the primary")
        assert in_runs(nodes[third].queues.get("orders.f")) > 200
        again = await world.client(third, "again")
        assert await drain(world, again, "orders.f", 250) == list(range(50, 300))
        await world.until(lambda: nodes[third].pager.store.live_bytes == 0,
                          what="every record let go")
        await world.close()

    run(play)


def test_a_durable_copy_promoted_in_runs_lets_every_journal_record_go(tmp_path):
    """Durable messages on every node with a journal and a small budget: the new primary
    keeps the copy's runs with the journal ids its copy wrote; drained, in order, its
    journal holds no live record and its page store none."""
    rule = {**RULE, "durable": True}
    journal = {"fsync": False, "segment_size": 16384}

    async def play():
        world = World(tmp_path)
        etcd = MemoryEtcd()
        nodes = {name: await world.node(name, etcd=etcd, rules=[rule], journal=journal,
                                        limits={"max_memory": BUDGET}, paging=PAGING,
                                        queues={"durable": True},
                                        cluster={"etcd": ["http://memory:2379"],
                                                 "lease_ttl": TTL})
                 for name in "abc"}
        primary = await make_primary(world, nodes, "orders.d")
        producer = await world.client(primary, "producer")
        sender = producer.sender("orders.d")
        for i in range(200):
            await world.until(lambda: sender.credit > 0, what=f"credit for message {i}")
            sender.link.delivery(f"d{i}")
            sender.link.send(Message(body=body(i), id=i, durable=True).encode())
            sender.link.advance()
            producer.flush()
        await world.until(lambda: sender.accepted() == 200, what="200 accepted")
        await world.quiet(0.05)
        others = [n for n in "abc" if n != primary]
        for name in others:
            assert nodes[name].broker.journal.live >= 200, f"{name}'s copy is not journaled"
        await lose_node(world, nodes, primary)
        await world.until(lambda: any(view(nodes[n], "orders.d").get("role") == "primary"
                                      for n in others), timeout=TTL + 3, what="a new primary")
        new = next(n for n in others if view(nodes[n], "orders.d").get("role") == "primary")
        assert in_runs(nodes[new].queues.get("orders.d")) > 150, "the new primary is not in runs"
        consumer = await world.client(new, "consumer")
        assert await drain(world, consumer, "orders.d", 200) == list(range(200))
        await world.until(lambda: nodes[new].broker.journal.live == 0
                          and nodes[new].pager.store.live_bytes == 0,
                          what="every journal record and page record let go")
        await world.close()

    run(play)
