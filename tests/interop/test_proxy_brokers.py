"""Proxy queues with third-party primaries: RabbitMQ 3.10 and ActiveMQ Artemis.

The brokers are real, installed and started by the project's set-up
(``tests/brokers.py``). Each test uses its own queue names (run id) so runs do
not see each other's messages.
"""

from __future__ import annotations

import collections
import uuid

import brokers
import pytest
from admin_client import ADMIN, upstream_members, wait_for
from blocking_checks import (
    accepted_ids,
    browse,
    check_drain,
    large_bodies,
    receive_messages,
    refusal,
    select,
    send_messages,
)
from proton import Described, Message, symbol, ulong
from proton.reactor import Copy, Filter, Selector

BROKERS = ["rabbitmq", "rabbitmq4", "artemis"]


class Primary:
    def __init__(self, name: str) -> None:
        self.name = name
        self.url = {"rabbitmq": brokers.ensure_rabbitmq, "rabbitmq4": brokers.ensure_rabbitmq4,
                    "artemis": brokers.ensure_artemis}[name]()
        # RabbitMQ 3.10's AMQP 1.0 plugin names queues /queue/NAME, RabbitMQ 4 (address
        # v2) /queues/NAME; Artemis uses the plain name
        self.template = {"rabbitmq": "/queue/{1}", "rabbitmq4": "/queues/{1}"}.get(name, "{1}")

    def queue(self, tag: str) -> str:
        """A queue of this test's own; RabbitMQ 4 needs it declared before an attach."""
        name = queue_name(tag)
        if self.name == "rabbitmq4":
            brokers.rabbitmq4_declare_queue(name)
        return name

    def direct(self, queue: str) -> str:
        return self.template.replace("{1}", queue)

    def existing(self, queue: str) -> str:
        """An address that uses the queue as it is (RabbitMQ: no re-declare, no durability clash)."""
        return f"/amq/queue/{queue}" if self.name == "rabbitmq" else self.direct(queue)

    @property
    def reader(self) -> str:
        """The client that reads the primary directly: rhea 3.0.5's receivers fail on RabbitMQ
        4.0.5 with amqp:session:window-violation (its flow's next-incoming-id 0 against
        rhea's initial next-outgoing-id 4294967292), so proton there."""
        return "proton" if self.name == "rabbitmq4" else "rhea"

    def restart(self) -> None:
        if self.name == "rabbitmq":
            brokers.restart_rabbitmq()
        elif self.name == "rabbitmq4":
            brokers.restart_rabbitmq4()
        else:
            brokers.kill_artemis(restart=True)


@pytest.fixture(params=BROKERS)
def primary(request):
    return Primary(request.param)


@pytest.fixture
def proxy(primary, start_node):
    return start_node({"rules": [
        {"name": "ext", "match": "ext.*", "kind": "proxy", "primary": primary.url,
         "remote": primary.template, "upstream": {"heartbeat": 2.0}},
    ]})


def queue_name(tag: str) -> str:
    return f"fg-{tag}-{uuid.uuid4().hex[:8]}"


def ids_of(lines):
    return [line["id"] for line in lines if "id" in line]


@pytest.mark.parametrize("send_via, receive_via", [
    ("proxy", "primary"), ("primary", "proxy"), ("proxy", "proxy"),
])
def test_message_set_through_the_proxy(primary, proxy, clients, send_via, receive_via):
    queue = primary.queue("set")
    where = {"proxy": (proxy.url, f"ext.{queue}"), "primary": (primary.url, primary.direct(queue))}
    send_url, send_address = where[send_via]
    receive_url, receive_address = where[receive_via]
    senders = [clients(kind, "send", send_url, address=send_address, count=500, prefix=kind,
                       timeout_ms=60000) for kind in ("proton", "rhea")]
    for sender in senders:
        (result,) = sender.finish(timeout=90)
        assert result["error"] is None and result["accepted"] == 500
    receivers = [clients(kind, "receive", receive_url, address=receive_address, count=0,
                         credit=20, idle_ms=3000, timeout_ms=60000) for kind in ("proton", "rhea")]
    got = [i for r in receivers for i in ids_of(r.finish(timeout=90))]
    assert set(got) == {f"{k}-{n}" for k in ("proton", "rhea") for n in range(500)}
    assert [i for i, c in collections.Counter(got).items() if c > 1] == []


def test_killed_client_unsettled_messages_come_back(primary, proxy, clients):
    queue = primary.queue("kill")
    (sent,) = clients("rhea", "send", primary.url, address=primary.direct(queue), count=20,
                      prefix="k").finish()
    assert sent["accepted"] == 20
    holder = clients("proton", "receive", proxy.url, address=f"ext.{queue}", credit=5, hold=True)
    held = {holder.readline()["id"] for _ in range(5)}
    holder.kill()
    lines = clients(primary.reader, "receive", primary.url, address=primary.direct(queue), count=20,
                    timeout_ms=30000).finish()
    assert set(ids_of(lines)) == {f"k-{i}" for i in range(20)} and held <= set(ids_of(lines))


def test_credit_one_fetches_one(primary, proxy, clients):
    queue = primary.queue("credit")
    (sent,) = clients("rhea", "send", primary.url, address=primary.direct(queue), count=30,
                      prefix="c").finish()
    assert sent["accepted"] == 30
    holder = clients("proton", "receive", proxy.url, address=f"ext.{queue}", credit=1, hold=True)
    first = holder.readline()["id"]
    direct = ids_of(clients(primary.reader, "receive", primary.url, address=primary.direct(queue),
                            count=0, idle_ms=2000).finish())
    assert len(direct) == 29 and first not in direct
    holder.kill()


def test_large_messages_cross_the_proxy_whole(primary, proxy):
    # multi-frame on both sides of the node, larger than proton's output buffer
    address = f"ext.{primary.queue('large')}"
    bodies = large_bodies()
    send_messages(proxy.url, address, [Message(id=f"l{i}", body=b) for i, b in enumerate(bodies)])
    got = receive_messages(proxy.url, address, len(bodies))
    assert [m.id for m in got] == [f"l{i}" for i in range(len(bodies))]
    assert [m.body for m in got] == bodies


def test_drain_passes_through_the_proxy(primary, proxy):
    # Artemis: the node drains its upstream link and answers the client's drain
    # once the primary has. RabbitMQ 3.10 does not answer a drain (directly, a
    # drain of 10 on a queue of 3 got 2 messages and no answer; with credit 1 its
    # channel failed), so the node never sends it one and answers the client
    # itself after a grace period (proxy.primaries)
    check_drain(proxy.url, f"ext.{primary.queue('drain')}")


def test_browsing_through_the_proxy_takes_nothing(primary, proxy):
    # Artemis browses (§3.5.3 distribution-mode copy). RabbitMQ 3.10 and 4.0 answer
    # "copy" and move the messages, so the proxy refuses a browser there (proxy.primaries)
    queue = primary.queue("browse")
    send_messages(primary.url, primary.direct(queue),
                  [Message(id=f"b{i}", body="x") for i in range(3)])
    if primary.name in ("rabbitmq", "rabbitmq4"):
        assert refusal(proxy.url, f"ext.{queue}", Copy()) == "amqp:not-implemented"
    else:
        assert browse(proxy.url, f"ext.{queue}", 3) == ["b0", "b1", "b2"]
    got = receive_messages(primary.url, primary.direct(queue), 3)
    assert [m.id for m in got] == ["b0", "b1", "b2"]


def test_a_selector_through_the_proxy_selects_or_is_refused(primary, proxy):
    # Artemis applies a JMS selector; RabbitMQ 3.10 and 4.0 echo it and deliver everything
    queue = primary.queue("select")
    send_messages(primary.url, primary.direct(queue),
                  [Message(id=f"s{i}", body="x", properties={"color": "red" if i % 2 else "blue"})
                   for i in range(4)])
    if primary.name in ("rabbitmq", "rabbitmq4"):
        assert refusal(proxy.url, f"ext.{queue}", Selector("color = 'red'")) == "amqp:not-implemented"
        left = ["s0", "s1", "s2", "s3"]
    else:
        assert select(proxy.url, f"ext.{queue}", "color = 'red'", 2) == ["s1", "s3"]
        left = ["s0", "s2"]
    got = receive_messages(primary.url, primary.direct(queue), len(left))
    assert [m.id for m in got] == left


def test_not_found_reaches_the_client(primary, start_node, clients):
    missing = {"rabbitmq": "/amq/queue/fg-missing-", "rabbitmq4": "/queues/fg-missing-"}.get(
        primary.name, "strict.") + uuid.uuid4().hex[:8]
    node = start_node({"rules": [{"name": "all", "match": "#", "kind": "proxy",
                                  "primary": primary.url}]})
    lines = clients("rhea", "receive", node.url, address=missing, count=1, timeout_ms=10000).finish()
    assert lines[-1]["error"]["condition"] == "amqp:not-found"


def upstream_reconnects(node) -> int:
    return sum(m.get("reconnects", 0) for m in upstream_members(node))


def test_primary_restarted_mid_stream_loses_nothing(primary, start_node, clients):
    proxy = start_node({
        "admin": ADMIN,
        "rules": [{"name": "ext", "match": "ext.*", "kind": "proxy", "primary": primary.url,
                   "remote": primary.template, "upstream": {"heartbeat": 2.0}}],
    })
    queue = primary.queue("restart")
    producer = clients("proton", "send", proxy.url, address=f"ext.{queue}", count=20000,
                       prefix="d", durable=True, report_accepted=True, timeout_ms=150000)
    accepted = set()
    while len(accepted) < 500:  # the stream is flowing through the proxy
        accepted.add(producer.readline(timeout=30)["accepted_id"])
    assert producer.proc.poll() is None  # ... and still sending
    primary.restart()
    lines = producer.finish(timeout=180)
    result = lines[-1]
    accepted |= {line["accepted_id"] for line in lines if "accepted_id" in line}
    assert result["error"] is None, result  # the client's link survived the restart
    assert result["accepted"] == 20000  # replayed after reconnecting: real outcomes only
    assert upstream_reconnects(proxy) >= 1
    lines = clients(primary.reader, "receive", primary.url, address=primary.existing(queue), count=0,
                    credit=200, idle_ms=3000, timeout_ms=150000).finish(timeout=180)
    assert lines[-1]["error"] is None, lines[-1]
    got = ids_of(lines)
    assert accepted == {f"d-{i}" for i in range(20000)}
    assert set(got) == accepted  # 0 lost
    duplicates = sum(c - 1 for c in collections.Counter(got).values())
    print(f"{primary.name}: restart mid-stream: 0 lost of 20000, {duplicates} duplicates")


# -- RabbitMQ 4: SASL PLAIN with the password out of the rules, a virtual host ----------
@pytest.fixture(scope="module")
def rabbitmq4_tenant():
    """A virtual host of its own on RabbitMQ 4 and a user who may use only it."""
    brokers.ensure_rabbitmq4()
    tenant = f"fg-{uuid.uuid4().hex[:6]}"
    password = uuid.uuid4().hex
    brokers.rabbitmq4_ctl("add_vhost", tenant)
    brokers.rabbitmq4_ctl("add_user", tenant, password)
    brokers.rabbitmq4_ctl("set_permissions", "-p", tenant, tenant, ".*", ".*", ".*")
    brokers.rabbitmq4_ctl("set_permissions", "-p", tenant, "guest", ".*", ".*", ".*")  # the test's
    yield tenant, password
    brokers.rabbitmq4_ctl("delete_vhost", tenant)
    brokers.rabbitmq4_ctl("delete_user", tenant)


@pytest.mark.parametrize("where", ["password_file", "password_env"])
def test_plain_login_and_a_virtual_host_on_rabbitmq4(rabbitmq4_tenant, start_node, clients,
                                                      tmp_path, where):
    tenant, password = rabbitmq4_tenant
    queue = queue_name("tenant")
    brokers.rabbitmq4_declare_queue(queue, vhost=tenant)
    upstream = {"user": tenant, "vhost": tenant}
    env_name = f"FG_TEST_PASSWORD_{tenant.replace('-', '_').upper()}"
    if where == "password_file":
        secret = tmp_path / "rabbitmq-password"
        secret.write_text(password + "\n")
        secret.chmod(0o600)
        upstream["password_file"] = str(secret)
    else:
        upstream["password_env"] = env_name
    import os

    os.environ[env_name] = password  # the node process inherits it
    try:
        node = start_node({"rules": [{"name": "tenant", "match": "t.*", "kind": "proxy",
                                      "primary": brokers.RABBITMQ4_URL, "remote": "/queues/{1}",
                                      "upstream": upstream}]})
    finally:
        del os.environ[env_name]
    assert password not in node.config_path.read_text()  # never in the rules
    (sent,) = clients("rhea", "send", node.url, address=f"t.{queue}", count=200,
                      prefix="v").finish(timeout=60)
    assert sent["error"] is None and sent["accepted"] == 200, sent
    # the messages are in the tenant's virtual host, not in "/"
    assert brokers.rabbitmq4_queue_count(queue, vhost=tenant) == 200
    assert brokers.rabbitmq4_queue_count(queue) is None
    lines = clients("proton", "receive", node.url, address=f"t.{queue}", count=200,
                    timeout_ms=30000).finish(timeout=60)
    assert sorted(ids_of(lines)) == sorted(f"v-{n}" for n in range(200))


# -- RabbitMQ 4: queues the rule declares on first use ----------------------------------
def declaring_node(start_node, url: str, declare):
    upstream = {} if declare is None else {"declare": declare}
    return start_node({"rules": [{"name": "made", "match": "m.*", "kind": "proxy", "primary": url,
                                  "remote": "/queues/{1}", "upstream": upstream}]})


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_a_rule_declares_its_queue_on_rabbitmq4(start_node, clients, queue_type):
    url = brokers.ensure_rabbitmq4()
    node = declaring_node(start_node, url, {"type": queue_type, "arguments": {"x-max-length": 5000}})
    queue = queue_name(f"made-{queue_type}")
    # producers and a consumer at once: one declare, then everyone attaches
    consumer = clients("proton", "receive", node.url, address=f"m.{queue}", count=400,
                       timeout_ms=60000)
    senders = [clients(kind, "send", node.url, address=f"m.{queue}", count=200, prefix=kind)
               for kind in ("proton", "rhea")]
    for sender in senders:
        (sent,) = sender.finish(timeout=60)
        assert sent["error"] is None and sent["accepted"] == 200, sent
    got = ids_of(consumer.finish(timeout=60))
    assert sorted(got) == sorted(f"{k}-{n}" for k in ("proton", "rhea") for n in range(200))
    info = brokers.rabbitmq4_ctl("list_queues", "name", "type", "arguments", "--no-table-headers")
    line = next(line for line in info.splitlines() if line.startswith(queue + "\t"))
    assert queue_type in line and "x-max-length" in line, line
    assert node.log_path.read_text().count(f"declaring /queues/{queue}") == 1


def test_a_declare_that_clashes_with_the_queue_refuses_the_client(start_node, clients):
    url = brokers.ensure_rabbitmq4()
    queue = queue_name("clash")
    brokers.rabbitmq4_declare_queue(queue, "classic")
    node = declaring_node(start_node, url, {"type": "quorum"})
    (sent,) = clients("rhea", "send", node.url, address=f"m.{queue}", count=1,
                      timeout_ms=20000).finish(timeout=40)
    assert sent["error"]["condition"] == "amqp:precondition-failed", sent
    assert "409" in sent["error"]["description"] and "x-queue-type" in sent["error"]["description"]


def test_without_declare_a_missing_queue_is_not_found_naming_the_rule(start_node, clients):
    node = declaring_node(start_node, brokers.ensure_rabbitmq4(), None)
    lines = clients("rhea", "receive", node.url, address=f"m.{queue_name('absent')}", count=1,
                    timeout_ms=20000).finish(timeout=40)
    error = lines[-1]["error"]
    assert error["condition"] == "amqp:not-found", error
    assert "rule 'made'" in error["description"] and "upstream.declare" in error["description"]


def test_declare_on_a_primary_without_a_management_node_is_not_implemented(start_node, clients):
    node = declaring_node(start_node, brokers.ensure_rabbitmq(), True)  # RabbitMQ 3.10
    (sent,) = clients("rhea", "send", node.url, address=f"m.{queue_name('old')}", count=1,
                      timeout_ms=20000).finish(timeout=40)
    assert sent["error"]["condition"] == "amqp:not-implemented", sent


def rabbitmq4_queues(*fields: str) -> dict[str, list[str]]:
    """Queue name -> the other ``fields`` of ``rabbitmqctl list_queues`` on RabbitMQ 4."""
    out = brokers.rabbitmq4_ctl("list_queues", "name", *fields, "--no-table-headers")
    return {line.split("\t")[0]: line.split("\t")[1:] for line in out.splitlines() if line}


def test_a_rule_declares_a_stream_and_its_consumer_reads_the_set(start_node, clients):
    node = declaring_node(start_node, brokers.ensure_rabbitmq4(), {"type": "stream"})
    queue = queue_name("made-stream")
    # a stream consumer starts at the stream's end ("next", RabbitMQ's default offset):
    # it is attached, on the broker too, before anything is sent
    consumer = clients("rhea", "receive", node.url, address=f"m.{queue}", count=400,
                       timeout_ms=60000, announce=True)
    assert "attached" in consumer.readline(timeout=30)
    wait_for(lambda: rabbitmq4_queues("consumers").get(queue) == ["1"], 15,
             "the proxied stream consumer on RabbitMQ")
    senders = [clients(kind, "send", node.url, address=f"m.{queue}", count=200, prefix=kind)
               for kind in ("proton", "rhea")]
    for sender in senders:
        (sent,) = sender.finish(timeout=60)
        assert sent["error"] is None and sent["accepted"] == 200, sent
    lines = consumer.finish(timeout=60)
    got = ids_of(lines)
    assert sorted(got) == sorted(f"{k}-{n}" for k in ("proton", "rhea") for n in range(200))
    assert rabbitmq4_queues("type", "durable")[queue] == ["stream", "true"]
    assert node.log_path.read_text().count(f"declaring /queues/{queue}") == 1


OFFSET_SPEC = symbol("rabbitmq:stream-offset-spec")


def test_a_stream_offset_filter_goes_through_to_rabbitmq_4_0_and_a_selector_does_not(start_node):
    # Measured on 4.0.5: the offset filter is applied (directly, "first" reads the stream
    # from its start, an offset from there, "last" the last chunk) but a JMS selector is
    # echoed and not applied, so the proxy lets the offset filter through and refuses a
    # selector (proxy.upstream.primaries.filters_applied); docs/proxy.md says so
    url = brokers.ensure_rabbitmq4()
    node = declaring_node(start_node, url, {"type": "stream"})
    queue = queue_name("stream-offset")
    send_messages(node.url, f"m.{queue}", [Message(id=f"o{i}", body="x") for i in range(5)])
    first = Filter({OFFSET_SPEC: "first"})
    assert accepted_ids(node.url, f"m.{queue}", 5, first) == [f"o{i}" for i in range(5)]
    assert accepted_ids(url, f"/queues/{queue}", 5, first) == [f"o{i}" for i in range(5)]
    from_offset = Filter({OFFSET_SPEC: ulong(3)})
    assert accepted_ids(node.url, f"m.{queue}", 2, from_offset) == ["o3", "o4"]
    selector = Described(symbol("apache.org:selector-filter:string"), "color = 'red'")
    with_selector = Filter({OFFSET_SPEC: "first", symbol("selector"): selector})
    assert refusal(node.url, f"m.{queue}", with_selector) == "amqp:not-implemented"


def test_a_rule_declares_a_transient_classic_queue(start_node, clients):
    node = declaring_node(start_node, brokers.ensure_rabbitmq4(),
                          {"type": "classic", "durable": False})
    queue = queue_name("made-transient")
    (sent,) = clients("proton", "send", node.url, address=f"m.{queue}", count=100,
                      prefix="t").finish(timeout=60)
    assert sent["error"] is None and sent["accepted"] == 100, sent
    assert rabbitmq4_queues("type", "durable")[queue] == ["classic", "false"]
    lines = clients("proton", "receive", node.url, address=f"m.{queue}", count=100,
                    timeout_ms=30000).finish(timeout=60)
    assert sorted(ids_of(lines)) == sorted(f"t-{n}" for n in range(100))
    brokers.rabbitmq4_delete_queue(queue)
