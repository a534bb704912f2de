"""A restart with a durable backlog larger than memory (issue #44, docs/paging.md "Durable
messages: the journal as page store"), on the virtual clock.

Recovery keeps bodies up to half the budget; the rest of the backlog comes back as index
entries whose body stays in the journal and is read back, in order, as consumers near it.
Each test checks what a user would: every id sent received once and in order, bodies
intact, the node's memory for bodies within its budget after the restart, nothing written
to the page store by the restart, and the journal's compaction leaving alone the records
that queues read by location.
"""

from __future__ import annotations

import shutil

import pytest
from proton import Message

from playbook import World, run
from test_paging import BODY, BUDGET, fill, ids_of, paging, send_message, take

from proxy.journal.journal import Journal
from proxy.queues.journal_pages import JournalPages

pytestmark = pytest.mark.timeout(60)

JOURNAL = {"fsync": False, "segment_size": 16384}  # about 15 messages of BODY a segment


async def durable_node(world: World, **more):
    return await world.node("a", limits={"max_memory": BUDGET}, paging=paging(**more),
                            queues={"credit_window": 50, "durable": True}, journal=JOURNAL)


async def restarted(tmp_path, **more):
    world = World(tmp_path)
    node = await durable_node(world, **more)
    return world, node, await world.client("a")


def test_journal_recovery_keeps_bodies_up_to_its_budget_and_locations_for_the_rest(tmp_path):
    journal = Journal(tmp_path / "j", fsync=False, segment_size=16384)
    journal.open()
    ids = [journal.enqueue("q", bytes([n]) * 1000)[0] for n in range(40)]
    journal.dequeue(ids[0])
    journal.close()
    journal = Journal(tmp_path / "j", fsync=False, segment_size=16384)
    recovered = journal.open(body_budget=10_000)
    messages = recovered.queues["q"]
    assert [m for m, _ in messages] == ids[1:]
    kept = [payload for _, payload in messages if payload is not None]
    # the oldest, in id order: 0 counted too until its dequeue came, after the enqueues
    assert kept == [bytes([n]) * 1000 for n in range(1, 10)]
    assert all(payload is None for _, payload in messages[9:])
    number, offset, length = journal.location(ids[20])
    with open(journal.segment_path(number), "rb") as f:
        f.seek(offset)
        record = f.read(length)
    assert record.endswith(bytes([20]) * 1000)
    assert journal.location(ids[0]) is None  # dequeued: not live
    journal.close()


class NowStore:
    """The page store's I/O thread, here and now (only the closing of files is asked)."""

    def after_io(self, call) -> None:
        call()


def test_a_journal_page_reads_plain_and_transaction_records_and_catches_damage(tmp_path):
    journal = Journal(tmp_path / "j", fsync=False, segment_size=16384)
    journal.open()
    plain, _ = journal.enqueue("queue-one", b"p" * 700)
    (in_txn,), _ = journal.commit([("q2", b"t" * 900)], [])
    journal.close()
    journal = Journal(tmp_path / "j", fsync=False, segment_size=16384)
    journal.open(body_budget=0)
    pages = JournalPages(journal, NowStore())
    first, second = pages.page("queue-one", plain), pages.page("q2", in_txn)
    assert (first.read(), second.read()) == (b"p" * 700, b"t" * 900)
    assert pages.live == 2 and set(journal.pinned) == {first.segment.number}
    with open(journal.segment_path(first.segment.number), "r+b") as f:
        f.seek(first.offset + first.segment.overhead + 10)
        f.write(b"X")  # a body damaged on disk
    with pytest.raises(OSError):
        first.read()
    first.segment.dead(first)
    second.segment.dead(second)
    assert pages.live == 0 and not journal.pinned and not pages.files
    journal.close()


def test_a_durable_backlog_of_ten_budgets_restarts_paged_and_drains_in_order(tmp_path):
    async def fill_and_stop():
        world = World(tmp_path)
        await durable_node(world)
        client = await world.client("a")
        await fill(world, client.sender("big"), 200, durable=True)
        await world.close()

    run(fill_and_stop)

    async def play():
        world, node, client = await restarted(tmp_path)
        memory = node.queues.memory
        queue = node.queues.get("big")
        pages = node.journal_pages
        assert queue.depth == 200 and memory.used > 10 * BUDGET
        assert memory.resident <= BUDGET // 2 + len(BODY) + 10, "recovery kept too many bodies"
        assert queue.paged_count >= 185 and pages.live == queue.paged_count
        assert node.pager.store.writes == 0 and not node.pager.store.segments, \
            "the restart wrote bodies to the page store"
        assert node.journal.pinned, "the records read by location are pinned"
        receiver = await take(world, client.receiver("big"), 200, credit=7)
        assert ids_of(receiver) == list(range(200))
        await world.quiet(0.2)
        assert (queue.paged_count, memory.paged, memory.used, pages.live) == (0, 0, 0, 0)
        assert not node.journal.pinned and not pages.files, "files left open or pinned"
        assert node.journal.live == 0
        await world.close()

    run(play)


def test_a_crash_while_reading_back_loses_nothing_the_journal_held(tmp_path):
    async def fill_and_stop():
        world = World(tmp_path)
        await durable_node(world)
        client = await world.client("a")
        await fill(world, client.sender("q"), 150, durable=True)
        await world.close()

    run(fill_and_stop)
    crash = tmp_path / "crash"

    async def read_back_and_crash():
        world, node, client = await restarted(tmp_path)
        receiver = client.receiver("q")
        await take(world, receiver, 40, credit=8)
        receiver.flow(8)  # a read-ahead under way (journal pages) when the copy is taken
        await world.until(lambda: len(receiver.received) > 40, what="more while reading back")
        node.journal.sync()
        shutil.copytree(tmp_path / "a" / "journal", crash)  # kill -9: the files as they are
        await world.close()

    run(read_back_and_crash)
    shutil.rmtree(tmp_path / "a" / "journal")
    shutil.copytree(crash, tmp_path / "a" / "journal")

    async def after_the_crash():
        world, node, client = await restarted(tmp_path)
        queue = node.queues.get("q")
        assert queue.depth >= 110 and queue.paged_count > 80
        ids = ids_of(await take(world, client.receiver("q"), queue.depth, credit=9))
        assert ids[0] <= 40 and ids == list(range(ids[0], 150)), "lost, twice or out of order"
        await world.close()

    run(after_the_crash)


def test_compaction_leaves_pinned_segments_alone_and_the_bodies_read_back_right(tmp_path):
    queues = [f"q{i}" for i in range(5)]

    async def fill_and_stop():
        world = World(tmp_path)
        await durable_node(world)
        client = await world.client("a")
        senders = [client.sender(name) for name in queues]
        await world.until(lambda: all(s.credit > 0 for s in senders), what="credit")
        for n in range(150):  # interleaved: each segment holds all five queues
            sender = senders[n % 5]
            await world.until(lambda: sender.credit > 0, what=f"credit for {n}")
            send_message(sender, Message(id=n, body=f"{n}:{BODY}", durable=True))
        await world.until(lambda: sum(s.accepted() for s in senders) == 150, what="accepted")
        await world.close()

    run(fill_and_stop)

    async def play():
        world, node, client = await restarted(tmp_path)
        journal = node.journal
        for name in queues[:4]:  # four fifths of every segment dead: sparse
            ids = ids_of(await take(world, client.receiver(name), 30, credit=10))
            assert ids == list(range(queues.index(name), 150, 5))
        pinned = set(journal.pinned)
        assert pinned, "q4's paged records pin their segments"
        sender = client.sender("fresh")
        await fill(world, sender, 60, durable=True)  # new segments: the cleaner runs
        await world.quiet(0.1)
        assert journal.stats.segments_created > 3
        assert pinned <= set(journal._segments), "a pinned segment was relocated and deleted"
        ids = ids_of(await take(world, client.receiver("q4"), 30, credit=6))
        assert ids == list(range(4, 150, 5))
        await world.quiet(0.2)
        assert not journal.pinned and node.journal_pages.live == 0
        await fill(world, sender, 60, 60, durable=True)  # unpinned now: sparse ones may go
        await world.quiet(0.1)
        assert ids_of(await take(world, client.receiver("fresh"), 120, credit=20)) == \
            list(range(120))
        await world.close()

    run(play)


def test_sparse_segments_found_at_restart_are_not_relocated_under_the_queues_reading_them(
        tmp_path):
    queues = [f"q{i}" for i in range(5)]

    async def fill_drain_and_stop():
        world = World(tmp_path)
        await durable_node(world)
        client = await world.client("a")
        senders = [client.sender(name) for name in queues]
        await world.until(lambda: all(s.credit > 0 for s in senders), what="credit")
        for n in range(150):
            sender = senders[n % 5]
            await world.until(lambda: sender.credit > 0, what=f"credit for {n}")
            send_message(sender, Message(id=n, body=f"{n}:{BODY}", durable=True))
        await world.until(lambda: sum(s.accepted() for s in senders) == 150, what="accepted")
        for name in queues[:4]:  # the segments are sparse when the node stops
            await take(world, client.receiver(name), 30, credit=10)
        await world.close()

    run(fill_drain_and_stop)

    async def play():
        world, node, client = await restarted(tmp_path)
        journal = node.journal
        assert journal.stats.relocated == 0, "relocated before the queues pinned their records"
        assert journal.pinned and node.queues.get("q4").paged_count >= 15
        ids = ids_of(await take(world, client.receiver("q4"), 30, credit=6))
        assert ids == list(range(4, 150, 5))
        await world.close()

    run(play)
