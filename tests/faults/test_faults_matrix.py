"""Network faults on node-to-node links, with the real Toxiproxy in the middle.

Two links x seven faults. Each case runs a numbered message set (4 producers
x 1,500 messages, rate-limited so the stream lasts a few seconds; 2 consumers
on another node that check every body), injects the fault once a fifth of
the messages got through, takes it away again, and checks what a user would:

* 0 lost, every body intact (a stream cut or sliced mid-frame is closed and
  reopened, never misparsed);
* duplicates no more than the credit windows of the links that cross the
  fault (what can be in flight when a connection dies), for every connection
  the fault cost (``/api/v1/upstreams`` reconnects per node);
* no client waited past its own timeout (producers finish without error);
* a fault that must cost the connection (blackhole, reset, limit_data,
  disabled) shows up in ``/api/v1/upstreams`` as a reconnect, detected by the
  heartbeats (``upstream.heartbeat = 1``) where nothing is closed.

Links:

``proxy``
    producers -> node P -> Toxiproxy -> primary (a fedgate node) <- Toxiproxy
    <- node Q <- consumers. P and Q proxy ``faults.#`` to the primary through
    the same Toxiproxy proxy: producer links and consumer links cross it.
``fragments``
    producers -> n1 (fragment) ... n2 (fragment) <- consumers: n2 steals from
    n1 over a node-to-node link; each node's ``[peers]`` URL for the other is
    a Toxiproxy proxy.

Each case prints one line (``-s`` shows it): fault, lost, duplicates, bound,
reconnects, seconds.
"""

from __future__ import annotations

import time

import pytest
from conftest import free_port
from fault_workload import MessageSet
from fragment_cluster import TOKEN, admin
from toxi import FAULTS, toxi, toxiproxy_server  # noqa: F401  (fixtures)

PRODUCERS = 4
PER_PRODUCER = 1500
CONSUMERS = 2
CONSUMER_CREDIT = 50
PRIMARY_WINDOW = 100  # the primary's credit window per producer link ([queues] credit_window)
RATE = 300  # messages/s per producer: the stream lasts ~5 s
HEARTBEAT = 1.0  # upstream.heartbeat: a silent primary is declared dead after 2 s
CLIENT_TIMEOUT_MS = 40000
ADMIN = {"tokens": [{"token": TOKEN, "role": "admin"}]}
UPSTREAM = {"heartbeat": HEARTBEAT, "idle_timeout": 30.0}


def reconnects(node) -> int:
    return int(admin(node, "/api/v1/upstreams")["reconnects"])


class ProxyLink:
    """P and Q proxy ``faults.#`` to a fedgate primary through one Toxiproxy proxy."""

    # in flight per lost connection: P's producer links a window of sends each,
    # Q's consumer links their clients' credit
    windows = {"p": PRODUCERS * PRIMARY_WINDOW, "q": CONSUMERS * CONSUMER_CREDIT}

    def __init__(self, start_node, toxi) -> None:
        # the primary notices a dead client connection by its own idle timeout
        self.primary = start_node({"queues": {"credit_window": PRIMARY_WINDOW},
                                   "limits": {"idle_timeout": 4.0}}, name="primary")
        self.toxics = [toxi.proxy("primary", self.primary.port)]
        rule = {"name": "faults", "match": "faults.#", "kind": "proxy",
                "primary": self.toxics[0].url, "upstream": UPSTREAM}
        self.send_node = start_node({"admin": ADMIN, "rules": [rule]}, name="p")
        self.receive_node = start_node({"admin": ADMIN, "rules": [rule]}, name="q")
        self.watched = {"p": self.send_node, "q": self.receive_node}


class FragmentLink:
    """n1 and n2 share fragmented ``faults.#``; each reaches the other through Toxiproxy."""

    # stolen messages in flight per lost connection: the stealing node's consumers' credit
    windows = {"n1": 0, "n2": CONSUMERS * CONSUMER_CREDIT}

    def __init__(self, start_node, toxi) -> None:
        ports = {"n1": free_port(), "n2": free_port()}
        proxies = {name: toxi.proxy(name, port) for name, port in ports.items()}
        self.toxics = list(proxies.values())
        rule = {"name": "faults", "match": "faults.#", "kind": "fragmented",
                "fragments": ["n1", "n2"], "upstream": UPSTREAM}
        nodes = {}
        for name, other in (("n1", "n2"), ("n2", "n1")):
            nodes[name] = start_node({
                "node": {"listen": f"127.0.0.1:{ports[name]}"}, "admin": ADMIN,
                "peers": {other: proxies[other].url}, "rules": [rule]}, name=name)
        self.send_node, self.receive_node = nodes["n1"], nodes["n2"]
        self.watched = {"n1": nodes["n1"], "n2": nodes["n2"]}


LINKS = {"proxy": ProxyLink, "fragments": FragmentLink}


@pytest.mark.parametrize("fault_name", list(FAULTS))
@pytest.mark.parametrize("link_name", list(LINKS))
def test_fault_mid_stream_loses_nothing(start_node, clients, toxi, link_name, fault_name):
    started = time.monotonic()
    fault = FAULTS[fault_name]
    link = LINKS[link_name](start_node, toxi)
    run = MessageSet(clients, send_url=link.send_node.url, receive_url=link.receive_node.url,
                     address="faults.orders", producers=PRODUCERS, per_producer=PER_PRODUCER,
                     consumers=CONSUMERS, credit=CONSUMER_CREDIT, rate=RATE,
                     timeout_ms=CLIENT_TIMEOUT_MS)
    try:
        run.start()
        run.wait_received(len(run.expected) // 5, timeout=20)  # the stream is flowing
        before = {name: reconnects(node) for name, node in link.watched.items()}
        at_injection = run.received()

        def reconnected() -> bool:  # cuts that repeat on every new connection stop at one
            return any(reconnects(node) > before[name] for name, node in link.watched.items())

        held = fault.inject(link.toxics, until=reconnected if fault_name == "limit_data" else None)
        during = run.received() - at_injection
        result = run.finish(timeout=45)
    finally:
        run.stop()
    lost_connections = {name: reconnects(node) - before[name] for name, node in link.watched.items()}
    # each lost connection may duplicate one window; a fault that cost none, nothing
    bound = sum(window * lost_connections[name] for name, window in link.windows.items())
    elapsed = time.monotonic() - started
    print(f"\nFAULT link={link_name} fault={fault_name} held={held:.1f}s "
          f"lost={len(result.lost)} duplicates={result.duplicates} bound={bound} "
          f"reconnects={sum(lost_connections.values())} received_at_injection={at_injection} "
          f"received_during={during} producers={result.producer_seconds:.1f}s "
          f"case={elapsed:.1f}s")

    assert result.corrupt == [], f"misparsed or corrupt messages: {result.corrupt[:3]}"
    assert result.consumer_errors == [], result.consumer_errors
    assert at_injection < len(run.expected), "the fault came after the stream"
    for final in result.producers:  # no producer waited past its timeout, none failed
        assert final.get("error") is None and final.get("accepted") == PER_PRODUCER, final
    assert result.producer_seconds < CLIENT_TIMEOUT_MS / 1000
    assert not result.lost, f"{len(result.lost)} lost, e.g. {sorted(result.lost)[:5]}"
    assert not result.unexpected, sorted(result.unexpected)[:5]
    assert result.duplicates <= bound, f"{result.duplicates} duplicates > windows {bound}"
    if fault.breaks:
        assert sum(lost_connections.values()) >= 1, \
            "the fault must have cost (and the node reconnected) a connection"
    if fault_name == "blackhole":  # nothing was closed: only the heartbeats could tell
        logs = "".join(node.log_path.read_text() for node in link.watched.values())
        assert "local-idle-timeout expired" in logs, "the blackhole was not noticed by heartbeats"
