"""Selectors, priority, scheduled delivery and the delivery limit on real processes (issue #43,
docs/queue-semantics.md), with python-qpid-proton's BlockingConnection and its ``Selector`` as
a user would write them. A replicated queue on three nodes on etcd:

* a consumer with a selector on a backup node (its link goes to the primary through the
  proxy path, the primary applies the filter and answers with it);
* priority order and a scheduled message kept across kill -9 of the primary: the new primary
  delivers by priority, and the scheduled one only at its time;
* a poison message (its consumer gone with it unsettled, three times) dead-lettered at the rule's delivery_limit,
  with the annotations naming the queue and the reason.

And on one node: a durable queue killed -9 keeps a delayed message's time and the priority
order; the admin API and /metrics show scheduled and per-priority counts.
"""

from __future__ import annotations

import time
import uuid

import pytest
from etcd_servers import cluster_name, etcd_url  # noqa: F401 (fixtures)
from proton import Message, symbol
from proton.reactor import Selector
from proton.utils import BlockingConnection
from replication_support import LEASE_TTL, replicated_nodes, replicated_rule, wait_isr, wait_primary

pytestmark = pytest.mark.timeout(180)

ADDRESS = "orders.sem"
RULE = replicated_rule(nodes=["n1", "n2", "n3"], delivery_limit=3, dead_letter="dead.orders")


def take(url: str, address: str, count: int, timeout: float = 10.0, selector: str | None = None,
         **options) -> list[Message]:
    """Up to ``count`` messages, each accepted; stops at the first ``timeout`` without one."""
    connection = BlockingConnection(url, timeout=timeout + 5)
    try:
        receiver = connection.create_receiver(
            address, credit=count, options=Selector(selector) if selector else None, **options)
        got = []
        while len(got) < count:
            try:
                message = receiver.receive(timeout=timeout)
            except Exception:  # proton's Timeout: nothing more within the wait
                break
            got.append(message)
            receiver.accept()
        return got
    finally:
        connection.close()


def send(url: str, address: str, messages) -> None:
    connection = BlockingConnection(url, timeout=15)
    try:
        sender = connection.create_sender(address)
        for message in messages:
            sender.send(message)  # waits for the outcome: accepted once the copies hold it
    finally:
        connection.close()


def three(start_node, etcd_url, cluster_name):  # noqa: F811
    nodes = replicated_nodes(start_node, [etcd_url], cluster_name, RULE)
    return nodes


def test_a_selector_on_a_backup_node_is_applied_by_the_primary(start_node, etcd_url,  # noqa: F811
                                                                 cluster_name):  # noqa: F811
    nodes = three(start_node, etcd_url, cluster_name)
    send(nodes["n2"].url, ADDRESS, [Message(id=f"m{i}", body=i, properties={"n": i})
                                    for i in range(10)])
    assert wait_primary(nodes, ADDRESS, 10.0) == "n1"
    got = take(nodes["n3"].url, ADDRESS, 10, timeout=2.0, selector="n >= 7 OR n = 2")
    assert [m.id for m in got] == ["m2", "m7", "m8", "m9"]
    rest = take(nodes["n2"].url, ADDRESS, 10, timeout=2.0)
    assert [m.id for m in rest] == [f"m{i}" for i in (0, 1, 3, 4, 5, 6)]


def test_priority_and_a_scheduled_message_survive_the_primary_killed(start_node, etcd_url,  # noqa: F811
                                                                      cluster_name):  # noqa: F811
    nodes = three(start_node, etcd_url, cluster_name)
    due = time.time() + LEASE_TTL + 10.0  # beyond the failover and the first take, under load
    later = Message(id="later", body="x",
                    annotations={symbol("x-opt-delivery-time"): int(due * 1000)})
    send(nodes["n1"].url, ADDRESS, [later] + [Message(id=f"p{i}", body=i, priority=p)
                                             for i, p in enumerate([1, 8, 4, 8, 0, 6])])
    assert wait_primary(nodes, ADDRESS, 10.0) == "n1"
    wait_isr(etcd_url, cluster_name, ADDRESS, ["n2", "n3"], 10.0, primary="n1")
    nodes["n1"].kill()
    new = wait_primary(nodes, ADDRESS, LEASE_TTL + 10.0, other_than="n1")
    got = take(nodes[new].url, ADDRESS, 10, timeout=2.0)
    assert [m.id for m in got] == ["p1", "p3", "p5", "p2", "p0", "p4"]  # by priority, FIFO within
    assert time.time() < due
    late = take(nodes[new].url, ADDRESS, 1, timeout=due - time.time() + 10.0)
    assert [m.id for m in late] == ["later"] and time.time() >= due - 0.05


def test_a_poison_message_is_dead_lettered_at_the_rules_delivery_limit(start_node, etcd_url,  # noqa: F811
                                                                        cluster_name):  # noqa: F811
    nodes = three(start_node, etcd_url, cluster_name)
    poison = f"poison-{uuid.uuid4().hex[:6]}"
    send(nodes["n2"].url, ADDRESS, [Message(id=poison, body="bad")])
    assert wait_primary(nodes, ADDRESS, 10.0) == "n1"
    for attempt in range(3):
        connection = BlockingConnection(nodes["n1"].url, timeout=15)
        receiver = connection.create_receiver(ADDRESS, credit=1)
        message = receiver.receive(timeout=10)
        assert message.id == poison, attempt
        connection.close()  # gone with it unsettled: the delivery failed, it counts
    dead = take(nodes["n1"].url, "dead.orders", 1, timeout=5.0)
    assert [m.id for m in dead] == [poison]
    notes = {str(k): v for k, v in dead[0].annotations.items()}
    assert notes["x-opt-dead-letter-address"] == ADDRESS
    assert notes["x-opt-dead-letter-reason"] == "delivery-limit"
    assert take(nodes["n2"].url, ADDRESS, 1, timeout=1.0) == []


def test_scheduled_counts_and_priorities_in_the_admin_api_and_metrics(start_node):
    """What an operator sees (issue #43: visible): scheduled apart from the depth, waiting
    messages by priority, the delivery limit, and the same in /metrics."""
    from admin_client import ADMIN, admin, http

    node = start_node({"queues": {"delivery_limit": 5}, "admin": ADMIN})
    at = int((time.time() + 600) * 1000)
    send(node.url, "vis.q", [Message(id="s", body=0, annotations={symbol("x-opt-delivery-time"): at}),
                             Message(id="a", body=1, priority=7), Message(id="b", body=2)])
    queue = next(q for q in admin(node, "/api/v1/queues")["queues"] if q["name"] == "vis.q")
    assert (queue["depth"], queue["scheduled"], queue["delivery_limit"]) == (2, 1, 5)
    assert queue["by_priority"] == {"7": 1, "4": 1}
    status, metrics = http("GET", node.admin_url + "/metrics")
    assert status == 200
    text = metrics if isinstance(metrics, str) else metrics.decode()
    assert 'fedgate_queue_scheduled{queue="vis.q"} 1' in text
    assert 'fedgate_queue_depth_by_priority{queue="vis.q",priority="7"} 1' in text


def test_durable_scheduled_and_priority_messages_keep_their_time_and_order_across_kill_9(
        start_node):
    """A durable queue journals the message with the time its delay became (docs/queue-
    semantics.md): killed -9 and started again, the node holds it until that time, not a
    fresh delay from the restart, and the others come by priority."""
    node = start_node({"queues": {"durable": True}})
    sent_at = time.time()
    send(node.url, "dur.q", [Message(id="late", body=0, durable=True,
                                     annotations={symbol("x-opt-delivery-delay"): 6000})]
         + [Message(id=f"p{p}", body=p, durable=True, priority=p) for p in (2, 9, 5)])
    node.kill()
    # The node stays down a while so that "its own time" and "a fresh delay from the
    # restart" are 1.5 s apart, however fast this machine restarts it.
    time.sleep(max(0.0, sent_at + 1.5 - time.time()))
    node.start()
    restarted = time.time()
    assert restarted - sent_at >= 1.5
    got = take(node.url, "dur.q", 3, timeout=2.0)
    assert [m.id for m in got] == ["p9", "p5", "p2"]
    late = take(node.url, "dur.q", 1, timeout=15.0)
    assert [m.id for m in late] == ["late"]
    arrived = time.time()
    # its own time, not a fresh delay from the restart (which would be restarted + 6 s)
    assert sent_at + 6.0 - 0.05 <= arrived < restarted + 6.0 - 1.0, (arrived - sent_at,
                                                                      restarted - sent_at)


def test_rhea_receives_what_its_selector_selects(start_node, clients):
    """rhea (``rhea.filter.selector``) as a Node.js user writes it: the seq >= 6 of ten."""
    node = start_node()
    (sent,) = clients("rhea", "send", node.url, address="sel.rhea", count=10).finish()
    assert sent["accepted"] == 10
    receiver = clients("rhea", "receive", node.url, address="sel.rhea", count=4,
                       selector="seq >= 6", timeout_ms=10000)
    lines = receiver.finish(timeout=30)
    assert lines[-1]["done"] is True and lines[-1]["received"] == 4
    assert sorted(line["seq"] for line in lines if "seq" in line) == [6, 7, 8, 9]
    rest = clients("rhea", "receive", node.url, address="sel.rhea", count=6, timeout_ms=10000)
    assert sorted(line["seq"] for line in rest.finish(timeout=30) if "seq" in line) == list(range(6))


def test_a_durable_subscription_survives_kill_9_and_is_listed_and_deleted_by_the_admin_api(
        start_node, monkeypatch, capsys):
    """proton's ``DurableSubscription`` on an exchange ([[exchanges]]): made, left, messages published,
    the node killed -9 and started again: they are still there for it (durable messages, in
    the journal); the admin API lists it, and deletes it once nobody consumes it."""
    from admin_client import ADMIN, admin, http
    from proton.reactor import Container, DurableSubscription

    node = start_node({"queues": {"durable": True}, "admin": ADMIN,
                       "exchanges": [{"name": "prices", "type": "fanout"}]})

    def subscribe(timeout: float) -> list:
        container = Container()
        container.container_id = "app-1"  # the client id: part of the subscription's name
        connection = BlockingConnection(node.url, timeout=15, container=container)
        try:
            receiver = connection.create_receiver("prices", name="audit",
                                                  options=DurableSubscription(), credit=10)
            got = []
            while True:
                try:
                    got.append(receiver.receive(timeout=timeout))
                except Exception:
                    break
                receiver.accept()
            receiver.detach()  # closed = false: the subscription stays
            return [m.id for m in got]
        finally:
            connection.close()

    assert subscribe(0.5) == []
    connection = BlockingConnection(node.url, timeout=15)
    sender = connection.create_sender("prices", options=None)
    for i in range(3):
        sender.send(Message(id=f"p{i}", body=i, durable=True))
    connection.close()
    listed = admin(node, "/api/v1/subscriptions")["subscriptions"]
    assert [(s["exchange"], s["durable"], s["depth"], s["consumers"]) for s in listed] == \
        [("prices", True, 3, 0)]
    import argparse

    from admin_api import cli
    from admin_client import ADMIN_TOKEN

    monkeypatch.setenv("FEDGATE_TOKEN", ADMIN_TOKEN)
    parser = argparse.ArgumentParser(prog="fedgate")
    cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["subscriptions", "--admin", node.admin_url])
    assert args.func(args) == 0
    row = capsys.readouterr().out.splitlines()[1].split()
    assert row[:4] == ["app-1:audit", "prices", "True", "False"] and row[-2:] == ["3", "0"]
    node.kill()
    node.start()
    assert subscribe(2.0) == ["p0", "p1", "p2"]
    name = admin(node, "/api/v1/subscriptions")["subscriptions"][0]["name"]
    status, body = http("DELETE", f"{node.admin_url}/api/v1/subscriptions/{name}")
    assert status == 200 and body["deleted"] == name == "app-1:audit", (status, body)
    assert admin(node, "/api/v1/subscriptions")["subscriptions"] == []
    status, body = http("DELETE", f"{node.admin_url}/api/v1/subscriptions/{name}")
    assert status == 404 and body["error"] == "subscription_not_found"
