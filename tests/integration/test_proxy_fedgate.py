"""Proxy queues with another fedgate node as the primary (real processes, real sockets)."""

from __future__ import annotations

import collections
import subprocess

import pytest
from blocking_checks import browse, check_drain, receive_messages, send_messages
from conftest import PYTHON, TESTS
from proton import Message
from proton.reactor import Selector
from proton.utils import BlockingConnection

PER_SENDER = 500


@pytest.fixture
def pair(start_node):
    """n2 is the primary; n1 proxies `orders.#` (and a not-found-prone prefix) to it."""
    primary = start_node({"queues": {"auto_create": True}}, name="n2")
    proxy = start_node({
        "peers": {"n2": primary.url},
        "rules": [
            {"name": "strict", "match": "strict.#", "kind": "proxy", "primary": "n2",
             "remote": "missing.{1}"},
            {"name": "orders", "match": "orders.#", "kind": "proxy", "primary": "n2"},
        ],
    }, name="n1")
    return proxy, primary


def ids_of(lines):
    return [line["id"] for line in lines if "id" in line]


@pytest.mark.parametrize("send_via, receive_via", [
    ("proxy", "primary"), ("primary", "proxy"), ("proxy", "proxy"),
])
def test_message_set_through_the_proxy(pair, clients, send_via, receive_via):
    proxy, primary = pair
    url = {"proxy": proxy.url, "primary": primary.url}
    receivers = [clients(kind, "receive", url[receive_via], address="orders.eu", count=0,
                         credit=20, idle_ms=3000, timeout_ms=60000)
                 for kind in ("proton", "rhea")]
    senders = [clients(kind, "send", url[send_via], address="orders.eu", count=PER_SENDER,
                       prefix=kind, timeout_ms=60000) for kind in ("proton", "rhea")]
    for sender in senders:
        (result,) = sender.finish()
        assert result["error"] is None and result["accepted"] == PER_SENDER
    got = [i for r in receivers for i in ids_of(r.finish(timeout=90))]
    expected = {f"{k}-{n}" for k in ("proton", "rhea") for n in range(PER_SENDER)}
    assert set(got) == expected
    assert [i for i, c in collections.Counter(got).items() if c > 1] == []


def test_killed_client_unsettled_messages_come_back_from_the_primary(pair, clients):
    proxy, primary = pair
    (sent,) = clients("rhea", "send", primary.url, address="orders.kill", count=20, prefix="k").finish()
    assert sent["accepted"] == 20
    holder = clients("proton", "receive", proxy.url, address="orders.kill", credit=5, hold=True)
    held = {holder.readline()["id"] for _ in range(5)}
    holder.kill()
    lines = clients("rhea", "receive", primary.url, address="orders.kill", count=20).finish()
    assert set(ids_of(lines)) == {f"k-{i}" for i in range(20)}
    assert held <= set(ids_of(lines))


def test_credit_one_leaves_every_other_message_on_the_primary(pair, clients):
    proxy, primary = pair
    (sent,) = clients("rhea", "send", primary.url, address="orders.credit", count=50, prefix="c").finish()
    assert sent["accepted"] == 50
    holder = clients("proton", "receive", proxy.url, address="orders.credit", credit=1, hold=True)
    first = holder.readline()["id"]  # held, unsettled, by the proxied client (credit 1, no top-up)
    lines = clients("rhea", "receive", primary.url, address="orders.credit", count=0,
                    idle_ms=2000).finish()
    direct = ids_of(lines)
    assert len(direct) == 49 and first not in direct  # nothing was fetched beyond its credit
    holder.kill()
    (last,) = ids_of(clients("rhea", "receive", primary.url, address="orders.credit",
                             count=1).finish())
    assert last == first  # released upstream when the client went away


def test_release_and_reject_through_the_proxy(pair):
    proxy, primary = pair
    conn = BlockingConnection(proxy.url, timeout=10)
    try:
        conn.create_sender("orders.outcomes").send(Message(id="r1", body="x"))
        receiver = conn.create_receiver("orders.outcomes", credit=1)
        assert receiver.receive(timeout=5).id == "r1"
        receiver.release(delivered=False)
        assert receiver.receive(timeout=5).id == "r1"  # released upstream, redelivered
        receiver.reject()
    finally:
        conn.close()
    direct = BlockingConnection(primary.url, timeout=10)
    try:
        receiver = direct.create_receiver("orders.outcomes", credit=1)
        with pytest.raises(Exception):
            receiver.receive(timeout=1.5)  # rejected at the primary: gone
    finally:
        direct.close()


def test_large_messages_cross_the_proxy_whole_on_idle_connections(pair):
    # larger than proton's output buffer, around 64 KiB, and multi-frame; nothing else
    # happens on the connections, so every byte must go out with the message
    proxy, primary = pair
    sizes = [300, 65_535, 65_536, 65_537, 300_000]  # encoded, as the client sends them
    overhead = len(Message(id="s0", body=b"x" * 1000).encode()) - 1000
    bodies = [bytes([i]) * (size - overhead) for i, size in enumerate(sizes)]
    messages = [Message(id=f"s{i}", body=body) for i, body in enumerate(bodies)]
    assert [len(m.encode()) for m in messages] == sizes
    send_messages(proxy.url, "orders.sizes", messages)
    got = receive_messages(proxy.url, "orders.sizes", len(sizes))
    assert [m.id for m in got] == [f"s{i}" for i in range(len(sizes))]
    assert [m.body for m in got] == bodies


def test_drain_passes_through_the_proxy(pair):
    # the node drains its upstream link and answers the client's drain once the
    # primary has; no message is fetched beyond what the client asked for
    proxy, _ = pair
    check_drain(proxy.url, "orders.drain")


def test_browsing_through_the_proxy_takes_nothing_from_the_primary(pair):
    # §3.5.3 distribution-mode copy: the primary browses, the proxy passes copies
    proxy, primary = pair
    send_messages(primary.url, "orders.browse", [Message(id=f"b{i}", body="x") for i in range(3)])
    assert browse(proxy.url, "orders.browse", 3) == ["b0", "b1", "b2"]
    assert [m.id for m in receive_messages(primary.url, "orders.browse", 3)] == ["b0", "b1", "b2"]


def test_a_selector_through_the_proxy_is_applied_by_the_fedgate_primary(pair):
    # the primary applies the selector and echoes it (issue #43); any other filter is refused
    proxy, primary = pair
    send_messages(primary.url, "orders.sel", [
        Message(id=f"s{i}", body="x", properties={"color": ("red", "blue")[i % 2]})
        for i in range(4)])
    connection = BlockingConnection(proxy.url, timeout=15)
    try:
        receiver = connection.create_receiver("orders.sel", credit=10,
                                              options=Selector("color = 'red'"))
        got = []
        for _ in range(2):
            got.append(receiver.receive(timeout=10))
            receiver.accept()
    finally:
        connection.close()
    assert [m.id for m in got] == ["s0", "s2"]
    assert [m.id for m in receive_messages(primary.url, "orders.sel", 2)] == ["s1", "s3"]


def test_not_found_from_the_primary_reaches_the_client(start_node, clients):
    primary = start_node({"queues": {"auto_create": False}}, name="n2")
    proxy = start_node({"peers": {"n2": primary.url}, "rules": [
        {"name": "all", "match": "#", "kind": "proxy", "primary": "n2"}]}, name="n1")
    for kind in ("rhea", "proton"):
        lines = clients(kind, "receive", proxy.url, address="nope", count=1, timeout_ms=10000).finish()
        assert lines[-1]["error"]["condition"] == "amqp:not-found"
        lines = clients(kind, "send", proxy.url, address="nope", count=1, timeout_ms=10000).finish()
        assert lines[-1]["error"]["condition"] == "amqp:not-found"


def test_open_frame_carries_failover_server_list(pair):
    proxy, primary = pair
    conn = BlockingConnection(proxy.url, timeout=10)
    try:
        servers = conn.conn.remote_properties["failover-server-list"]
        assert [(s["network-host"], int(s["port"])) for s in servers] == [("127.0.0.1", primary.port)]
    finally:
        conn.close()


def established_to(port: int) -> int:
    """Established TCP connections to ``port`` on this host (from /proc/net/tcp)."""
    count = 0
    for line in open("/proc/net/tcp").read().splitlines()[1:]:
        fields = line.split()
        remote_port = int(fields[2].split(":")[1], 16)
        if remote_port == port and fields[3] == "01":
            count += 1
    return count


def test_thousand_clients_share_at_most_two_upstream_connections(pair):
    proxy, primary = pair
    proc = subprocess.Popen(
        [PYTHON, str(TESTS / "clients" / "many_connections.py"), "--url", proxy.url,
         "--address", "orders.many", "--count", "1000"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        from conftest import ClientProcess

        reader = ClientProcess.__new__(ClientProcess)
        reader.proc, reader._pending, reader.cmd = proc, b"", ["many_connections"]
        status = reader.readline(timeout=120)
        assert status == {"open": 1000, "accepted": 1000}
        assert established_to(proxy.port) >= 1000  # all clients still connected
        assert 1 <= established_to(primary.port) <= 2
        proc.stdin.write(b"close\n")
        proc.stdin.flush()
        assert reader.readline(timeout=60) == {"closed": 1000}
    finally:
        proc.kill()
        proc.wait(10)
    conn = BlockingConnection(primary.url, timeout=10)
    try:
        receiver = conn.create_receiver("orders.many", credit=1000)
        got = set()
        for _ in range(1000):
            got.add(receiver.receive(timeout=10).id)
        receiver.accept()
        assert got == {f"c-{i}" for i in range(1000)}
    finally:
        conn.close()


@pytest.mark.parametrize("split, connections, roles", [
    (True, 2, {"receive": 1, "send": 1}), (False, 1, {"both": 2}),
])
def test_publishers_and_consumers_get_separate_upstream_connections(start_node, split, connections,
                                                                     roles):
    """split_directions (default): a blocked publishing connection cannot stall consumers."""
    from exchange_support import ADMIN, upstream_members, wait_for

    primary = start_node({"queues": {"auto_create": True}}, name="n2")
    proxy = start_node({"peers": {"n2": primary.url}, "admin": ADMIN, "rules": [
        {"name": "all", "match": "#", "kind": "proxy", "primary": "n2",
         "upstream": {"split_directions": split}}]}, name="n1")
    conn = BlockingConnection(proxy.url, timeout=10)
    try:
        receiver = conn.create_receiver("split.q", credit=10)
        sender = conn.create_sender("split.q")
        for n in range(20):
            sender.send(Message(id=n, body=n))
        got = []
        for _ in range(20):
            got.append(receiver.receive(timeout=10).id)
            receiver.accept()
        assert sorted(got) == list(range(20))
        wait_for(lambda: established_to(primary.port) == connections, 10, "upstream connections")
        members = [m for m in upstream_members(proxy) if m["state"] == "up"]
        carried = collections.Counter()
        for m in members:
            carried[m["role"]] += m["links"]
        assert dict(carried) == roles
    finally:
        conn.close()


def test_links_closed_through_the_proxy_are_freed_on_every_connection(start_node):
    """Short-lived proxied links on long-lived connections leave nothing behind.

    One client connection attaches and detaches 150 proxied receivers and
    senders; the client's connection on the proxy, the proxy's upstream
    connections and the primary's side of them end up holding no links.
    """
    from exchange_support import ADMIN, admin_get, upstream_members, wait_for

    primary = start_node({"queues": {"auto_create": True}, "admin": ADMIN}, name="n2")
    proxy = start_node({"peers": {"n2": primary.url}, "admin": ADMIN, "rules": [
        {"name": "all", "match": "#", "kind": "proxy", "primary": "n2"}]}, name="n1")
    conn = BlockingConnection(proxy.url, timeout=10)
    try:
        got = []
        for n in range(150):
            receiver = conn.create_receiver("churn.q", credit=1)
            sender = conn.create_sender("churn.q")
            sender.send(Message(id=n, body=n))
            got.append(receiver.receive(timeout=10).id)
            receiver.accept()
            sender.close()
            receiver.close()
        assert got == list(range(150))

        def held():
            client = [c["proton_links"] for c in admin_get(proxy, "/api/v1/connections")["connections"]]
            upstream = [m["proton_links"] for m in upstream_members(proxy) if m["state"] == "up"]
            on_primary = [c["proton_links"] for c in admin_get(primary, "/api/v1/connections")["connections"]]
            return client, upstream, on_primary

        none = ([0], [0, 0], [0, 0])  # client; upstream receive + send; the primary's side of them
        wait_for(lambda: held() == none, 10, "no links held on any of the connections")
    finally:
        conn.close()


def test_a_burst_of_clients_is_attached_upstream_in_paced_steps_and_every_link_arrives(start_node):
    """500 clients attach at once: the proxy keeps at most MAX_ATTACHING attaches in flight
    to the primary (proxy.upstream), and every one of the 500 links ends up attached there."""
    import json

    from conftest import ROOT
    from exchange_support import ADMIN, admin_get, upstream_members, wait_for

    from proxy.upstream.member import MAX_ATTACHING

    primary = start_node({"queues": {"auto_create": True}, "admin": ADMIN}, name="n2")
    proxy = start_node({"peers": {"n2": primary.url}, "admin": ADMIN, "rules": [
        {"name": "all", "match": "#", "kind": "proxy", "primary": "n2"}]}, name="n1")
    clients = subprocess.Popen(
        [PYTHON, str(ROOT / "bench" / "idle_clients.py"), "--port", str(proxy.port),
         "--address", "burst.q", "--count", "500", "--batch", "500"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        ready = None
        while ready is None:
            line = clients.stdout.readline()
            assert line, "idle clients exited early"
            ready = json.loads(line) if '"ready"' in line else None
        assert (ready["ready"], ready["failed"]) == (500, 0)

        def on_primary():
            return sum(c["links"] for c in admin_get(primary, "/api/v1/connections")["connections"])

        wait_for(lambda: on_primary() == 500, 30, "500 links attached on the primary")
        receiving = [m for m in upstream_members(proxy) if m["role"] == "receive"]
        assert [(m["links"], m["attaching"]) for m in receiving] == [(500, 0)]
        assert 0 < receiving[0]["attaching_peak"] <= MAX_ATTACHING  # the burst waited its turn
    finally:
        clients.communicate("close\n", timeout=60)
