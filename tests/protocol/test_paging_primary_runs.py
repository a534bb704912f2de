"""A replicated primary in runs (docs/paging.md, "A replicated primary in runs"): a
``ReplicatedQueue`` with a real pager and page store (its I/O on the loop, a budget of about
20 messages) keeps its backlog in runs; its rid index holds only the messages in memory; a
backup that attaches late catches up from the runs (read backwards, newest first) while
consumers take, release and modify messages, runs are read back and more arrive. Checked
as a user would: the copy (``ReplicaImage``, with its own pager, over the wire format) holds
every message the primary holds, with the same body and acquired flag, in rid order; a
purge reaches it; once drained both are empty and the page stores' live bytes are zero.
"""

from __future__ import annotations

import asyncio
import random

import pytest
from proton import Message
from test_paging_image_runs import Backup, Clock, io, ship

from proxy.paging.pager import Pager
from proxy.paging.store import PageStore, body
from proxy.queues.local import StoredMessage
from proxy.queues.memory import MemoryUse
from proxy.queues.runs import RunQueue
from proxy.replication import catchup
from proxy.replication import primary as primary_module
from proxy.replication.primary import ReplicaSet
from proxy.replication.queue import ReplicatedQueue

pytestmark = pytest.mark.timeout(60)

BUDGET = 20_000


def payload(n: int) -> bytes:
    return Message(id=n, body=f"{n}:" + "x" * 1000).encode()


class Consumer:
    def __init__(self) -> None:
        self.consumer_id = 1
        self.credit = 0
        self.out: list = []  # delivered, not settled

    def deliver(self, message) -> None:
        self.credit -= 1
        self.out.append(message)


class Primary:
    """A replicated queue served by its replica set, paging beyond ``BUDGET``."""

    def __init__(self, directory, clock: Clock) -> None:
        self.memory = MemoryUse(BUDGET)
        self.store = PageStore(directory, threads=False, segment_size=64 * 1024)
        self.queue = ReplicatedQueue("q", memory=self.memory)
        self.pager = Pager(self.store, self.memory, lambda: [self.queue], read_ahead=8,
                           read_ahead_bytes=8 * 1100)
        self.pager.on_loaded = lambda queue: queue.dispatch()
        self.pager.start(asyncio.get_running_loop())
        self.rs = ReplicaSet("q", 1, clock)
        self.queue.serve_replicas(self.rs, lambda queue: None)
        self.consumer = Consumer()
        self.queue.add_consumer(self.consumer)
        self.sent = 0

    def enqueue(self, count: int) -> None:
        for _ in range(count):
            self.queue.enqueue(StoredMessage(payload(self.sent)))
            self.sent += 1

    def in_runs(self) -> int:
        messages = self.queue.messages
        return messages.count if type(messages) is RunQueue else 0

    def take(self, count: int) -> None:
        self.consumer.credit += count
        self.queue.dispatch()

    def settle(self, rng: random.Random, share: float = 1.0) -> None:
        """Each message out: accepted, released or modified (back with a new body)."""
        out, self.consumer.out = self.consumer.out, []
        for message in out:
            pick = rng.random() if share < 1.0 else 0.0
            if pick < 0.6:
                self.queue.settled_accepted(message)
            elif pick < 0.8:
                self.queue.settled_released(message)
            else:
                self.queue.settled_modified(message, delivery_failed=True,
                                            undeliverable_here=False, consumer_id=1)

    def state(self) -> dict:
        """rid -> (body, acquired): every message the primary holds, in rid order."""
        return {m.rid: (bytes(body(m)), m.rid in self.rs.acquired)
                for m in catchup.held(self.rs, self.queue)}


async def paged(primary: Primary) -> None:
    for _ in range(50):
        await io()


async def three_hundred_in_runs(tmp_path):
    """A primary holding 300 messages, most of them in runs, and a backup not attached."""
    clock = Clock()
    primary = Primary(tmp_path / "a", clock)
    backup = Backup(tmp_path / "b")
    primary.enqueue(300)
    await paged(primary)
    assert primary.in_runs() >= 250
    return clock, primary, backup


async def drained(primary: Primary, backup, clock: Clock) -> None:
    """Every message taken and accepted; the copy follows the primary to empty. Closes both
    pagers."""
    for _ in range(400):
        primary.settle(random.Random(0))
        if not primary.queue.depth and not primary.consumer.out:
            break
        primary.take(50)
        await io()
        await ship(primary.rs, backup, clock)
    await paged(primary)
    await ship(primary.rs, backup, clock)
    assert primary.queue.depth == 0 and not primary.rs.index
    assert backup.contents() == {} == primary.state()
    primary.pager.close()
    backup.pager.close()


def test_a_primary_keeps_runs_and_its_index_names_only_the_messages_in_memory(tmp_path):
    async def play():
        primary = Primary(tmp_path / "a", Clock())
        primary.enqueue(400)
        await paged(primary)
        assert primary.in_runs() >= 350, "the primary's backlog is not in runs"
        assert len(primary.rs.index) <= 400 - primary.in_runs()
        assert primary.memory.resident <= BUDGET
        # what a fence that keeps the queue keeps (ReplicatedAddress.fence): every message,
        # those in runs read from disk, in rid order
        kept = catchup.held(primary.rs, primary.queue)
        assert [bytes(body(m)) for m in kept] == [payload(n) for n in range(400)]
        assert [m.rid for m in kept] == sorted(m.rid for m in kept)
        primary.take(400)  # read back run by run, each message in the index while out
        for _ in range(200):
            if len(primary.consumer.out) == 400:
                break
            primary.settle(random.Random(0))
            await io()
        primary.settle(random.Random(0))
        await paged(primary)
        assert not primary.queue.depth and not primary.rs.index
        assert primary.store.live_bytes == 0
        primary.pager.close()

    asyncio.run(play())


@pytest.mark.parametrize("seed", range(1, 13))
def test_a_late_backup_catches_up_from_the_runs_while_consumers_and_producers_go_on(
        tmp_path, seed, monkeypatch):
    """Dequeues, acquires, releases, modified bodies, read-backs and new arrivals (which
    page the tail that was in memory at the sync point: read from its new run) race with a
    catch-up read from the runs, 16 events a batch: the copy ends equal to the primary's
    state, and follows it to empty."""
    monkeypatch.setattr(primary_module, "MAX_BATCH_EVENTS", 16)

    async def play():
        rng = random.Random(seed)
        clock = Clock()
        primary = Primary(tmp_path / "a", clock)
        backup = Backup(tmp_path / "b")
        primary.enqueue(600)
        if seed % 4 == 0:  # the sync point before anything is paged: all of it moves
            primary.rs.attach("b", clock.now)
            assert not primary.rs.streams["b"].catchup.chunks
            await paged(primary)
        else:
            await paged(primary)
            assert primary.in_runs() >= 500
            primary.enqueue(40 * (seed % 3))  # the sync point with a tail in memory, or not
            if seed % 3 == 2:
                await asyncio.sleep(0)  # and a run being written
            primary.rs.attach("b", clock.now)
            assert len(primary.rs.streams["b"].catchup.chunks) >= 2
        stream = primary.rs.streams["b"]
        assert len(stream.catchup) == primary.sent

        def between() -> None:
            pick = rng.random()
            if pick < 0.35:
                primary.take(rng.randrange(1, 40))
            elif pick < 0.6:
                primary.settle(rng, share=0.5)
            elif pick < 0.85:
                primary.enqueue(rng.randrange(1, 60))
            else:  # a few out and back modified at once: new bodies at the head
                primary.take(3)
                for message in primary.consumer.out[-3:]:
                    primary.consumer.out.remove(message)
                    primary.queue.settled_modified(message, delivery_failed=True,
                                                   undeliverable_here=False, consumer_id=1)
        for _ in range(200):
            await ship(primary.rs, backup, clock, between=between)
            if stream.catchup is None:
                break
            await io()
        assert stream.catchup is None, "the catch-up did not end"
        primary.consumer.credit = 0
        await paged(primary)
        await ship(primary.rs, backup, clock)
        assert primary.in_runs() > 0, "nothing left in runs: the race proves little"
        assert backup.contents() == primary.state()

        await drained(primary, backup, clock)
        assert primary.store.live_bytes == 0

    asyncio.run(play())


def test_a_purge_during_the_catch_up_reaches_the_copy(tmp_path):
    async def play():
        clock, primary, backup = await three_hundred_in_runs(tmp_path)
        primary.rs.attach("b", clock.now)
        number, items = primary.rs.take_batch("b", clock.now)  # a part of the catch-up
        from proxy.replication import events
        backup.apply(events.decode(events.encode(1, number, items)))
        primary.rs.acked("b", number, clock.now)
        assert primary.queue.purge() == 300
        primary.enqueue(5)
        await paged(primary)
        await ship(primary.rs, backup, clock)
        assert primary.rs.streams["b"].catchup is None
        assert list(backup.contents()) == list(primary.state()) and len(primary.state()) == 5
        primary.pager.close()
        backup.pager.close()

    asyncio.run(play())


def test_a_priority_at_a_primary_in_runs_brings_its_runs_back_into_the_index(tmp_path):
    """A replicated primary keeps one ``RunQueue`` (``priority_runs = False``): a message
    with a priority turns its runs back into messages paged one by one, and the rid index
    names every one of them again, so a backup attached after catches up to the primary's
    state, the priority message comes first, and both end empty."""
    async def play():
        clock, primary, backup = await three_hundred_in_runs(tmp_path)
        urgent = Message(id="urgent", body="u", priority=7).encode()
        primary.queue.enqueue(StoredMessage(urgent))
        assert primary.in_runs() == 0
        assert len(primary.rs.index) == 301, "messages back from the runs not in the index"
        primary.rs.attach("b", clock.now)
        for _ in range(100):
            await ship(primary.rs, backup, clock)
            if primary.rs.streams["b"].catchup is None:
                break
            await io()
        assert primary.rs.streams["b"].catchup is None
        assert backup.contents() == primary.state() and len(primary.state()) == 301
        primary.take(1)
        for _ in range(50):
            if primary.consumer.out:
                break
            await io()
        assert bytes(body(primary.consumer.out[0])) == urgent
        await drained(primary, backup, clock)

    asyncio.run(play())
