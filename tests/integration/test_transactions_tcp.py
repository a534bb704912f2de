"""Transactions over TCP with proton-python's own Transaction API (``tests/clients/proton_txn.py``).

A real node process: messages sent in transactions appear when they are
committed and never when aborted; messages accepted in a transaction that is
aborted come back with their delivery-count raised; an open transaction is
visible in the admin API (per connection) and in /metrics, and a client that
dies with one open has it rolled back. (rhea has no transaction API: it is not
covered.)
"""

from __future__ import annotations

import time

from admin_client import ADMIN, admin_get, http, wait_for
from txn_support import TxnClient, receive_plain


def test_proton_transactions_commit_abort_and_accept_then_abort(node, clients):
    committed = TxnClient("send", node.url, address="orders", count=10, batch=3).finish()
    assert committed[-1] == {"done": True, "committed": 4, "aborted": 0, "error": None}
    aborted = TxnClient("send", node.url, address="orders", count=2, abort=True).finish()
    assert aborted[-1]["aborted"] == 1 and aborted[-1]["error"] is None

    taken = TxnClient("receive", node.url, address="orders", count=4, abort=True).finish()[-1]
    assert taken["outcome"] == "aborted"
    assert taken["received"] == ["t1-0", "t1-1", "t1-2", "t2-0"]
    # given back at the abort: first again, delivery-count raised (§3.2.1)
    again = TxnClient("receive", node.url, address="orders", count=10).finish()[-1]
    assert again["outcome"] == "committed"
    assert again["received"] == [f"t{t}-{i}" for t in (1, 2, 3) for i in range(3)] + ["t4-0"]
    assert again["delivery_counts"] == [1, 1, 1, 1] + [0] * 6
    # committed: nothing is left, and nothing of the aborted sends ever appeared
    assert receive_plain(clients, node.url, "orders", 0) == []


def test_open_transactions_in_the_admin_api_and_metrics(start_node):
    node = start_node({"admin": ADMIN})
    holder = TxnClient("send", node.url, address="held", count=5, hold=True)
    assert holder.readline() == {"holding": 1}
    connections = admin_get(node, "/api/v1/connections")["connections"]
    (open_txn,) = [t for c in connections for t in c["transactions"]]
    assert open_txn["messages"] == 5 and open_txn["state"] == "active"
    assert open_txn["home"] == "local" and open_txn["age_s"] >= 0 and open_txn["bytes_held"] > 0
    summary = admin_get(node, "/api/v1/node")["transactions"]
    assert summary["open"] == 1 and summary["messages_held"] == 5
    status, metrics = http("GET", node.admin_url + "/metrics")
    assert status == 200 and "fedgate_transactions_open 1" in metrics
    assert "fedgate_transaction_messages_held 5" in metrics

    holder.kill()  # the connection ends with the transaction open: rolled back
    wait_for(lambda: admin_get(node, "/api/v1/node")["transactions"]["open"] == 0,
             what="rolled back at the connection's end")
    summary = admin_get(node, "/api/v1/node")["transactions"]
    assert summary["rolled_back"] == 1 and summary["committed"] == 0
    queues = {q["name"]: q for q in admin_get(node, "/api/v1/queues")["queues"]}
    assert queues.get("held", {"depth": 0})["depth"] == 0
    status, metrics = http("GET", node.admin_url + "/metrics")
    assert 'fedgate_transactions_total{outcome="rolled_back"} 1' in metrics


def test_a_transaction_timeout_rolls_back_and_ends_the_coordinator_link(start_node):
    node = start_node({"admin": ADMIN, "limits": {"transaction_timeout": 1.0}})
    holder = TxnClient("send", node.url, address="slow", count=2, hold=True)
    assert holder.readline() == {"holding": 1}
    started = time.monotonic()
    error = holder.readline(timeout=10)
    assert "amqp:transaction:timeout" in error["error"] and "transaction_timeout" in error["error"]
    assert time.monotonic() - started < 5
    assert admin_get(node, "/api/v1/node")["transactions"]["timed_out"] == 1
