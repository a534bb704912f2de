"""Links and sessions closed on a connection that stays open are freed (in memory).

proton keeps every link of a connection until it is freed, so a long-lived
connection that attaches and detaches links (a client doing request/response
with short-lived receivers, or the node's own upstream connections) would
hold all of them. These tests count what proton still holds.
"""

from __future__ import annotations

from memory import Harness
from proton import Message

from proxy.amqp.engine import links_held


def held(client) -> int:
    return links_held(client.server.connection_ptr)


def test_links_detached_on_an_open_connection_are_freed():
    harness = Harness()
    client = harness.client()
    got = []
    for n in range(150):
        receiver = client.receiver("q.churn", credit=1)
        sender = client.sender("q.churn")
        client.send(sender, Message(id=n, body="x"))
        harness.pump()
        for item in client.received(receiver):
            item.delivery.update(item.delivery.ACCEPTED)
            item.delivery.settle()
            got.append(item.message.id)
        sender.close()
        receiver.close()
        harness.pump()
    assert got == list(range(150))
    assert held(client) == 0
    queue = harness.queues.lookup_or_create("q.churn")
    assert (queue.depth, len(queue.consumers), len(queue.producers)) == (0, 0, 0)
    assert client.handler.links == {}


def test_a_session_ended_without_detaching_gives_its_unsettled_messages_back():
    harness = Harness()
    holder = harness.client()
    receiver = holder.receiver("q.ended", credit=5)
    producer = harness.client()
    sender = producer.sender("q.ended")
    for n in range(3):
        producer.send(sender, Message(id=n, body="x"))
    harness.pump()
    assert [r.message.id for r in holder.received(receiver)] == [0, 1, 2]  # held, unsettled

    holder.session.close()  # §2.7.8: ends the session; its links are detached with it
    harness.pump()
    assert held(holder) == 0 and holder.handler.links == {}

    other = harness.client()
    again = other.receiver("q.ended", credit=5)
    harness.pump()
    assert sorted(r.message.id for r in other.received(again)) == [0, 1, 2]
    queue = harness.queues.lookup_or_create("q.ended")
    assert len(queue.consumers) == 1
