"""Topic subscriptions on a node with two workers (docs/exchanges.md, "On a node with
workers"): real processes, python-qpid-proton clients whose connections are steered onto
different workers (the supervisor hands a connection to the worker with the fewest, the
first on a tie; a dynamic first attach keeps it there), checked in the admin API's
connection list.

Each case puts a subscriber and a publisher, or two consumers of one shared subscription, on
different workers, whichever worker hosts the subscription: every message published comes
once, a durable subscription collects while away and goes at unsubscribe.
"""

from __future__ import annotations

import collections
import time

import pytest
from admin_client import ADMIN, admin
from proton import Endpoint, Message, Timeout
from proton.reactor import Container, DurableSubscription, LinkOption
from proton.utils import BlockingConnection

from proxy.amqp.termini import set_capabilities
from proxy.workers.ownership import ring_of

pytestmark = pytest.mark.timeout(120)


class Shared(LinkOption):
    """JMS 2.0 ``createSharedConsumer`` as Qpid JMS sends it (no client id: global)."""

    def apply(self, link) -> None:
        set_capabilities(link.source, ("shared", "global"))


def start(start_node):
    return start_node({"node": {"workers": 2}, "admin": ADMIN,
                       "exchanges": [{"name": "prices", "type": "fanout"}]})


def connect(node, container_id: str) -> BlockingConnection:
    container = Container()
    container.container_id = container_id
    connection = BlockingConnection(node.url, timeout=15, container=container)
    # a first attach without an address: the connection is not placed by it (docs/workers.md)
    # and stays on the worker the supervisor gave it
    connection.create_receiver(None, dynamic=True)
    return connection


def worker_of(node, container_id: str) -> int:
    found = [c["worker"] for c in admin(node, "/api/v1/connections")["connections"]
             if c.get("container_id") == container_id]
    assert len(found) == 1, admin(node, "/api/v1/connections")
    return found[0]


def take(receiver, timeout: float) -> list:
    got = []
    while True:
        try:
            got.append(receiver.receive(timeout=timeout).id)
        except Timeout:
            return got
        receiver.accept()


def publish(node, ids, container_id="publisher") -> BlockingConnection:
    connection = connect(node, container_id)
    sender = connection.create_sender("prices")
    for i in ids:
        sender.send(Message(id=i, body=i))
    return connection


def name_hosted_on(worker: int) -> str:
    """A subscription name of client app-1 that a fresh node hosts on ``worker`` (the table of
    owners gives a first name its ring owner: proxy.workers.ownership)."""
    ring = ring_of(2)
    return next(f"audit{i}" for i in range(100)
                if ring.get_node(f"subscription:app-1:audit{i}") == f"w{worker}")


@pytest.mark.parametrize("host", [0, 1], ids=["subscriber-forwarded", "subscriber-on-its-host"])
def test_a_durable_subscription_with_its_publisher_on_another_worker(start_node, host):
    node = start(start_node)
    name = name_hosted_on(host)
    pin = connect(node, "pin")  # on worker 0: the next connection goes to worker 1
    sub = connect(node, "app-1")
    receiver = sub.create_receiver("prices", name=name, options=DurableSubscription(), credit=10)
    receiver.detach()  # closed = false: it stays, collecting
    sub.wait(lambda: receiver.link.state & Endpoint.REMOTE_CLOSED, timeout=10, msg="detached")
    publisher = publish(node, [f"p{i}" for i in range(4)])  # worker 0 (1 each)
    assert {worker_of(node, "app-1"), worker_of(node, "publisher")} == {0, 1}
    publisher.close()
    listed = admin(node, "/api/v1/subscriptions")["subscriptions"]
    assert [(s["name"], s["depth"], s["worker"]) for s in listed] == [(f"app-1:{name}", 4, host)]
    again = sub.create_receiver("prices", name=name, options=DurableSubscription(), credit=10)
    assert take(again, 2.0) == [f"p{i}" for i in range(4)]
    again.close()  # closed = true: JMS unsubscribe
    sub.close()
    pin.close()
    assert admin(node, "/api/v1/subscriptions")["subscriptions"] == []


def test_consumers_of_a_shared_subscription_on_two_workers_compete(start_node):
    node = start(start_node)
    one, two = connect(node, "c1"), connect(node, "c2")
    assert {worker_of(node, "c1"), worker_of(node, "c2")} == {0, 1}
    first = one.create_receiver("prices", name="workers", options=Shared(), credit=5)
    second = two.create_receiver("prices", name="workers|2", options=Shared(), credit=5)
    publisher = publish(node, [f"s{i}" for i in range(20)])
    got_one, got_two = take(first, 1.5), take(second, 1.5)
    publisher.close()
    taken = got_one + got_two
    assert sorted(taken) == sorted(f"s{i}" for i in range(20)), collections.Counter(taken)
    assert got_one and got_two  # they competed
    (listed,) = admin(node, "/api/v1/subscriptions")["subscriptions"]
    assert listed["name"] == "global:workers" and listed["consumers"] == 2
    first.close()
    second.close()
    one.close()
    two.close()
    assert admin(node, "/api/v1/subscriptions")["subscriptions"] == []


def test_a_non_durable_subscriber_gets_what_another_worker_publishes(start_node):
    node = start(start_node)
    sub = connect(node, "live")
    receiver = sub.create_receiver("prices", credit=10)
    publisher = publish(node, ["n0", "n1", "n2"])
    assert worker_of(node, "live") != worker_of(node, "publisher")
    assert take(receiver, 1.5) == ["n0", "n1", "n2"]
    publisher.close()
    sub.close()


def test_a_durable_subscription_comes_back_with_its_worker_killed_9(start_node):
    """The host worker killed -9: the supervisor starts it again, it restores the subscription
    (its durable messages from its journal) and tells the others again; what was published
    while it was away is not accepted without it (released: sent again) and nothing is lost."""
    import os
    import signal

    from proton.utils import SendException
    from test_workers import alive, wait_for, worker_pids

    node = start_node({"node": {"workers": 2}, "admin": ADMIN, "queues": {"durable": True},
                       "exchanges": [{"name": "prices", "type": "fanout"}]})
    name = name_hosted_on(1)
    sub = connect(node, "app-1")
    receiver = sub.create_receiver("prices", name=name, options=DurableSubscription(), credit=10)
    receiver.detach()
    sub.wait(lambda: receiver.link.state & Endpoint.REMOTE_CLOSED, timeout=10, msg="detached")
    sub.close()
    publisher = connect(node, "publisher")
    sender = publisher.create_sender("prices")
    for i in range(3):
        sender.send(Message(id=f"d{i}", body=i, durable=True))
    pids = worker_pids(node)
    os.kill(pids[1], signal.SIGKILL)
    wait_for(lambda: not alive(pids[1]), 10, "worker 1 to die")
    sent = 3
    while sent < 6:  # while it is away, and once it is back
        try:
            sender.send(Message(id=f"d{sent}", body=sent, durable=True), timeout=10)
            sent += 1
        except SendException:  # released: the host was away
            time.sleep(0.2)
    publisher.close()
    wait_for(lambda: worker_pids(node)[1] != pids[1]
             and node.log_path.read_text().count("worker 1 ready") >= 2, 20, "worker 1 restarted")
    again = connect(node, "app-1")
    back = again.create_receiver("prices", name=name, options=DurableSubscription(), credit=20)
    got = take(back, 2.0)
    back.close()  # unsubscribe
    again.close()
    assert sorted(set(got)) == [f"d{i}" for i in range(6)], got
    assert len(got) - len(set(got)) <= 1, got  # at most the one in flight at the kill
