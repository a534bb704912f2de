"""Message ttl on local queues (§3.2.1), in memory, on a clock the test moves."""

from __future__ import annotations

import pytest
from memory import Harness
from proton import Message

import proxy.queues.local as local_queues


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(local_queues, "monotonic", clock)
    return clock


def send(c, address: str, specs) -> None:
    snd = c.sender(address)
    for mid, ttl in specs:
        c.send(snd, Message(id=mid, body="x", ttl=ttl) if ttl else Message(id=mid, body="x"))
    c.harness.pump()


def ids(items) -> list:
    return [r.message.id for r in items]


def test_expired_messages_are_not_delivered(clock):
    h = Harness()
    c = h.client()
    send(c, "q", [("short", 1.0), ("none", None), ("long", 60.0), ("short2", 0.5)])
    clock.now += 2.0
    rcv = c.receiver("q", credit=10)
    assert ids(c.received(rcv)) == ["none", "long"]
    stats = h.queues.get("q").stats
    assert stats.expired == 2 and stats.delivered == 2


def test_live_messages_are_delivered_before_their_ttl(clock):
    h = Harness()
    c = h.client()
    send(c, "q", [("a", 1.0), ("b", 1.0)])
    clock.now += 0.9
    rcv = c.receiver("q", credit=10)
    assert ids(c.received(rcv)) == ["a", "b"]
    assert h.queues.get("q").stats.expired == 0


def test_expired_messages_leave_the_head_without_consumers_and_are_dead_lettered(clock):
    h = Harness(dead_letter="dlq")
    c = h.client()
    send(c, "q", [("old", 1.0)])
    clock.now += 5.0
    send(c, "q", [("new", None)])  # the queue is dispatched: its expired head goes
    queue = h.queues.get("q")
    assert queue.depth == 1 and queue.stats.expired == 1 and queue.stats.dead_lettered == 1
    clock.now += 3600.0  # a dead-lettered copy does not expire again
    rcv = c.receiver("dlq", credit=10)
    assert ids(c.received(rcv)) == ["old"]


def test_a_browser_does_not_see_expired_messages(clock):
    h = Harness()
    c = h.client()
    send(c, "q", [("old", 1.0), ("live", 100.0)])
    clock.now += 2.0
    browser = c.receiver("q", credit=10, browse=True)
    assert ids(c.received(browser)) == ["live"]
