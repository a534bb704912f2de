"""Placement by first attach, on real processes (issue #36, proxy.amqp.first_attach).

A node with two workers: a client that sends its open, begin and first attach in one
go (proton's Container, as most clients) is handed to the worker that owns the local
queue it attaches to, or for a fragmented queue to a worker where its role is missing,
so its messages cross nothing inside the node. What must hold: every message arrives
once and in order, the connection is shown on the worker that serves it, and the
node-wide limits still count it once (per user, across the hand-over).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from admin_client import ADMIN, admin
from conftest import ROOT

from test_workers import WORKERS, owned_by, wait_for

FRAGMENTED = {"name": "work", "match": "work.#", "kind": "fragmented", "fragments": ["n1"]}


def connections(node) -> list[dict]:
    return admin(node, "/api/v1/connections")["connections"]


def attached(node, consumers: int, producers: int, what: str) -> list[dict]:
    """The node's connections once that many consumer and producer links are attached:
    each connection is then where it stays (a link exists only once the proton of the
    worker serving it has read the attach; before that a connection is listed where it
    landed)."""
    def seen():
        links = admin(node, "/api/v1/links")
        if (links["consumers"], links["producers"]) != (consumers, producers):
            return None
        return connections(node)

    return wait_for(seen, 20, what)


def received_ids(consumer) -> list[str]:
    return [line["id"] for line in consumer.finish(timeout=60) if "id" in line]


# proton's Container sends its first attach at once; go-amqp waits for our open and begin
# (answered by the first worker, read again by the owner: first_attach)
@pytest.mark.parametrize("owner,kind", [(0, "proton"), (1, "proton"), (0, "go"), (1, "go")])
def test_a_pair_on_a_local_queue_is_served_by_the_queues_owner(start_node, clients, owner, kind):
    queue = owned_by("n1", owner, "placed")
    node = start_node({"node": {"workers": WORKERS}, "admin": ADMIN})
    consumer = clients(kind, "receive", node.url, address=queue, count=600, credit=50,
                       timeout_ms=60000)
    attached(node, 1, 0, "the consumer attached")
    producer = clients(kind, "send", node.url, address=queue, count=600, rate=150, prefix="p")
    both = attached(node, 1, 1, "the producer attached")
    assert [c["worker"] for c in both] == [owner, owner], both  # neither crosses to the owner
    (sent,) = [line for line in producer.finish(timeout=60) if "sent" in line]
    assert sent["error"] is None and sent["accepted"] == 600, sent
    assert received_ids(consumer) == [f"p-{n}" for n in range(600)]  # all, once, in order
    held = {q["name"]: q for q in admin(node, "/api/v1/queues")["queues"]}
    assert held[queue]["worker"] == owner
    # each new connection lands on the worker with the fewest (worker 0 first): the consumer
    # is handed over when worker 1 owns the queue, the producer (landing on the other) always
    counters = admin(node, "/api/v1/node")["counters"]
    assert counters["connections_handed_over"] == (2 if owner == 1 else 1), counters


def test_a_fragmented_queue_places_a_producer_beside_its_consumer(start_node, clients):
    node = start_node({"node": {"workers": WORKERS}, "admin": ADMIN, "rules": [FRAGMENTED]})
    consumer = clients("proton", "receive", node.url, address="work.jobs", count=600, credit=50,
                       timeout_ms=60000)
    first = attached(node, 1, 0, "the consumer attached")
    producer = clients("proton", "send", node.url, address="work.jobs", count=600, rate=150,
                       prefix="p")
    both = attached(node, 1, 1, "the producer attached")
    # the supervisor gives the producer to the other worker (the fewest connections);
    # it lacks a consumer there, so it is handed to the consumer's worker
    assert {c["worker"] for c in both} == {first[0]["worker"]}, both
    (sent,) = [line for line in producer.finish(timeout=60) if "sent" in line]
    assert sent["error"] is None and sent["accepted"] == 600, sent
    assert received_ids(consumer) == [f"p-{n}" for n in range(600)]
    fragments = {f["local"]: f for f in admin(node, "/api/v1/fragments")["fragments"]}
    here = fragments[f"n1/w{first[0]['worker']}"]
    assert here["enqueued"] == 600  # enqueued beside its consumer: nothing stolen


def test_the_per_user_limit_counts_a_handed_over_connection_once(start_node, clients, tmp_path):
    users = tmp_path / "users.json"
    subprocess.run([sys.executable, "-m", "proxy", "users", "add", "bob", "--file", str(users),
                    "--password-stdin", "--groups", "ops"], input=b"bob pw\n", check=True, cwd=ROOT,
                   capture_output=True)
    queue = owned_by("n1", 1, "limited")
    node = start_node({
        "node": {"workers": WORKERS}, "admin": ADMIN,
        "sasl": {"mechanisms": ["PLAIN"], "users_file": str(users), "allow_plain_without_tls": True},
        "limits": {"max_connections_per_user": 2},
        "acl": [{"group": "ops", "send": [queue], "receive": [queue]}],  # groups travel along
    })
    login = {"username": "bob", "password": "bob pw"}
    held = [clients("proton", "receive", node.url, address=queue, count=1, credit=1,
                    timeout_ms=60000, **login) for _ in range(2)]
    both = attached(node, 2, 0, "two connections of bob")
    assert [c["worker"] for c in both] == [1, 1], both  # handed to the queue's owner
    refused = clients("proton", "send", node.url, address=queue, count=1, **login).finish(timeout=30)
    assert "resource-limit-exceeded" in str(refused), refused  # a third, wherever it landed
    # bob's connections end: his count goes back down where they were served
    for consumer in held:
        consumer.kill()
    wait_for(lambda: not connections(node), 20, "bob's connections closed")
    sender_after = clients("proton", "send", node.url, address=queue, count=2, prefix="b",
                           **login).finish(timeout=30)
    (sent,) = [line for line in sender_after if "sent" in line]
    assert sent["error"] is None and sent["accepted"] == 2, sent
