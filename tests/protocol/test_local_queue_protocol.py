"""Local-queue semantics over in-memory proton transports (no sockets)."""

from __future__ import annotations

from memory import Harness
from proton import Delivery, Endpoint, Message, Terminus


def msg(i: int, **kw) -> Message:
    return Message(id=f"m{i}", body=f"body {i}", **kw)


def ids(items) -> list:
    return [r.message.id for r in items]


def settle_all(items, state=Delivery.ACCEPTED):
    for r in items:
        r.delivery.update(state)
        r.delivery.settle()


def test_bytes_forwarded_unchanged_and_accepted():
    h = Harness()
    c = h.client()
    snd = c.sender("q")
    encoded = msg(1, properties={"k": "v"}, subject="s").encode()
    d = c.send(snd, encoded)
    h.pump()
    assert d.remote_state == Delivery.ACCEPTED and d.settled
    rcv = c.receiver("q", credit=5)
    got = c.received(rcv)
    assert [r.raw for r in got] == [bytes(encoded)]


def test_competing_consumers_round_robin_and_never_beyond_credit():
    h = Harness()
    c = h.client()
    receivers = [c.receiver("q", credit=10) for _ in range(3)]
    small = c.receiver("q", credit=2)
    snd = c.sender("q")
    for i in range(40):
        c.send(snd, msg(i))
    h.pump()
    counts = [len(c.received(r)) for r in receivers]
    assert counts == [10, 10, 10]
    assert len(c.received(small)) == 2
    assert h.queues.get("q").depth == 40 - 32


def test_drain_on_empty_queue_returns_credit():
    h = Harness()
    c = h.client()
    rcv = c.receiver("q")
    rcv.drain(7)
    h.pump()
    assert rcv.credit == 0  # the node answered the drain: no messages, credit consumed
    assert c.received(rcv) == []


def test_released_goes_back_to_head():
    h = Harness()
    c = h.client()
    snd = c.sender("q")
    for i in range(3):
        c.send(snd, msg(i))
    r1 = c.receiver("q", credit=1)
    first = c.received(r1)
    assert ids(first) == ["m0"]
    settle_all(first, Delivery.RELEASED)
    h.pump()
    r2 = c.receiver("q", credit=3)
    got = c.received(r2)
    assert ids(got)[0] == "m0"
    assert got[0].message.delivery_count == 0  # released does not count (3.4.4)


def test_modified_delivery_failed_increments_count():
    h = Harness()
    c = h.client()
    snd = c.sender("q")
    c.send(snd, msg(0, durable=True, priority=7))
    rcv = c.receiver("q", credit=1)
    (first,) = c.received(rcv)
    first.delivery.local.failed = True
    first.delivery.update(Delivery.MODIFIED)
    first.delivery.settle()
    rcv.flow(1)
    h.pump()
    (again,) = c.received(rcv)
    assert again.message.id == "m0"
    assert again.message.delivery_count == 1
    assert again.message.durable is True and again.message.priority == 7


def test_modified_undeliverable_here_goes_to_another_link():
    h = Harness()
    c = h.client()
    snd = c.sender("q")
    c.send(snd, msg(0))
    r1 = c.receiver("q", credit=5)
    (first,) = c.received(r1)
    first.delivery.local.undeliverable = True
    first.delivery.update(Delivery.MODIFIED)
    first.delivery.settle()
    h.pump()
    assert c.received(r1) == []  # never offered to r1 again
    r2 = c.receiver("q", credit=5)
    assert ids(c.received(r2)) == ["m0"]


def test_rejected_is_dropped_or_dead_lettered():
    h = Harness(dead_letter=None)
    c = h.client()
    snd = c.sender("q")
    c.send(snd, msg(0))
    rcv = c.receiver("q", credit=5)
    settle_all(c.received(rcv), Delivery.REJECTED)
    h.pump()
    assert c.received(rcv) == [] and h.queues.get("q").depth == 0

    h = Harness(dead_letter="dlq")
    c = h.client()
    snd = c.sender("q")
    c.send(snd, msg(1))
    rcv = c.receiver("q", credit=5)
    settle_all(c.received(rcv), Delivery.REJECTED)
    h.pump()
    dlq = c.receiver("dlq", credit=5)
    assert ids(c.received(dlq)) == ["m1"]


def test_unsettled_deliveries_return_when_receiver_detaches():
    h = Harness()
    c = h.client()
    snd = c.sender("q")
    for i in range(5):
        c.send(snd, msg(i))
    r1 = c.receiver("q", credit=3)
    held = c.received(r1)
    assert ids(held) == ["m0", "m1", "m2"]
    settle_all(held[:1])
    r1.close()
    h.pump()
    r2 = c.receiver("q", credit=10)
    got = c.received(r2)
    assert ids(got) == ["m1", "m2", "m3", "m4"]
    assert [r.message.delivery_count for r in got] == [1, 1, 0, 0]


def test_unsettled_deliveries_return_when_connection_drops():
    h = Harness()
    producer = h.client()
    snd = producer.sender("q")
    for i in range(4):
        producer.send(snd, msg(i))
    doomed = h.client()
    rcv = doomed.receiver("q", credit=4)
    assert len(doomed.received(rcv)) == 4
    h.drop(doomed)
    h.pump()
    other = h.client()
    r2 = other.receiver("q", credit=10)
    assert sorted(ids(other.received(r2))) == ["m0", "m1", "m2", "m3"]


def test_dynamic_source_gets_address_and_is_deleted_on_detach():
    h = Harness()
    c = h.client()
    rcv = c.receiver(None, dynamic=True, credit=5)
    address = rcv.remote_source.address
    assert address and address in h.queues.queues
    snd = c.sender(address)
    c.send(snd, msg(0))
    h.pump()
    assert ids(c.received(rcv)) == ["m0"]
    rcv.close()
    snd.close()
    h.pump()
    assert address not in h.queues.queues


def test_dynamic_target():
    h = Harness()
    c = h.client()
    snd = c.sender(None, dynamic=True)
    address = snd.remote_target.address
    assert address in h.queues.queues
    c.send(snd, msg(0))
    rcv = c.receiver(address, credit=1)
    assert ids(c.received(rcv)) == ["m0"]


def test_transaction_coordinator_is_served():
    # §4.2: a transacted session (e.g. Qpid JMS) attaches a sender to a coordinator; the node
    # answers with one (tests/protocol/test_transactions_protocol.py goes further)
    h = Harness()
    c = h.client()
    link = c._session().sender("txn-ctrl")
    link.target.type = Terminus.COORDINATOR
    link.open()
    h.pump()
    assert link.state & Endpoint.REMOTE_ACTIVE and not link.state & Endpoint.REMOTE_CLOSED
    assert link.remote_target.type == Terminus.COORDINATOR


def test_depth_limit_withholds_credit_and_loses_nothing():
    h = Harness(max_depth=5, credit_window=100)
    c = h.client()
    snd = c.sender("q")
    assert snd.credit == 5  # only as much credit as the queue has room for
    sent = 0
    while snd.credit > 0:
        c.send(snd, msg(sent))
        sent += 1
    h.pump()
    assert sent == 5 and snd.credit == 0 and h.queues.get("q").depth == 5
    rcv = c.receiver("q", credit=3)
    settle_all(c.received(rcv))
    h.pump()
    assert snd.credit == 3  # room freed by acknowledged messages comes back as credit
    while snd.credit > 0:
        c.send(snd, msg(sent))
        sent += 1
    rcv.flow(100)
    h.pump()
    settle_all(c.received(rcv))
    h.pump()
    rcv.flow(100)
    h.pump()
    got = c.received(rcv)
    settle_all(got)
    assert sent == 8


def test_presettled_both_ways():
    h = Harness()
    c = h.client()
    snd = c.sender("q", presettled=True)
    for i in range(3):
        c.send(snd, msg(i))
    rcv = c.receiver("q", credit=10, presettled=True)
    got = c.received(rcv)
    assert ids(got) == ["m0", "m1", "m2"]
    assert all(r.delivery.settled for r in got)
    assert h.queues.get("q").unacked == 0


def test_auto_create_off_refuses_with_not_found():
    h = Harness(auto_create=False)
    c = h.client()
    rcv = c.receiver("nowhere", credit=1)
    assert rcv.remote_condition.name == "amqp:not-found"


def test_deny_rule_refuses_with_unauthorized_access():
    h = Harness(rules=[{"name": "no-secrets", "match": "secret.#", "kind": "deny"}])
    c = h.client()
    snd = c.sender("secret.plans")
    assert snd.remote_condition.name == "amqp:unauthorized-access"
    ok = c.sender("public")
    assert ok.remote_condition is None and ok.credit > 0


def test_message_size_limit():
    h = Harness(max_message_size=1000)
    c = h.client()
    snd = c.sender("q")
    c.send(snd, Message(body="x" * 5000))
    h.pump()
    assert snd.remote_condition.name == "amqp:link:message-size-exceeded"
    assert h.queues.get("q").depth == 0


def encoded_of_size(size: int) -> bytes:
    """An encoded message of exactly ``size`` bytes (a binary body of the right length)."""
    overhead = len(Message(body=b"x" * 1000).encode()) - 1000
    data = Message(body=b"x" * (size - overhead)).encode()
    assert len(data) == size
    return data


def test_messages_around_the_read_buffer_size_arrive_whole():
    # the node reads a complete transfer through a 64 KiB buffer: below, at and above it
    sizes = [300, 65_535, 65_536, 65_537, 300_000]
    h = Harness()
    c = h.client()
    snd = c.sender("q")
    sent = [encoded_of_size(size) for size in sizes]
    deliveries = [c.send(snd, data) for data in sent]
    h.pump()
    assert [d.remote_state for d in deliveries] == [Delivery.ACCEPTED] * len(sizes)
    rcv = c.receiver("q", credit=10)
    got = c.received(rcv)
    assert [len(r.raw) for r in got] == sizes
    assert [r.raw for r in got] == sent


def test_aborted_transfer_is_discarded_and_the_next_message_arrives():
    h = Harness()
    c = h.client()
    snd = c.sender("q")
    aborted = snd.delivery("aborted")
    snd.send(encoded_of_size(5000)[:2000])  # the first part of a transfer, not advanced
    h.pump()
    aborted.abort()  # §2.6.14
    h.pump()
    kept = c.send(snd, msg(2))
    h.pump()
    assert kept.remote_state == Delivery.ACCEPTED
    assert h.queues.get("q").depth == 1
    rcv = c.receiver("q", credit=5)
    assert ids(c.received(rcv)) == ["m2"]


def test_node_wide_link_table_follows_attach_detach_session_end_and_drop():
    # the shared event pump hands deliveries to endpoints through one table for all
    # client connections: it must hold exactly the links that are attached
    h = Harness()
    a, b = h.client(), h.client()
    kept = a.receiver("q", credit=5)
    detached = a.sender("q")
    b.sender("q")
    b.receiver("q2", credit=1)

    def table():
        return dict(h.broker.client_events.links)

    assert len(table()) == 4
    detached.close()
    h.pump()
    assert len(table()) == 3
    b.session.close()  # ends the session without detaching its links first
    h.pump()
    assert set(table()) == set(a.handler.links) and len(table()) == 1
    a.send(a.sender("q"), msg(1))
    h.pump()
    assert len(table()) == 2
    assert ids(a.received(kept)) == ["m1"]  # deliveries still reach the endpoints
    h.drop(a)
    assert table() == {}
