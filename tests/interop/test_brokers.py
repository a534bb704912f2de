"""The real brokers the interop tests lean on behave as tests/brokers.py says.

Real broker processes (.ci/install/*.sh), real clients (rhea and proton).
"""

from __future__ import annotations

import time
import uuid

import brokers
import pytest


def unique(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:10]}"


def final(client) -> dict:
    return client.finish(timeout=60)[-1]


def received_ids(lines: list[dict]) -> set[str]:
    return {line["id"] for line in lines if "id" in line}


@pytest.fixture
def artemis():
    return brokers.ensure_artemis()


def test_artemis_plain_address_is_a_queue_created_by_the_sender(artemis, clients):
    queue = unique("orders-")
    sent = final(clients("rhea", "send", artemis, address=queue, count=100, prefix="p"))
    assert sent == {"sent": 100, "accepted": 100, "released": 0, "rejected": 0,
                    "modified": 0, "error": None}
    # Stored before anyone subscribed: an ANYCAST queue, not a topic.
    assert brokers.artemis_queue_count(queue) == 100
    lines = clients("proton", "receive", artemis, address=queue, count=100).finish(60)
    assert lines[-1] == {"done": True, "received": 100, "error": None}
    assert received_ids(lines) == {f"p-{i}" for i in range(100)}
    assert brokers.artemis_queue_count(queue) == 0
    brokers.artemis_delete_queue(queue)


def test_artemis_receiver_attach_creates_the_queue(artemis, clients):
    queue = unique("rfirst-")
    receiver = clients("rhea", "receive", artemis, address=queue, count=3)
    deadline = time.monotonic() + 20
    while brokers.artemis_queue_count(queue) is None:
        assert time.monotonic() < deadline, "receiver attach did not create the queue"
        time.sleep(0.1)
    assert final(clients("proton", "send", artemis, address=queue, count=3))["accepted"] == 3
    assert final(receiver) == {"done": True, "received": 3, "error": None}
    brokers.artemis_delete_queue(queue)


@pytest.mark.parametrize("kind", ["rhea", "proton"])
def test_artemis_strict_addresses_are_not_auto_created(artemis, clients, kind):
    queue = unique("strict.")
    sender = clients(kind, "send", artemis, address=queue, count=1)
    assert final(sender)["error"]["condition"] == "amqp:not-found"
    assert sender.proc.returncode == 2
    receiver = clients(kind, "receive", artemis, address=queue, count=1, timeout_ms=10000)
    assert final(receiver)["error"]["condition"] == "amqp:not-found"
    assert brokers.artemis_queue_count(queue) is None

    brokers.artemis_create_queue(queue)
    assert final(clients(kind, "send", artemis, address=queue, count=2))["accepted"] == 2
    assert final(clients(kind, "receive", artemis, address=queue, count=2))["received"] == 2
    brokers.artemis_delete_queue(queue)
    assert brokers.artemis_queue_count(queue) is None


def test_artemis_sasl_anonymous_plain_and_wrong_password(artemis, clients):
    queue = unique("sasl-")
    anonymous = final(clients("rhea", "send", artemis, address=queue, count=1, sasl="anonymous"))
    assert anonymous["error"] is None
    plain = final(clients("rhea", "send", artemis, address=queue, count=1,
                          username=brokers.ARTEMIS_USER, password=brokers.ARTEMIS_PASSWORD))
    assert plain["error"] is None
    wrong = final(clients("proton", "send", artemis, address=queue, count=1,
                          username=brokers.ARTEMIS_USER, password="wrong"))
    assert wrong["error"]["condition"] == "amqp:unauthorized-access"
    assert brokers.artemis_queue_count(queue) == 2
    brokers.artemis_delete_queue(queue)


def test_artemis_purge_and_delete_helpers(artemis, clients):
    queue = unique("purge-")
    assert final(clients("rhea", "send", artemis, address=queue, count=10))["accepted"] == 10
    assert brokers.artemis_purge_queue(queue) == 10
    assert brokers.artemis_queue_count(queue) == 0
    brokers.artemis_delete_queue(queue)
    assert brokers.artemis_queue_count(queue) is None
    brokers.artemis_delete_queue(queue)  # deleting a missing queue is fine
    assert brokers.artemis_purge_queue(queue) == 0


@pytest.mark.parametrize("fault", ["restart_artemis", "kill_artemis"])
def test_artemis_durable_messages_survive(artemis, clients, fault):
    queue = unique(f"{fault}-")
    assert final(clients("rhea", "send", artemis, address=queue, count=50, prefix="d",
                         durable=True))["accepted"] == 50
    assert final(clients("rhea", "send", artemis, address=queue, count=5,
                         prefix="n"))["accepted"] == 5
    assert getattr(brokers, fault)() == artemis
    lines = clients("proton", "receive", artemis, address=queue, count=0, idle_ms=2000).finish(60)
    assert lines[-1]["error"] is None
    assert received_ids(lines) == {f"d-{i}" for i in range(50)}  # non-durable ones are gone
    brokers.artemis_delete_queue(queue)


def test_rabbitmq_queue_helpers(clients):
    url = brokers.ensure_rabbitmq()
    queue = unique("helpers-")
    assert final(clients("rhea", "send", url, address=f"/queue/{queue}", count=10))["accepted"] == 10
    assert brokers.rabbitmq_queue_count(queue) == 10
    brokers.purge_queue("rabbitmq", queue)
    assert brokers.queue_count("rabbitmq", queue) == 0
    brokers.delete_queue("rabbitmq", queue)
    assert brokers.rabbitmq_queue_count(queue) is None
    brokers.rabbitmq_delete_queue(queue)  # deleting a missing queue is fine
