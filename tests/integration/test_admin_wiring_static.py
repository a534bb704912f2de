"""Run-time wiring in a static cluster: a node that missed a push pulls the record
(issue #46, admin_api/wiring_sync.py).

Two live nodes whose ``[admin] cluster`` names each other. n2 is stopped, two changes are
made through n1 (their push to n2 fails), n2 starts again: within 3 s it has n1's record
(version, exchange, binding) and routes by it (every message sent on n2 in the bound
queue). Then n1 is stopped, a change is made through n2, n1 starts again and has it: the
greater ``(version, updated_at, origin)`` wins both ways.
"""

from __future__ import annotations

import time

import pytest
from admin_client import READ_TOKEN, wait_for
from proton import Message
from test_admin_queue_ops import TOKENS, receive_all, send
from test_admin_wiring import api, static_pair

pytestmark = pytest.mark.timeout(120)


def declared_version(node) -> int:
    status, listing = api(node, "GET", "/api/v1/bindings", token=READ_TOKEN)
    return listing["version"] if status == 200 else -1


def test_a_node_that_was_down_pulls_the_record_as_it_starts(start_node):
    n1, n2 = static_pair(start_node)
    assert api(n1, "POST", "/api/v1/exchanges", {"name": "bus", "type": "fanout"})[0] == 201
    wait_for(lambda: declared_version(n2) == 1, timeout=3.0, what="n2 to have version 1")

    n2.stop()
    assert api(n1, "POST", "/api/v1/bindings", {"exchange": "bus", "queue": "copy"})[0] == 201
    status, body = api(n1, "PUT", "/api/v1/queues/copy", {"max_depth": 50})
    assert status == 201 and body["version"] == 3
    n2.start()
    started = time.monotonic()
    wait_for(lambda: declared_version(n2) == 3, timeout=3.0, interval=0.05,
             what="n2 to pull version 3")
    print(f"n2 had version 3 {time.monotonic() - started:.2f} s after its admin API answered")
    status, queue = api(n2, "GET", "/api/v1/queues/copy", token=READ_TOKEN)
    assert status == 200 and queue["declared"]["max_depth"] == 50
    send(n2.url, "bus", [Message(id=i, body="b") for i in range(4)])
    assert sorted(m.id for m in receive_all(n2.url, "copy", 4)) == [0, 1, 2, 3]

    # the other way: a change made on n2 while n1 is down reaches n1 as it starts
    n1.stop()
    status, body = api(n2, "PUT", "/api/v1/exchanges/news", {"type": "topic"})
    assert status == 201 and body["version"] == 4
    n1.start()
    wait_for(lambda: declared_version(n1) == 4, timeout=3.0, what="n1 to pull version 4")
    status, news = api(n1, "GET", "/api/v1/exchanges/news", token=READ_TOKEN)
    assert status == 200 and news["exchange"]["type"] == "topic"
    assert api(n1, "GET", "/api/v1/cluster/wiring", token=READ_TOKEN)[1]["origin"] == "n2"


def test_a_remote_source_bound_at_run_time_feeds_its_queue_until_unbound(start_node):
    """n2 binds its queue ``copy`` to n1's queue ``src`` through the API: every message sent
    to n1's ``src`` reaches n2's ``copy``; after the binding is deleted, n1 keeps what is
    sent to ``src`` (nothing more reaches ``copy``)."""
    n1 = start_node({"admin": {"tokens": TOKENS}}, "n1")
    n2 = start_node({"admin": {"tokens": TOKENS}}, "n2")
    source = {"primary": n1.url, "address": "src", "window": 10}
    status, bad = api(n2, "POST", "/api/v1/bindings",
                      {"queue": "copy", "source": {"primary": "nowhere", "address": "src"}})
    assert status == 422 and bad["field"] == "bindings[0].source.primary"
    status, bound = api(n2, "POST", "/api/v1/bindings", {"queue": "copy", "source": source})
    assert status == 201 and bound["binding"]["source"] == source, bound
    status, again = api(n2, "POST", "/api/v1/bindings", {"queue": "copy", "source": source})
    assert status == 409 and again["id"] == bound["binding"]["id"]

    def attached() -> bool:
        sources = api(n2, "GET", "/api/v1/exchanges", token=READ_TOKEN)[1]["sources"]
        return [(s["queue"], s["source"], s["attached"]) for s in sources] == [("copy", "src", True)]
    wait_for(attached, timeout=5.0, what="n2's source to attach to n1")
    send(n1.url, "src", [Message(id=i, body="s") for i in range(20)])
    assert sorted(m.id for m in receive_all(n2.url, "copy", 20)) == list(range(20))

    status, body = api(n2, "DELETE", f"/api/v1/bindings/{bound['binding']['id']}")
    assert status == 200 and body["version"] == 2
    wait_for(lambda: api(n2, "GET", "/api/v1/exchanges", token=READ_TOKEN)[1]["sources"] == [],
             timeout=3.0, what="n2's source to close")
    wait_for(lambda: api(n1, "GET", "/api/v1/queues/src", token=READ_TOKEN)[1]["consumers"] == 0,
             timeout=3.0, what="n2's receiver on n1 to detach")
    send(n1.url, "src", [Message(id=100 + i, body="kept") for i in range(5)])
    assert receive_all(n2.url, "copy", 0) == []
    assert sorted(m.id for m in receive_all(n1.url, "src", 5)) == [100, 101, 102, 103, 104]
