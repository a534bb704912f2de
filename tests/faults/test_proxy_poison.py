"""One client's message or outcome never takes down the shared upstream for the others.

RabbitMQ 3.10 drops the connection for a message it cannot convert (an
``amqp-value`` body holding the list ``[1, null]``) and ends the session on a
``modified`` outcome. Through a proxy rule both used to reach every client on
the shared upstream: the poison message was replayed at every reconnect (a
bystander's 1,000-message set got 1,020 duplicates), and one ``modified``
reset the session of every consumer. Now the poison message is sent again
alone and rejected to its sender after ``max_send_failures``
(``proxy.suspects``), and ``modified`` goes to RabbitMQ 3.x as ``released``.

The poison test runs against RabbitMQ 3.10 and 4.0 (``rabbit_proxy`` is
parametrized). RabbitMQ 4.0.5 takes that message (measured: accepted, and
delivered again with the body ``[1, null]``), so there the right answer is
``accepted`` for the sender, the message on the queue, and no reconnect and
no suspect at all. The ``modified`` test is for the RabbitMQ 3.x workaround
only: RabbitMQ 4 honours ``modified`` and the node passes it on as it is
(``tests/interop/test_rabbitmq4_quirks.py``).
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


class Rabbit:
    """What differs between the two primaries: URL, address scheme, queue helpers."""

    def __init__(self, version: int) -> None:
        self.version = version
        if version == 3:
            self.url = brokers.ensure_rabbitmq()
            self.template, self.direct = "/queue/{1}", "/queue/"
            self.count, self.delete = brokers.rabbitmq_queue_count, brokers.rabbitmq_delete_queue
        else:
            # address v2 uses existing queues only: the rule declares them (upstream.declare)
            self.url = brokers.ensure_rabbitmq4()
            self.template, self.direct = "/queues/{1}", "/queues/"
            self.count, self.delete = brokers.rabbitmq4_queue_count, brokers.rabbitmq4_delete_queue


@pytest.fixture(params=[3, 4], ids=["rabbitmq", "rabbitmq4"])
def rabbit_proxy(request, start_node):
    rabbit = Rabbit(request.param)
    upstream = {"heartbeat": HEARTBEAT}
    if rabbit.version == 4:
        upstream["declare"] = True
    node = start_node({
        "admin": {"tokens": [{"token": TOKEN, "role": "admin"}]},
        "rules": [{"name": "ext", "match": "ext.*", "kind": "proxy", "primary": rabbit.url,
                   "remote": rabbit.template, "upstream": upstream}],
    })
    node.rabbit = rabbit
    return node


def upstream_of(node) -> dict:
    body = admin(node, "/api/v1/upstreams")
    (pool,) = body["upstreams"] if isinstance(body, dict) else body
    return pool


def sessions_ended(pool) -> int:
    return sum(m["sessions_ended"] for m in pool["members"])


def test_poison_message_is_rejected_to_its_sender_and_bystanders_lose_nothing(rabbit_proxy, clients):
    rabbit = rabbit_proxy.rabbit
    run = uuid.uuid4().hex[:8]
    bystander_queue, poison_queue = f"fg-bystander-{run}", f"fg-poison-{run}"
    bystander = clients("go", "send", rabbit_proxy.url, address=f"ext.{bystander_queue}",
                        count=1000, prefix="b", rate=200, timeout_ms=90000)
    time.sleep(0.5)  # the bystander's stream is under way (it lasts ~5 s)
    conn = BlockingConnection(rabbit_proxy.url, timeout=60)
    try:
        sender = conn.create_sender(f"ext.{poison_queue}")
        started = time.monotonic()
        if rabbit.version == 3:
            with pytest.raises(SendException) as refused:
                sender.send(Message(id="poison", body=[1, None]), timeout=60)
            assert refused.value.state == Delivery.REJECTED
        else:  # RabbitMQ 4 takes it: nothing to protect anyone from
            delivery = sender.send(Message(id="poison", body=[1, None]), timeout=60)
            assert delivery.remote_state == Delivery.ACCEPTED
        waited = time.monotonic() - started
    finally:
        conn.close()
    assert waited < 30, f"poison settled after {waited:.1f}s"
    (sent,) = bystander.finish(timeout=120)
    assert sent["error"] is None and sent["accepted"] == 1000, sent
    # read back with proton: go-amqp's receiver stalls on RabbitMQ 3.10 itself (a flow
    # sent while deliveries are in flight gets more than its credit, see docs/primaries.md)
    lines = clients("proton", "receive", rabbit.url, address=f"{rabbit.direct}{bystander_queue}",
                    count=0, credit=200, idle_ms=3000, timeout_ms=60000).finish(timeout=90)
    got = [line["id"] for line in lines if "id" in line]
    missing = {f"b-{n}" for n in range(1000)} - set(got)
    assert not missing, (f"{len(missing)} missing, {rabbit.count(bystander_queue)} "
                         f"left on RabbitMQ", sorted(missing)[:5], lines[-1])
    dups = sum(c - 1 for c in collections.Counter(got).values())
    pool = upstream_of(rabbit_proxy)
    suspects = pool["suspects"]
    if rabbit.version == 3:
        assert dups <= 100, f"{dups} duplicates: more than the bystander's in-flight window"
        assert suspects["rejected"] == 1 and suspects["waiting"] == 0, suspects
        assert rabbit.count(poison_queue) in (0, None)
    else:
        # nothing broke: no reconnect, no replay, no suspect, no duplicate
        assert dups == 0, f"{dups} duplicates"
        assert pool["reconnects"] == 0 and sessions_ended(pool) == 0, pool
        assert suspects["rejected"] == 0 and suspects["waiting"] == 0, suspects
        conn = BlockingConnection(rabbit.url, timeout=20, allowed_mechs="ANONYMOUS")
        try:
            receiver = conn.create_receiver(f"{rabbit.direct}{poison_queue}", credit=1)
            kept = receiver.receive(timeout=10)
            receiver.accept()
        finally:
            conn.close()
        assert (kept.id, kept.body) == ("poison", [1, None])  # on the queue, as sent
    for queue in (bystander_queue, poison_queue):
        rabbit.delete(queue)


@pytest.mark.parametrize("rabbit_proxy", [3], ids=["rabbitmq"], indirect=True)
def test_modified_goes_upstream_as_released_and_leaves_the_session_alone(rabbit_proxy, clients):
    # RabbitMQ 3.x only: the workaround is keyed on the open frame's version; RabbitMQ 4.0
    # honours modified and gets it as it is (test_rabbitmq4_quirks.py)
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
