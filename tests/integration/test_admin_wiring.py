"""Exchanges and bindings at run time through the admin API (issue #46, docs/operations.md).

Live nodes and python-qpid-proton clients: an exchange and its bindings declared through
the API route a sender's messages to the bound queues (every id once in each), ETag and
If-Match as for rules, 422 naming the field, 409 for the configuration's own; they survive
a restart. Then two nodes on etcd: declared through one, applied on the other within a
second, and deleted everywhere (a sender on the deleted exchange detached with
amqp:resource-deleted).
"""

from __future__ import annotations

import time

import pytest
from admin_client import ADMIN_TOKEN, READ_TOKEN, http, wait_for
from cluster_support import etcd_node, wait_members
from conftest import free_port
from etcd_servers import cluster_name, etcd_url  # noqa: F401 (fixtures)
from proton import Message
from proton.utils import BlockingConnection, LinkDetached
from test_admin_queue_ops import TOKENS, receive_all, send

pytestmark = pytest.mark.timeout(90)


def api(node, method: str, path: str, body=None, token=ADMIN_TOKEN, headers=None):
    return http(method, node.admin_url + path, body, token=token, headers=headers, timeout=10)


def test_an_exchange_and_bindings_declared_at_run_time_route_and_survive_a_restart(start_node):
    node = start_node({"admin": {"tokens": TOKENS},
                       "exchanges": [{"name": "fixed", "type": "fanout"}],
                       "bindings": [{"exchange": "fixed", "queue": "fixed.q"}]}, "n1")
    status, body = api(node, "POST", "/api/v1/exchanges", {"name": "events", "type": "topic"})
    assert status == 201 and body["version"] == 1
    status, bound = api(node, "POST", "/api/v1/bindings",
                        {"exchange": "events", "queue": "eu", "key": "orders.eu.#"})
    assert status == 201 and bound["version"] == 2
    eu_id = bound["binding"]["id"]
    status, body = api(node, "POST", "/api/v1/bindings",
                       {"exchange": "events", "queue": "all", "key": "#"})
    assert status == 201
    status, body = api(node, "POST", "/api/v1/bindings", {"exchange": "fixed", "queue": "extra"})
    assert status == 201  # run-time bindings on the configuration's exchange too

    # refusals: by name and field
    status, bad = api(node, "POST", "/api/v1/exchanges", {"name": "x", "type": "headers"})
    assert status == 422 and bad["field"] == "exchanges[1].type"
    status, bad = api(node, "POST", "/api/v1/bindings", {"exchange": "nope", "queue": "q", "key": "k"})
    assert status == 422 and "unknown exchange" in bad["detail"]
    status, bad = api(node, "POST", "/api/v1/exchanges", {"name": "events", "type": "fanout"})
    assert status == 409 and bad["error"] == "exchange_exists"
    status, bad = api(node, "DELETE", "/api/v1/exchanges/fixed")
    assert status == 409 and bad["error"] == "in_config"
    status, bad = api(node, "POST", "/api/v1/bindings",
                      {"exchange": "events", "queue": "eu", "key": "orders.eu.#"})
    assert status == 409 and bad["id"] == eu_id
    status, stale = api(node, "PUT", "/api/v1/exchanges/events", {"type": "fanout"},
                        headers={"If-Match": '"1"'})
    assert status == 412 and stale["version"] == 4
    status, body = api(node, "POST", "/api/v1/exchanges", {"name": "x"}, token=READ_TOKEN)
    assert status == 403

    status, listing = api(node, "GET", "/api/v1/exchanges", token=READ_TOKEN)
    declared = listing["declared"]
    assert declared["version"] == 4
    assert [(e["name"], e["origin"]) for e in declared["exchanges"]] == [("fixed", "config"),
                                                                         ("events", "api")]
    assert sorted((b["exchange"], b["queue"], b["origin"]) for b in declared["bindings"]) == [
        ("events", "all", "api"), ("events", "eu", "api"), ("fixed", "extra", "api"),
        ("fixed", "fixed.q", "config")]

    send(node.url, "events", [Message(id=i, subject="orders.eu.de" if i % 2 else "orders.us",
                                      body=f"e{i}") for i in range(10)])
    send(node.url, "fixed", [Message(id=100 + i, body="f") for i in range(3)])
    assert sorted(m.id for m in receive_all(node.url, "eu", 5)) == [1, 3, 5, 7, 9]
    assert sorted(m.id for m in receive_all(node.url, "all", 10)) == list(range(10))
    assert sorted(m.id for m in receive_all(node.url, "extra", 3)) == [100, 101, 102]

    node.stop()
    node.start()
    status, listing = api(node, "GET", "/api/v1/bindings", token=READ_TOKEN)
    assert listing["version"] == 4 and len(listing["bindings"]) == 4
    status, body = api(node, "DELETE", f"/api/v1/bindings/{eu_id}", headers={"If-Match": '"4"'})
    assert status == 200 and body["version"] == 5
    send(node.url, "events", [Message(id=50, subject="orders.eu.fr", body="late")])
    assert [m.id for m in receive_all(node.url, "all", 1)] == [50]
    assert receive_all(node.url, "eu", 0) == []
    status, audit = api(node, "GET", "/api/v1/audit?limit=3")
    assert [e["path"] for e in audit["entries"]][-1] == f"/api/v1/bindings/{eu_id}"


def test_declared_on_one_etcd_node_applied_on_the_other_within_a_second(start_node, etcd_url,
                                                                        cluster_name):
    nodes = {n: etcd_node(start_node, n, [etcd_url], cluster_name,
                          admin={"tokens": TOKENS}) for n in ("n1", "n2")}
    for item in nodes.values():
        wait_members(item, ["n1", "n2"], 10.0)
    n1, n2 = nodes["n1"], nodes["n2"]
    assert api(n1, "POST", "/api/v1/exchanges", {"name": "bus", "type": "fanout"})[0] == 201
    status, body = api(n1, "POST", "/api/v1/bindings", {"exchange": "bus", "queue": "mirror"})
    assert status == 201 and body["version"] == 2
    started = time.monotonic()  # stored in etcd: n2 applies it within a second

    def bound_on_n2():
        status, listing = api(n2, "GET", "/api/v1/exchanges", token=READ_TOKEN)
        return listing["declared"]["version"] == 2 and \
            any(e["name"] == "bus" and e["bindings"] == 1 for e in listing["exchanges"])
    wait_for(bound_on_n2, timeout=1.0, interval=0.02, what="n2 to apply version 2")
    print(f"applied on n2 {time.monotonic() - started:.3f} s after n1 answered")
    send(n2.url, "bus", [Message(id=i, body="b") for i in range(4)])
    assert sorted(m.id for m in receive_all(n2.url, "mirror", 4)) == [0, 1, 2, 3]

    # stale on n2 after a change through n1: 412 there too (one record, in etcd)
    assert api(n1, "PUT", "/api/v1/exchanges/bus", {"type": "fanout", "name": "bus"})[0] == 200
    status, stale = api(n2, "DELETE", "/api/v1/exchanges/bus", headers={"If-Match": '"2"'})
    assert status == 412 and stale["version"] == 3
    conn = BlockingConnection(n2.url, timeout=10)
    sender = conn.create_sender("bus")
    sender.send(Message(id=9, body="before"))
    status, body = api(n2, "DELETE", "/api/v1/exchanges/bus", headers={"If-Match": '"3"'})
    assert status == 200 and body["bindings_deleted"] == 1
    with pytest.raises(LinkDetached) as detached:
        for _ in range(50):
            sender.send(Message(id=10, body="after"), timeout=1)
            time.sleep(0.05)
    assert "amqp:resource-deleted" in str(detached.value)
    conn.close()
    wait_for(lambda: api(n1, "GET", "/api/v1/exchanges/bus")[0] == 404, timeout=2.0,
             what="n1 to drop bus")


def test_queues_declared_at_run_time_apply_their_settings_and_durable_ones_survive(start_node):
    node = start_node({"admin": {"tokens": TOKENS},
                       "queue": [{"name": "conf", "max_depth": 5, "durable": True}]}, "n1")
    status, body = api(node, "POST", "/api/v1/queues",
                       {"name": "keep", "durable": True, "dead_letter": "keep.dlq"})
    assert status == 201 and body["version"] == 1
    status, body = api(node, "PUT", "/api/v1/queues/small", {"max_depth": 3})
    assert status == 201 and body["version"] == 2
    status, bad = api(node, "POST", "/api/v1/queues", {"name": "x", "overflow": "drop-tail"})
    assert status == 422 and bad["field"] == "queues[2].overflow"
    status, bad = api(node, "PUT", "/api/v1/queues/conf", {"max_depth": 9})
    assert status == 409 and bad["error"] == "in_config"
    status, bad = api(node, "POST", "/api/v1/queues", {"name": "keep"})
    assert status == 409 and bad["error"] == "queue_exists"

    status, small = api(node, "GET", "/api/v1/queues/small", token=READ_TOKEN)
    assert status == 200 and small["max_depth"] == 3 and small["declared"]["origin"] == "api"
    status, conf = api(node, "GET", "/api/v1/queues/conf", token=READ_TOKEN)
    assert conf["declared"] == {"name": "conf", "max_depth": 5, "durable": True, "origin": "config"}
    status, body = api(node, "PUT", "/api/v1/queues/small", {"max_depth": 7},
                       headers={"If-Match": '"2"'})
    assert status == 200 and api(node, "GET", "/api/v1/queues/small")[1]["max_depth"] == 7

    send(node.url, "keep", [Message(id=i, body=f"k{i}", durable=True) for i in range(8)])
    conn = BlockingConnection(node.url, timeout=10)
    receiver = conn.create_receiver("keep", credit=1)
    receiver.receive(timeout=5)
    receiver.reject()  # dead-lettered: the declared dead_letter applies
    conn.close()
    wait_for(lambda: api(node, "GET", "/api/v1/queues/keep.dlq")[1].get("depth") == 1,
             what="one dead-lettered")
    node.stop()
    node.start()
    status, keep = api(node, "GET", "/api/v1/queues/keep", token=READ_TOKEN)
    assert status == 200 and keep["depth"] == 7 and keep["durable"] and keep["dead_letter"] == "keep.dlq"
    assert sorted(m.id for m in receive_all(node.url, "keep", 7)) == list(range(1, 8))

    status, deleted = api(node, "DELETE", "/api/v1/queues/small")
    assert status == 200 and deleted["version"] == 4
    assert api(node, "GET", "/api/v1/queues/small")[0] == 404


def test_a_durable_queue_is_refused_on_a_node_without_a_journal(start_node):
    node = start_node({"admin": {"tokens": TOKENS}}, "n1")
    status, refused = api(node, "POST", "/api/v1/queues", {"name": "keep", "durable": True})
    assert status == 409 and refused["error"] == "no_journal"
    assert refused["field"] == "queues[0].durable"


def static_pair(start_node):
    """Two nodes of a static cluster (each other's ``[admin] cluster`` peers): (n1, n2)."""
    admin = {n: free_port() for n in ("n1", "n2")}
    table = {n: f"http://127.0.0.1:{port}" for n, port in admin.items()}
    nodes = {n: start_node({"admin": {"tokens": TOKENS, "listen": f"127.0.0.1:{admin[n]}",
                                      "cluster": table}}, n) for n in ("n1", "n2")}
    return nodes["n1"], nodes["n2"]


def test_a_static_cluster_pushes_the_change_to_its_peers(start_node):
    n1, n2 = static_pair(start_node)
    assert api(n1, "POST", "/api/v1/exchanges", {"name": "bus", "type": "fanout"})[0] == 201
    assert api(n1, "POST", "/api/v1/bindings", {"exchange": "bus", "queue": "copy"})[0] == 201
    status, listing = api(n2, "GET", "/api/v1/bindings", token=READ_TOKEN)
    assert listing["version"] == 2 and [b["queue"] for b in listing["bindings"]] == ["copy"]
    send(n2.url, "bus", [Message(id=i, body="b") for i in range(3)])
    assert sorted(m.id for m in receive_all(n2.url, "copy", 3)) == [0, 1, 2]
    status, old = api(n2, "POST", "/api/v1/cluster/wiring",
                      {"version": 1, "updated_at": 0, "origin": "n9", "exchanges": [],
                       "bindings": []})
    assert status == 200 and old == {"accepted": False, "version": 2}  # an older record
    n2.stop()
    n2.start()  # kept in its own state file
    assert api(n2, "GET", "/api/v1/exchanges/bus", token=READ_TOKEN)[1]["exchange"]["type"] == "fanout"
