"""A replicated primary's drain with a slow backup (issue #44; docs/replication.md, "The
primary's stream", and docs/paging.md, "A replicated primary's drain"): the dequeues waiting
for the backup are kept compact (``proxy.replication.dequeue_runs``) and the stream's count
(``memory``: its entries' ``pending_bytes`` and its tables) is what it costs in memory, so ``MAX_STREAM_BYTES`` bounds it.

On a virtual clock, no sockets: a ``ReplicatedQueue`` with a consumer, its ``ReplicaSet``,
and a ``ReplicaImage`` fed over the wire format. Checked as a user would: the memory the
stream holds, measured object by object (``held_by``) and with ``tracemalloc``, stays under
a bound and under the count; every id is delivered once; the copy ends equal to the primary
(at every sync point, in random interleavings); the events sent are those, in the order,
that a primary without runs of dequeues sends; a backup past the bound is dropped while the
stream's memory is within it, and catches up again.
"""

from __future__ import annotations

import random
import sys
import tracemalloc

import pytest
from proton import Message

from proxy.queues.local import StoredMessage
from proxy.replication import dequeue_runs, events
from proxy.replication import primary as primary_module
from proxy.replication.primary import ReplicaSet
from proxy.replication.queue import ReplicatedQueue
from proxy.replication.replica import ReplicaImage

pytestmark = pytest.mark.timeout(60)


class Clock:
    now = 1000.0

    def __call__(self) -> float:
        return self.now


class Consumer:
    def __init__(self) -> None:
        self.consumer_id = 1
        self.credit = 0
        self.out: list = []  # delivered, not settled
        self.ids: list = []  # every id delivered, in order

    def deliver(self, message) -> None:
        self.credit -= 1
        self.out.append(message)
        decoded = Message()
        decoded.decode(message.payload)
        self.ids.append(decoded.id)


class Primary:
    """A replicated queue, its consumer and its replica set; a backup ``b`` fed by ``ship``."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.queue = ReplicatedQueue("q")
        self.rs = ReplicaSet("q", 1, clock)
        self.queue.serve_replicas(self.rs, lambda queue: None)
        self.consumer = Consumer()
        self.queue.add_consumer(self.consumer)
        self.copy = ReplicaImage("q")
        self.sent = 0
        self.wire: list = []  # (kind, rid, payload) of every event sent to b, in order

    def enqueue(self, count: int, size: int = 100) -> None:
        for _ in range(count):
            body = f"{self.sent}:" + "x" * size
            self.queue.enqueue(StoredMessage(Message(id=self.sent, body=body).encode()))
            self.sent += 1

    def take(self, count: int) -> None:
        self.consumer.credit += count
        self.queue.dispatch()

    def accept_all(self) -> None:
        out, self.consumer.out = self.consumer.out, []
        for message in out:
            self.queue.settled_accepted(message)

    def ship(self, batches: int | None = None) -> int:
        """Up to ``batches`` batches for b (all with None), over the wire, acknowledged."""
        shipped = 0
        while batches is None or shipped < batches:
            batch = self.rs.take_batch("b", self.clock.now)
            if batch is None:
                break
            number, items = batch
            decoded = events.decode(events.encode(self.rs.epoch, number, items))
            self.wire.extend((e.kind, e.rid, bytes(e.payload) if e.payload is not None else None)
                             for e in decoded.events)
            self.copy.apply(decoded)
            self.rs.acked("b", number, self.clock.now)
            shipped += 1
        return shipped

    def in_sync(self) -> None:
        self.rs.attach("b", self.clock.now)
        self.ship()
        while (proposal := self.rs.proposal()) is not None:
            self.rs.isr_committed(proposal)
        self.ship()
        assert self.rs.isr == {"b"} and not self.copy.catching_up

    def state(self) -> dict:
        return {value: (bytes(m.payload), value in self.rs.acquired)
                for value, m in sorted(self.rs.index.items())}

    def copy_state(self) -> dict:
        return {value: (e.payload, e.acquired) for value, e in sorted(self.copy.messages.items())}


def held_by(stream, tables: bool = True) -> int:
    """The bytes the stream's waiting entries hold, object by object (each counted once), and
    with ``tables`` its tables of what is not sent yet beyond empty ones."""
    seen: set = set()
    total = sys.getsizeof(stream.pending) - sys.getsizeof(type(stream.pending)())
    if tables:
        total += (sys.getsizeof(stream.unsent_enqueues) - sys.getsizeof({})
                  + sys.getsizeof(stream.unsent_acquires) - sys.getsizeof(set()))

    def count(obj) -> None:
        nonlocal total
        if obj is not None and id(obj) not in seen:
            seen.add(id(obj))
            total += sys.getsizeof(obj)

    for entry in stream.pending:
        event = entry[0]
        for obj in (entry, event, entry[1], entry[2], getattr(event, "rid", None),
                    getattr(event, "rids", None), getattr(event, "payload", None)):
            count(obj)
    return total


def test_a_slow_backup_during_a_fast_drain_keeps_the_waiting_dequeues_small():
    """A consumer takes 1,300 messages a tick, the backup one batch (512 events) a tick: the
    dequeues wait by the tens of thousands, in about 9 bytes each, counted honestly."""
    clock = Clock()
    primary = Primary(clock)
    primary.enqueue(40_000)
    primary.in_sync()
    stream = primary.rs.streams["b"]
    most_waiting, most_held = 0, 0
    while primary.queue.depth or primary.consumer.out:
        primary.take(1300)
        primary.accept_all()
        clock.now += 0.01
        primary.ship(1)
        waiting = stream.lag_events
        assert stream.memory >= held_by(stream), "the stream's count is below what it holds"
        held = held_by(stream, tables=False)  # the entries: no table of 1,300 acquires at once
        assert held <= 16 * waiting + 64 * 1024, f"{held} bytes for {waiting} dequeues waiting"
        most_waiting, most_held = max(most_waiting, waiting), max(most_held, held)
    assert most_waiting > 15_000, "the backup kept up: the test proves little"
    assert most_held < 16 * most_waiting + 64 * 1024
    primary.ship()
    assert not stream.pending and stream.pending_bytes == 0
    assert primary.consumer.ids == list(range(40_000))  # every id once, in order
    assert primary.copy_state() == primary.state() == {}


def test_the_stream_counts_at_least_what_its_entries_cost_in_memory():
    """Measured with tracemalloc: enqueues (their bytes held for the backup only), releases
    with new bytes, single dequeues and runs of dequeues waiting for a backup cost no more
    than the stream counts, and a run of dequeues costs under 10 bytes a dequeue."""
    clock = Clock()
    rs = ReplicaSet("q", 1, clock)
    stream = rs.attach("b", clock.now)
    stream.catchup = None

    class Gone:  # a message of the queue's runs, named by a purge (not in the index)
        def __init__(self, value: int) -> None:
            self.rid = value

    gone = [Gone(events.rid(1, 1_000_000 + n)) for n in range(20_000)]
    bodies = [Message(id=n, body="y" * 200).encode() for n in range(10_000)]
    tracemalloc.start()
    try:
        counted = stream.memory
        before = tracemalloc.get_traced_memory()[0]
        for n, body in enumerate(bodies):  # enqueued while the backup waits
            stream.add(events.Event(events.ENQUEUE, events.rid(1, n + 1), bytes(body)),
                       n + 1, clock())
            clock.now += 0.001
        for n in range(2000):  # released with new bytes, each followed by a dequeue
            stream.release(events.Event(events.RELEASE, events.rid(1, 500_000 + n),
                                        bytes(bodies[n]) + b"!"), rs.ticket, clock())
            rs.dequeued(gone[n], in_run=True)
            clock.now += 0.001
        mixed = tracemalloc.get_traced_memory()[0] - before
        mixed_count = stream.memory - counted
        start = tracemalloc.get_traced_memory()[0]
        for message in gone[2000:]:  # a drain: one run after another
            rs.dequeued(message, in_run=True)
            clock.now += 0.001
        drained = tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()
    assert stream.lag_events == 10_000 + 2 * 2000 + 18_000
    assert mixed <= mixed_count, f"{mixed} bytes held, {mixed_count} counted"
    assert drained <= stream.memory - counted - mixed_count, "a run of dequeues counted too low"
    assert drained < 10 * 18_000, f"{drained} bytes for 18,000 dequeues waiting"


def reference_wire(seed: int) -> tuple[list, list, dict]:
    """The events a primary sends in a random interleaving, its lag at each step, and how
    often it was seen: in sync, with runs of dequeues waiting, with one taken in part."""
    rng = random.Random(seed)
    clock = Clock()
    primary = Primary(clock)
    primary.enqueue(rng.randrange(0, 200), size=rng.choice((10, 300)))
    primary.in_sync()
    stream = primary.rs.streams["b"]
    lags, seen = [], {"sync points": 0, "runs": 0, "runs taken in part": 0}
    for step in range(400):
        pick = rng.random()
        if pick < 0.2:
            primary.enqueue(rng.randrange(1, 30), size=rng.choice((10, 300)))
        elif pick < 0.45:
            primary.take(rng.randrange(1, 60))
        elif pick < 0.75:  # the consumer settles what it holds: accepted mostly, in a row
            out, primary.consumer.out = primary.consumer.out, []
            for message in out:
                roll = rng.random()
                if roll < 0.8:
                    primary.queue.settled_accepted(message)
                elif roll < 0.9:
                    primary.queue.settled_released(message)
                else:
                    primary.queue.settled_modified(message, delivery_failed=True,
                                                   undeliverable_here=False, consumer_id=1)
        elif pick < 0.8:  # a purge: a run of dequeues of messages never handed out
            if rng.random() < 0.2:
                primary.queue.purge()
        else:
            primary.ship(rng.randrange(1, 4))
            if not stream.pending and not stream.unacked and not stream.unsent_acquires:
                assert primary.copy_state() == primary.state(), (seed, step)  # a sync point
                seen["sync points"] += 1
        clock.now += 0.01
        lags.append(stream.lag_events)
        runs = [entry[0] for entry in stream.pending if entry[0].kind == dequeue_runs.RUN]
        seen["runs"] += len(runs)
        seen["runs taken in part"] += sum(1 for run in runs if run.taken)
    primary.ship()
    assert primary.copy_state() == primary.state(), seed
    assert stream.pending_bytes == 0, seed
    return primary.wire, lags, seen


@pytest.mark.parametrize("seed", range(12))
def test_runs_of_dequeues_send_the_same_events_in_the_same_order(seed, monkeypatch):
    """Random enqueues, takes, accepts, releases, modified bodies and purges, the backup
    taking a few batches of at most 7 events at random times, runs of at most 5 dequeues
    (so they are split by batches and by their size): the copy equals the primary at every
    sync point and at the end, and the backup was sent exactly the events, in the order,
    that a primary keeping each dequeue as its own event sends (its lag counted the same)."""
    monkeypatch.setattr(primary_module, "MAX_BATCH_EVENTS", 7)
    monkeypatch.setattr(dequeue_runs, "RUN_MAX", 5)
    wire, lags, seen = reference_wire(seed)
    assert sum(1 for kind, _, _ in wire if kind == events.DEQUEUE) > 20, "too few dequeues"
    assert all(seen.values()), seen  # the interleaving proves something
    monkeypatch.setattr(dequeue_runs, "coalesce", lambda stream, value: False)
    plain_wire, plain_lags, plain_seen = reference_wire(seed)
    assert plain_seen["runs"] == 0
    assert wire == plain_wire and lags == plain_lags


def test_a_backup_past_the_bound_is_dropped_within_it_and_catches_up_again(monkeypatch):
    """``MAX_STREAM_BYTES`` at 256 KiB: a drain with the backup silent fills its stream
    until the count passes the bound; the backup is dropped then, while what the stream
    holds is still within the bound; attached again, it catches up to the primary's state
    and follows the rest of the drain."""
    bound = 256 * 1024
    monkeypatch.setattr(primary_module, "MAX_STREAM_BYTES", bound)
    clock = Clock()
    primary = Primary(clock)
    primary.enqueue(60_000, size=10)
    primary.in_sync()
    stream = primary.rs.streams["b"]
    dropped = []
    for _ in range(60):
        primary.take(1000)
        primary.accept_all()
        clock.now += 0.01
        assert held_by(stream) <= stream.memory
        dropped = primary.rs.lagging(clock.now)
        if dropped:
            break
    assert dropped and dropped[0][0] == "b" and "bytes waiting" in dropped[0][1], dropped
    assert held_by(stream) <= bound + dequeue_runs.RUN_COST + 64 * 1024
    # ~9 bytes a dequeue: ~28,000 fit in 256 KiB, less the table of the 1,000 acquires at once
    assert stream.lag_events > 20_000
    primary.rs.detach("b", dropped[0][1])
    primary.copy.restart(1)
    primary.in_sync()  # a fresh catch-up of what is left
    assert primary.copy_state() == primary.state() and len(primary.state()) > 0
    while primary.queue.depth or primary.consumer.out:
        primary.take(1000)
        primary.accept_all()
        primary.ship(2)
        assert not primary.rs.lagging(clock.now)
    primary.ship()
    assert primary.consumer.ids == list(range(60_000))
    assert primary.copy_state() == primary.state() == {}


def test_two_nodes_a_backup_that_stops_acknowledging_during_a_drain(tmp_path, monkeypatch):
    """Real nodes on the virtual clock (a static pair, ``orders.x`` replicated on a and b): 3,000
    messages stored and held by b; b then applies batches but does not acknowledge them while
    a consumer on a takes and accepts all of them. The dequeues waiting for b are one run at
    a (about 9 bytes each, honestly counted), b is not dropped; once b answers again its copy
    ends empty as a's queue, and the consumer got every id once, in order."""
    from playbook import World, run
    from test_replication_playbooks import PEERS, Consumer, service, view

    from proxy.replication import links

    rule = {"name": "orders", "match": "orders.*", "kind": "replicated", "replicas": 2,
            "nodes": ["a", "b"]}
    held_back: list = []
    answering = [True]
    settle = links.ReplicaSink.settle

    def slow_settle(sink, item) -> None:
        if answering[0]:
            settle(sink, item)
        else:
            held_back.append((sink, item))
    monkeypatch.setattr(links.ReplicaSink, "settle", slow_settle)

    async def play():
        world = World(tmp_path)
        a = await world.node("a", peers=PEERS, rules=[rule])
        b = await world.node("b", peers=PEERS, rules=[rule])
        producer = await world.client("a", "producer")
        sender = producer.sender("orders.x")
        await world.until(lambda: view(a, "orders.x").get("in_sync") == ["b"], what="b in sync")
        sent = 0
        while sent < 3000:
            await world.until(lambda: sender.credit > 0, what="credit")
            while sender.credit > 0 and sent < 3000:
                sender.send(b"x" * 200, message_id=sent, flush=False)
                sent += 1
            producer.flush()
        await world.until(lambda: sender.accepted() == 3000, what="stored, b holding each")
        stream = service(a).addresses["orders.x"].primary.replica_set.streams["b"]
        answering[0] = False
        link = (await world.client("a", "consumer")).receiver("orders.x", credit=500)
        consumer = Consumer(link)

        def drained() -> bool:
            consumer.step()
            if link.credit < 250:
                link.flow(500 - link.credit)
            return len(consumer.ids()) == 3000 and stream.lag_events >= 2000
        await world.until(drained, timeout=5, what="drained while b is silent")
        await world.quiet(0.1)
        waiting = stream.lag_events
        assert len(stream.pending) <= 2 and stream.pending[-1][0].kind == dequeue_runs.RUN
        assert held_by(stream) <= stream.memory, (held_by(stream), stream.memory)
        assert stream.pending_bytes <= 16 * waiting + 1024, (stream.pending_bytes, waiting)
        assert view(a, "orders.x")["backups"][0]["stream_bytes"] == stream.memory
        assert view(a, "orders.x")["in_sync"] == ["b"]  # not dropped
        answering[0] = True
        for sink, item in held_back:
            settle(sink, item)
        copy = service(b).addresses["orders.x"].backup.image
        await world.until(lambda: not stream.pending and not stream.unacked and not copy.messages,
                          what="b follows the drain to empty")
        assert consumer.ids() == list(range(3000))
        assert a.queues.get("orders.x").depth == 0 and stream.pending_bytes == 0
        await world.close()

    run(play)
