"""Queue operations through the admin API on live nodes (issue #46, docs/operations.md).

A ``fedgate serve`` process and python-qpid-proton clients: peek shows the first messages
and takes none; delete is refused while the queue has messages or consumers and, forced,
detaches its consumer with ``amqp:resource-deleted``; purge answers the count (and, on a
durable queue, the messages stay gone after a restart); move by selector and by count
(every moved id received once at the target, the rest still at the source; a refused
target leaves every message where it was); resend of dead-lettered messages to their
queue; the audit log of it all. Then a replicated queue on etcd: purge and move asked of
the backup are done by the primary and its backup's copy follows.
"""

from __future__ import annotations

import json

import pytest
from admin_client import ADMIN_TOKEN, READ_TOKEN, http, wait_for
from cluster_support import etcd_node, wait_members
from conftest import free_port
from etcd_servers import cluster_name, etcd_url  # noqa: F401 (fixtures)
from proton import Message
from proton.utils import BlockingConnection, LinkDetached
from test_admin_replication import cli_run

from proxy.config.version import version

pytestmark = pytest.mark.timeout(90)

TOKENS = [{"token": ADMIN_TOKEN, "role": "admin", "name": "ops-alice"},
          {"token": READ_TOKEN, "role": "read"}]


def ops_node(start_node, name="n1", **sections):
    return start_node({"admin": {"tokens": TOKENS}, "node": {"log_level": "info"}, **sections},
                      name)


def send(url: str, address: str, messages) -> None:
    conn = BlockingConnection(url, timeout=10)
    sender = conn.create_sender(address)
    for message in messages:
        sender.send(message)
    conn.close()


def receive_all(url: str, address: str, expected: int, *, timeout: float = 5.0) -> list[Message]:
    """Exactly ``expected`` messages (accepted); then nothing more within a short wait."""
    conn = BlockingConnection(url, timeout=10)
    receiver = conn.create_receiver(address, credit=expected + 10)
    got = []
    for _ in range(expected):
        got.append(receiver.receive(timeout=timeout))
        receiver.accept()
    try:
        extra = receiver.receive(timeout=0.3)
    except Exception:  # proton's Timeout: nothing more
        extra = None
    conn.close()
    assert extra is None, f"one more than {expected}: {extra}"
    return got


def queue_of(node, name: str) -> dict:
    status, doc = http("GET", node.admin_url + "/api/v1/queues", token=READ_TOKEN)
    assert status == 200, doc
    return next((q for q in doc["queues"] if q["name"] == name), {})


def api(node, method: str, path: str, body=None, token=ADMIN_TOKEN):
    return http(method, node.admin_url + path, body, token=token, timeout=40)


def test_peek_delete_purge_and_the_audit_log(start_node):
    node = ops_node(start_node)
    status, about = api(node, "GET", "/api/v1/node", token=READ_TOKEN)
    assert status == 200 and about["version"] == version()  # the release (CHANGELOG.md)
    send(node.url, "orders", [Message(id=i, subject=f"s{i}", body=f"order {i}" + "x" * 300,
                                      properties={"n": i, "color": "red"}, durable=True)
                              for i in range(5)])

    status, peeked = api(node, "GET", "/api/v1/queues/orders/messages?count=3", token=READ_TOKEN)
    assert status == 200, peeked
    assert [m["properties"]["message_id"] for m in peeked["messages"]] == [0, 1, 2]
    first = peeked["messages"][0]
    assert first["application_properties"] == {"n": 0, "color": "red"}
    assert first["properties"]["subject"] == "s0" and first["header"]["durable"] is True
    assert first["delivery_count"] == 0 and first["body"].startswith("order 0xxx")
    assert first["body_truncated"] and len(first["body"]) == 256
    assert peeked["depth"] == 5 and queue_of(node, "orders")["depth"] == 5  # nothing taken

    status, refused = api(node, "DELETE", "/api/v1/queues/orders")
    assert status == 409 and refused["error"] == "queue_in_use" and refused["messages"] == 5
    status, refused = api(node, "POST", "/api/v1/queues/orders/purge", token=READ_TOKEN)
    assert status == 403
    status, purged = api(node, "POST", "/api/v1/queues/orders/purge")
    assert status == 200 and (purged["purged"], purged["depth"], purged["scope"]) == (5, 0, "local")

    conn = BlockingConnection(node.url, timeout=10)
    receiver = conn.create_receiver("orders", credit=1)
    wait_for(lambda: queue_of(node, "orders").get("consumers") == 1, what="a consumer")
    status, refused = api(node, "DELETE", "/api/v1/queues/orders")
    assert status == 409 and refused["consumers"] == 1 and "consumers" in refused["detail"]
    status, deleted = api(node, "DELETE", "/api/v1/queues/orders?force=true")
    assert status == 200 and deleted["deleted"] and deleted["links_closed"] == 1
    with pytest.raises(LinkDetached) as detached:
        receiver.receive(timeout=5)
    assert "amqp:resource-deleted" in str(detached.value)
    conn.close()
    assert queue_of(node, "orders") == {}
    status, missing = api(node, "POST", "/api/v1/queues/nothing/purge")
    assert status == 404 and missing["error"] == "queue_not_found"
    status, bad = api(node, "GET", "/api/v1/queues/orders/messages?count=0")
    assert status == 400 and bad["field"] == "count"

    status, audit = api(node, "GET", "/api/v1/audit", token=READ_TOKEN)
    assert status == 200
    seen = [(e["who"], e["method"], e["path"], e["status"]) for e in audit["entries"]]
    assert seen == [
        ("ops-alice", "DELETE", "/api/v1/queues/orders", 409),
        (f"token:{__import__('hashlib').sha256(READ_TOKEN.encode()).hexdigest()[:12]}", "POST",
         "/api/v1/queues/orders/purge", 403),
        ("ops-alice", "POST", "/api/v1/queues/orders/purge", 200),
        ("ops-alice", "DELETE", "/api/v1/queues/orders", 409),
        ("ops-alice", "DELETE", "/api/v1/queues/orders?force=true", 200),
        ("ops-alice", "POST", "/api/v1/queues/nothing/purge", 404),
    ]
    assert audit["entries"][2]["result"]["purged"] == 5
    assert audit["entries"][0]["result"]["error"] == "queue_in_use"
    lines = (node.workdir / "data-n1" / "audit.jsonl").read_text().splitlines()
    assert [json.loads(line)["status"] for line in lines] == [409, 403, 200, 409, 200, 404]
    log_lines = [line for line in node.log_path.read_text().splitlines() if "fedgate.audit" in line]
    assert len(log_lines) == 6


def test_a_durable_queue_purged_stays_empty_after_a_restart(start_node):
    node = ops_node(start_node, queue=[{"name": "keep", "durable": True}])
    send(node.url, "keep", [Message(id=i, body=f"k{i}", durable=True) for i in range(20)])
    status, purged = api(node, "POST", "/api/v1/queues/keep/purge")
    assert status == 200 and purged["purged"] == 20
    send(node.url, "keep", [Message(id=100, body="after", durable=True)])
    node.stop()
    node.start()
    assert queue_of(node, "keep")["depth"] == 1
    (message,) = receive_all(node.url, "keep", 1)
    assert message.id == 100


def test_move_by_selector_and_count_every_id_once(start_node):
    node = ops_node(start_node, rules=[{"name": "closed", "match": "closed.#", "kind": "deny"}],
                    exchanges=[{"name": "void", "type": "direct"}],
                    queue=[{"name": "tiny", "max_depth": 2}])
    send(node.url, "orders", [Message(id=i, body=f"o{i}", properties={
        "color": "red" if i % 2 else "blue"}) for i in range(20)])

    status, moved = api(node, "POST", "/api/v1/queues/orders/move",
                        {"to": "red", "selector": "color = 'red'"})
    assert status == 200, moved
    assert (moved["selected"], moved["moved"], moved["returned"], moved["depth"]) == (10, 10, 0, 10)
    status, moved = api(node, "POST", "/api/v1/queues/orders/move", {"to": "some", "count": 3})
    assert status == 200 and moved["moved"] == 3 and moved["depth"] == 7

    # a target that refuses: nothing is lost, every message stays at the source
    status, refused = api(node, "POST", "/api/v1/queues/orders/move", {"to": "closed.x"})
    assert status == 200 and (refused["moved"], refused["returned"], refused["depth"]) == (0, 7, 7)
    assert refused["failures"][0]["to"] == "closed.x"
    assert "amqp:unauthorized-access" in refused["failures"][0]["reason"]

    # an exchange that routes them nowhere would accept and drop them: refused instead
    status, refused = api(node, "POST", "/api/v1/queues/orders/move", {"to": "void", "count": 2})
    assert status == 200 and (refused["moved"], refused["returned"], refused["depth"]) == (0, 2, 7)
    assert "amqp:not-found" in refused["failures"][0]["reason"]

    # a target at its max_depth takes what fits; the rest stays at the source
    status, partly = api(node, "POST", "/api/v1/queues/orders/move", {"to": "tiny", "count": 3})
    assert status == 200 and (partly["moved"], partly["returned"], partly["depth"]) == (2, 1, 5)
    assert partly["failures"] == [{"to": "tiny", "reason": "released", "count": 1}]

    for body, field in (({"count": 1}, "to"), ({"to": "x", "count": 0}, "count"),
                        ({"to": "x", "selector": "color = "}, "selector"), ({"to": "orders"}, "to"),
                        ({"to": "x", "other": 1}, "other"), ([1], "body")):
        status, bad = api(node, "POST", "/api/v1/queues/orders/move", body)
        assert status == 400 and bad["field"] == field, (body, bad)

    red = {m.id for m in receive_all(node.url, "red", 10)}
    some = [m.id for m in receive_all(node.url, "some", 3)]
    tiny = [m.id for m in receive_all(node.url, "tiny", 2)]
    rest = [m.id for m in receive_all(node.url, "orders", 5)]
    assert red == set(range(1, 20, 2))
    assert some == [0, 2, 4] and tiny == [6, 8] and rest == [10, 12, 14, 16, 18]


def test_resend_dead_lettered_messages_to_their_queue(start_node):
    node = ops_node(start_node, queue=[{"name": "work", "dead_letter": "work.dlq"}])
    send(node.url, "work", [Message(id=i, body=f"w{i}") for i in range(6)])
    conn = BlockingConnection(node.url, timeout=10)
    receiver = conn.create_receiver("work", credit=6)
    for _ in range(6):
        receiver.receive(timeout=5)
        receiver.reject()
    conn.close()
    wait_for(lambda: queue_of(node, "work.dlq").get("depth") == 6, what="6 dead-lettered")
    send(node.url, "work.dlq", [Message(id="not-dead", body="sent here by hand")])

    status, peeked = api(node, "GET", "/api/v1/queues/work.dlq/messages?count=1")
    annotations = peeked["messages"][0]["annotations"]
    assert annotations["x-opt-dead-letter-address"] == "work"
    assert annotations["x-opt-dead-letter-reason"] == "rejected"

    status, resent = api(node, "POST", "/api/v1/queues/work.dlq/resend", {})
    assert status == 200, resent
    assert (resent["selected"], resent["resent"], resent["targets"], resent["depth"]) == \
        (6, 6, {"work": 6}, 1)
    back = receive_all(node.url, "work", 6)
    assert sorted(m.id for m in back) == list(range(6))
    assert not any("x-opt-dead-letter-address" in (m.annotations or {}) for m in back)
    (left,) = receive_all(node.url, "work.dlq", 1)
    assert left.id == "not-dead"


def test_purge_and_move_on_a_replicated_queue_asked_of_its_backup(start_node, etcd_url,
                                                                  cluster_name):
    rule = {"name": "orders", "match": "orders.*", "kind": "replicated", "replicas": 2,
            "nodes": ["n1", "n2"]}
    admin = {n: free_port() for n in ("n1", "n2")}
    nodes = {n: etcd_node(start_node, n, [etcd_url], cluster_name, rules=[rule],
                          admin={"tokens": TOKENS, "listen": f"127.0.0.1:{admin[n]}"},
                          cluster={"advertise_admin": f"http://127.0.0.1:{admin[n]}"},
                          node={"log_level": "info"}) for n in ("n1", "n2")}
    for item in nodes.values():
        wait_members(item, ["n1", "n2"], 10.0)
    n1, n2 = nodes["n1"], nodes["n2"]
    send(n1.url, "orders.eu", [Message(id=i, body=f"e{i}", properties={"big": i >= 10})
                               for i in range(30)])

    def copy_depth() -> int | None:
        return (queue_of(n2, "orders.eu").get("replication") or {}).get("copy", {}).get("depth")

    wait_for(lambda: copy_depth() == 30, timeout=10, what="n2's copy holds 30")
    status, moved = api(n2, "POST", "/api/v1/queues/orders.eu/move",
                        {"to": "big", "selector": "big = TRUE"})
    assert status == 200, moved
    assert (moved["forwarded_to"], moved["node"], moved["moved"], moved["depth"]) == \
        ("n1", "n1", 20, 10)
    wait_for(lambda: copy_depth() == 10, timeout=10, what="n2's copy down to 10")
    status, purged = api(n2, "POST", "/api/v1/queues/orders.eu/purge")
    assert status == 200 and (purged["purged"], purged["scope"]) == (10, "replicated")
    wait_for(lambda: copy_depth() == 0, timeout=10, what="n2's copy empty")
    assert queue_of(n1, "orders.eu")["replication"]["in_sync"] == ["n2"]
    # into a replicated queue: accepted there once its backup holds the messages
    send(n1.url, "staging", [Message(id=f"s{i}", body="staged") for i in range(5)])
    status, moved = api(n2, "POST", "/api/v1/queues/staging/move", {"to": "orders.eu"})
    assert status == 404 and moved["error"] == "queue_not_found"  # staging is n1's
    status, moved = api(n1, "POST", "/api/v1/queues/staging/move", {"to": "orders.eu"})
    assert status == 200 and (moved["moved"], moved["depth"]) == (5, 0)
    assert copy_depth() == 5  # held by the backup before the move was answered
    status, purged = api(n1, "POST", "/api/v1/queues/orders.eu/purge")
    assert status == 200 and purged["purged"] == 5
    status, refused = api(n1, "DELETE", "/api/v1/queues/orders.eu")
    assert status == 409 and refused["error"] == "not_deletable"
    assert sorted(m.id for m in receive_all(n1.url, "big", 20)) == list(range(10, 30))
    status, audit = api(n1, "GET", "/api/v1/audit")
    move = next(e for e in audit["entries"] if e["path"].endswith("/move"))
    assert move["who"].startswith("ops-alice at n2 via ")


def test_the_cli_peeks_moves_resends_purges_deletes_and_shows_the_audit(start_node, capsys,
                                                                        monkeypatch):
    node = ops_node(start_node, queue=[{"name": "jobs", "dead_letter": "jobs.dlq"}])
    send(node.url, "jobs", [Message(id=f"j{i}", subject="job", body=f"job {i}\nline 2",
                                    properties={"urgent": i < 2}) for i in range(5)])
    monkeypatch.setenv("FEDGATE_TOKEN", ADMIN_TOKEN)
    admin = ("--admin", node.admin_url)

    code, out, _ = cli_run(capsys, "queue", "peek", "jobs", "--count", "2", *admin)
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == f"local queue jobs on n1: depth 5, first 2"
    assert lines[1].split() == ["ID", "SUBJECT", "DELIVERY_COUNT", "SIZE", "BODY"]
    assert lines[2].split()[:3] == ["j0", "job", "0"] and lines[2].endswith("job 0 line 2")
    code, out, _ = cli_run(capsys, "queue", "move", "jobs", "--to", "jobs.urgent",
                           "--selector", "urgent = TRUE", *admin)
    assert (code, out) == (0, "local queue jobs on n1: 2 of 2 messages moved to jobs.urgent\n")
    code, out, err = cli_run(capsys, "queue", "delete", "jobs", *admin)
    assert code == 1 and "409 queue_in_use (field name)" in err and "3 messages" in err
    code, out, _ = cli_run(capsys, "queue", "move", "jobs", "--to", "jobs.dlq", "--count", "1",
                           *admin)
    assert code == 0 and "1 of 1 messages moved" in out
    code, out, _ = cli_run(capsys, "queue", "resend", "jobs.dlq", *admin)
    assert (code, out) == (0, "local queue jobs.dlq on n1: 0 of 0 dead-lettered messages resent "
                              "(none)\n")  # moved there by hand: not dead-lettered
    code, out, _ = cli_run(capsys, "queue", "purge", "jobs", *admin)
    assert (code, out) == (0, "local queue jobs on n1: 2 messages purged\n")
    code, out, _ = cli_run(capsys, "queue", "delete", "jobs", *admin)
    assert (code, out) == (0, "local queue jobs on n1: deleted (0 messages purged, 0 links "
                              "closed)\n")
    assert sorted(m.id for m in receive_all(node.url, "jobs.urgent", 2)) == ["j0", "j1"]

    code, out, _ = cli_run(capsys, "audit", *admin)
    rows = [line.split() for line in out.splitlines()[1:]]
    assert [(r[1], r[2], r[4], r[5]) for r in rows] == [
        ("ops-alice", "POST", "200", "ok"), ("ops-alice", "DELETE", "409", "queue_in_use"),
        ("ops-alice", "POST", "200", "ok"), ("ops-alice", "POST", "200", "ok"),
        ("ops-alice", "POST", "200", "ok"), ("ops-alice", "DELETE", "200", "ok")]
    assert [r[3] for r in rows][:2] == ["/api/v1/queues/jobs/move", "/api/v1/queues/jobs"]


def test_a_fragmented_queue_is_operated_on_in_this_nodes_fragment(start_node):
    node = ops_node(start_node, rules=[{"name": "work", "match": "work.#", "kind": "fragmented",
                                        "fragments": ["n1"]}])
    send(node.url, "work.a", [Message(id=i, body=f"w{i}") for i in range(10)])
    status, peeked = api(node, "GET", "/api/v1/queues/work.a/messages?count=2")
    assert status == 200 and (peeked["scope"], peeked["depth"]) == ("fragment", 10)
    assert [m["properties"]["message_id"] for m in peeked["messages"]] == [0, 1]
    status, moved = api(node, "POST", "/api/v1/queues/work.a/move", {"to": "done", "count": 4})
    assert status == 200 and (moved["moved"], moved["depth"]) == (4, 6)
    status, refused = api(node, "DELETE", "/api/v1/queues/work.a?force=true")
    assert status == 409 and refused["error"] == "not_deletable"
    status, purged = api(node, "POST", "/api/v1/queues/work.a/purge")
    assert status == 200 and purged["purged"] == 6
    assert [m.id for m in receive_all(node.url, "done", 4)] == [0, 1, 2, 3]


def test_with_workers_each_queue_is_operated_on_by_the_worker_that_keeps_it(start_node):
    node = ops_node(start_node, node={"workers": 2, "log_level": "info"})
    names = [f"w{i}" for i in range(6)]
    for name in names:
        send(node.url, name, [Message(id=f"{name}-{i}", body="x") for i in range(3)])
    status, doc = api(node, "GET", "/api/v1/queues")
    assert sorted({q["worker"] for q in doc["queues"] if q["name"] in names}) == [0, 1]
    for name in names:
        status, one = api(node, "GET", f"/api/v1/queues/{name}")
        assert status == 200 and one["depth"] == 3  # from the worker that keeps it
        status, peeked = api(node, "GET", f"/api/v1/queues/{name}/messages?count=1")
        assert status == 200 and peeked["messages"][0]["properties"]["message_id"] == f"{name}-0"
        status, moved = api(node, "POST", f"/api/v1/queues/{name}/move", {"to": "all", "count": 1})
        assert status == 200 and moved["moved"] == 1, moved
        status, purged = api(node, "POST", f"/api/v1/queues/{name}/purge")
        assert status == 200 and purged["purged"] == 2
    assert sorted(m.id for m in receive_all(node.url, "all", 6)) == sorted(f"{n}-0" for n in names)
    status, audit = api(node, "GET", "/api/v1/audit")
    assert len(audit["entries"]) == 12  # worker 0 keeps the node's log
