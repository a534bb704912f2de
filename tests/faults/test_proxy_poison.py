"""One client's message or outcome never takes down the shared upstream for the others.

RabbitMQ 3.10 drops the connection for a message it cannot convert (an
``amqp-value`` body holding the list ``[1, null]``) and ends the session on a
``modified`` outcome. Through a proxy rule both used to reach every client on
the shared upstream: the poison message was replayed at every reconnect (a
bystander's 1,000-message set got 1,020 duplicates), and one ``modified``
reset the session of every consumer. Now the poison message is sent again
alone and rejected to its sender after ``max_send_failures``
(``proxy.suspects``), and ``modified`` goes to RabbitMQ 3.x as ``released``.
"""

from __future__ import annotations

import collections
import time
import uuid

import brokers
import pytest
from fragment_cluster import TOKEN, admin
from proton import Delivery, Message
from proton.utils import BlockingConnection, SendException

HEARTBEAT = 1.0  # the suspect verdict waits 1.5 heartbeats for other connections to fail


@pytest.fixture
def rabbit_proxy(start_node):
    url = brokers.ensure_rabbitmq()
    node = start_node({
        "admin": {"tokens": [{"token": TOKEN, "role": "admin"}]},
        "rules": [{"name": "ext", "match": "ext.*", "kind": "proxy", "primary": url,
                   "remote": "/queue/{1}", "upstream": {"heartbeat": HEARTBEAT}}],
    })
    return node


def upstream_of(node) -> dict:
    body = admin(node, "/api/v1/upstreams")
    (pool,) = body["upstreams"] if isinstance(body, dict) else body
    return pool


def sessions_ended(pool) -> int:
    return sum(m["sessions_ended"] for m in pool["members"])


def test_poison_message_is_rejected_to_its_sender_and_bystanders_lose_nothing(rabbit_proxy, clients):
    run = uuid.uuid4().hex[:8]
    bystander_queue, poison_queue = f"fg-bystander-{run}", f"fg-poison-{run}"
    bystander = clients("go", "send", rabbit_proxy.url, address=f"ext.{bystander_queue}",
                        count=1000, prefix="b", rate=200, timeout_ms=90000)
    time.sleep(0.5)  # the bystander's stream is under way (it lasts ~5 s)
    conn = BlockingConnection(rabbit_proxy.url, timeout=60)
    try:
        sender = conn.create_sender(f"ext.{poison_queue}")
        started = time.monotonic()
        with pytest.raises(SendException) as refused:
            sender.send(Message(id="poison", body=[1, None]), timeout=60)
        waited = time.monotonic() - started
    finally:
        conn.close()
    assert refused.value.state == Delivery.REJECTED
    assert waited < 30, f"poison settled after {waited:.1f}s"
    (sent,) = bystander.finish(timeout=120)
    assert sent["error"] is None and sent["accepted"] == 1000, sent
    # read back with proton: go-amqp's receiver stalls on RabbitMQ 3.10 itself (a flow
    # sent while deliveries are in flight gets more than its credit, see docs/primaries.md)
    lines = clients("proton", "receive", brokers.ensure_rabbitmq(), address=f"/queue/{bystander_queue}",
                    count=0, credit=200, idle_ms=3000, timeout_ms=60000).finish(timeout=90)
    got = [line["id"] for line in lines if "id" in line]
    missing = {f"b-{n}" for n in range(1000)} - set(got)
    assert not missing, (f"{len(missing)} missing, {brokers.rabbitmq_queue_count(bystander_queue)} "
                         f"left on RabbitMQ", sorted(missing)[:5], lines[-1])
    dups = sum(c - 1 for c in collections.Counter(got).values())
    assert dups <= 100, f"{dups} duplicates: more than the bystander's in-flight window"
    suspects = upstream_of(rabbit_proxy)["suspects"]
    assert suspects["rejected"] == 1 and suspects["waiting"] == 0, suspects
    assert brokers.rabbitmq_queue_count(poison_queue) in (0, None)


def test_modified_goes_upstream_as_released_and_leaves_the_session_alone(rabbit_proxy, clients):
    queue = f"fg-modified-{uuid.uuid4().hex[:8]}"
    (sent,) = clients("go", "send", rabbit_proxy.url, address=f"ext.{queue}", count=20,
                      prefix="m").finish()
    assert sent["accepted"] == 20
    # a bystander consumer on the same upstream session, attached throughout
    conn = BlockingConnection(rabbit_proxy.url, timeout=20)
    try:
        other = f"fg-modified-other-{uuid.uuid4().hex[:8]}"
        bystander = conn.create_receiver(f"ext.{other}", credit=10)
        lines = clients("go", "receive", rabbit_proxy.url, address=f"ext.{queue}", count=20,
                        credit=20, outcome="modify-failed").finish()
        assert lines[-1]["error"] is None and len([x for x in lines if "id" in x]) == 20
        pool = upstream_of(rabbit_proxy)
        assert sessions_ended(pool) == 0 and pool["reconnects"] == 0, pool
        # the bystander still works on the same upstream session
        conn.create_sender(f"ext.{other}").send(Message(id="still-here", body="x"))
        assert bystander.receive(timeout=10).id == "still-here"
        bystander.accept()
    finally:
        conn.close()
    # every modified message is back on the queue (as released: delivery-count unchanged)
    lines = clients("go", "receive", rabbit_proxy.url, address=f"ext.{queue}", count=20,
                    credit=20).finish()
    assert sorted(x["id"] for x in lines if "id" in x) == sorted(f"m-{n}" for n in range(20))
    assert sessions_ended(upstream_of(rabbit_proxy)) == 0
