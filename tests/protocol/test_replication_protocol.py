"""The replication protocol as data (proxy.replication): primary, streams, copies, on a virtual clock.

No sockets and no nodes: a ``ReplicaSet`` (the primary's side) makes batches,
they are encoded and decoded as on the wire, and ``ReplicaImage`` copies
apply them. Checked: a copy equals the primary after a catch-up that races
with dequeues, acquires and releases; a lower epoch is refused; a producer's
delivery completes only when every in-sync copy holds it (and at least
``min_in_sync`` copies do); a lagging backup leaves the in-sync set and comes
back after a new catch-up; promotion raises the delivery-count of what was
out with a consumer.
"""

from __future__ import annotations

import random

import pytest

from proxy.amqp import message_header
from proxy.queues.local import StoredMessage
from proxy.replication import events
from proxy.replication.primary import ReplicaSet
from proxy.replication.replica import ReplicaImage, StaleEpoch
from proxy.replication.states import CopyState
from proton import Message


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def message(n: int) -> StoredMessage:
    return StoredMessage(Message(id=n, body=f"body {n}").encode())


def ship(primary: ReplicaSet, node: str, copy: ReplicaImage, clock: Clock, *, ack=True) -> int:
    """Every batch ``node`` has waiting, over the wire format, applied; acknowledged."""
    shipped = 0
    while (batch := primary.take_batch(node, clock.now)) is not None:
        number, items = batch
        decoded = events.decode(events.encode(primary.epoch, number, items))
        copy.apply(decoded)
        if ack:
            primary.acked(node, number, clock.now)
        shipped += 1
    return shipped


def state_of(primary: ReplicaSet) -> dict:
    return {rid: (bytes(m.payload), rid in primary.acquired) for rid, m in primary.index.items()}


def copy_state(copy: ReplicaImage) -> dict:
    return {rid: (e.payload, e.acquired) for rid, e in copy.messages.items()}


def commit(primary: ReplicaSet) -> None:
    while (proposal := primary.proposal()) is not None:
        primary.isr_committed(proposal)


def test_a_backup_attached_first_follows_every_event_and_completes_deliveries():
    clock = Clock()
    primary = ReplicaSet("q", epoch=1, clock=clock)
    copy = ReplicaImage("q")
    primary.attach("b", clock.now)
    ship(primary, "b", copy, clock)  # an empty catch-up
    commit(primary)
    assert primary.isr == {"b"} and primary.streams["b"].state == CopyState.READY
    held = [message(n) for n in range(5)]
    for m in held:
        primary.wait(primary.enqueued(m), m)
    assert primary.completed() == []  # the backup has not acknowledged them
    primary.acquired_by_consumer(held[0])
    primary.dequeued(held[1])
    ship(primary, "b", copy, clock)
    assert primary.completed() == held
    assert copy_state(copy) == state_of(primary)
    assert [events.rid_epoch(r) for r in copy.messages] == [1] * 4


def test_catch_up_racing_with_dequeues_acquires_and_releases_ends_equal_to_the_primary():
    for seed in range(40):
        rng = random.Random(seed)
        clock = Clock()
        primary = ReplicaSet("q", epoch=3, clock=clock)
        live = []
        for n in range(rng.randint(0, 300)):
            m = message(n)
            primary.enqueued(m)
            live.append(m)
        copy = ReplicaImage("q")
        primary.attach("b", clock.now)
        counter = 1000
        while primary.streams["b"].catchup is not None or rng.random() < 0.3:
            for _ in range(rng.randint(0, 20)):  # traffic meanwhile
                action = rng.random()
                if action < 0.35 or not live:
                    m = message(counter)
                    counter += 1
                    primary.enqueued(m)
                    live.append(m)
                elif action < 0.6:
                    primary.dequeued(live.pop(rng.randrange(len(live))))
                elif action < 0.8:
                    primary.acquired_by_consumer(rng.choice(live))
                else:
                    m = rng.choice(live)
                    changed = rng.random() < 0.5
                    if changed:
                        m.payload = message_header.modify(m.payload, increment_count=True)
                    primary.released(m, changed)
            batch = primary.take_batch("b", clock.now)
            if batch is not None:
                copy.apply(events.decode(events.encode(primary.epoch, *batch)))
                primary.acked("b", batch[0], clock.now)
        ship(primary, "b", copy, clock)
        assert not copy.catching_up and copy.unknown == 0, seed
        assert copy_state(copy) == state_of(primary), seed
        assert list(copy.messages) == sorted(copy.messages), seed  # rid order


def test_a_batch_of_a_lower_epoch_is_refused():
    clock = Clock()
    copy = ReplicaImage("q")
    new = ReplicaSet("q", epoch=5, clock=clock)
    new.attach("b", clock.now)
    ship(new, "b", copy, clock)
    old = ReplicaSet("q", epoch=4, clock=clock)
    old.attach("b", clock.now)
    number, items = old.take_batch("b", clock.now)
    with pytest.raises(StaleEpoch):
        copy.apply(events.decode(events.encode(old.epoch, number, items)))
    with pytest.raises(StaleEpoch):
        copy.restart(4)


def test_completion_waits_for_every_in_sync_copy_and_min_in_sync():
    clock = Clock()
    primary = ReplicaSet("q", epoch=1, clock=clock, min_in_sync=3)
    copies = {"b": ReplicaImage("q"), "c": ReplicaImage("q")}
    for node, copy in copies.items():
        primary.attach(node, clock.now)
        ship(primary, node, copy, clock)
    commit(primary)
    assert primary.isr == {"b", "c"}
    m = message(1)
    primary.wait(primary.enqueued(m), m)
    ship(primary, "b", copies["b"], clock)
    assert primary.completed() == []  # c does not hold it yet
    ship(primary, "c", copies["c"], clock)
    assert primary.completed() == [m]

    # c goes: until its removal is committed nothing completes; then min_in_sync 3 is not met
    primary.detach("c")
    m2 = message(2)
    primary.wait(primary.enqueued(m2), m2)
    ship(primary, "b", copies["b"], clock)
    assert primary.completed() == []
    commit(primary)
    assert primary.isr == {"b"} and primary.completed() == []
    primary.min_in_sync = 2
    assert primary.completed() == [m2]


def test_a_lagging_backup_leaves_the_in_sync_set_then_catches_up_and_rejoins():
    clock = Clock()
    primary = ReplicaSet("q", epoch=1, clock=clock, catchup_timeout=10.0)
    copy = ReplicaImage("q")
    primary.attach("b", clock.now)
    ship(primary, "b", copy, clock)
    commit(primary)
    sent = [message(n) for n in range(3)]
    for m in sent:
        primary.wait(primary.enqueued(m), m)
    ship(primary, "b", copy, clock, ack=False)  # sent, never acknowledged
    clock.now += 5
    assert primary.lagging(clock.now) == []
    clock.now += 6
    (node, why), = primary.lagging(clock.now)
    assert node == "b" and "behind" in why
    primary.detach("b", why)
    assert primary.completed() == []  # not before the smaller ISR is written
    commit(primary)
    assert primary.isr == frozenset() and primary.completed() == sent  # availability: alone

    # it comes back: a new catch-up, then it is in sync again
    primary.dequeued(sent[0])
    later = message(9)
    primary.enqueued(later)
    copy.restart(primary.epoch)
    primary.attach("b", clock.now)
    assert primary.proposal() is None  # not before its catch-up is acknowledged
    ship(primary, "b", copy, clock)
    commit(primary)
    assert primary.isr == {"b"} and copy_state(copy) == state_of(primary)


def test_promotion_gives_what_was_out_with_a_consumer_again_counted():
    clock = Clock()
    primary = ReplicaSet("q", epoch=1, clock=clock)
    copy = ReplicaImage("q")
    primary.attach("b", clock.now)
    held = [message(n) for n in range(4)]
    for m in held:
        primary.enqueued(m)
    primary.acquired_by_consumer(held[1])
    ship(primary, "b", copy, clock)
    content = copy.promote()
    assert [r for r, _ in content] == [m.rid for m in held]
    decoded = []
    for _, entry in content:
        msg = Message()
        msg.decode(entry.payload)
        decoded.append(msg.delivery_count)
    assert decoded == [0, 1, 0, 0]
    assert not any(e.acquired for _, e in content)


def test_what_is_settled_before_its_batch_leaves_is_never_sent():
    """Events wait for the next batch (the primary keeps few batches in flight): a message
    enqueued, acquired and accepted in between costs the backup nothing, and its producer's
    delivery still completes once the backup acknowledges the batch."""
    clock = Clock()
    primary = ReplicaSet("q", epoch=1, clock=clock)
    copy = ReplicaImage("q")
    primary.attach("b", clock.now)
    ship(primary, "b", copy, clock)
    commit(primary)
    quick, slow, released = message(1), message(2), message(3)
    for m in (quick, slow, released):
        primary.wait(primary.enqueued(m), m)
    primary.acquired_by_consumer(quick)
    primary.dequeued(quick)  # consumed before any batch left
    primary.acquired_by_consumer(released)
    primary.released(released, False)  # handed out and back: nothing to tell
    primary.acquired_by_consumer(slow)  # still out with its consumer
    number, items = primary.take_batch("b", clock.now)
    kinds = [(bytes([e.kind]), e.rid) for e in items]
    assert kinds == [(b"S", 0), (b"E", slow.rid), (b"E", released.rid), (b"A", slow.rid)]
    copy.apply(events.decode(events.encode(primary.epoch, number, items)))
    primary.acked("b", number, clock.now)
    assert primary.completed() == [quick, slow, released]
    assert copy_state(copy) == state_of(primary)


def test_a_delivery_whose_message_was_consumed_before_any_batch_left_still_completes():
    """Every event waiting for the backup cancelled (the messages were consumed before a batch
    went out): no batch is sent, and the producers' deliveries complete all the same, at once
    or with the batch still on its way (the bench's stalls, fixed)."""
    clock = Clock()
    primary = ReplicaSet("q", epoch=1, clock=clock)
    copy = ReplicaImage("q")
    primary.attach("b", clock.now)
    ship(primary, "b", copy, clock)
    commit(primary)
    ship(primary, "b", copy, clock)  # the in-sync notice
    first = message(1)
    primary.wait(primary.enqueued(first), first)
    number, items = primary.take_batch("b", clock.now)  # on its way, not acknowledged
    gone = message(2)
    primary.wait(primary.enqueued(gone), gone)
    primary.acquired_by_consumer(gone)
    primary.dequeued(gone)
    assert primary.take_batch("b", clock.now) is None  # nothing left to send
    assert primary.completed() == []
    primary.acked("b", number, clock.now)
    assert primary.completed() == [first, gone]
    later = message(3)
    primary.wait(primary.enqueued(later), later)
    primary.dequeued(later)
    assert primary.take_batch("b", clock.now) is None
    assert primary.completed() == [later]  # nothing on its way: at once
