"""Qpid JMS (qpid-jms-client, Jakarta JMS) against fedgate nodes: real processes.

The client is ``tests/jms`` (built by ``.ci/install/jms.sh``); each command
prints JSON lines. Covered: a message set on a local queue, a QueueBrowser that
takes nothing, request/reply through a temporary queue (an anonymous JMS
producer replies), also with the service behind a gateway, a selector on a local queue (a
transacted session commits: ``test_jms_transactions.py``), the
same client through a proxy to Artemis (which applies the selector), and
failover to the gateway named in the open frame's ``failover-server-list``,
time to live, prefetch 0 through the proxy, SCRAM-SHA-256 with an ACL, and
TLS with SCRAM or a client certificate (EXTERNAL); over WebSocket: ``amqpws://``
on a local queue and through a proxy to RabbitMQ, ``amqpwss://`` through a
proxy to RabbitMQ 3.10 and 4.0.
"""

from __future__ import annotations

import collections
import shutil
import subprocess
import time

import brokers
import pytest
from certs import make_certs
from conftest import PYTHON, ROOT, TESTS, ClientProcess, free_port, require
from exchange_support import ADMIN, upstream_members

JMS = TESTS / "jms" / "target"
JAVA = shutil.which("java")


# short-lived client JVMs: the C1 compiler alone and the serial collector start in about half
# the CPU time of the defaults (0.5 s against 0.9 s here), which two cores under load feel
JVM_FLAGS = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")


class JmsProcess(ClientProcess):
    """``fedgate.JmsClient COMMAND ARGS...`` with its stdin open (``send`` may pause)."""

    def __init__(self, *args) -> None:
        require(JAVA is not None, "java")
        require((JMS / "classes" / "fedgate" / "JmsClient.class").is_file(),
                "the Qpid JMS test client (bash .ci/install/jms.sh)")
        self.cmd = [JAVA, *JVM_FLAGS, "-cp", f"{JMS / 'classes'}:{JMS / 'lib'}/*",
                    "fedgate.JmsClient", *map(str, args)]
        self.proc = subprocess.Popen(self.cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, bufsize=0)
        self._pending = b""

    def resume(self) -> None:
        self.proc.stdin.write(b"go\n")
        self.proc.stdin.flush()

    def result(self, timeout: float = 90.0) -> dict:
        """The last line: the command's result, or its error."""
        lines = self.finish(timeout=timeout)
        return lines[-1]


@pytest.fixture
def jms():
    started: list[JmsProcess] = []

    def run(*args) -> JmsProcess:
        process = JmsProcess(*args)
        started.append(process)
        return process

    yield run
    for process in started:
        process.kill()


def duplicates(ids) -> list:
    return [i for i, n in collections.Counter(ids).items() if n > 1]


@pytest.mark.parametrize("transport", ["tcp", "websocket"])
def test_jms_message_set_on_a_local_queue(node, jms, transport):
    # websocket: amqpws:// (Qpid JMS's AMQP over WebSocket, on the same port)
    url = node.url if transport == "tcp" else node.url.replace("amqp://", "amqpws://")
    senders = [jms("send", url, "jms.set", 300, prefix) for prefix in ("a", "b")]
    for sender in senders:
        assert sender.result()["sent"] == 300
    got = jms("receive", url, "jms.set", 0, 2000).result()["ids"]
    assert set(got) == {f"{p}-{i}" for p in ("a", "b") for i in range(300)}
    assert duplicates(got) == []
    # per-producer order holds on one queue
    assert [i for i in got if i.startswith("a-")] == [f"a-{i}" for i in range(300)]


def test_jms_time_to_live_expires_messages_on_a_local_queue(node, jms):
    # JMS setTimeToLive sets the header's ttl (§3.2.1): past it, nothing is delivered
    assert jms("send", node.url, "jms.ttl", 3, "short", 0, 200).result()["sent"] == 3
    assert jms("send", node.url, "jms.ttl", 2, "keep", 0, 600000).result()["sent"] == 2
    time.sleep(0.6)  # the short ttl passes (the condition under test, not a wait for work)
    assert jms("receive", node.url, "jms.ttl", 0, 1500).result()["ids"] == ["keep-0", "keep-1"]


def test_jms_queue_browser_takes_nothing(node, jms):
    assert jms("send", node.url, "jms.browse", 5, "b").result()["sent"] == 5
    assert jms("browse", node.url, "jms.browse").result()["browsed"] == [f"b-{i}" for i in range(5)]
    assert jms("receive", node.url, "jms.browse", 5, 2000).result()["ids"] == \
        [f"b-{i}" for i in range(5)]


def test_jms_request_reply_through_a_temporary_queue(node, jms):
    result = jms("rpc", node.url, "jms.service", 5).result()
    assert result["replies"] == [f"re:q{i}" for i in range(5)]  # each matched to its request
    assert result["reply_to"].startswith("tmp.")


def test_jms_on_a_node_with_workers_is_placed_on_the_queues_owner(start_node, jms):
    """Qpid JMS waits for our open and begin before it attaches: the worker it lands on
    answers them, reads its first attach, and hands it to the queue's owner, whose proton
    reads the same frames again (proxy.amqp.first_attach). Request/reply through a
    temporary queue (a dynamic first attach: served where it landed) works alongside."""
    from proxy.workers.ownership import QueueOwners

    owners = QueueOwners("n1", 2)
    queue = next(f"jms.placed-{i}" for i in range(1000) if owners.owner(f"jms.placed-{i}") == 1)
    node = start_node({"node": {"workers": 2}, "admin": ADMIN})
    senders = [jms("send", node.url, queue, 300, prefix) for prefix in ("a", "b")]
    for sender in senders:
        assert sender.result()["sent"] == 300
    got = jms("receive", node.url, queue, 0, 2000).result()["ids"]
    assert set(got) == {f"{p}-{i}" for p in ("a", "b") for i in range(300)}
    assert duplicates(got) == []
    assert [i for i in got if i.startswith("a-")] == [f"a-{i}" for i in range(300)]
    result = jms("rpc", node.url, "jms.service", 5).result()
    assert result["replies"] == [f"re:q{i}" for i in range(5)]
    from admin_client import admin

    counters = admin(node, "/api/v1/node")["counters"]
    assert counters["connections_handed_over"] >= 2, counters  # the senders landing on worker 0


def test_jms_request_reply_across_a_gateway(start_node, jms):
    # The requester is on gateway a, its service behind a on the primary p. The
    # reply-to is a's temporary queue (tmp.a.N); p routes tmp.a.# back to a, so
    # the responder's reply, sent on p, reaches the requester.
    a_port = free_port()
    a_url = f"amqp://127.0.0.1:{a_port}"
    p = start_node({"peers": {"a": a_url}, "rules": [
        {"name": "replies", "match": "tmp.a.#", "kind": "proxy", "primary": "a"}]}, name="p")
    a = start_node({"node": {"listen": f"127.0.0.1:{a_port}"}, "peers": {"p": p.url}, "rules": [
        {"name": "service", "match": "jms.#", "kind": "proxy", "primary": "p"}]}, name="a")
    result = jms("rpc", a.url, "jms.service", 5, p.url).result()
    assert result["replies"] == [f"re:q{i}" for i in range(5)]
    assert result["reply_to"].startswith("tmp.a.")


def test_jms_selector_selects_on_a_local_queue_and_a_transacted_session_commits(node, jms):
    assert jms("send", node.url, "jms.sel", 2, "r").result()["sent"] == 2
    # selectors in depth, against Artemis as the reference: test_jms_semantics.py
    assert jms("select", node.url, "jms.sel", "id = 'r-1'", 0, 1000).result()["ids"] == ["r-1"]
    # transactions: tests/interop/test_jms_transactions.py
    assert jms("transacted", node.url, "jms.sel").result() == {"committed": 1}
    assert jms("receive", node.url, "jms.sel", 0, 1500).result()["ids"] == ["r-0", None]


def primary_rule(broker: str) -> tuple[str, str, dict]:
    """(URL, remote template, upstream options) of a proxy rule to ``broker``: RabbitMQ 4's
    queues are declared by the rule (address v2 uses existing queues only)."""
    if broker == "rabbitmq":
        return brokers.ensure_rabbitmq(), "/queue/{1}", {}
    if broker == "rabbitmq4":
        return brokers.ensure_rabbitmq4(), "/queues/{1}", {"declare": True}
    return brokers.ensure_artemis(), "{1}", {}


@pytest.mark.parametrize("broker", ["rabbitmq", "rabbitmq4", "artemis"])
def test_jms_message_set_through_the_proxy(start_node, jms, broker):
    # JMS messages (with Qpid JMS's annotations) cross the proxy as bytes, both ways
    url, template, upstream = primary_rule(broker)
    node = start_node({"rules": [{"name": "ext", "match": "ext.*", "kind": "proxy",
                                  "primary": url, "remote": template, "upstream": upstream}]})
    queue = "ext.fg-jms-set-" + node.url.rsplit(":", 1)[1]
    senders = [jms("send", node.url, queue, 150, prefix) for prefix in ("a", "b")]
    for sender in senders:
        assert sender.result()["sent"] == 150
    got = jms("receive", node.url, queue, 300, 5000).result()["ids"]
    assert set(got) == {f"{p}-{i}" for p in ("a", "b") for i in range(150)}
    assert duplicates(got) == []


def test_jms_over_websocket_through_the_proxy_to_rabbitmq(start_node, jms):
    url, template, upstream = primary_rule("rabbitmq")
    node = start_node({"rules": [{"name": "ext", "match": "ext.*", "kind": "proxy",
                                  "primary": url, "remote": template, "upstream": upstream}]})
    ws = node.url.replace("amqp://", "amqpws://")
    queue = "ext.fg-jms-ws-" + node.url.rsplit(":", 1)[1]
    assert jms("send", ws, queue, 200, "w").result()["sent"] == 200
    got = jms("receive", ws, queue, 200, 5000).result()["ids"]
    assert got == [f"w-{i}" for i in range(200)]  # all, once, in order


def java_truststore(path, ca) -> str:
    """A PKCS12 trust store (password "secret") holding ``ca``; Qpid JMS URL options for it."""
    subprocess.run(["keytool", "-importcert", "-noprompt", "-alias", "ca", "-file", str(ca),
                    "-keystore", str(path), "-storetype", "PKCS12", "-storepass", "secret"],
                   check=True, capture_output=True, timeout=60)
    return (f"transport.trustStoreLocation={path}&transport.trustStorePassword=secret"
            "&transport.trustStoreType=PKCS12")


@pytest.mark.parametrize("broker", ["rabbitmq", "rabbitmq4"])
def test_jms_over_secure_websocket_through_the_proxy_to_rabbitmq(start_node, jms, certs, tmp_path,
                                                                 broker):
    # amqpwss://: Qpid JMS's AMQP over WebSocket inside TLS (JSSE) on the node's TLS
    # listener, a proxy rule on to RabbitMQ; two producers' sets, every id once
    require(shutil.which("keytool") is not None, "keytool")
    url, template, upstream = primary_rule(broker)
    node = start_node({
        "tls": {"cert": str(certs.server_cert), "key": str(certs.server_key)},
        "rules": [{"name": "ext", "match": "ext.*", "kind": "proxy", "primary": url,
                   "remote": template, "upstream": upstream}]})
    wss = (f"amqpwss://127.0.0.1:{node.port}?"
           + java_truststore(tmp_path / "trust.p12", certs.ca))
    queue = f"ext.fg-jms-wss-{broker}-{node.port}"
    senders = [jms("send", wss, queue, 200, prefix) for prefix in ("a", "b")]
    for sender in senders:
        assert sender.result()["sent"] == 200
    got = jms("receive", wss, queue, 400, 5000).result()["ids"]
    assert set(got) == {f"{p}-{i}" for p in ("a", "b") for i in range(200)}
    assert duplicates(got) == []
    for prefix in ("a", "b"):  # each producer's order holds on one queue
        assert [i for i in got if i.startswith(f"{prefix}-")] == [f"{prefix}-{i}" for i in range(200)]


@pytest.mark.parametrize("broker", ["rabbitmq", "rabbitmq4", "artemis"])
def test_jms_prefetch_zero_through_the_proxy(start_node, jms, broker):
    # With prefetch 0 each receive grants one credit and drains it. RabbitMQ 3.10
    # fails such a drain (amqp:internal-error: the same client directly gets that
    # error), which would end the proxy's shared session for every client on it:
    # the node never sends it a drain and answers the client's itself.
    url, template, upstream = primary_rule(broker)
    node = start_node({"admin": ADMIN, "rules": [
        {"name": "ext", "match": "ext.*", "kind": "proxy", "primary": url, "remote": template,
         "upstream": upstream}]})
    queue = "ext.fg-jms-pull-" + node.url.rsplit(":", 1)[1]
    assert jms("send", node.url, queue, 5, "z").result()["sent"] == 5
    pulled = jms("receive", node.url + "?jms.prefetchPolicy.all=0", queue, 0, 1000).result()
    assert pulled["ids"] == [f"z-{i}" for i in range(5)]
    members = upstream_members(node)
    assert members and all(m["sessions_ended"] == 0 and m["reconnects"] == 0 for m in members)


def test_jms_through_the_proxy_to_artemis_browses_and_selects(start_node, jms):
    url = brokers.ensure_artemis()
    node = start_node({"rules": [{"name": "art", "match": "art.*", "kind": "proxy",
                                  "primary": url, "remote": "{1}"}]})
    queue = "art.fg-jms-" + node.url.rsplit(":", 1)[1]
    assert jms("send", node.url, queue, 6, "p").result()["sent"] == 6
    assert jms("browse", node.url, queue).result()["browsed"] == [f"p-{i}" for i in range(6)]
    selected = jms("select", node.url, queue, "id = 'p-1' OR id = 'p-4'", 2, 5000).result()
    assert selected["ids"] == ["p-1", "p-4"]
    assert jms("receive", node.url, queue, 0, 2000).result()["ids"] == ["p-0", "p-2", "p-3", "p-5"]


def failover_pair(start_node):
    """Gateways a and b proxy jms.* to one primary and name each other in [peers]."""
    primary = start_node(name="primary")
    rule = {"name": "jms", "match": "jms.#", "kind": "proxy", "primary": primary.url}
    ports = {"a": free_port(), "b": free_port()}
    urls = {k: f"amqp://127.0.0.1:{p}" for k, p in ports.items()}
    gateways = {
        name: start_node({"node": {"listen": f"127.0.0.1:{ports[name]}"},
                          "peers": {other: urls[other]}, "rules": [rule]}, name=name)
        for name, other in (("a", "b"), ("b", "a"))
    }
    failover = (f"failover:({urls['a']})?failover.initialReconnectDelay=100"
                "&failover.reconnectDelay=200&failover.maxReconnectAttempts=50")
    return primary, gateways, urls, failover


def run_until_paused(process) -> list:
    lines = [process.readline(timeout=60)]
    while "paused" not in lines[-1]:
        lines.append(process.readline(timeout=60))
    return lines


def test_jms_consumer_fails_over_and_every_message_arrives(start_node, jms):
    # A consumer on gateway a has taken 50 of 200 messages (more are prefetched,
    # unacknowledged) when a is killed: what a held goes back to the primary, the
    # client reconnects to b by itself and gets the rest. Each id at least once.
    primary, gateways, urls, failover = failover_pair(start_node)
    assert jms("send", primary.url, "jms.work", 200, "w").result()["sent"] == 200
    consumer = jms("receive", failover, "jms.work", 0, 3000, 50)
    assert run_until_paused(consumer)[-1]["paused"] == 50
    gateways["a"].kill()
    consumer.resume()
    lines = consumer.finish(timeout=90)
    assert "error" not in lines[-1], lines
    assert [line["uri"].split("?")[0] for line in lines if line.get("event") == "restored"] == \
        [urls["b"]]
    got = lines[-1]["ids"]
    assert set(got) == {f"w-{i}" for i in range(200)}
    # Duplicates: the primary redelivers what a had not settled upstream when it
    # died, the 150 the client had prefetched and at most one whose acknowledgement
    # was still on its way; Qpid JMS also hands the application the prefetched
    # copies it received from a (measured: 150 or 151 duplicates of 350-351)
    assert len(got) - len(set(got)) <= 151


def test_jms_fails_over_to_the_gateway_named_in_the_open_frame(start_node, jms):
    # Gateways a and b proxy jms.* to the same primary and name each other in
    # [peers], so each one's open frame carries the other in failover-server-list.
    # The client is given only a; a is killed between two sends; the client must
    # reconnect to b by itself and every message must reach the primary.
    primary, gateways, urls, failover = failover_pair(start_node)
    sender = jms("send", failover, "jms.orders", 200, "f", 100)
    lines = run_until_paused(sender)
    assert lines[-1]["paused"] == 100
    gateways["a"].kill()
    sender.resume()
    lines += sender.finish(timeout=90)
    assert "error" not in lines[-1], lines
    # (the client adds the map's "hostname" to the URI as amqp.vhost)
    assert lines[-1]["sent"] == 200 and lines[-1]["uri"].split("?")[0] == urls["b"]
    restored = [line["uri"].split("?")[0] for line in lines if line.get("event") == "restored"]
    assert restored == [urls["b"]]
    got = jms("receive", primary.url, "jms.orders", 0, 2000).result()["ids"]
    assert set(got) == {f"f-{i}" for i in range(200)}
    assert duplicates(got) == []  # the kill fell between two acknowledged sends


def test_jms_authenticates_with_scram_and_meets_the_acl(tmp_path, start_node, jms):
    # Qpid JMS's own SCRAM-SHA-256 against the node's SASL layer (PLAIN is not
    # offered without TLS); the user's [[acl]] entry then decides per address
    users = tmp_path / "users.json"
    subprocess.run([PYTHON, "-m", "proxy", "users", "add", "alice", "--file", str(users),
                    "--password-stdin"], input=b"alice pw\n", check=True, cwd=ROOT,
                   capture_output=True)
    node = start_node({"sasl": {"mechanisms": ["PLAIN", "SCRAM-SHA-256"], "users_file": str(users),
                                "require": True},
                       "acl": [{"user": "alice", "send": ["orders.#"], "receive": ["orders.#"]}]})
    alice = node.url + "?jms.username=alice&jms.password=alice%20pw"
    assert jms("send", alice, "orders.jms", 3, "s").result()["sent"] == 3
    assert jms("receive", alice, "orders.jms", 3, 2000).result()["ids"] == ["s-0", "s-1", "s-2"]
    denied = jms("send", alice, "payroll.jms", 1, "x").result()
    assert "amqp:unauthorized-access" in denied["error"]
    wrong = jms("send", node.url + "?jms.username=alice&jms.password=nope", "orders.jms", 1,
                "x").result()
    assert wrong["type"].endswith("JMSSecuritySaslException")
    assert "SCRAM-SHA-256" in wrong["error"]  # the mechanism the client chose, and failed
    anonymous = jms("send", node.url, "orders.jms", 1, "x").result()  # SASL required
    assert anonymous["type"].endswith("JMSSecuritySaslException")
    assert "Server offered: [SCRAM-SHA-256]" in anonymous["error"]  # no PLAIN without TLS


@pytest.mark.parametrize("scheme", ["amqps", "amqpwss"])
def test_jms_over_tls_with_scram_and_with_a_client_certificate(tmp_path, start_node, jms, scheme):
    # the DMZ listener (TLS from Python's ssl, client certificates verified) with
    # Qpid JMS's TLS (JSSE): SCRAM-SHA-256 over TLS, then EXTERNAL from the
    # certificate (CN=alice); the ACL holds for both
    require(shutil.which("openssl") is not None and shutil.which("keytool") is not None,
            "openssl and keytool")
    certs = make_certs(tmp_path / "certs")
    trust, keys = tmp_path / "trust.p12", tmp_path / "alice.p12"
    subprocess.run(["keytool", "-importcert", "-noprompt", "-alias", "ca", "-file", str(certs.ca),
                    "-keystore", str(trust), "-storetype", "PKCS12", "-storepass", "secret"],
                   check=True, capture_output=True, timeout=60)
    subprocess.run(["openssl", "pkcs12", "-export", "-in", str(certs.client_cert), "-inkey",
                    str(certs.client_key), "-out", str(keys), "-passout", "pass:secret",
                    "-name", "alice"], check=True, capture_output=True, timeout=60)
    users = tmp_path / "users.json"
    subprocess.run([PYTHON, "-m", "proxy", "users", "add", "alice", "--file", str(users),
                    "--password-stdin"], input=b"alice pw\n", check=True, cwd=ROOT,
                   capture_output=True)
    node = start_node({
        "tls": {"cert": str(certs.server_cert), "key": str(certs.server_key), "ca": str(certs.ca),
                "verify_client": True},
        "sasl": {"mechanisms": ["PLAIN", "SCRAM-SHA-256", "EXTERNAL"], "users_file": str(users),
                 "require": True},
        "acl": [{"user": "alice", "send": ["orders.#"], "receive": ["orders.#"]}]})
    # amqpwss: the same over WebSocket inside TLS, the certificate's CN still the identity
    tls = (f"{scheme}://127.0.0.1:{node.port}?transport.trustStoreLocation={trust}"
           f"&transport.trustStorePassword=secret&transport.trustStoreType=PKCS12"
           f"&transport.keyStoreLocation={keys}&transport.keyStorePassword=secret"
           f"&transport.keyStoreType=PKCS12")
    scram = tls + "&jms.username=alice&jms.password=alice%20pw&amqp.saslMechanisms=SCRAM-SHA-256"
    external = tls + "&amqp.saslMechanisms=EXTERNAL"
    assert jms("send", scram, "orders.tls", 2, "s").result()["sent"] == 2
    assert jms("send", external, "orders.tls", 2, "e").result()["sent"] == 2
    assert jms("receive", external, "orders.tls", 4, 2000).result()["ids"] == \
        ["s-0", "s-1", "e-0", "e-1"]
    assert "amqp:unauthorized-access" in jms("send", external, "payroll.tls", 1, "x").result()["error"]
