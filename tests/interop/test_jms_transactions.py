"""Qpid JMS transacted sessions against fedgate: on a local queue, and through a proxy rule to
Artemis (one upstream transaction per JMS transaction).

Checked as a JMS user would: what was committed is received once, what was
rolled back is not (a send) or comes again with ``JMSRedelivered`` (a
receive); several producers and consumers in transactions at once keep the
message set; a transaction that would span two primaries fails its commit
with the reason, and a primary without transactions (RabbitMQ) is named.
The client is ``tests/jms`` (``txsend``, ``txreceive``).
"""

from __future__ import annotations

import collections

import brokers
import pytest
from test_jms import JmsProcess, jms  # noqa: F401  (the fixture)

from txn_support import TxnClient


def artemis_rule(match: str = "art.#") -> dict:
    return {"name": "artemis", "match": match, "kind": "proxy", "primary": brokers.ensure_artemis(),
            "remote": "{1}"}


@pytest.fixture(params=["local", "artemis"])
def target(request, start_node):
    """(node URL, address prefix): a node's local queue, or a queue on Artemis by a rule."""
    if request.param == "local":
        return start_node().url, "jtx"
    node = start_node({"rules": [artemis_rule("art.*")]})
    return node.url, "art.jtx"


def unique(name: str) -> str:
    import uuid

    return f"{name}-{uuid.uuid4().hex[:8]}"


def test_jms_commit_then_rollback_and_redelivery(target, jms):  # noqa: F811
    url, prefix = target
    address = unique(prefix)
    sent = jms("txsend", url, address, 12, "a", 4, 3).result()
    # batches of 4: the first two committed, the third rolled back
    assert sent["committed"] == [f"a-{i}" for i in range(8)]
    assert sent["rolled_back"] == [f"a-{i}" for i in range(8, 12)]
    got = jms("txreceive", url, address, 2000, 4, 2).result()
    batches = got["batches"]
    assert batches[0]["outcome"] == "rollback" and batches[0]["redelivered"] == [False] * 4
    # what was rolled back comes again, marked redelivered (Qpid JMS releases what it had
    # prefetched after the discharge: on a local queue those come back ahead of it)
    again = {i: r for b in batches[1:] if b["outcome"] == "commit"
             for i, r in zip(b["ids"], b["redelivered"])}
    assert all(again[i] is True for i in batches[0]["ids"])
    assert sorted(got["committed"]) == sorted(sent["committed"])
    assert len(got["committed"]) == len(set(got["committed"]))


def test_jms_many_producers_and_consumers_in_transactions_keep_the_message_set(target, jms):  # noqa: F811
    url, prefix = target
    address = unique(prefix)
    producers = [jms("txsend", url, address, 120, p, 10, 3) for p in "abcd"]
    consumers = [jms("txreceive", url, address, 4000, 7, 4) for _ in range(3)]
    sent = [p.result(timeout=180) for p in producers]
    got = [c.result(timeout=180) for c in consumers]
    committed_sent = [i for s in sent for i in s["committed"]]
    rolled_back = {i for s in sent for i in s["rolled_back"]}
    assert len(committed_sent) == 4 * 80 and len(rolled_back) == 4 * 40
    taken = [i for g in got for i in g["committed"]]
    leftover = jms("receive", url, address, 0, 2000).result()["ids"]
    duplicates = [i for i, n in collections.Counter(taken + leftover).items() if n > 1]
    assert duplicates == []
    assert set(taken + leftover) == set(committed_sent)  # nothing rolled back ever delivered
    assert any(b["outcome"] == "rollback" for g in got for b in g["batches"])


def test_jms_transaction_spanning_two_primaries_fails_with_the_reason(start_node, jms):  # noqa: F811
    other = start_node(name="other")
    node = start_node({"rules": [artemis_rule("art.*"), {
        "name": "fg", "match": "fg.*", "kind": "proxy", "primary": other.url, "remote": "{1}"}]})
    error = jms("txsend", node.url, "art.span,fg.span", 2, "s", 2).result()
    assert "spans primary" in error["error"] and "127.0.0.1" in error["error"]
    assert jms("receive", other.url, "span", 0, 1000).result()["ids"] == []


def test_a_primary_without_transactions_is_named(start_node):
    url = brokers.ensure_rabbitmq()
    node = start_node({"rules": [{"name": "rabbit", "match": "rb.*", "kind": "proxy",
                                  "primary": url, "remote": "/queue/{1}"}]})
    line = TxnClient("send", node.url, address="rb.txn", count=1).finish()[-1]
    assert "RabbitMQ" in line["error"] and "has no AMQP transactions" in line["error"]
