"""go-amqp (Azure's Go AMQP 1.0 client, no proton inside) against fedgate.

The client (``tests/clients/goamqp``, built by ``make test``) waits for the
node's protocol header before it sends anything (§2.2), speaks its own SASL,
and settles with each outcome. It talks to fedgate exactly as it would to
RabbitMQ or Artemis. Every message set is numbered: every id sent must be
received, duplicates are counted.
"""

from __future__ import annotations

import collections
import uuid

import brokers
import pytest
from conftest import PYTHON, ROOT
from fragment_cluster import start_cluster
from proton.utils import BlockingConnection

COUNT = 1000


def ids_of(lines):
    return [line["id"] for line in lines if "id" in line]


def duplicates(ids):
    return sorted(i for i, c in collections.Counter(ids).items() if c > 1)


def message_set(clients, send_url, send_address, receive_url=None, receive_address=None, *,
                count=COUNT, prefix="go", send_options=None, receive_options=None):
    """Send ``count`` numbered messages with go-amqp, receive them with go-amqp; check the set."""
    receive_url = receive_url or send_url
    receive_address = receive_address or send_address
    (sent,) = clients("go", "send", send_url, address=send_address, count=count, prefix=prefix,
                      timeout_ms=60000, **(send_options or {})).finish(timeout=90)
    assert sent["error"] is None and sent["sent"] == count, sent
    if not (send_options or {}).get("presettled"):
        assert sent["accepted"] == count, sent
    lines = clients("go", "receive", receive_url, address=receive_address, count=count,
                    timeout_ms=60000, **(receive_options or {})).finish(timeout=90)
    assert lines[-1]["error"] is None, lines[-1]
    got = ids_of(lines)
    assert set(got) == {f"{prefix}-{n}" for n in range(count)}
    assert duplicates(got) == []
    return lines


# -- a local queue -----------------------------------------------------------------

@pytest.mark.parametrize("send_options, receive_options", [
    ({}, {"credit": 100}),                       # at-least-once
    ({"presettled": True}, {"credit": 100}),     # at-most-once
    ({}, {"credit": 1}),                         # a receiver with credit 1
], ids=["at-least-once", "at-most-once", "credit-1"])
def test_message_set_through_a_local_queue(node, clients, send_options, receive_options):
    lines = message_set(clients, node.url, "go.local", send_options=send_options,
                        receive_options=receive_options)
    seqs = [line["seq"] for line in lines if "id" in line]
    assert seqs == sorted(seqs)  # one producer, one consumer: its order holds


@pytest.fixture
def outcome_node(start_node):
    return start_node({"queue": [{"name": "go.outcomes", "dead_letter": "go.dead"}]})


def drain(url: str, address: str, limit: int = 100) -> list:
    """Everything on a queue (proton, independent of the client under test)."""
    conn = BlockingConnection(url, timeout=10)
    try:
        receiver = conn.create_receiver(address, credit=limit)
        messages = []
        while True:
            try:
                message = receiver.receive(timeout=1.0)
            except Exception:  # proton.Timeout: the queue is empty
                break
            messages.append(message)
            receiver.accept()
        return messages
    finally:
        conn.close()


@pytest.mark.parametrize("outcome, stays, delivery_count, dead", [
    ("accept", False, None, False),
    ("release", True, 0, False),                # back, delivery-count unchanged (§3.4.4)
    ("modify-failed", True, 1, False),          # back, delivery-count + 1 (§3.4.5)
    ("modify-undeliverable", True, 1, False),   # back for others, never to that link again
    ("reject", False, None, True),              # to the dead-letter queue (§3.4.3)
])
def test_each_outcome_is_applied_on_the_queue(outcome_node, clients, outcome, stays,
                                              delivery_count, dead):
    count = 20
    (sent,) = clients("go", "send", outcome_node.url, address="go.outcomes", count=count,
                      prefix="o").finish()
    assert sent["accepted"] == count
    # credit = count: each message is delivered once before any comes back
    lines = clients("go", "receive", outcome_node.url, address="go.outcomes", count=count,
                    credit=count, outcome=outcome).finish()
    assert lines[-1]["error"] is None and sorted(ids_of(lines)) == sorted(f"o-{n}" for n in range(count))
    left = drain(outcome_node.url, "go.outcomes")
    dead_letters = drain(outcome_node.url, "go.dead")
    expected = {f"o-{n}" for n in range(count)}
    assert {m.id for m in left} == (expected if stays else set())
    assert {m.id for m in dead_letters} == (expected if dead else set())
    if stays:
        assert {m.delivery_count for m in left} == {delivery_count}


# -- SASL and TLS ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def secured_nodes(tmp_path_factory, certs):
    """A plain-TCP and a TLS node, both offering ANONYMOUS and PLAIN (alice)."""
    import subprocess

    from conftest import NodeProcess

    workdir = tmp_path_factory.mktemp("go-secured")
    users = workdir / "users.json"
    subprocess.run([PYTHON, "-m", "proxy", "users", "add", "alice", "--file", str(users),
                    "--password-stdin"], input=b"correct horse\n", check=True, cwd=ROOT,
                   capture_output=True, timeout=30)
    sasl = {"mechanisms": ["ANONYMOUS", "PLAIN"], "users_file": str(users)}
    tcp = NodeProcess(workdir, {"sasl": {**sasl, "allow_plain_without_tls": True}}, "tcp").start()
    tls = NodeProcess(workdir, {"sasl": sasl, "tls": {"cert": str(certs.server_cert),
                                                      "key": str(certs.server_key)}}, "tls").start()
    yield {"tcp": tcp, "tls": tls}
    tcp.stop()
    tls.stop()


@pytest.mark.parametrize("listener, sasl", [
    ("tcp", "anonymous"), ("tcp", "plain"), ("tcp", "none"),
    ("tls", "none"), ("tls", "anonymous"), ("tls", "plain"),
])
def test_message_set_over_each_sasl_and_tls_layer(secured_nodes, certs, clients, listener, sasl):
    node = secured_nodes[listener]
    url = node.url if listener == "tcp" else node.url.replace("amqp://", "amqps://").replace(
        "127.0.0.1", "localhost")
    options = {"sasl": sasl}
    if sasl == "plain":
        options.update(username="alice", password="correct horse")
    if listener == "tls":
        options["ca"] = str(certs.ca)
    message_set(clients, url, f"go.{listener}.{sasl}", count=200, send_options=options,
                receive_options=options)


def test_wrong_password_is_refused_by_name(secured_nodes, clients):
    (result,) = clients("go", "send", secured_nodes["tcp"].url, address="go.denied", count=1,
                        sasl="plain", username="alice", password="wrong").finish()
    assert result["sent"] == 0
    assert result["error"] is not None and "auth" in result["error"]["description"].lower()


# -- a fragmented queue ------------------------------------------------------------

def test_message_set_through_a_fragmented_queue_across_nodes(start_node, clients):
    """Sent on n1's fragment, received on n2: n2 steals from its empty fragment's peer."""
    nodes = start_cluster(start_node, ("n1", "n2"))
    message_set(clients, nodes["n1"].url, "work.go", nodes["n2"].url, "work.go",
                receive_options={"credit": 50})


# -- proxy rules to third-party brokers and to another fedgate node ------------------

def primary_of(name: str, start_node):
    """(primary URL, remote address template, upstream options) for a proxy rule."""
    if name == "rabbitmq":
        return brokers.ensure_rabbitmq(), "/queue/{1}", {}
    if name == "rabbitmq4":  # address v2: the rule declares the queue
        return brokers.ensure_rabbitmq4(), "/queues/{1}", {"declare": True}
    if name == "artemis":
        return brokers.ensure_artemis(), "{1}", {}
    return start_node(name="primary").url, "{1}", {}


@pytest.mark.parametrize("primary", ["rabbitmq", "rabbitmq4", "artemis", "fedgate"])
def test_message_set_through_a_proxy_rule(start_node, clients, primary):
    url, remote, upstream = primary_of(primary, start_node)
    proxy = start_node({"rules": [{"name": "ext", "match": "ext.*", "kind": "proxy",
                                   "primary": url, "remote": remote,
                                   "upstream": {"heartbeat": 2.0, **upstream}}]}, name="proxy")
    queue = f"fg-go-{uuid.uuid4().hex[:8]}"
    message_set(clients, proxy.url, f"ext.{queue}", receive_options={"credit": 100})
    message_set(clients, proxy.url, f"ext.{queue}", prefix="go1", count=50,
                receive_options={"credit": 1})
