"""Browsing a local queue (§3.5.3 distribution-mode copy) and filters, in memory."""

from __future__ import annotations

from memory import Harness
from proton import Delivery, Endpoint, Message, Terminus


def fill(c, address: str, first: int, count: int) -> None:
    snd = c.sender(address)
    for i in range(first, first + count):
        c.send(snd, Message(id=f"m{i}", body=f"body {i}"))
    c.harness.pump()


def ids(items) -> list:
    return [r.message.id for r in items]


def accept_all(c, items) -> None:
    for r in items:
        r.delivery.update(Delivery.ACCEPTED)
        r.delivery.settle()
    c.harness.pump()


def test_browser_sees_every_waiting_message_and_takes_none():
    h = Harness()
    c = h.client()
    fill(c, "q", 0, 5)
    browser = c.receiver("q", credit=10, browse=True)
    assert browser.remote_source.distribution_mode == Terminus.DIST_MODE_COPY
    seen = c.received(browser)
    assert ids(seen) == [f"m{i}" for i in range(5)]
    accept_all(c, seen)  # an outcome for a copy takes nothing from the queue
    assert h.queues.get("q").depth == 5
    consumer = c.receiver("q", credit=10)
    got = c.received(consumer)
    assert ids(got) == [f"m{i}" for i in range(5)]
    assert [r.raw for r in got] == [r.raw for r in seen]  # the copies are the same bytes


def test_browser_sees_later_messages_once_each_within_its_credit():
    h = Harness()
    c = h.client()
    browser = c.receiver("q", credit=4, browse=True)
    fill(c, "q", 0, 3)
    assert ids(c.received(browser)) == ["m0", "m1", "m2"]
    fill(c, "q", 3, 3)
    assert ids(c.received(browser)) == ["m3"]  # one credit left
    browser.flow(10)
    h.pump()
    assert ids(c.received(browser)) == ["m4", "m5"]
    fill(c, "q", 6, 1)
    assert ids(c.received(browser)) == ["m6"]
    assert h.queues.get("q").depth == 7


def test_consumers_come_first_and_a_browser_sees_only_waiting_messages():
    h = Harness()
    c = h.client()
    consumer = c.receiver("q", credit=2)
    browser = c.receiver("q", credit=10, browse=True)
    fill(c, "q", 0, 4)
    assert ids(c.received(consumer)) == ["m0", "m1"]
    assert ids(c.received(browser)) == ["m2", "m3"]


def test_browser_drain_is_answered_when_there_is_nothing_more_to_see():
    h = Harness()
    c = h.client()
    fill(c, "q", 0, 3)
    browser = c.receiver("q", browse=True)
    browser.drain(10)
    h.pump()
    assert ids(c.received(browser)) == ["m0", "m1", "m2"]
    assert browser.credit == 0  # drained: the enumeration is over
    browser.drain(5)
    h.pump()
    assert c.received(browser) == [] and browser.credit == 0
    assert h.queues.get("q").depth == 3


def test_presettled_browser_and_detach_leave_the_queue_whole():
    h = Harness()
    c = h.client()
    fill(c, "q", 0, 3)
    browser = c.receiver("q", credit=10, browse=True, presettled=True)
    seen = c.received(browser)
    assert ids(seen) == ["m0", "m1", "m2"] and all(r.delivery.settled for r in seen)
    browser.close()
    h.pump()
    queue = h.queues.get("q")
    assert queue.depth == 3 and queue.browsers == [] and queue.unacked == 0
