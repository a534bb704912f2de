"""ACL grants through the admin API (issue #46, admin_api/grants.py, docs/operations.md).

A live node with a users file (SASL PLAIN) and one ``[[acl]]`` entry in its configuration
(bob's). alice may do nothing until a grant is PUT for her; then her sender is allowed and
every message she sends arrives. The grant is narrowed: her receiver outside it is
detached with ``amqp:unauthorized-access`` while her sender inside stays. The grant is
deleted: her sender is detached and a new attach is refused, both with
``amqp:unauthorized-access``. ETag / If-Match, 409 for the configuration's own subject,
422 naming the field, 403 for a read token; the grants survive a restart. Then a node
with two workers: a grant and its removal reach alice's links on both workers.
"""

from __future__ import annotations

import pytest
from admin_client import READ_TOKEN
from dmz_support import condition_of
from proton import Message
from proton.reactor import Container
from proton.utils import BlockingConnection, LinkDetached
from test_admin_queue_ops import TOKENS
from test_admin_wiring import api
from test_subscriptions_workers import worker_of

from proxy.auth.users import UsersFile, make_record

pytestmark = pytest.mark.timeout(90)

UNAUTHORIZED = "amqp:unauthorized-access"


def as_user(node, user: str) -> BlockingConnection:
    return BlockingConnection(node.url, user=user, password=f"{user} pw", allowed_mechs="PLAIN",
                              timeout=10)


def bob_receives(node, count: int) -> list:
    conn = as_user(node, "bob")
    receiver = conn.create_receiver("orders", credit=count + 5)
    got = []
    for _ in range(count):
        got.append(receiver.receive(timeout=5).id)
        receiver.accept()
    conn.close()
    return got


def test_a_grant_made_through_the_api_allows_and_its_removal_detaches(start_node, tmp_path):
    users = UsersFile(tmp_path / "users.json")
    for name in ("alice", "bob"):
        users.add(make_record(name, f"{name} pw", groups=("ops",) if name == "bob" else ()))
    users.save()
    node = start_node({"admin": {"tokens": TOKENS},
                       "sasl": {"mechanisms": ["PLAIN"], "users_file": str(users.path),
                                "require": True, "allow_plain_without_tls": True},
                       "acl": [{"user": "bob", "send": ["#"], "receive": ["#"]}]}, "n1")
    with pytest.raises(LinkDetached) as refused:
        as_user(node, "alice").create_sender("orders")
    assert condition_of(refused.value) == UNAUTHORIZED

    # refusals first: the file's subject, a bad pattern, an unknown key, a read token
    status, bad = api(node, "PUT", "/api/v1/acl/bob", {"send": ["x"]})
    assert status == 409 and bad["error"] == "in_config"
    status, bad = api(node, "PUT", "/api/v1/acl/alice", {"send": ["orders.#.x.##"]})
    assert status == 422 and bad["field"] == "acl[0].send[0]", bad
    status, bad = api(node, "PUT", "/api/v1/acl/alice", {"user": "carol", "send": ["x"]})
    assert status == 400 and bad["field"] == "user"
    assert api(node, "PUT", "/api/v1/acl/alice", {"send": ["x"]}, token=READ_TOKEN)[0] == 403

    status, body = api(node, "PUT", "/api/v1/acl/alice", {"send": ["orders"], "receive": ["audit"]})
    assert status == 201 and body["version"] == 1
    assert body["grant"] == {"user": "alice", "send": ["orders"], "receive": ["audit"]}
    status, listing = api(node, "GET", "/api/v1/acl", token=READ_TOKEN)
    assert [(e["subject"], e["origin"]) for e in listing["entries"]] == [("bob", "config"),
                                                                        ("alice", "api")]
    conn = as_user(node, "alice")
    sender = conn.create_sender("orders")  # allowed from the next attach on
    audit = conn.create_receiver("audit", credit=1)
    for i in range(5):
        sender.send(Message(id=i, body="a"), timeout=5)
    assert sorted(bob_receives(node, 5)) == [0, 1, 2, 3, 4]

    # narrowed: the receiver outside it is detached, the sender inside stays
    status, stale = api(node, "PUT", "/api/v1/acl/alice", {"send": ["orders"]},
                        headers={"If-Match": '"0"'})
    assert status == 412 and stale["version"] == 1
    status, body = api(node, "PUT", "/api/v1/acl/alice", {"send": ["orders"]},
                       headers={"If-Match": '"1"'})
    assert status == 200 and body["version"] == 2
    with pytest.raises(LinkDetached) as detached:
        audit.receive(timeout=5)
    assert condition_of(detached.value) == UNAUTHORIZED
    sender.send(Message(id=5, body="still"), timeout=5)
    assert bob_receives(node, 1) == [5]

    # removed: the sender is detached, a new attach refused
    status, body = api(node, "DELETE", "/api/v1/acl/alice")
    assert status == 200 and body["version"] == 3
    with pytest.raises(LinkDetached) as detached:
        for i in range(50):
            sender.send(Message(id=100 + i, body="after"), timeout=1)
    assert condition_of(detached.value) == UNAUTHORIZED
    with pytest.raises(LinkDetached) as refused:
        conn.create_sender("orders", name="alice-again")
    assert condition_of(refused.value) == UNAUTHORIZED
    conn.close()
    assert api(node, "DELETE", "/api/v1/acl/alice")[1]["error"] == "acl_not_found"
    assert bob_receives(node, 0) == []  # nothing sent after the removal went through

    # a group's grant, kept across a restart
    status, body = api(node, "PUT", "/api/v1/acl/group:ops", {"receive": ["audit"]})
    assert status == 201 and body["grant"] == {"group": "ops", "receive": ["audit"]}
    node.stop()
    node.start()
    status, one = api(node, "GET", "/api/v1/acl/group:ops", token=READ_TOKEN)
    assert status == 200 and one["version"] == 4 and one["entries"][0]["origin"] == "api"
    status, audit_log = api(node, "GET", "/api/v1/audit?limit=20")
    assert "/api/v1/acl/group:ops" in [e["path"] for e in audit_log["entries"]]


def test_grants_apply_on_every_worker(start_node, tmp_path):
    """``[node] workers = 2``, a static node: alice has a connection on each worker (steered
    as in test_subscriptions_workers); a grant lets both send, its removal detaches both."""
    users = UsersFile(tmp_path / "users.json")
    for name in ("alice", "bob"):
        users.add(make_record(name, f"{name} pw"))
    users.save()
    node = start_node({"node": {"workers": 2}, "admin": {"tokens": TOKENS},
                       "sasl": {"mechanisms": ["PLAIN"], "users_file": str(users.path),
                                "require": True, "allow_plain_without_tls": True},
                       "acl": [{"user": "bob", "send": ["#"], "receive": ["#"]}]}, "n1")
    assert api(node, "PUT", "/api/v1/acl/alice", {"send": ["orders"]})[0] == 201
    connections = {}
    for n in range(2):
        container = Container()
        container.container_id = f"alice-{n}"
        conn = BlockingConnection(node.url, user="alice", password="alice pw",
                                  allowed_mechs="PLAIN", timeout=15, container=container)
        conn.create_receiver(None, dynamic=True)  # not placed: stays on its worker
        connections[worker_of(node, f"alice-{n}")] = conn
    assert sorted(connections) == [0, 1]
    senders = {}
    for worker, conn in connections.items():
        senders[worker] = conn.create_sender("orders")
        for i in range(3):
            senders[worker].send(Message(id=worker * 10 + i, body="a"), timeout=5)
    assert sorted(bob_receives(node, 6)) == [0, 1, 2, 10, 11, 12]
    assert api(node, "DELETE", "/api/v1/acl/alice")[0] == 200
    for worker, sender in senders.items():
        with pytest.raises(LinkDetached) as detached:
            for i in range(50):
                sender.send(Message(id=100 + i, body="after"), timeout=1)
        assert condition_of(detached.value) == UNAUTHORIZED, worker
    for conn in connections.values():
        conn.close()
