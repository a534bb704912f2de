"""A backup's copy in runs (docs/paging.md, "A backup's copy in runs"): the primary's side
(``ReplicaSet``) makes batches, they go over the wire format to a ``ReplicaImage`` whose
node has a budget of about 20 messages, with a real pager and page store (its I/O on the
loop). Checked as a user would: the copy holds every message the primary holds, with the
same body and acquired flag, in rid order; most of it in runs (no object per message); the
page store's live bytes back to zero once the messages are gone.
"""

from __future__ import annotations

import asyncio
import random

import pytest
from proton import Message

from proxy.amqp import message_header
from proxy.paging.pager import Pager
from proxy.paging.store import PageStore, body
from proxy.queues.local import StoredMessage
from proxy.queues.memory import MemoryUse
from proxy.replication import events
from proxy.replication.primary import ReplicaSet
from proxy.replication.replica import ReplicaImage

pytestmark = pytest.mark.timeout(60)

BUDGET = 20_000


class Clock:
    now = 1000.0

    def __call__(self) -> float:
        return self.now


def id_of(payload: bytes) -> int:
    decoded = Message()
    decoded.decode(payload)
    return decoded.id


def message(n: int) -> StoredMessage:
    return StoredMessage(Message(id=n, body=f"{n}:" + "x" * 1000).encode())


class Backup:
    """A backup node's copy with its pager, as ``BackupCopy.apply`` drives them."""

    def __init__(self, directory, runs: bool = True) -> None:
        self.image = ReplicaImage("q")
        self.memory = MemoryUse(BUDGET)
        self.store = PageStore(directory, threads=False, segment_size=64 * 1024)
        self.pager = Pager(self.store, self.memory, lambda: (), runs=runs)
        self.pager.images = lambda: [self.image]
        self.pager.start(asyncio.get_running_loop())
        self.journal = 0  # journal ids given (a durable copy: BackupCopy.apply)
        self.journaled: list = []  # journal ids dequeued
        self.journal_of: dict = {}  # rid -> the journal id given

    def apply(self, batch, durable: bool = False) -> None:
        changes = self.image.apply(batch)
        if durable:  # as BackupCopy.apply: journaled before the pager writes the records
            for value, entry in changes.added:
                self.journal += 1
                entry.journal_id = self.journal_of[value] = self.journal
            for entry in changes.removed:
                self.journaled.append(entry.journal_id)
            for value, entry in changes.rewritten:
                self.journaled.append(entry.journal_id)
                self.journal += 1
                entry.journal_id = self.journal_of[value] = self.journal
        self.pager.image_changes(self.image, changes)

    def contents(self) -> dict:
        """rid -> (body, acquired), in the copy's order, its runs turned into entries first
        (as a promotion does)."""
        self.pager.image_paged += self.image.unrun(self.store)
        return {value: (body(entry), entry.acquired) for value, entry in self.image.messages.items()}


async def io() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def ship(primary: ReplicaSet, backup: Backup, clock: Clock, *, durable=False,
               between=None) -> None:
    """Every batch waiting for "b", over the wire format, applied and acknowledged."""
    while (batch := primary.take_batch("b", clock.now)) is not None:
        number, items = batch
        backup.apply(events.decode(events.encode(primary.epoch, number, items)), durable)
        primary.acked("b", number, clock.now)
        await io()
        if between is not None:
            between()


def state_of(primary: ReplicaSet) -> dict:
    return {value: (bytes(m.payload), value in primary.acquired)
            for value, m in sorted(primary.index.items())}


def churn(primary: ReplicaSet, rng: random.Random, share: float) -> None:
    """Acquire, release (with a new body or not), modify and dequeue some of the messages."""
    for value, stored in list(primary.index.items()):
        if rng.random() >= share:
            continue
        pick = rng.random()
        if value in primary.acquired:  # out with a consumer: settled or back
            if pick < 0.5:
                primary.dequeued(stored)
            else:
                primary.released(stored, False)
        elif pick < 0.3:
            primary.dequeued(stored)
        elif pick < 0.5:
            primary.acquired_by_consumer(stored)
        elif pick < 0.7:
            primary.acquired_by_consumer(stored)
            primary.released(stored, False)
        elif pick < 0.85:
            primary.acquired_by_consumer(stored)
            stored.payload = message_header.modify(stored.payload, increment_count=True)
            primary.released(stored, True)
        else:
            primary.acquired_by_consumer(stored)


def enqueue(primary: ReplicaSet, first: int, count: int) -> None:
    for n in range(first, first + count):
        primary.enqueued(message(n))


def play(coroutine) -> None:
    asyncio.run(coroutine)


def test_a_copy_beyond_its_budget_keeps_runs_and_follows_every_event(tmp_path):
    async def main():
        clock = Clock()
        primary = ReplicaSet("q", epoch=1, clock=clock)
        backup = Backup(tmp_path / "paging")
        primary.attach("b", clock.now)
        await ship(primary, backup, clock)  # the (empty) catch-up
        enqueue(primary, 0, 1500)
        await ship(primary, backup, clock)
        image = backup.image
        assert image.depth == 1500
        assert image.run_count >= 1400 and len(image.messages) <= 100, "not in runs"
        assert len(image.runs) <= 40, "one run per write per segment, not per message"
        assert backup.pager.image_resident() <= BUDGET
        assert backup.pager.image_paged == 0, "runs are not paged one by one"

        rng = random.Random(7)
        for _ in range(3):
            churn(primary, rng, 0.2)
            enqueue(primary, 10_000 + primary.n, 50)
            await ship(primary, backup, clock)
            assert image.depth == len(primary.index)
            assert image.bytes == sum(len(m.payload) for m in primary.index.values())
        assert backup.contents() == state_of(primary), "the copy differs from the primary"

        for stored in list(primary.index.values()):
            primary.dequeued(stored)
        await ship(primary, backup, clock)
        assert (image.depth, image.bytes, image.runs) == (0, 0, [])
        assert backup.store.live_bytes == 0 and backup.pager.image_paged == 0
        backup.pager.close()

    play(main())


def test_a_late_backup_catches_up_into_runs_while_the_primary_changes(tmp_path):
    """The catch-up's fronts come newest first and are paged as runs at the copy's head,
    while live enqueues, acquires, releases and dequeues race with them."""
    async def main():
        clock = Clock()
        primary = ReplicaSet("q", epoch=1, clock=clock)
        enqueue(primary, 0, 3000)
        backup = Backup(tmp_path / "paging")
        primary.attach("b", clock.now)
        rng = random.Random(11)

        rounds = iter(range(30))  # then the primary is left alone: the stream ends

        def between():
            if next(rounds, None) is not None:
                churn(primary, rng, 0.01)
                enqueue(primary, 100_000 + primary.n, 5)

        await ship(primary, backup, clock, between=between)
        image = backup.image
        assert not image.catching_up
        assert image.run_count >= 2500, "the catch-up was not kept in runs"
        assert backup.contents() == state_of(primary)
        backup.pager.close()

    play(main())


def test_crossing_the_budget_and_back_keeps_the_order_for_a_promotion(tmp_path):
    """Over the budget (runs), drained under it (new arrivals stay in memory), over it again
    (new runs after them): a promotion gets every message once, in rid order."""
    async def main():
        clock = Clock()
        primary = ReplicaSet("q", epoch=1, clock=clock)
        backup = Backup(tmp_path / "paging")
        primary.attach("b", clock.now)
        await ship(primary, backup, clock)
        image = backup.image
        enqueue(primary, 0, 600)
        await ship(primary, backup, clock)
        assert image.run_count >= 500
        for value in sorted(primary.index)[:590]:  # consumed in order: under the budget
            primary.dequeued(primary.index[value])
        await ship(primary, backup, clock)
        assert image.depth == 10
        enqueue(primary, 600, 5)  # under the budget: in memory
        await ship(primary, backup, clock)
        in_memory = len(image.messages)
        assert in_memory >= 5
        enqueue(primary, 605, 600)  # over it again: runs after them
        await ship(primary, backup, clock)
        assert image.run_count >= 500 and len(image.runs) >= 2
        assert backup.contents() == state_of(primary)
        content = image.promote()
        assert [value for value, _ in content] == sorted(primary.index)
        assert [id_of(body(entry)) for _, entry in content] == list(range(590, 1205))
        backup.pager.close()

    play(main())


async def durable_copy_in_runs(tmp_path):
    """A durable backup caught up, then 800 enqueues shipped: its copy mostly in runs."""
    clock = Clock()
    primary = ReplicaSet("q", epoch=1, clock=clock)
    backup = Backup(tmp_path / "paging")
    primary.attach("b", clock.now)
    await ship(primary, backup, clock, durable=True)
    enqueue(primary, 0, 800)
    await ship(primary, backup, clock, durable=True)
    assert backup.image.run_count >= 700
    return clock, primary, backup


def test_a_new_catch_up_lets_the_runs_go_and_a_durable_copy_keeps_journal_ids(tmp_path):
    async def main():
        clock, primary, backup = await durable_copy_in_runs(tmp_path)
        image = backup.image
        gone = sorted(value for run in image.runs for value in run.rids)[:100]
        for value in gone:
            primary.dequeued(primary.index[value])
        await ship(primary, backup, clock, durable=True)
        assert sorted(backup.journaled) == sorted(backup.journal_of[v] for v in gone), \
            "a message dequeued from a run: its journal record is not dequeued"

        live = backup.store.live_bytes
        assert live > 600 * 1000
        dropped = image.restart(2, backup.store)  # a new primary's catch-up
        assert backup.store.live_bytes == 0, "the runs' records were not let go"
        assert image.depth == 0 and image.runs == []
        assert sorted(entry.journal_id for entry in dropped) == sorted(
            backup.journal_of[v] for v in primary.index), "a journal record of the old copy stays"
        backup.pager.close()

    play(main())


def test_a_durable_copy_promoted_from_runs_keeps_every_journal_id(tmp_path):
    """The journal ids kept in a run's array come back with the entries a promotion makes
    (the new primary's messages dequeue and rewrite those journal records)."""
    async def main():
        clock, primary, backup = await durable_copy_in_runs(tmp_path)
        image = backup.image
        assert all(run.journal_ids is not None for run in image.runs)
        rng = random.Random(3)
        churn(primary, rng, 0.2)  # rewrites get new journal ids, dequeues drop theirs
        await ship(primary, backup, clock, durable=True)
        backup.pager.image_paged += image.unrun(backup.store)
        for entry in image.messages.values():  # as BackupCopy.promote: a new body to count
            if entry.acquired and entry.page is not None:
                entry.payload = body(entry)
                backup.pager.entry_gone(entry)
        content = image.promote()
        assert [value for value, _ in content] == sorted(primary.index)
        assert {value: entry.journal_id for value, entry in content} == \
            {value: backup.journal_of[value] for value in primary.index}
        backup.pager.close()

    play(main())
