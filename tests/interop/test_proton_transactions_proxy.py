"""python-qpid-proton's own transaction API through a proxy rule (issue #41), as a new user
writes it: to Artemis and to another fedgate node, with a local queue and Artemis directly
as the references in the same tests.

``--eager`` is proton's ``tx_send.py`` shape: a transaction's messages are sent as soon as
it is declared, whether or not the link has credit yet (proton queues them), and committed
at once. On the wire the discharge would overtake transfers still waiting for credit; the
node answers a declare once the connection's senders have their first credit, as a local
queue's do (``proxy.transactions.coordinator``, the declare fence). Checked as a user would:
what was committed is on the primary exactly once, what was aborted never appears, and
messages accepted in a transaction that is aborted come back with their delivery-count raised.
"""

from __future__ import annotations

import collections
import uuid

import brokers
import pytest

from txn_support import TxnClient, receive_plain

TARGETS = ["local", "artemis-direct", "artemis-rule", "fedgate-rule"]


@pytest.fixture(params=TARGETS)
def target(request, start_node):
    """(URL clients use, URL of the queue's home, address)."""
    address = f"ptx-{uuid.uuid4().hex[:8]}"
    if request.param == "local":
        node = start_node()
        return node.url, node.url, address
    if request.param.startswith("artemis"):
        artemis = brokers.ensure_artemis()
        if request.param == "artemis-direct":
            return artemis, artemis, address
        node = start_node({"rules": [{"name": "artemis", "match": "art.*", "kind": "proxy",
                                      "primary": artemis, "remote": "{1}"}]})
        return node.url, artemis, "art." + address
    primary = start_node({"queues": {"auto_create": True}}, name="n2")
    node = start_node({"peers": {"n2": primary.url}, "rules": [
        {"name": "fwd", "match": "fwd.#", "kind": "proxy", "primary": "n2"}]}, name="n1")
    return node.url, primary.url, "fwd." + address


def home_address(target) -> str:
    url, home, address = target
    return address[4:] if address.startswith("art.") else address


def on_home(clients, target) -> collections.Counter:
    """Every message id left on the queue's home (drained), with how often it came."""
    _, home, _ = target
    return collections.Counter(line["id"] for line in receive_plain(clients, home, home_address(target), 0))


def test_eager_sends_then_commit_at_once_deliver_exactly_the_committed_set(target, clients):
    url, _, address = target
    lines = TxnClient("send", url, address=address, count=12, batch=4, eager=True).finish()
    assert lines[-1] == {"done": True, "committed": 3, "aborted": 0, "error": None}, lines
    got = on_home(clients, target)
    assert sorted(got) == sorted(f"t{t}-{i}" for t in (1, 2, 3) for i in range(4))
    assert max(got.values()) == 1  # no duplicates


def test_eager_sends_then_abort_deliver_nothing(target, clients):
    url, _, address = target
    lines = TxnClient("send", url, address=address, count=6, batch=3, eager=True, abort=True).finish()
    assert lines[-1] == {"done": True, "committed": 0, "aborted": 2, "error": None}, lines
    assert on_home(clients, target) == collections.Counter()


def test_transactional_accept_then_abort_brings_the_messages_back(target, clients):
    url, _, address = target
    sent = TxnClient("send", url, address=address, count=4, batch=4, eager=True).finish()
    assert sent[-1]["committed"] == 1
    taken = TxnClient("receive", url, address=address, count=4, abort=True).finish()[-1]
    assert taken["outcome"] == "aborted" and sorted(taken["received"]) == [f"t1-{i}" for i in range(4)]
    again = TxnClient("receive", url, address=address, count=4).finish()[-1]
    assert again["outcome"] == "committed"
    assert sorted(again["received"]) == [f"t1-{i}" for i in range(4)]
    assert all(count >= 1 for count in again["delivery_counts"])  # given back, counted (§3.2.1)
    assert on_home(clients, target) == collections.Counter()  # the commit took them
