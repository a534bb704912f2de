"""RabbitMQ 4.0 behaviours measured through a proxy rule (docs/proxy.md's table).

Each test states what RabbitMQ 4.0.5 does and checks that a client behind the
node sees the same: ``modified`` honoured by a quorum queue (the redelivery
counts it), an unroutable message ``released``, message annotations carried,
a queue deleted under a consumer.
"""

from __future__ import annotations

import uuid

import brokers
import pytest
from proton import Delivery, Message
from proton.utils import BlockingConnection, SendException


def name(tag: str) -> str:
    return f"fg4-{tag}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def node(start_node):
    url = brokers.ensure_rabbitmq4()
    return start_node({"rules": [
        {"name": "quorum", "match": "q.*", "kind": "proxy", "primary": url, "remote": "/queues/{1}",
         "upstream": {"declare": {"type": "quorum"}}},
        {"name": "direct", "match": "x.*", "kind": "proxy", "primary": url,
         "remote": "/exchanges/amq.direct/{1}"},
    ]})


def test_modified_is_honoured_by_a_quorum_queue(node):
    queue = name("modified")
    conn = BlockingConnection(node.url, timeout=15)
    try:
        conn.create_sender(f"q.{queue}").send(Message(id="m1", body="x"))
        receiver = conn.create_receiver(f"q.{queue}", credit=1)
        first = receiver.receive(timeout=10)
        assert first.delivery_count == 0
        delivery = receiver.fetcher.unsettled[0]
        delivery.local.failed = True  # modified with delivery-failed (§3.4.5)
        receiver.settle(Delivery.MODIFIED)
        again = receiver.receive(timeout=10)  # RabbitMQ 3.10 would end the session instead
        assert again.id == "m1" and again.delivery_count == 1
        assert again.annotations.get("x-delivery-count") == 1  # RabbitMQ 4's own count
        receiver.accept()
    finally:
        conn.close()


def test_an_unroutable_message_is_released_to_its_sender(node):
    conn = BlockingConnection(node.url, timeout=15)
    try:
        sender = conn.create_sender(f"x.{name('nobody')}")  # no queue bound with this key
        with pytest.raises(SendException) as refused:
            sender.send(Message(id="u1", body="x"), timeout=10)
        assert refused.value.state == Delivery.RELEASED
    finally:
        conn.close()


def test_message_annotations_and_properties_cross_the_proxy(node):
    queue = name("annotations")
    conn = BlockingConnection(node.url, timeout=15)
    try:
        conn.create_sender(f"q.{queue}").send(Message(
            id="a1", body={"k": 1}, subject="s", content_type="application/json",
            properties={"colour": "red"}, annotations={"x-opt-fedgate": "yes"}))
        receiver = conn.create_receiver(f"q.{queue}", credit=1)
        got = receiver.receive(timeout=10)
        receiver.accept()
    finally:
        conn.close()
    assert (got.id, got.body, got.subject, got.content_type) == ("a1", {"k": 1}, "s", "application/json")
    assert got.properties == {"colour": "red"}
    assert got.annotations.get("x-opt-fedgate") == "yes"


def test_a_queue_deleted_under_a_consumer_detaches_it(node):
    queue = name("deleted")
    conn = BlockingConnection(node.url, timeout=15)
    try:
        conn.create_sender(f"q.{queue}").send(Message(id="d1", body="x"))
        receiver = conn.create_receiver(f"q.{queue}", credit=1)
        receiver.receive(timeout=10)
        receiver.accept()
        brokers.rabbitmq4_ctl("delete_queue", queue)
        with pytest.raises(Exception) as ended:
            receiver.receive(timeout=15)
        assert "amqp:resource-deleted" in str(ended.value)
    finally:
        try:
            conn.close()
        except Exception:  # the link is gone already
            pass
