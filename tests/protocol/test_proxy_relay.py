"""Messages of every shape through a proxy rule, both ways, in C and in Python.

The proxy hop moves a message from link to link in C when it can
(``proxy/amqp/_fastpath.c``: complete deliveries up to 64 KiB) and in Python
otherwise (larger, multi-frame and aborted transfers, a link with a partial
transfer counted), and the node falls back to Python entirely when the C module
is not built. These playbooks send each kind through a gateway to a fedgate
primary and back, pre-settled and unsettled, and check the message sets; the
last test runs them again in a process with the C module switched off.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from proton import Delivery, Message

from playbook import World, run
from proxy.amqp import engine

PROXY_RULE = {"name": "work", "match": "work.#", "kind": "proxy", "primary": "amqp://primary:5672"}
LIMITS = {"max_message_size": 300_000}

pytestmark = pytest.mark.timeout(30)


def encoded(body: str, message_id: str) -> bytes:
    return Message(body=body, id=message_id).encode()


BODIES = {
    "small": "s" * 100,
    "empty": "",
    "just under the buffer": "u" * (64 * 1024 - 200),
    "over the buffer": "o" * (64 * 1024 + 10),
    "large": "l" * 250_000,
}


async def gateway_world(tmp_path):
    world = World(tmp_path)
    await world.node("primary", limits=LIMITS)
    await world.node("gw", rules=[PROXY_RULE], limits=LIMITS)
    return world


async def send_all(world, client, sender, items, *, presettled: bool) -> list:
    """Send (id, body) pairs; pre-settled ones are settled before they leave (§2.6.12)."""
    await world.until(lambda: sender.credit >= len(items), what="credit for every message")
    deliveries = []
    for message_id, body in items:
        delivery = sender.link.delivery(message_id)
        sender.link.send(encoded(body, message_id))
        sender.link.advance()
        if presettled:
            delivery.settle()
        deliveries.append(delivery)
    client.flush()
    return deliveries


async def receive_ids(world, receiver, count: int) -> Counter:
    await world.until(lambda: len(receiver.received) >= count, what=f"{count} messages through the proxy")
    await world.quiet(0.5)  # and no more
    receiver.settle(Delivery.ACCEPTED)
    return Counter(message.id for message, _ in receiver.received)


@pytest.mark.parametrize("presettled", [False, True], ids=["unsettled", "presettled"])
def test_every_size_crosses_the_proxy_both_ways_whole(tmp_path, presettled):
    async def play():
        world = await gateway_world(tmp_path)
        producer = await world.client("gw")
        sender = producer.sender("work.sizes")
        items = [(f"{name}-{i}", body) for i in range(3) for name, body in BODIES.items()]
        await send_all(world, producer, sender, items, presettled=presettled)
        if not presettled:  # every unsettled send is accepted by the primary, through the proxy
            await world.until(lambda: sender.accepted() == len(items), what="all accepted")
        consumer = await world.client("gw")
        receiver = consumer.receiver("work.sizes", credit=len(items))
        counts = await receive_ids(world, receiver, len(items))
        assert counts == Counter(message_id for message_id, _ in items)  # each once
        bodies = {message.id: message.body for message, _ in receiver.received}
        assert bodies == dict(items)
        primary = world.nodes["primary"].queues.lookup_or_create("work.sizes")
        await world.until(lambda: (len(primary.messages), primary.unacked) == (0, 0), what="settled upstream")
        await world.close()

    run(play)


def test_a_message_in_several_frames_crosses_whole_and_later_ones_go_on(tmp_path):
    """The gateway sees a partial delivery (more=true) before its last frame (§2.6.14)."""
    async def play():
        world = await gateway_world(tmp_path)
        producer = await world.client("gw")
        sender = producer.sender("work.frames")
        await world.until(lambda: sender.credit > 0, what="credit")
        whole = encoded("f" * 5000, "framed")
        sender.link.delivery("framed")
        sender.link.send(whole[:1000])
        producer.flush()
        await world.quiet(0.5)  # the first part reaches the gateway alone
        sender.link.send(whole[1000:])
        sender.link.advance()
        producer.flush()
        after = [(f"after-{i}", "a" * 50) for i in range(5)]
        await send_all(world, producer, sender, after, presettled=False)
        await world.until(lambda: sender.accepted() == 6, what="all accepted")
        consumer = await world.client("gw")
        receiver = consumer.receiver("work.frames", credit=10)
        counts = await receive_ids(world, receiver, 6)
        assert counts == Counter(["framed"] + [message_id for message_id, _ in after])
        assert receiver.received[0][0].body == "f" * 5000
        await world.close()

    run(play)


def test_an_aborted_transfer_is_dropped_and_the_next_crosses(tmp_path):
    """An aborted delivery is discarded (§2.6.14); the link goes on."""
    async def play():
        world = await gateway_world(tmp_path)
        producer = await world.client("gw")
        sender = producer.sender("work.aborts")
        await world.until(lambda: sender.credit > 1, what="credit")
        aborted = sender.link.delivery("aborted")
        sender.link.send(encoded("x" * 5000, "aborted")[:1000])
        producer.flush()
        await world.quiet(0.5)
        aborted.abort()
        producer.flush()
        await send_all(world, producer, sender, [("kept", "k")], presettled=False)
        await world.until(lambda: sender.accepted() == 1, what="the next accepted")
        consumer = await world.client("gw")
        receiver = consumer.receiver("work.aborts", credit=5)
        assert await receive_ids(world, receiver, 1) == Counter(["kept"])
        assert sender.closed_with is None
        await world.close()

    run(play)


def test_a_message_over_the_limit_is_refused_by_name_and_others_go_on(tmp_path):
    async def play():
        world = await gateway_world(tmp_path)
        producer = await world.client("gw")
        sender = producer.sender("work.limit")
        await send_all(world, producer, sender, [("big", "b" * 400_000)], presettled=False)
        await world.until(lambda: sender.closed_with, what="the link refused")
        assert sender.closed_with == "amqp:link:message-size-exceeded"
        other = await world.client("gw")
        second = other.sender("work.limit")
        await send_all(world, other, second, [("fine", "f" * 100)], presettled=False)
        await world.until(lambda: second.accepted() == 1, what="another sender served")
        await world.close()

    run(play)


def test_a_sender_gets_at_most_a_window_of_the_primarys_credit_and_never_stalls(tmp_path):
    """The primary grants 1,000; the gateway's window is 10 messages held for it (§2.6.7),
    fixed here (``producer_window_growth = 1``; its growth: test_producer_window.py)."""
    async def play():
        world = World(tmp_path)
        await world.node("primary")
        await world.node("gw", rules=[PROXY_RULE], queues={"credit_window": 10,
                                                           "producer_window_growth": 1})
        producer = await world.client("gw")
        sender = producer.sender("work.window")
        await world.until(lambda: sender.credit > 0, what="credit")
        upstream_credit = [f["link-credit"] for f in world.frames("primary", "gw", "flow")]
        assert max(upstream_credit) >= 1000
        most, sent = 0, 0
        while sent < 200:  # send whatever credit the client has, as a client does
            await world.until(lambda: sender.credit > 0, what=f"credit again after {sent} sent")
            most = max(most, sender.credit)
            burst = sender.credit
            for _ in range(burst):
                sender.send(f"w{sent}", message_id=f"w{sent}", flush=False)
                sent += 1
            producer.flush()
        await world.until(lambda: sender.accepted() == sent, what="every message accepted")
        assert most <= 10
        consumer = await world.client("gw")
        receiver = consumer.receiver("work.window", credit=sent)
        counts = await receive_ids(world, receiver, sent)
        assert counts == Counter(f"w{i}" for i in range(sent))
        await world.close()

    run(play)


def test_the_c_fast_path_is_built():
    """The optional extension built (pyproject.toml): a failed build would only show as a slower node."""
    if os.environ.get("FEDGATE_NO_FASTPATH"):
        pytest.skip("FEDGATE_NO_FASTPATH is set: the Python path is under test")
    assert engine.fastpath_loaded


@pytest.mark.timeout(120)
def test_the_same_playbooks_pass_on_the_python_path():
    if os.environ.get("FEDGATE_NO_FASTPATH"):
        pytest.skip("already on the Python path")
    here = Path(__file__).parent
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(here / "test_proxy_relay.py"),
         str(here / "test_playbooks.py"), str(here / "test_credit_enforced.py"),
         str(here / "test_memory_bounds.py")],
        env={**os.environ, "FEDGATE_NO_FASTPATH": "1"}, capture_output=True, text=True, timeout=110)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert " passed" in result.stdout and "skipped" in result.stdout
