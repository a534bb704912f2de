"""Selectors, priority, scheduled delivery and the delivery limit on a local queue, in memory
(issue #43, docs/queue-semantics.md). The same cases run against Artemis and fedgate over
the network with Qpid JMS and proton in tests/interop/test_jms_semantics.py."""

from __future__ import annotations

import time

import pytest
from memory import Harness
from proton import Delivery, Endpoint, Message, symbol

from proxy.queues import schedule


def send(c, address: str, messages) -> None:
    snd = c.sender(address)
    for message in messages:
        c.send(snd, message)
    c.harness.pump()


def ids(items) -> list:
    return [r.message.id for r in items]


def settle(c, items, outcome=Delivery.ACCEPTED) -> None:
    for r in items:
        r.delivery.update(outcome)
        r.delivery.settle()
    c.harness.pump()


def colours(count: int) -> list[Message]:
    return [Message(id=f"m{i}", body=i, properties={"colour": ("red", "blue")[i % 2], "n": i})
            for i in range(count)]


# -- selectors --------------------------------------------------------------------------------
def test_a_selective_consumer_gets_only_what_it_selects_and_the_rest_waits():
    h = Harness()
    c = h.client()
    send(c, "q", colours(10))
    red = c.receiver("q", credit=100, selector="colour = 'red' AND n > 2")
    assert not red.state & Endpoint.REMOTE_CLOSED
    assert ids(c.received(red)) == ["m4", "m6", "m8"]
    queue = h.queues.get("q")
    assert queue.depth == 7  # not selected: waiting
    everyone = c.receiver("q", credit=100)
    assert ids(c.received(everyone)) == ["m0", "m1", "m2", "m3", "m5", "m7", "m9"]


def test_consumers_with_different_selectors_compete_and_each_message_goes_once():
    h = Harness()
    c = h.client()
    red = c.receiver("q", credit=100, selector="colour = 'red'")
    blue = c.receiver("q", credit=100, selector="colour <> 'red'")
    send(c, "q", colours(20))
    got_red, got_blue = ids(c.received(red)), ids(c.received(blue))
    assert got_red == [f"m{i}" for i in range(0, 20, 2)]
    assert got_blue == [f"m{i}" for i in range(1, 20, 2)]
    assert h.queues.get("q").depth == 0


def test_a_released_message_goes_back_to_the_selective_consumer_that_selects_it():
    h = Harness()
    c = h.client()
    red = c.receiver("q", credit=1, selector="colour = 'red'")
    send(c, "q", colours(4))
    first = c.received(red)
    assert ids(first) == ["m0"]
    settle(c, first, Delivery.RELEASED)
    red.flow(1)
    h.pump()
    assert ids(c.received(red)) == ["m0"]  # at the head again, before m2


def test_the_attach_answers_with_the_selector_it_applies():
    h = Harness()
    c = h.client()
    rcv = c.receiver("q", credit=1, selector="colour = 'red'")
    rcv.remote_source.filter.rewind()
    rcv.remote_source.filter.next()
    answered = rcv.remote_source.filter.get_object()
    assert [str(v.descriptor) for v in answered.values()] == ["apache.org:selector-filter:string"]
    assert [v.value for v in answered.values()] == ["colour = 'red'"]


def test_a_selector_that_does_not_parse_is_refused_with_invalid_field_and_its_position():
    h = Harness()
    c = h.client()
    send(c, "q", colours(2))
    rcv = c.receiver("q", credit=10, selector="colour = 'red' AND")
    assert rcv.state & Endpoint.REMOTE_CLOSED
    assert rcv.remote_condition.name == "amqp:invalid-field"
    assert "position" in rcv.remote_condition.description
    assert c.received(rcv) == [] and h.queues.get("q").depth == 2
    good = c.receiver("q", credit=10)  # the node serves on
    assert len(c.received(good)) == 2


def test_a_filter_other_than_a_selector_is_refused_not_echoed():
    h = Harness()
    c = h.client()
    rcv = c.receiver("q", credit=10, filters={symbol("x"): "something"})
    assert rcv.remote_condition.name == "amqp:not-implemented"


def test_a_selector_on_a_temporary_queue_and_on_a_browser():
    h = Harness()
    c = h.client()
    tmp = c.receiver(None, dynamic=True, credit=10, selector="colour = 'blue'")
    address = tmp.remote_source.address
    send(c, address, colours(4))
    assert ids(c.received(tmp)) == ["m1", "m3"]
    send(c, "q", colours(6))
    browser = c.receiver("q", credit=10, browse=True, selector="n >= 3")
    assert ids(c.received(browser)) == ["m3", "m4", "m5"]
    assert h.queues.get("q").depth == 6


def test_jms_header_names_select_on_the_amqp_fields():
    h = Harness()
    c = h.client()
    send(c, "q", [Message(id="a", priority=7, durable=True, correlation_id="c1", body=1),
                  Message(id="b", priority=2, body=2)])
    rcv = c.receiver("q", credit=10,
                     selector="JMSPriority > 5 AND JMSDeliveryMode = 'PERSISTENT' "
                              "AND JMSCorrelationID = 'c1'")
    assert ids(c.received(rcv)) == ["a"]


# -- priority ---------------------------------------------------------------------------------
def test_higher_priority_first_and_fifo_within_a_priority():
    h = Harness()
    c = h.client()
    order = [(0, 4), (1, 9), (2, 4), (3, 0), (4, 9), (5, 7), (6, None)]
    send(c, "q", [Message(id=f"m{i}", body=i, **({"priority": p} if p is not None else {}))
                  for i, p in order])
    rcv = c.receiver("q", credit=100)
    assert ids(c.received(rcv)) == ["m1", "m4", "m5", "m0", "m2", "m6", "m3"]


def test_priority_holds_for_competing_consumers_and_for_released_messages():
    h = Harness()
    c = h.client()
    send(c, "q", [Message(id=f"low{i}", priority=1, body=i) for i in range(3)]
         + [Message(id=f"high{i}", priority=8, body=i) for i in range(3)])
    one = c.receiver("q", credit=2)
    two = c.receiver("q", credit=2)
    first, second = c.received(one), c.received(two)
    assert sorted(ids(first) + ids(second)) == ["high0", "high1", "high2", "low0"]
    highs = [r for r in first + second if r.message.id.startswith("high")]
    settle(c, highs, Delivery.RELEASED)
    third = c.receiver("q", credit=10)
    got = ids(c.received(third))  # each released one back at the head of its priority
    assert sorted(got[:3]) == ["high0", "high1", "high2"] and got[3:] == ["low1", "low2"]


def test_a_priority_above_nine_counts_as_nine():
    h = Harness()
    c = h.client()
    send(c, "q", [Message(id="nine", priority=9, body=0), Message(id="big", priority=200, body=1)])
    rcv = c.receiver("q", credit=10)
    assert ids(c.received(rcv)) == ["nine", "big"]


# -- scheduled delivery -----------------------------------------------------------------------
@pytest.fixture
def clock(monkeypatch):
    """The wall clock the schedule reads, moved by hand."""
    now = [time.time()]
    monkeypatch.setattr(schedule.time, "time", lambda: now[0])
    return now


def test_a_message_with_a_delivery_time_waits_until_then_and_is_counted_apart(clock):
    h = Harness()
    c = h.client()
    at = int(clock[0] * 1000) + 60_000
    send(c, "q", [Message(id="later", body=0, annotations={symbol("x-opt-delivery-time"): at}),
                  Message(id="now", body=1)])
    rcv = c.receiver("q", credit=10)
    assert ids(c.received(rcv)) == ["now"]
    queue = h.queues.get("q")
    assert queue.depth == 0 and len(queue.scheduled) == 1 and queue.next_due == at / 1000
    clock[0] += 59.0
    h.broker.dirty_queues.add(queue)
    h.pump()
    assert c.received(rcv) == []
    clock[0] += 1.5
    h.broker.dirty_queues.add(queue)
    h.pump()
    assert ids(c.received(rcv)) == ["later"] and not queue.scheduled


def test_a_delay_becomes_a_time_when_the_message_arrives(clock):
    h = Harness()
    c = h.client()
    send(c, "q", [Message(id=f"d{i}", body=i,
                          annotations={symbol("x-opt-delivery-delay"): 10_000 - i * 1000})
                  for i in range(3)])
    queue = h.queues.get("q")
    assert len(queue.scheduled) == 3 and queue.depth == 0
    stored = [entry[2] for entry in sorted(queue.scheduled)]
    times = [schedule.due_of(m.payload) for m in stored]
    assert times == sorted(times) and abs(times[-1] - (clock[0] + 10)) < 0.01
    rcv = c.receiver("q", credit=10)
    clock[0] += 11
    h.broker.dirty_queues.add(queue)
    h.pump()
    assert ids(c.received(rcv)) == ["d2", "d1", "d0"]  # in the order of their times


def test_a_modified_outcome_with_a_delivery_time_delays_the_redelivery(clock):
    h = Harness()
    c = h.client()
    send(c, "q", [Message(id="retry", body=0)])
    rcv = c.receiver("q", credit=10)
    got = c.received(rcv)
    got[0].delivery.local.annotations = {symbol("x-opt-delivery-time"):
                                         int(clock[0] * 1000) + 5000}
    settle(c, got, Delivery.MODIFIED)
    queue = h.queues.get("q")
    assert len(queue.scheduled) == 1 and c.received(rcv) == []
    clock[0] += 6
    h.broker.dirty_queues.add(queue)
    h.pump()
    assert ids(c.received(rcv)) == ["retry"]


def test_a_purge_takes_the_scheduled_messages_too(clock):
    h = Harness()
    c = h.client()
    send(c, "q", [Message(id="x", body=0, annotations={symbol("x-opt-delivery-delay"): 60_000}),
                  Message(id="y", body=1)])
    queue = h.queues.get("q")
    assert queue.purge() == 2 and queue.bytes == 0 and not queue.scheduled


# -- delivery limit ---------------------------------------------------------------------------
def dead_letter_annotations(message: Message) -> dict:
    return {str(k): v for k, v in (message.annotations or {}).items()
            if str(k).startswith("x-opt-dead-letter")}


@pytest.mark.parametrize("outcome", ["modified", "detach"])
def test_a_message_back_delivery_limit_times_goes_to_the_dead_letter_queue(outcome):
    h = Harness()
    c = h.client()
    h.queues.declare("q", delivery_limit=3, dead_letter="dlq")
    send(c, "q", [Message(id="poison", body=0), Message(id="fine", body=1)])
    for attempt in range(3):
        rcv = c.receiver("q", credit=1)
        got = c.received(rcv)
        assert ids(got) == ["poison"], attempt
        if outcome == "released":
            settle(c, got, Delivery.RELEASED)
        elif outcome == "modified":
            got[0].delivery.local.failed = True
            settle(c, got, Delivery.MODIFIED)
        rcv.close()
        h.pump()
    queue = h.queues.get("q")
    assert queue.depth == 1 and queue.stats.delivery_limited == 1 and queue.stats.dead_lettered == 1
    dead = c.receiver("dlq", credit=10)
    got = c.received(dead)
    assert ids(got) == ["poison"]
    notes = dead_letter_annotations(got[0].message)
    assert notes["x-opt-dead-letter-address"] == "q"
    assert notes["x-opt-dead-letter-reason"] == "delivery-limit"
    assert abs(notes["x-opt-dead-letter-time"] / 1000 - time.time()) < 60
    rest = c.receiver("q", credit=10)
    assert ids(c.received(rest)) == ["fine"]


def test_released_does_not_count_but_delivery_failed_does():
    """As in Artemis: released means not processed (§3.4.4); Qpid JMS releases the messages it
    had prefetched at every rollback, which the application never saw."""
    h = Harness()
    c = h.client()
    h.queues.declare("q", delivery_limit=2)
    send(c, "q", [Message(id="m", body=0)])
    rcv = c.receiver("q", credit=1)
    for _ in range(5):
        got = c.received(rcv)
        assert ids(got) == ["m"]
        settle(c, got, Delivery.RELEASED)
        rcv.flow(1)
        h.pump()
    assert h.queues.get("q").stats.delivery_limited == 0


def test_without_a_dead_letter_address_the_limited_message_is_dropped_and_counted():
    h = Harness()
    c = h.client()
    h.queues.declare("q", delivery_limit=2)
    send(c, "q", [Message(id="poison", body=0)])
    rcv = c.receiver("q", credit=1)
    for _ in range(2):
        got = c.received(rcv)
        assert ids(got) == ["poison"]
        got[0].delivery.local.failed = True
        settle(c, got, Delivery.MODIFIED)
        rcv.flow(1)
        h.pump()
    assert c.received(rcv) == []
    queue = h.queues.get("q")
    assert queue.depth == 0 and queue.stats.delivery_limited == 1 and queue.bytes == 0


def test_a_rejected_message_is_dead_lettered_with_the_reason():
    h = Harness(dead_letter="dlq")
    c = h.client()
    send(c, "q", [Message(id="bad", body=0)])
    rcv = c.receiver("q", credit=1)
    settle(c, c.received(rcv), Delivery.REJECTED)
    got = c.received(c.receiver("dlq", credit=1))
    assert ids(got) == ["bad"]
    assert dead_letter_annotations(got[0].message)["x-opt-dead-letter-reason"] == "rejected"


def test_the_priority_store_against_a_model_under_random_operations():
    """Random enqueues, takes from the head and from the middle, and returns to the head: the
    store always gives the model's head (highest priority, then arrival, returned first)."""
    import random

    from proxy.queues.local import StoredMessage
    from proxy.queues.store import PriorityStore

    rng = random.Random(43)
    store, model, seq = PriorityStore(), [], 0  # model: (-priority, rank, seq) kept sorted
    front = 0
    for _ in range(5000):
        op = rng.random()
        if op < 0.5 or not model:
            seq += 1
            message = StoredMessage(b"", seq=seq, priority=rng.choice((0, 4, 4, 4, 7, 9)))
            store.append(message)
            model.append((-message.priority, seq, seq, message))
        elif op < 0.7:
            model.sort(key=lambda m: m[:2])
            assert store[0] is model[0][3]
            assert store.popleft() is model.pop(0)[3]
        elif op < 0.85:
            item = model.pop(rng.randrange(len(model)))
            assert store.remove(item[3]) and not store.remove(item[3])
        else:
            model.sort(key=lambda m: m[:2])
            item = model.pop(0)
            store.popleft()
            front -= 1  # back at the head of its priority: before everything of that priority
            store.appendleft(item[3])
            model.append((item[0], front, item[2], item[3]))
        assert len(store) == len(model)
    model.sort(key=lambda m: m[:2])
    assert list(store) == [m[3] for m in model]
