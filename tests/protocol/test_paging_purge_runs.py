"""A purge of a queue with runs reads no record (issue #44, docs/paging_purge.md): the
journal's dequeues of its durable messages and a replicated primary's dequeue events come
from what each run keeps in memory (journal ids, rids), not from its records.

Checked as a user would: no ``os.pread`` and no journal body read while the purge runs (the
playbook's I/O is on the loop: every read would be counted); every purged durable message
dequeued for good (a restart brings none back); a replicated primary's copy ends empty and
equal; a purge while a run is being written and while a run's front is being read back.
"""

from __future__ import annotations

import asyncio
import os
import random

import pytest
from test_paging import fill, ids_of, take
from test_paging_image_runs import io, ship
from test_paging_primary_runs import drained, paged, three_hundred_in_runs
from test_paging_durable_runs import durable_node, filled, journal_runs, restarted
from test_paging_scheduled import clock, in_runs, scheduled, send  # noqa: F401 (a fixture)

from playbook import World, run

from proxy.broker import operations
from proxy.exchanges.subscriptions import Subscription
from proxy.queues.journal_pages import JournalView
from proxy.queues.level_runs import LevelRuns
from proxy.queues import schedule
from proxy.queues.runs import ON_DISK, WRITING_RUN, Chunk, RunQueue

pytestmark = pytest.mark.timeout(90)


class Reads:
    """Reads of records (``os.pread``, a journal body) made while ``armed``."""

    def __init__(self, monkeypatch) -> None:
        self.armed = False
        self.count = 0
        pread, view_read = os.pread, JournalView.read

        def counted_pread(*args):
            self.count += self.armed
            return pread(*args)

        def counted_view(view, page):
            self.count += self.armed
            return view_read(view, page)

        monkeypatch.setattr(os, "pread", counted_pread)
        monkeypatch.setattr(JournalView, "read", counted_view)

    def during(self, action):
        self.armed = True
        try:
            return action()
        finally:
            self.armed = False


def chunks(queue) -> list:
    messages = queue.messages
    levels = messages.levels if type(messages) is LevelRuns else [messages]
    return [chunk for level in levels if type(level) is RunQueue for chunk in level.runs]


def on_disk(queue) -> int:
    return sum(chunk.count for chunk in chunks(queue) if chunk.state == ON_DISK)


def test_purge_and_delete_of_durable_runs_read_nothing_and_a_restart_brings_none_back(
        tmp_path, monkeypatch):
    reads = Reads(monkeypatch)

    async def play():
        world = World(tmp_path)
        node = await durable_node(world)
        client = await world.client("a")
        await fill(world, client.sender("fifo"), 300, durable=True)
        await fill(world, client.sender("prio"), 100, durable=True, priority=2)
        await fill(world, client.sender("prio"), 100, 100, durable=True, priority=7)
        fifo, prio = (node.queues.get(name) for name in ("fifo", "prio"))
        assert ids_of(await take(world, client.receiver("fifo"), 10)) == list(range(10))
        await world.until(lambda: on_disk(fifo) > 250 and on_disk(prio) > 150,
                          what="runs written")
        assert type(prio.messages) is LevelRuns
        assert reads.during(lambda: operations.purge(node.broker, fifo)) == 290
        assert reads.during(lambda: operations.purge(node.broker, prio)) == 200
        await fill(world, client.sender("gone"), 200, durable=True)  # (the budget's room back)
        gone = node.queues.get("gone")
        await world.until(lambda: on_disk(gone) > 150, what="runs written")
        assert reads.during(lambda: operations.delete(node.broker, gone, force=True))[
            "purged"] == 200
        assert reads.count == 0, f"the purges read {reads.count} records"
        assert fifo.depth == prio.depth == 0
        await world.quiet(0.2)
        await world.close()

    run(play)

    assert_nothing_back(tmp_path, ("fifo", "prio", "gone"))


def test_a_purge_of_recovered_journal_runs_reads_no_body(tmp_path, monkeypatch):
    filled(tmp_path, "purged", 400)
    reads = Reads(monkeypatch)

    async def play():
        world, node, client = await restarted(tmp_path)
        queue = node.queues.get("purged")
        assert journal_runs(queue) > 300
        assert reads.during(lambda: operations.purge(node.broker, queue)) == 400
        assert reads.count == 0, f"the purge read {reads.count} bodies"
        await world.quiet(0.2)
        await world.close()

    run(play)

    async def again():
        world, node, _ = await restarted(tmp_path)
        queue = node.queues.get("purged")
        assert queue is None or queue.depth == 0, "purged messages came back"
        await world.close()

    run(again)


def test_a_purge_of_durable_scheduled_runs_reads_nothing(tmp_path, monkeypatch, clock):
    reads = Reads(monkeypatch)

    async def play():
        world = World(tmp_path)
        node = await durable_node(world)
        client = await world.client("a")
        start = schedule.clock()
        await send(world, client.sender("later"), [scheduled(i, start + 3600, durable=True)
                                                   for i in range(150)])
        await world.quiet(0.1)
        assert in_runs(node, "later") >= 120
        queue = node.queues.get("later")
        assert reads.during(lambda: operations.purge(node.broker, queue)) == 150
        assert reads.count == 0, f"the purge read {reads.count} records"
        await world.quiet(0.2)
        await world.close()

    run(play)

    assert_nothing_back(tmp_path, ("later",), left=lambda queue: queue.scheduled.total)


@pytest.mark.parametrize("moment", ["writing", "reading"])
def test_a_purge_while_a_run_is_written_or_read_back(tmp_path, monkeypatch, moment):
    """The purge comes between the pager's write (or the read-ahead's read) and its end: it
    names the run's messages from memory, the late write or read changes nothing."""
    reads = Reads(monkeypatch)

    async def play():
        world = World(tmp_path)
        node = await durable_node(world)
        client = await world.client("a")
        await fill(world, client.sender("q"), 300, durable=True)
        queue = node.queues.get("q")
        await world.until(lambda: on_disk(queue) > 200, what="runs written")
        runs = queue.messages
        assert type(runs) is RunQueue
        if moment == "writing":
            assert runs.tail, "messages in memory after the runs"
            runs.page_out(0, 10**9)  # the pager's next round, here and now
            assert any(chunk.state == WRITING_RUN for chunk in runs.runs)
        else:
            first = runs.head.popleft()  # the head below the window: a read-ahead asked
            assert runs.read_ahead() is False and queue.reading
            runs.appendleft(first)
        assert reads.during(lambda: operations.purge(node.broker, queue)) > 0
        assert reads.count == 0, f"the purge read {reads.count} records"
        await world.quiet(0.3)  # the write / read comes back to a purged queue
        memory = node.queues.memory
        assert queue.depth == 0 and (queue.paged_count, queue.paged_bytes) == (0, 0)
        assert memory.paged == 0 and node.pager.writing == 0
        await fill(world, client.sender("q"), 5, 1000, durable=True)
        await world.close()

    run(play)

    async def again():
        world, node, client = await restarted(tmp_path)
        assert ids_of(await take(world, client.receiver("q"), 5)) == list(range(1000, 1005))
        await world.close()

    run(again)


def test_queue_delete_while_messages_are_out_reads_nothing(tmp_path, monkeypatch):
    reads = Reads(monkeypatch)

    async def play():
        world = World(tmp_path)
        node = await durable_node(world)
        client = await world.client("a")
        await fill(world, client.sender("q"), 200, durable=True)
        receiver = client.receiver("q")
        receiver.flow(5)
        await world.until(lambda: len(receiver.received) == 5, what="5 out")
        queue = node.queues.get("q")
        await world.until(lambda: on_disk(queue) > 150, what="runs written")
        answer = reads.during(lambda: operations.delete(node.broker, queue, force=True))
        assert answer["purged"] == 200, "the 5 out came back when its link closed"
        assert reads.count == 0, f"the delete read {reads.count} records"
        await world.quiet(0.2)
        await world.close()

    run(play)


@pytest.mark.parametrize("seed", range(1, 7))
def test_a_replicated_primary_purged_with_a_backup_following_reads_nothing(
        tmp_path, monkeypatch, seed):
    """Releases and modified bodies (back at the head), more arrivals, a run being written
    (odd seeds), then a purge: the dequeue events name every rid from memory,
    the copy ends equal (the messages out with the consumer), then empty with the primary."""
    reads = Reads(monkeypatch)

    async def play():
        rng = random.Random(seed)
        clock, primary, backup = await three_hundred_in_runs(tmp_path)
        primary.rs.attach("b", clock.now)
        for _ in range(100):
            await ship(primary.rs, backup, clock)
            if primary.rs.streams["b"].catchup is None:
                break
            await io()
        for _ in range(3):  # out and back, released or modified: new orders of rids
            primary.take(rng.randrange(5, 30))
            await io()
            primary.settle(rng, share=0.5)
            primary.enqueue(rng.randrange(10, 60))
            await paged(primary)
        primary.take(4)
        await io()
        if seed % 2:
            primary.enqueue(40)
            await asyncio.sleep(0)  # a round of the pager: a run being written
        assert primary.in_runs() > 100
        depth = primary.queue.depth
        assert reads.during(primary.queue.purge) == depth
        assert reads.count == 0, f"the purge read {reads.count} records"
        await paged(primary)
        await ship(primary.rs, backup, clock)
        state = primary.state()
        assert len(state) == len(primary.consumer.out) and all(a for _, a in state.values())
        assert backup.contents() == state, "the copy differs from the primary after the purge"
        await drained(primary, backup, clock)
        assert primary.store.live_bytes == 0

    asyncio.run(play())


def test_a_run_keeps_journal_ids_and_rids_compactly():
    chunk = Chunk(None, 0)
    for k, (journal_id, rid) in enumerate([(0, 5), (0, 6), (9, 7), (0, 9), (11, 10)]):
        chunk.add_name(journal_id, rid)
        chunk.count += 1
        if k == 1:
            assert chunk.ids is None and chunk.rids is None and chunk.rid0 == 5
    assert list(chunk.names()) == [(0, 5), (0, 6), (9, 7), (0, 9), (11, 10)]
    chunk.advance(2, 0)
    assert list(chunk.names()) == [(9, 7), (0, 9), (11, 10)]
    plain = Chunk(None, 0)
    for _ in range(3):
        plain.add_name(0, 0)
        plain.count += 1
    assert (plain.ids, plain.rids, list(plain.names())) == (None, None, [(0, 0)] * 3)
    late = Chunk(None, 0)
    for rid in (0, 0, 4):
        late.add_name(0, rid)
        late.count += 1
    assert list(late.names()) == [(0, 0), (0, 0), (0, 4)]


def test_an_exchange_subscription_queue_removed_reads_nothing(tmp_path, monkeypatch):
    """A subscription's queue (its backlog in runs) goes with the subscription: its durable
    messages are dequeued from what the runs keep, and a restart brings none back."""
    reads = Reads(monkeypatch)

    async def play():
        world = World(tmp_path)
        node = await durable_node(world)
        client = await world.client("a")
        await fill(world, client.sender("topic::audit"), 200, durable=True)
        queue = node.queues.get("topic::audit")
        await world.until(lambda: on_disk(queue) > 150, what="runs written")
        subs = node.broker.exchanges.topic_subscriptions
        sub = Subscription("audit", "topic", queue)
        subs.by_name["audit"] = sub
        reads.during(lambda: subs.remove(sub))
        assert reads.count == 0, f"the removal read {reads.count} records"
        assert node.queues.get("topic::audit") is None
        await world.quiet(0.2)
        await world.close()

    run(play)

    assert_nothing_back(tmp_path, ("topic::audit",))


def assert_nothing_back(tmp_path, names, left=lambda queue: queue.depth) -> None:
    """The node of ``tmp_path`` started again: none of the queues ``names`` holds anything
    (``left``: what a queue still holds; a queue gone holds nothing)."""
    async def again():
        world = World(tmp_path)
        node = await durable_node(world)
        back = {name: left(queue) for name in names
                if (queue := node.queues.get(name)) is not None}
        assert not any(back.values()), f"purged messages came back: {back}"
        await world.close()

    run(again)
