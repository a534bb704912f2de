"""Run-time wiring on a node with two workers (issue #46, docs/operations.md "Limits").

Live nodes with ``[node] workers = 2`` and python-qpid-proton clients: an exchange and a
binding declared through the admin API (worker 0's) apply on both workers, in a static
cluster (worker 0 hands the record to the other worker) and on etcd (each worker follows
etcd). A client on each worker (steered there as in ``test_subscriptions_workers``, checked
in the connection list) sends to the exchange; the bound queue gets every message once.
Then the binding is deleted and a message to the exchange reaches no queue on either worker.
"""

from __future__ import annotations

import pytest
from admin_client import READ_TOKEN, wait_for
from cluster_support import etcd_node, wait_members
from etcd_servers import cluster_name, etcd_url  # noqa: F401 (fixtures)
from proton import Message
from test_admin_queue_ops import TOKENS, receive_all
from test_admin_wiring import api
from test_subscriptions_workers import connect, worker_of

pytestmark = pytest.mark.timeout(120)


def on_each_worker(node, prefix: str) -> dict:
    """{worker: connection}: one client connection on worker 0 and one on worker 1."""
    connections = {}
    for n in range(2):
        connection = connect(node, f"{prefix}-{n}")
        connections[worker_of(node, f"{prefix}-{n}")] = connection
    assert sorted(connections) == [0, 1], connections
    return connections


def check_on_both_workers(node) -> None:
    status, body = api(node, "POST", "/api/v1/exchanges", {"name": "bus", "type": "fanout"})
    assert status == 201, body
    status, bound = api(node, "POST", "/api/v1/bindings", {"exchange": "bus", "queue": "all"})
    assert status == 201 and bound["version"] == 2

    def both_have_it() -> bool:
        status, listing = api(node, "GET", "/api/v1/exchanges", token=READ_TOKEN)
        bus = [e for e in listing["exchanges"] if e["name"] == "bus"]
        return sorted((e["worker"], e["bindings"]) for e in bus) == [(0, 1), (1, 1)]
    wait_for(both_have_it, timeout=3.0, interval=0.05, what="both workers to have bus bound")

    connections = on_each_worker(node, "sender")
    for worker, connection in connections.items():
        sender = connection.create_sender("bus")
        for i in range(5):
            sender.send(Message(id=worker * 100 + i, body=f"w{worker}"))
    for connection in connections.values():
        connection.close()
    got = sorted(m.id for m in receive_all(node.url, "all", 10))
    assert got == [0, 1, 2, 3, 4, 100, 101, 102, 103, 104]

    status, body = api(node, "DELETE", f"/api/v1/bindings/{bound['binding']['id']}")
    assert status == 200 and body["version"] == 3

    def both_unbound() -> bool:
        status, listing = api(node, "GET", "/api/v1/exchanges", token=READ_TOKEN)
        return sorted((e["worker"], e["bindings"]) for e in listing["exchanges"]
                      if e["name"] == "bus") == [(0, 0), (1, 0)]
    wait_for(both_unbound, timeout=3.0, interval=0.05, what="both workers to unbind")
    connections = on_each_worker(node, "late")
    for worker, connection in connections.items():
        connection.create_sender("bus").send(Message(id=900 + worker, body="late"))
        connection.close()
    assert receive_all(node.url, "all", 0) == []


def test_a_static_node_with_two_workers_applies_the_wiring_on_both(start_node):
    node = start_node({"node": {"workers": 2}, "admin": {"tokens": TOKENS}}, "n1")
    check_on_both_workers(node)
    node.stop()
    node.start()  # each worker keeps the record in its own state file
    status, listing = api(node, "GET", "/api/v1/exchanges", token=READ_TOKEN)
    assert sorted(e["worker"] for e in listing["exchanges"] if e["name"] == "bus") == [0, 1]
    assert listing["declared"]["version"] == 3
    # a declared queue deleted (on whichever worker keeps it): its declaration goes too
    for name in ("dq.a", "dq.b"):
        assert api(node, "PUT", f"/api/v1/queues/{name}", {"max_depth": 5})[0] == 201
    queues = api(node, "GET", "/api/v1/queues", token=READ_TOKEN)[1]["queues"]
    assert sorted(q["name"] for q in queues if q["name"].startswith("dq.")) == ["dq.a", "dq.b"]
    for name, version in (("dq.a", 6), ("dq.b", 7)):
        status, deleted = api(node, "DELETE", f"/api/v1/queues/{name}")
        assert status == 200 and deleted["version"] == version, deleted
    status, listing = api(node, "GET", "/api/v1/exchanges", token=READ_TOKEN)
    assert listing["declared"]["version"] == 7


def test_an_etcd_node_with_two_workers_applies_the_wiring_on_both(start_node, etcd_url,
                                                                   cluster_name):
    node = etcd_node(start_node, "n1", [etcd_url], cluster_name, node={"workers": 2})
    wait_members(node, ["n1"], 10.0)
    check_on_both_workers(node)
