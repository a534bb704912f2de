"""A promoted backup keeps its paged backlog in runs (docs/paging_failover.md): a primary
(``ReplicaSet`` + ``ReplicatedQueue`` with its pager) ships its batches over the wire format
to a backup node's copy (``ReplicaImage``) whose pager and page store it shares with the
queue it becomes when promoted (``promote_runs``), as ``BackupCopy.promote`` and
``ReplicatedQueue.restore`` do. Checked as a user would: nothing read at the promotion (the
page store's ``pread``s counted), the new primary's backlog in runs, every id once in order
with its body and delivery-count, ttls and the delivery limit kept, a backup caught up from
the new primary's runs equal to its state and promoted in turn.
"""

from __future__ import annotations

import asyncio
import os
import random

import pytest
from proton import Message, symbol
from test_paging_image_runs import Clock, io, ship
from test_paging_primary_runs import BUDGET, Consumer, Primary, paged, payload

from proxy.amqp import message_header
from proxy.paging.pager import Pager
from proxy.paging.store import PageStore, body
from proxy.queues import local
from proxy.queues.memory import MemoryUse
from proxy.queues.runs import RunQueue
from proxy.replication import catchup, events, promote_runs
from proxy.replication import primary as primary_module
from proxy.replication.primary import ReplicaSet
from proxy.replication.queue import ReplicatedQueue
from proxy.replication.replica import ReplicaImage

pytestmark = pytest.mark.timeout(60)


class Node(Primary):
    """A backup node (a copy, its pager and page store) that may become the primary."""

    def __init__(self, directory, clock: Clock) -> None:  # noqa: super().__init__ not wanted
        self.clock = clock
        self.memory = MemoryUse(BUDGET)
        self.store = PageStore(directory, threads=False, segment_size=64 * 1024)
        self.image = ReplicaImage("q")
        self.queues: list = []
        self.pager = Pager(self.store, self.memory, lambda: self.queues, read_ahead=8,
                           read_ahead_bytes=8 * 1100)
        self.pager.images = lambda: [self.image] if self.image is not None else []
        self.pager.on_loaded = lambda queue: queue.dispatch()
        self.pager.start(asyncio.get_running_loop())
        self.journal = 0
        self.journal_of: dict = {}  # rid -> journal id (a durable copy)
        self.queue = self.rs = self.consumer = None
        self.sent = 0
        self.reads = 0  # preads of the page store during the promotion

    def apply(self, batch, durable: bool = False) -> None:
        """As ``BackupCopy.apply``: journaled first, then the pager."""
        changes = self.image.apply(batch)
        if durable:
            for value, entry in changes.added:
                self.journal += 1
                entry.journal_id = self.journal_of[value] = self.journal
            for value, entry in changes.rewritten:
                self.journal += 1
                entry.journal_id = self.journal_of[value] = self.journal
        self.pager.image_changes(self.image, changes)

    def contents(self) -> dict:
        """rid -> (body, acquired) of the copy (read, not promoted: a copy of its runs)."""
        out = {}
        for value, entry in self.image.messages.items():
            out[value] = (bytes(body(entry)), entry.acquired)
        for run in self.image.runs:
            for i, value in enumerate(run.rids):
                size = run.sizes[i]
                if size == -1:
                    continue
                if size == -2:
                    entry = run.changed[value]
                    out[value] = (bytes(entry.payload), entry.acquired)
                    continue
                where = run.offset + run.offsets[i]
                data = os.pread(run.segment.fd, 53 + size, where)
                out[value] = (data[53:], value in (run.acquired or ()))
        return dict(sorted(out.items()))

    def promote(self, epoch: int, monkeypatch) -> None:
        """The copy becomes the queue (``BackupCopy.promote``, ``become_primary``), its
        ``pread``s counted."""
        calls = []
        real = os.pread
        monkeypatch.setattr(os, "pread", lambda *a: calls.append(a) or real(*a))
        self.queue = ReplicatedQueue("q", memory=self.memory)
        self.queues.append(self.queue)
        for item in promote_runs.promote(self.image, self.pager):
            self.queue.restore(item)
        monkeypatch.setattr(os, "pread", real)
        self.reads = len(calls)
        self.image = None
        self.rs = ReplicaSet("q", epoch, self.clock)
        catchup.index_content(self.rs, self.queue)
        self.queue.serve_replicas(self.rs, lambda queue: None)
        self.consumer = Consumer()
        self.queue.add_consumer(self.consumer)


def expected(state: dict) -> list:
    """The bodies a promoted copy of ``state`` serves, in order: an acquired one counted."""
    return [message_header.modify(data, increment_count=True) if acquired else data
            for data, acquired in state.values()]


async def take_all(primary: Primary, count: int, rng=None) -> list:
    """``count`` messages taken and accepted (with ``rng``: some released or modified once
    first, taken again later); their bodies in the order they were accepted."""
    got: list = []
    back: set = set()
    for _ in range(2000):
        if len(got) >= count:
            break
        primary.take(10)
        await io()
        out, primary.consumer.out = primary.consumer.out, []
        for message in out:
            pick = rng.random() if rng is not None and message.rid not in back else 1.0
            if pick < 0.1:
                back.add(message.rid)
                primary.queue.settled_released(message)
            elif pick < 0.2:
                back.add(message.rid)
                primary.queue.settled_modified(message, delivery_failed=True,
                                               undeliverable_here=False, consumer_id=1)
            else:
                got.append((message.rid, bytes(body(message))))
                primary.queue.settled_accepted(message)
    return got


async def copied(tmp_path, count: int = 600, *, durable: bool = False):
    """A primary with ``count`` messages and a backup holding them, most in runs."""
    clock = Clock()
    primary = Primary(tmp_path / "a", clock)
    node = Node(tmp_path / "b", clock)
    primary.rs.attach("b", clock.now)
    primary.enqueue(count)
    await paged(primary)
    await ship(primary.rs, node, clock, durable=durable)
    await io()
    assert node.image.run_count >= count - 100, "the copy is not in runs"
    return clock, primary, node


def test_a_promoted_copy_keeps_its_runs_reads_nothing_and_serves_every_id_in_order(
        tmp_path, monkeypatch):
    async def play():
        clock, primary, node = await copied(tmp_path)
        state = node.contents()
        node.promote(2, monkeypatch)
        assert node.reads == 0, "the promotion read records"
        queue = node.queue
        assert type(queue.messages) is RunQueue and queue.messages.count >= 500, \
            "the new primary's backlog is not in runs"
        assert len(queue.messages.head) + len(queue.messages.tail) < 100
        assert queue.depth == 600 and queue.paged_count >= 500
        assert node.pager.image_paged == 0 and node.memory.resident <= BUDGET
        in_memory = list(queue.messages.head) + list(queue.messages.tail)
        assert set(node.rs.index) == {m.rid for m in in_memory}, "the index names the runs"
        got = await take_all(node, 600)
        assert [data for _, data in got] == expected(state), "an id lost, twice or changed"
        assert [value for value, _ in got] == list(state)
        await paged(node)
        assert queue.depth == 0 and node.store.live_bytes == 0 and node.memory.paged == 0
        primary.pager.close()
        node.pager.close()

    asyncio.run(play())


def test_ttls_and_the_delivery_limit_go_on_in_the_promoted_runs(tmp_path, monkeypatch):
    """The first 100 came back once modified (delivery-count 1) before a late backup caught
    up from the primary's runs; every third has a ttl of 10 s. Promoted at t: nothing has
    expired at t + 5; at t + 11 those with a ttl are expired as they reach the head; with a
    delivery limit of 2, one more failed delivery takes exactly the first 100 out."""
    now = [5000.0]
    monkeypatch.setattr(local, "monotonic", lambda: now[0])

    async def play():
        clock = Clock()
        primary = Primary(tmp_path / "a", clock)
        for n in range(300):
            primary.queue.enqueue(local.StoredMessage(Message(
                id=n, body=f"{n}:" + "x" * 1000, ttl=10.0 if n % 3 == 0 else 0).encode()))
        primary.sent = 300
        primary.take(100)
        out, primary.consumer.out = primary.consumer.out, []
        for message in out:
            primary.queue.settled_modified(message, delivery_failed=True,
                                           undeliverable_here=False, consumer_id=1)
        await paged(primary)
        node = Node(tmp_path / "b", clock)
        primary.rs.attach("b", clock.now)
        for _ in range(100):
            await ship(primary.rs, node, clock)
            if primary.rs.streams["b"].catchup is None:
                break
            await io()
        await io()
        assert node.image.run_count >= 200
        node.promote(2, monkeypatch)
        assert node.reads == 0
        queue = node.queue
        queue.delivery_limit = 2
        now[0] += 5
        node.take(150)  # the other 150 stay in runs
        for _ in range(200):
            if len(node.consumer.out) == 150:
                break
            await io()
        assert len(node.consumer.out) == 150 and not queue.expired, "expired too soon"
        assert node.queue.messages.count >= 100
        out, node.consumer.out = node.consumer.out, []
        for message in reversed(out):  # back at the head in their order
            queue.settled_modified(message, delivery_failed=True, undeliverable_here=False,
                                   consumer_id=1)
        assert sorted(id_of(m) for m in queue.limited) == list(range(100)), \
            "the delivery-counts of the runs' messages were lost"
        now[0] += 6
        node.take(300)
        for _ in range(200):
            await io()
            if not queue.depth:
                break
        ids = [id_of(m) for m in node.consumer.out]
        assert ids == [n for n in range(100, 300) if n % 3], "ttl or order wrong"
        assert sorted(id_of(m) for m in queue.expired) == [n for n in range(100, 300)
                                                           if n % 3 == 0]
        primary.pager.close()
        node.pager.close()

    asyncio.run(play())


def id_of(message) -> int:
    decoded = Message()
    decoded.decode(bytes(body(message)))
    return decoded.id


def test_a_durable_copy_hands_its_journal_ids_over_with_its_runs(tmp_path, monkeypatch):
    async def play():
        clock, primary, node = await copied(tmp_path, 400, durable=True)
        journal_of = dict(node.journal_of)
        node.promote(2, monkeypatch)
        assert node.reads == 0 and node.queue.messages.count >= 300
        node.take(400)
        for _ in range(300):
            if len(node.consumer.out) == 400:
                break
            await io()
        assert [m.rid for m in node.consumer.out] == sorted(journal_of)
        assert all(m.journal_id == journal_of[m.rid] for m in node.consumer.out), \
            "a run's message lost its journal id"
        primary.pager.close()
        node.pager.close()

    asyncio.run(play())


@pytest.mark.parametrize("seed", range(1, 11))
def test_random_promotions_racing_consumers_then_a_backup_of_the_new_primary_and_again(
        tmp_path, seed, monkeypatch):
    """Consumers take, release and modify at the primary while its batches reach the backup
    (acquires, new bodies and dequeues in the copy's runs); the primary is lost at a random
    batch (what the backup acknowledged is what it holds). The new primary, in runs, is
    served with releases and modified bodies while a new backup catches up from its runs
    (16 events a batch); that backup equals its state, is promoted in turn, and serves
    what is left, once, in order."""
    monkeypatch.setattr(primary_module, "MAX_BATCH_EVENTS", 16 * (1 + seed % 2))

    async def play():
        rng = random.Random(seed)
        clock = Clock()
        primary = Primary(tmp_path / "a", clock)
        node = Node(tmp_path / "b", clock)
        primary.rs.attach("b", clock.now)
        primary.enqueue(500)
        await paged(primary)
        for _ in range(rng.randrange(5, 60)):  # then the primary is lost
            batch = primary.rs.take_batch("b", clock.now)
            if batch is not None:
                number, items = batch
                node.apply(events.decode(events.encode(primary.rs.epoch, number, items)))
                primary.rs.acked("b", number, clock.now)
            await io()
            pick = rng.random()
            if pick < 0.4:
                primary.take(rng.randrange(1, 30))
            elif pick < 0.7:
                primary.settle(rng, share=0.5)
            elif pick < 0.8:
                primary.enqueue(rng.randrange(1, 20))
        await io()
        state = node.contents()
        assert node.image.run_count > 100, "nothing in runs: the race proves little"
        node.promote(2, monkeypatch)
        acquired = sum(1 for _, flag in state.values() if flag)
        assert node.reads <= acquired + 5, "the promotion read the runs"
        assert node.queue.depth == len(state)
        assert node.queue.messages.count > 100, "the new primary is not in runs"

        later = Node(tmp_path / "c", clock)
        node.rs.attach("b", clock.now)  # ship() sends to "b"
        served = await take_all(node, rng.randrange(10, 60), rng)
        for _ in range(300):
            await ship(node.rs, later, clock, between=lambda: node.settle(rng, share=0.3))
            if node.rs.streams["b"].catchup is None:
                break
            node.take(rng.randrange(0, 8))
            await io()
        assert node.rs.streams["b"].catchup is None, "the catch-up did not end"
        node.consumer.credit = 0
        await paged(node)
        await ship(node.rs, later, clock)
        assert later.contents() == node.state(), "the new backup differs from the new primary"
        left = later.contents()
        accepted = set(state) - set(left)  # at the new primary, before it is lost
        later.promote(3, monkeypatch)
        assert later.reads <= sum(1 for _, flag in left.values() if flag) + 5
        rest = await take_all(later, len(left))
        assert [v for v, _ in rest] == list(left), "an id lost, twice or out of order"
        assert [data for _, data in rest] == expected(left), "a body or delivery-count wrong"
        assert accepted.isdisjoint(left) and accepted | set(left) == set(state)
        assert {v for v, _ in served} <= accepted
        await paged(later)
        assert later.queue.depth == 0 and later.store.live_bytes == 0
        for each in (primary, node, later):
            each.pager.close()

    asyncio.run(play())


def test_a_delivery_time_in_the_runs_is_held_and_a_priority_promotes_as_before(tmp_path,
                                                                              monkeypatch):
    """A message with a delivery time in the copy's runs is read alone at the promotion and
    held until its time (the rest stays in runs); a copy holding a priority other than 4
    is promoted as before (its runs read: a replicated primary's priority queue is not in
    runs), the priority message first."""
    later = Message(id="later", body="l" * 1000,
                    annotations={symbol("x-opt-delivery-time"): 4_102_444_800_000}).encode()
    urgent = Message(id="urgent", body="u" * 1000, priority=7).encode()

    async def play(extra: bytes, at: int, directory):
        clock = Clock()
        primary = Primary(directory / "a", clock)
        node = Node(directory / "b", clock)
        primary.rs.attach("b", clock.now)
        primary.enqueue(at)
        primary.queue.enqueue(local.StoredMessage(extra))
        primary.enqueue(300 - at)
        await paged(primary)
        await ship(primary.rs, node, clock)
        await io()
        assert sum(len(run.special or ()) for run in node.image.runs) == 1
        node.promote(2, monkeypatch)
        got = await take_all(node, 301 if extra is urgent else 300)
        await paged(node)
        primary.pager.close()
        node.pager.close()
        return node, [data for _, data in got]

    node, got = asyncio.run(play(later, 150, tmp_path / "1"))
    assert node.reads == 1, "more than the one record read"
    assert got == [payload(n) for n in range(300)]
    assert len(node.queue.scheduled) == 1 and body(node.queue.scheduled[0][2]) == later
    node, got = asyncio.run(play(urgent, 200, tmp_path / "2"))
    assert node.reads > 0 and got[0] == urgent
    assert got[1:] == [payload(n) for n in range(300)]


def test_entries_in_memory_between_the_runs_keep_their_place(tmp_path, monkeypatch):
    """Entries the copy kept in memory (its budget was free when they came) between runs
    (the budget full before and after): restored between the runs, in rid order."""
    async def play():
        clock = Clock()
        primary = Primary(tmp_path / "a", clock)
        node = Node(tmp_path / "b", clock)
        primary.rs.attach("b", clock.now)
        primary.enqueue(200)
        await paged(primary)
        await ship(primary.rs, node, clock)
        await io()
        node.memory.limit = 10 ** 9  # free: the next ones stay in memory
        primary.enqueue(20)
        await ship(primary.rs, node, clock)
        node.memory.limit = BUDGET
        primary.enqueue(200)
        await paged(primary)
        await ship(primary.rs, node, clock)
        await io()
        state = node.contents()
        assert len(node.image.messages) >= 20 and node.image.run_count >= 300
        node.promote(2, monkeypatch)
        assert node.reads == 0
        held = [c for c in node.queue.messages.runs if c.messages]
        assert held, "the entries between the runs are not held between them"
        got = await take_all(node, 420)
        assert [data for _, data in got] == expected(state) == [payload(n) for n in range(420)]
        primary.pager.close()
        node.pager.close()

    asyncio.run(play())
