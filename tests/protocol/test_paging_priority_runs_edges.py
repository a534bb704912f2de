"""A priority queue in runs at its edges (docs/paging.md, "A priority queue in runs"): drop-head,
the delivery limit, lower levels' heads passed by higher ones, a durable queue's journal and
restart, a queue class without runs per level, and the admin API's take. The harness and the
way each test checks what a user would are those of ``test_paging_priority_runs.py``.
"""

from __future__ import annotations

import pytest
from proton import Delivery
from test_paging import BUDGET, READ_AHEAD, ids_of, paging_node, take
from test_paging_priority_runs import all_back, in_memory_order, in_runs, nodes, plan, send

from playbook import World, run

from proxy.broker import operations
from proxy.queues.level_runs import LevelRuns
from proxy.queues.runs import RunQueue

pytestmark = pytest.mark.timeout(60)


def test_drop_head_takes_the_highest_level_s_head_out_of_its_runs(tmp_path):
    """Overflow drop-head at a priority queue in runs drops what the in-memory queue drops
    (the head of the highest level: its first run's front loaded at once)."""
    async def play():
        world = World(tmp_path)
        paged, plain, ca, cb = await nodes(world, max_bytes=150_000, overflow="drop-head")
        steps = plan(400, seed=31, levels=(2, 4, 7))
        got = {}
        for name, client in (("a", ca), ("b", cb)):
            await send(world, client.sender("prio"), steps)
            await world.quiet(0.05)
            queue = (paged if name == "a" else plain).queues.get("prio")
            kept = queue.depth
            assert 100 < kept < 150 and queue.stats.dropped == 400 - kept
            if name == "a":
                assert in_runs(queue) > 50 and type(queue.messages) is LevelRuns
            got[name] = ids_of(await take(world, client.receiver("prio"), kept, credit=1))
        assert got["a"] == got["b"]
        await world.quiet(0.1)
        all_back(paged, paged.queues.get("prio"))
        await world.close()

    run(play)


def test_the_delivery_limit_dead_letters_a_message_of_a_level_with_runs(tmp_path):
    async def play():
        world = World(tmp_path)
        node = await paging_node(world, queue=[{"name": "prio", "delivery_limit": 2,
                                                "dead_letter": "dlq"}])
        client = await world.client("a")
        steps = plan(200, seed=37, levels=(3, 5))
        await send(world, client.sender("prio"), steps)
        await world.quiet(0.05)
        queue = node.queues.get("prio")
        assert in_runs(queue) > 150
        order = in_memory_order(steps)
        for attempt in range(2):  # the first five fail twice: out at the limit
            failing = client.receiver("prio", credit=5)
            await world.until(lambda: len(failing.received) == 5, what="5 out")
            assert sorted(ids_of(failing)) == sorted(order[:5])  # back one by one, at the head
            for _, delivery in failing.received:
                delivery.local.failed = True
                delivery.update(Delivery.MODIFIED)
                delivery.settle()
            client.flush()
            failing.link.close()
            client.flush()
            await world.quiet(0.05)
        assert queue.stats.delivery_limited == 5 and queue.depth == 195
        dead = ids_of(await take(world, client.receiver("dlq"), 5, credit=5))
        assert sorted(dead) == sorted(order[:5])
        got = ids_of(await take(world, client.receiver("prio"), 195, credit=15))
        assert got == order[5:]
        await world.quiet(0.1)
        all_back(node, queue)
        await world.close()

    run(play)


def test_heads_of_lower_levels_read_back_then_passed_by_higher_ones_go_back_to_disk(tmp_path):
    """A level read back (its head filled by the read-ahead) and then passed by a higher
    level keeps that head past the queue's window: nine such heads would hold more than the
    budget. They are written as a run before the level's first (docs/paging.md)."""
    async def play():
        world = World(tmp_path)
        node = await paging_node(world)
        client = await world.client("a")
        sender = client.sender("prio")
        receiver = client.receiver("prio")
        steps = []
        for priority in range(1, 10):  # each level read back a little, then passed
            batch = [(priority * 100 + i, priority) for i in range(60)]
            steps += batch
            await send(world, sender, batch)
            await world.quiet(0.05)
            before = len(receiver.received)
            receiver.flow(2)
            await world.until(lambda: len(receiver.received) == before + 2, what="2 more")
            receiver.settle()
        await world.quiet(0.1)
        queue = node.queues.get("prio")
        heads = sum(len(level.head) for level in queue.messages.levels)
        assert node.queues.memory.resident <= BUDGET, \
            f"{heads} messages in the levels' heads hold the memory"
        taken = ids_of(receiver)
        rest = ids_of(await take(world, client.receiver("prio"), len(steps) - 18, credit=20))
        assert sorted(taken + rest) == sorted(i for i, _ in steps)
        assert rest == [i for i in in_memory_order(steps) if i not in set(taken)]
        await world.quiet(0.1)
        all_back(node, queue)
        await world.close()

    run(play)


def test_a_durable_priority_queue_in_runs_dequeues_its_journal_and_restarts_in_order(tmp_path):
    """Durable messages in a level's runs keep their journal ids in the records: settled
    ones are dequeued from the journal; after a restart the rest come back in the priority
    order (recovered messages page one by one until the queue has read them back)."""
    journal = {"fsync": False, "segment_size": 16384}
    steps = plan(200, seed=41)
    order = in_memory_order(steps)

    async def node_of(world):
        return await world.node("a", limits={"max_memory": BUDGET},
                                paging={"io_thread": False, "read_ahead": READ_AHEAD,
                                        "segment_size": 16384},
                                queues={"credit_window": 50, "durable": True}, journal=journal)

    async def fill_take_and_stop():
        world = World(tmp_path)
        node = await node_of(world)
        client = await world.client("a")
        await send(world, client.sender("prio"), steps, durable=True)
        await world.quiet(0.05)
        queue = node.queues.get("prio")
        assert in_runs(queue) > 150 and node.pager.store.reads_now == 0
        got = ids_of(await take(world, client.receiver("prio"), 80, credit=10))
        assert got == order[:80]
        await world.quiet(0.1)
        assert node.journal.live == 120, "the settled ones dequeued from the journal"
        await world.close()

    run(fill_take_and_stop)

    async def restart():
        world = World(tmp_path)
        node = await node_of(world)
        client = await world.client("a")
        queue = node.queues.get("prio")
        assert queue.depth == 120
        got = ids_of(await take(world, client.receiver("prio"), 120, credit=10))
        assert got == order[80:]
        await world.quiet(0.2)
        assert node.journal.live == 0
        await world.close()

    run(restart)


def test_a_queue_class_without_runs_per_level_turns_them_back_as_before(tmp_path, monkeypatch):
    """``LocalQueue.priority_runs = False`` (a queue class whose FIFO runs must not become a
    level: a replicated primary in runs, until its rid index knows levels): a priority
    turns the runs back into messages paged one by one, the order kept."""
    from proxy.queues.local import LocalQueue
    from proxy.queues.store import PriorityStore

    monkeypatch.setattr(LocalQueue, "priority_runs", False)

    async def play():
        world = World(tmp_path)
        node = await paging_node(world)
        client = await world.client("a")
        sender = client.sender("mixed")
        await send(world, sender, [(i, 4) for i in range(120)])
        await world.quiet(0.05)
        queue = node.queues.get("mixed")
        assert type(queue.messages) is RunQueue and queue.messages.count > 80
        await send(world, sender, [(120, 9)])
        await world.quiet(0.05)
        assert type(queue.messages) is PriorityStore and queue.paged_count > 80
        assert node.pager.store.reads_now > 0, "the runs were read back (unrun)"
        await send(world, sender, [(i, 2) for i in range(121, 161)])
        await world.quiet(0.05)
        assert type(queue.messages) is PriorityStore, "no runs per level for this class"
        got = ids_of(await take(world, client.receiver("mixed"), 161, credit=23))
        assert got == [120] + list(range(120)) + list(range(121, 161))
        await world.quiet(0.1)
        all_back(node, queue)
        await world.close()

    run(play)


def test_the_admin_api_s_take_at_a_priority_queue_in_runs_turns_them_back_order_kept(tmp_path):
    """The admin API's move / resend take messages through ``operations.take``: it needs
    message objects, so the runs are turned back (docs/paging.md, "what still leaves
    runs"); it takes the first of the priority order, and the rest keeps that order."""
    from proxy.queues.store import PriorityStore

    async def play():
        world = World(tmp_path)
        node = await paging_node(world)
        client = await world.client("a")
        steps = plan(150, seed=43)
        await send(world, client.sender("prio"), steps)
        await world.quiet(0.05)
        queue = node.queues.get("prio")
        assert in_runs(queue) > 100
        order = in_memory_order(steps)
        taken = operations.take(queue, 10)
        assert type(queue.messages) is PriorityStore and queue.depth == 140
        for stored in taken:
            operations.settle(node.broker, queue, stored, accepted=True)
        got = ids_of(await take(world, client.receiver("prio"), 140, credit=20))
        assert got == order[10:], "taken: the first ten of the priority order"
        await world.quiet(0.1)
        all_back(node, queue)
        await world.close()

    run(play)
