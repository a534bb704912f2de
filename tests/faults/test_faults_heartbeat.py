"""Heartbeats: a blackholed primary is declared dead two heartbeats after its last frame.

``upstream.heartbeat = H`` makes the node's transport idle timeout 2H
(proxy/upstream.py; AMQP 1.0 §2.4.5): the primary sends a frame at least
every H, and a primary silent for 2H is dead. The real Toxiproxy drops every
byte both ways (``timeout`` toxic, 0 = never close), so nothing but the
heartbeats can notice. Proton measures the silence from the tick that first
sees new input, so a driver that ticks only at proton's deadlines noticed
between 2H and 4H; the node ticks upstream connections on every read
(``UpstreamProtocol.data_received``), and the detection is 2H.
"""

from __future__ import annotations

import dataclasses
import time

from fragment_cluster import TOKEN, admin
from proton import Message
from proton.utils import BlockingConnection
from toxi import FAULTS, toxi, toxiproxy_server  # noqa: F401  (fixtures)

HEARTBEAT = 1.0
ROUNDS = 3  # ticking at deadlines only detected within 2H + 0.6 s about 1 time in 3


def reconnects(node) -> int:
    return int(admin(node, "/api/v1/upstreams")["reconnects"])


def test_blackholed_primary_is_declared_dead_after_two_heartbeats(start_node, toxi):
    primary = start_node(name="primary")
    hole = toxi.proxy("primary", primary.port)
    node = start_node({
        "admin": {"tokens": [{"token": TOKEN, "role": "admin"}]},
        "rules": [{"name": "up", "match": "up.#", "kind": "proxy", "primary": hole.url,
                   "upstream": {"heartbeat": HEARTBEAT}}]}, name="p")
    blackhole = dataclasses.replace(FAULTS["blackhole"], duration=6 * HEARTBEAT)
    conn = BlockingConnection(node.url, timeout=15)
    try:
        sender = conn.create_sender("up.beat")  # a link keeps the pool member wanted
        sender.send(Message(id="before", body="before"))
        detected = []
        for _ in range(ROUNDS):
            before = reconnects(node)
            time.sleep(1.3 * HEARTBEAT)  # out of step with the previous round
            detected.append(blackhole.inject([hole], until=lambda: reconnects(node) > before))
            assert reconnects(node) > before, "the blackhole was never noticed"
        sender.send(Message(id="after", body="after"))  # reconnected: the link works again
        receiver = BlockingConnection(primary.url, timeout=15)
        try:
            inbox = receiver.create_receiver("up.beat", credit=10)
            got = []
            for _ in range(2):
                got.append(inbox.receive(timeout=10).id)
                inbox.accept()
        finally:
            receiver.close()
    finally:
        conn.close()
    print(f"\nblackhole noticed after {', '.join(f'{d:.2f}' for d in detected)} s "
          f"(heartbeat {HEARTBEAT} s)")
    assert got == ["before", "after"]
    node.wait_log("local-idle-timeout expired")  # noticed by heartbeats
    # 2H of silence, plus the 50 ms polling of the test and scheduling on a busy machine
    assert max(detected) <= 2 * HEARTBEAT + 0.6, detected


def test_idle_upstream_to_a_fedgate_primary_stays_up(start_node):
    """The primary sends the heartbeats the node asks for from the start, so a quiet
    but healthy link is never taken for a dead one (it used to be, every 2 s)."""
    primary = start_node(name="primary")
    node = start_node({
        "admin": {"tokens": [{"token": TOKEN, "role": "admin"}]},
        "rules": [{"name": "up", "match": "up.#", "kind": "proxy", "primary": primary.url,
                   "upstream": {"heartbeat": 0.5}}]}, name="p")
    conn = BlockingConnection(node.url, timeout=15)
    try:
        sender = conn.create_sender("up.quiet")
        sender.send(Message(id="m", body="m"))  # the upstream link is up
        time.sleep(5.0)  # 10 heartbeats of silence from everyone but the heartbeats
        assert reconnects(node) == 0, node.log_path.read_text()[-2000:]
        sender.send(Message(id="m2", body="m2"), timeout=5)
    finally:
        conn.close()
