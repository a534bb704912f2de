"""RabbitMQ 4.0 behaviours measured through a proxy rule (docs/proxy.md's table).

Each test states what RabbitMQ 4.0.5 does and checks that a client behind the
node sees the same: ``modified`` honoured by a quorum queue (the redelivery
counts it), an unroutable message ``released``, message annotations carried,
a queue deleted under a consumer. And address v2's exchange targets through a
rule: ``/exchanges/NAME/KEY`` to a queue bound with that key, ``/exchanges/NAME``
(routed with the empty key) to a fanout exchange and to a direct one; every id
read back from the bound queues through the node.
"""

from __future__ import annotations

import collections
import uuid

import brokers
import pytest
from exchange_support import Rabbit, tag
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


# -- address v2 exchange targets through a rule ---------------------------------------
@pytest.fixture
def rabbit4():
    """Exchanges, queues and bindings on RabbitMQ 4 (AMQP 0-9-1), deleted after the test."""
    helper = Rabbit(4)
    helper.url = brokers.ensure_rabbitmq4()
    yield helper
    helper.cleanup()


@pytest.fixture
def exchange_node(rabbit4, start_node):
    return start_node({"rules": [
        {"name": "keyed", "match": "x.*", "kind": "proxy", "primary": rabbit4.url,
         "remote": "/exchanges/amq.direct/{1}"},
        {"name": "exchange", "match": "f.*", "kind": "proxy", "primary": rabbit4.url,
         "remote": "/exchanges/{1}"},
        {"name": "queues", "match": "r.*", "kind": "proxy", "primary": rabbit4.url,
         "remote": "/queues/{1}"},  # the bound queues exist: no declare
    ]})


def send_sets(clients, url: str, address: str, count: int) -> set[str]:
    """``count`` messages from proton and from rhea to ``address``; the ids all accepted."""
    senders = [clients(kind, "send", url, address=address, count=count, prefix=kind,
                       timeout_ms=60000) for kind in ("proton", "rhea")]
    for sender in senders:
        (sent,) = sender.finish(timeout=90)
        assert sent["error"] is None and sent["accepted"] == count, sent
    return {f"{kind}-{n}" for kind in ("proton", "rhea") for n in range(count)}


def read_through(clients, node, queue: str) -> list[str]:
    """Every message of RabbitMQ 4 queue ``queue``, read through the node's ``r.*`` rule."""
    lines = clients("proton", "receive", node.url, address=f"r.{queue}", count=0, credit=100,
                    idle_ms=3000, timeout_ms=60000).finish(timeout=90)
    assert lines[-1]["error"] is None, lines[-1]
    return [line["id"] for line in lines if "id" in line]


def test_a_keyed_exchange_address_reaches_the_bound_queue(rabbit4, exchange_node, clients):
    t = tag()
    routed = rabbit4.queue(f"fg4-routed-{t}", bind=("amq.direct", f"key-{t}"))
    other = rabbit4.queue(f"fg4-other-{t}", bind=("amq.direct", f"other-{t}"))
    ids = send_sets(clients, exchange_node.url, f"x.key-{t}", 200)
    got = read_through(clients, exchange_node, routed)
    assert set(got) == ids
    assert [i for i, n in collections.Counter(got).items() if n > 1] == []
    assert read_through(clients, exchange_node, other) == []  # another key: nothing


@pytest.mark.parametrize("kind", ["fanout", "direct"])
def test_an_exchange_address_routes_with_the_empty_key(rabbit4, exchange_node, clients, kind):
    # /exchanges/NAME: a fanout exchange gives every bound queue each message; a direct
    # one only the queue bound with the empty key (measured on 4.0.5: the subject is not a key)
    t = tag()
    exchange = rabbit4.exchange(f"fg4-{kind}-{t}", kind)
    first = rabbit4.queue(f"fg4-{kind}-a-{t}", bind=(exchange, ""))
    second = rabbit4.queue(f"fg4-{kind}-b-{t}", bind=(exchange, "b"))
    ids = send_sets(clients, exchange_node.url, f"f.{exchange}", 150)
    got = read_through(clients, exchange_node, first)
    assert set(got) == ids and len(got) == len(ids)
    got = read_through(clients, exchange_node, second)
    if kind == "fanout":
        assert set(got) == ids and len(got) == len(ids)
    else:
        assert got == []
