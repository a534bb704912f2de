"""A restart with a durable backlog many times the budget (issue #44, docs/paging.md
"Recovered durable messages in runs"), on the virtual clock: recovery keeps what the queue
needs of each body it leaves in the journal (no body read at restore), and a plain FIFO
queue's backlog comes back as runs of journal records, a few tens of bytes a message.

Each test checks what a user would: every id once and in order, releases, expiry, the
delivery limit, a selector, purge and a second restart midway behaving as before a
restart; the index memory per message (tracemalloc) under a bound; no file left open or
pinned and no byte left counted at the end.
"""

from __future__ import annotations

import asyncio
import tracemalloc

import pytest
from proton import Delivery, Message
from test_paging import BODY, BUDGET, fill, ids_of, paging, send_message, take

from playbook import World, run

import proxy.queues.local as local_queues
from proxy.broker import operations
from proxy.queues.journal_pages import JournalView
from proxy.queues.level_runs import LevelRuns
from proxy.queues.runs import RunQueue

pytestmark = pytest.mark.timeout(90)

JOURNAL = {"fsync": False, "segment_size": 16384}  # about 15 messages of BODY a segment
COUNT = 400  # twenty budgets


async def durable_node(world: World, queue=()):
    return await world.node("a", limits={"max_memory": BUDGET}, paging=paging(),
                            queues={"credit_window": 50, "durable": True}, journal=JOURNAL,
                            queue=list(queue))


def filled(tmp_path, address: str, count: int = COUNT, queue=(), **fields) -> None:
    """A node with ``count`` durable messages in ``address``, stopped."""
    async def fill_and_stop():
        world = World(tmp_path)
        await durable_node(world, queue)
        client = await world.client("a")
        await fill(world, client.sender(address), count, durable=True, **fields)
        await world.close()

    run(fill_and_stop)


async def restarted(tmp_path, queue=()):
    world = World(tmp_path)
    node = await durable_node(world, queue)
    return world, node, await world.client("a")


def journal_runs(queue) -> int:
    """Messages of ``queue`` in journal runs (of a FIFO queue, or its levels' runs)."""
    messages = queue.messages
    if type(messages) is LevelRuns:
        levels = messages.levels
    elif type(messages) is RunQueue:
        levels = [messages]
    else:
        return 0
    return sum(chunk.count for level in levels for chunk in level.runs
               if type(chunk).__name__ == "JournalRun")


def all_back(node, queue) -> None:
    memory = node.queues.memory
    assert (queue.paged_count, queue.paged_bytes, memory.paged, memory.used) == (0, 0, 0, 0)
    assert node.journal_pages.live == 0 and not node.journal_pages.files, "files left open"
    assert not node.journal.pinned, "segments left pinned"


def settle_all(client, receiver, outcome=Delivery.ACCEPTED, failed=False) -> None:
    for _, delivery in receiver.received:
        if not delivery.settled:
            delivery.local.failed = failed
            delivery.update(outcome)
            delivery.settle()
    client.flush()


def test_restore_reads_no_body_and_keeps_ttl_priority_and_delivery_times(tmp_path,
                                                                          monkeypatch):
    monkeypatch.setattr(local_queues, "monotonic", lambda: asyncio.get_running_loop().time())
    later = {"x-opt-delivery-time": 4_102_444_800_000}  # 2100: held, not delivered

    async def fill_and_stop():
        world = World(tmp_path)
        await durable_node(world)
        client = await world.client("a")
        await fill(world, client.sender("fifo"), 100, durable=True)
        await fill(world, client.sender("fifo"), 50, 100, durable=True, ttl=1.0)
        await fill(world, client.sender("fifo"), 50, 150, durable=True)
        prio = client.sender("prio")
        await fill(world, prio, 60, durable=True, priority=2)
        await fill(world, prio, 60, 60, durable=True, priority=7)
        sender = client.sender("later")
        await world.until(lambda: sender.credit > 0, what="credit")
        send_message(sender, Message(id=0, body=f"0:{BODY}", durable=True,
                                     annotations=later))
        await world.until(lambda: sender.accepted() == 1, what="accepted")
        await world.close()

    run(fill_and_stop)
    reads = []
    read = JournalView.read

    def counted(view, page):
        reads.append(page)
        return read(view, page)

    monkeypatch.setattr(JournalView, "read", counted)

    async def play():
        world, node, client = await restarted(tmp_path)
        fifo, prio, held = (node.queues.get(name) for name in ("fifo", "prio", "later"))
        paged = fifo.paged_count + prio.paged_count
        assert paged > 250, "the backlog beyond the budget stayed in the journal"
        assert len(reads) == 1, f"restore read {len(reads)} bodies: only the scheduled one"
        # its delivery time kept: in memory or in a scheduled journal run (docs/paging-scheduled.md)
        assert held.scheduled.total == 1 and held.depth == 0, "its delivery time kept"
        assert journal_runs(fifo) > 150, "the FIFO backlog in journal runs"
        assert journal_runs(prio) > 100, "the priority queue's in journal runs per level"
        await world.quiet(1.5)  # the ttl (restarted at the restore) runs out
        got = ids_of(await take(world, client.receiver("fifo"), 150, credit=20))
        assert got == list(range(100)) + list(range(150, 200))
        assert fifo.stats.expired == 50 and fifo.depth == 0
        got = ids_of(await take(world, client.receiver("prio"), 120, credit=20))
        assert got == list(range(60, 120)) + list(range(60)), "priority order kept"
        await world.quiet(0.2)
        all_back_but(node, held)
        await world.close()

    run(play)


def all_back_but(node, held) -> None:
    """Everything read back and gone, but the scheduled message ``held``."""
    assert node.journal_pages.live == 1 and held.scheduled.total == 1


@pytest.mark.parametrize("fields", [{}, {"priority": 0}], ids=["default", "priority-0"])
def test_a_backlog_of_twenty_budgets_restarts_in_journal_runs_with_a_small_index(tmp_path,
                                                                                fields):
    """priority-0: as many clients send (go-amqp: priority 0 in every header), a level of
    a priority queue in runs."""
    filled(tmp_path, "big", **fields)

    async def play():
        tracemalloc.start()
        try:
            world, node, client = await restarted(tmp_path)
            snapshot = tracemalloc.take_snapshot()
        finally:
            tracemalloc.stop()
        queue = node.queues.get("big")
        memory = node.queues.memory
        assert queue.depth == COUNT and queue.paged_count > COUNT - 30
        assert memory.resident <= BUDGET // 2 + len(BODY) + 10, "recovery kept too many bodies"
        assert journal_runs(queue) == queue.paged_count, "the backlog in journal runs"
        assert node.pager.store.writes == 0, "the restart wrote bodies to the page store"
        # what the queue side holds (messages, pages, runs): the journal's own entry per
        # live message (proxy/journal) and the kept bodies are not in it
        held = sum(stat.size for stat in snapshot.statistics("filename")
                   if "/proxy/queues/" in stat.traceback[0].filename
                   or "/proxy/paging/" in stat.traceback[0].filename)
        # less what a queue costs whatever its depth (a priority queue in runs: ten levels,
        # each a RunQueue and two deques: about 24 KB)
        per_message = (held - 32 * 1024) / queue.paged_count
        assert per_message < 40, f"{per_message:.0f} bytes a message beyond the budget"
        # releases: every seventh first delivery released, the rest accepted
        first: list = []
        accepted: list = []
        receiver = client.receiver("big")
        while len(accepted) < COUNT:
            start = len(receiver.received)
            receiver.flow(11)
            await world.until(lambda: len(receiver.received) >= min(
                start + 11, start + COUNT - len(accepted)), what="more messages")
            for message, delivery in receiver.received[start:]:
                if message.id not in first:
                    first.append(message.id)
                    if len(first) % 7 == 0:
                        delivery.update(Delivery.RELEASED)
                        delivery.settle()
                        continue
                accepted.append(message.id)
                delivery.update(Delivery.ACCEPTED)
                delivery.settle()
            client.flush()
        assert first == list(range(COUNT)), "first deliveries out of order"
        assert sorted(accepted) == list(range(COUNT)), "an id lost or accepted twice"
        await world.quiet(0.2)
        all_back(node, queue)
        assert node.journal.live == 0
        await world.close()

    run(play)


def test_expiry_and_the_delivery_limit_for_messages_restored_in_journal_runs(tmp_path,
                                                                             monkeypatch):
    monkeypatch.setattr(local_queues, "monotonic", lambda: asyncio.get_running_loop().time())
    config = [{"name": "lim", "delivery_limit": 2, "dead_letter": "dlq"}]

    async def fill_and_stop():
        world = World(tmp_path)
        await durable_node(world, config)
        client = await world.client("a")
        sender = client.sender("lim")
        await fill(world, sender, 150, durable=True)
        await fill(world, sender, 100, 150, durable=True, ttl=1.0)
        await fill(world, sender, 50, 250, durable=True)
        await world.close()

    run(fill_and_stop)

    async def play():
        world, node, client = await restarted(tmp_path, config)
        queue = node.queues.get("lim")
        assert journal_runs(queue) > 250
        for attempt in range(2):  # the first five fail twice: out at the limit
            failing = client.receiver("lim", credit=5)
            await world.until(lambda: len(failing.received) == 5, what="5 out")
            assert sorted(ids_of(failing)) == list(range(5))
            settle_all(client, failing, Delivery.MODIFIED, failed=True)
            failing.link.close()
            client.flush()
            await world.quiet(0.05)
        assert queue.stats.delivery_limited == 5 and queue.depth == 295
        await world.quiet(1.5)  # messages 150-249 expire while in the runs
        assert queue.depth == 295, "expired messages in runs count until read back"
        got = ids_of(await take(world, client.receiver("lim"), 195, credit=20))
        assert got == list(range(5, 150)) + list(range(250, 300))
        assert queue.stats.expired == 100 and queue.depth == 0
        dead = ids_of(await take(world, client.receiver("dlq"), 105, credit=25))
        assert sorted(dead) == list(range(5)) + list(range(150, 250))
        await world.quiet(0.2)
        all_back(node, queue)
        await world.close()

    run(play)


def test_a_selector_and_a_browser_at_a_queue_restored_in_journal_runs(tmp_path):
    async def fill_and_stop():
        world = World(tmp_path)
        await durable_node(world)
        client = await world.client("a")
        sender = client.sender("look")
        for i in range(COUNT):
            await world.until(lambda: sender.credit > 0, what=f"credit for {i}")
            send_message(sender, Message(id=i, body=f"{i}:{BODY}", durable=True,
                                         properties={"even": i % 2 == 0}))
        await world.until(lambda: sender.accepted() == COUNT, what="accepted")
        await world.close()

    run(fill_and_stop)

    async def play():
        world, node, client = await restarted(tmp_path)
        queue = node.queues.get("look")
        assert journal_runs(queue) > COUNT - 30
        browser = client.receiver("look", credit=COUNT, browse=True)
        await world.until(lambda: len(browser.received) == COUNT, what="all browsed")
        assert ids_of(browser) == list(range(COUNT)) and queue.depth == COUNT
        assert journal_runs(queue) > COUNT - 30, "browsing leaves the runs in the journal"
        assert ids_of(await take(world, client.receiver("look"), 30, credit=10)) == \
            list(range(30))
        even = client.receiver("look", selector="even = true")
        even.flow(COUNT)
        await world.until(lambda: len(even.received) == (COUNT - 30) // 2, what="evens")
        settle_all(client, even)
        assert ids_of(even) == list(range(30, COUNT, 2))
        assert journal_runs(queue) == 0, "a selector turned the runs into messages"
        even.link.close()
        client.flush()
        got = ids_of(await take(world, client.receiver("look"), (COUNT - 30) // 2, credit=20))
        assert got == list(range(31, COUNT, 2))
        await world.quiet(0.2)
        all_back(node, queue)
        await world.close()

    run(play)


def test_purge_of_journal_runs_dequeues_them_for_good(tmp_path):
    filled(tmp_path, "purged")

    async def play():
        world, node, client = await restarted(tmp_path)
        queue = node.queues.get("purged")
        assert ids_of(await take(world, client.receiver("purged"), 20, credit=10)) == \
            list(range(20))
        assert journal_runs(queue) > COUNT - 60
        assert operations.purge(node.broker, queue) == COUNT - 20
        assert queue.depth == 0
        await world.quiet(0.2)
        all_back(node, queue)
        await fill(world, client.sender("purged"), 50, 1000, durable=True)
        await world.close()

    run(play)

    async def again():
        world, node, client = await restarted(tmp_path)
        queue = node.queues.get("purged")
        assert queue.depth == 50, "purged messages came back"
        assert ids_of(await take(world, client.receiver("purged"), 50, credit=10)) == \
            list(range(1000, 1050))
        await world.close()

    run(again)


def test_a_second_restart_midway_through_the_runs(tmp_path):
    filled(tmp_path, "twice")

    async def first():
        world, node, client = await restarted(tmp_path)
        queue = node.queues.get("twice")
        assert journal_runs(queue) > COUNT - 30
        assert ids_of(await take(world, client.receiver("twice"), 150, credit=15)) == \
            list(range(150))
        # some out with a consumer when the node stops: they come back
        out = client.receiver("twice", credit=7)
        await world.until(lambda: len(out.received) == 7, what="7 out")
        await world.quiet(0.1)
        node.journal.sync()
        await world.close()

    run(first)

    async def second():
        world, node, client = await restarted(tmp_path)
        queue = node.queues.get("twice")
        assert queue.depth == COUNT - 150
        assert journal_runs(queue) > COUNT - 150 - 30, "in journal runs again"
        got = ids_of(await take(world, client.receiver("twice"), COUNT - 150, credit=25))
        assert got == list(range(150, COUNT)), "lost, twice or out of order"
        await world.quiet(0.2)
        all_back(node, queue)
        assert node.journal.live == 0
        await world.close()

    run(second)


def test_a_priority_message_at_a_queue_restored_in_journal_runs(tmp_path):
    """The journal runs become level 4 of a priority queue in runs, nothing read."""
    filled(tmp_path, "mixed", 200)

    async def play():
        world, node, client = await restarted(tmp_path)
        queue = node.queues.get("mixed")
        assert journal_runs(queue) > 170
        await fill(world, client.sender("mixed"), 1, 500, durable=True, priority=9)
        await world.quiet(0.05)
        assert queue.depth == 201 and queue.messages.count > 170, "kept, as level 4"
        assert node.pager.store.reads_now == 0
        got = ids_of(await take(world, client.receiver("mixed"), 201, credit=20))
        assert got == [500] + list(range(200))
        await world.quiet(0.2)
        all_back(node, queue)
        await world.close()

    run(play)
