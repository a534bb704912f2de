"""The anonymous relay (ANONYMOUS-RELAY): one sender link, each message to its ``to``.

Real node processes: a relay node with local queues, an exchange, a deny rule
and a proxy rule to a primary node.
"""

from __future__ import annotations

import pytest
from exchange_support import ADMIN, admin_get, receive_ids, send_subjects
from proton import symbol
from proton.utils import BlockingConnection


@pytest.fixture
def relay(start_node):
    primary = start_node(name="p")
    node = start_node({
        "admin": ADMIN,
        "peers": {"p": primary.url},
        "queue": [{"name": "small", "max_depth": 2}],
        "exchanges": [{"name": "events", "type": "fanout"}],
        "bindings": [{"exchange": "events", "queue": "ev1"}, {"exchange": "events", "queue": "ev2"}],
        "rules": [{"name": "remote", "match": "remote.#", "kind": "proxy", "primary": "p"},
                  {"name": "secret", "match": "secret.#", "kind": "deny"}],
    }, name="r")
    return node, primary


def test_the_node_offers_the_anonymous_relay(relay):
    node, _ = relay
    conn = BlockingConnection(node.url, timeout=10)
    try:
        assert symbol("ANONYMOUS-RELAY") in (conn.conn.remote_offered_capabilities or [])
    finally:
        conn.close()


def test_each_message_goes_to_its_to_and_settles_with_that_outcome(relay):
    node, primary = relay
    items = [(f"l{i}", None, "local.q") for i in range(20)] + \
            [(f"r{i}", None, "remote.q") for i in range(20)] + \
            [(f"e{i}", None, "events") for i in range(20)] + \
            [("denied", None, "secret.x"), ("nowhere", None, None)]
    items = items[::3] + items[1::3] + items[2::3]  # interleaved destinations
    outcomes = send_subjects(node.url, None, items)
    assert "error" not in outcomes and len(outcomes) == len(items)
    assert outcomes.pop("denied") == ("rejected", "amqp:unauthorized-access")
    assert outcomes.pop("nowhere") == ("rejected", "amqp:not-found")
    assert set(outcomes.values()) == {("accepted", None)}
    assert sorted(receive_ids(node.url, "local.q")) == sorted(f"l{i}" for i in range(20))
    assert sorted(receive_ids(primary.url, "remote.q")) == sorted(f"r{i}" for i in range(20))
    for queue in ("ev1", "ev2"):
        assert sorted(receive_ids(node.url, queue)) == sorted(f"e{i}" for i in range(20))
    counters = admin_get(node, "/api/v1/exchanges")["anonymous_relay"]
    assert (counters["received"], counters["accepted"], counters["rejected"]) == (62, 60, 2)


def test_a_full_queue_releases_and_the_link_goes_on(relay):
    node, _ = relay
    outcomes = send_subjects(node.url, None, [("s0", None, "small"), ("s1", None, "small"),
                                              ("s2", None, "small"), ("other", None, "local.o")])
    assert [outcomes[i][0] for i in ("s0", "s1", "s2", "other")] == \
        ["accepted", "accepted", "released", "accepted"]
    assert receive_ids(node.url, "small") == ["s0", "s1"]
    assert receive_ids(node.url, "local.o") == ["other"]


def test_new_upstream_destinations_are_capped(start_node):
    # each distinct proxied 'to' costs a link on the primary: a client cannot open them without end
    primary = start_node(name="p")
    node = start_node({"peers": {"p": primary.url}, "limits": {"max_relay_destinations": 2},
                       "rules": [{"name": "remote", "match": "remote.#", "kind": "proxy",
                                  "primary": "p"}]}, name="r")
    outcomes = send_subjects(node.url, None, [("a", None, "remote.a"), ("b", None, "remote.b"),
                                              ("c", None, "remote.c"), ("a2", None, "remote.a"),
                                              ("l", None, "local.l")])
    assert outcomes["c"] == ("rejected", "amqp:resource-limit-exceeded")
    assert {k: v[0] for k, v in outcomes.items() if k != "c"} == \
        {"a": "accepted", "b": "accepted", "a2": "accepted", "l": "accepted"}
    assert receive_ids(primary.url, "remote.a") == ["a", "a2"]
    assert receive_ids(primary.url, "remote.c", quiet=0.5) == []
