"""A proxied sender's window adapts to its primary (issue #36).

The gateway holds at most a window of a client's messages for the primary (in flight,
or waiting for its credit: ``proxy.links.proxy_producer``). The window starts at
``[queues] credit_window``, doubles while the client waits on it and the primary keeps
up, halves when the primary does not, never passes ``producer_window_growth`` times
``credit_window`` nor, above ``credit_window``, its bound in bytes (a quarter of
``[limits] max_memory`` here), and never takes more than the primary's own credit.
Each playbook sends whatever credit the client has, as a client does, and checks that
every message arrives once, that a receiver's drain through the gateway is still
answered, and what the client was given along the way.
"""

from __future__ import annotations

from collections import Counter

import pytest

from playbook import World, run
from proxy.links.proxy_producer import ProxyProducer

pytestmark = pytest.mark.timeout(60)

PROXY_RULE = {"name": "work", "match": "work.#", "kind": "proxy", "primary": "amqp://primary:5672"}


def producer_of(node) -> ProxyProducer:
    found = [endpoint for handler in node.broker.handlers.values()
             for endpoint in handler.links.values() if isinstance(endpoint, ProxyProducer)]
    assert len(found) == 1, found
    return found[0]


def held_bytes(producer: ProxyProducer) -> int:
    """Bytes the gateway keeps for the primary: in flight (for a replay) and waiting."""
    return (sum(len(payload) for payload, _ in producer.inflight.values())
            + sum(len(payload) for payload, _ in producer.pending))


class Sending:
    """A client that sends whatever credit it has; records what the gateway gave and held."""

    def __init__(self, world, client, sender, producer, body: str) -> None:
        self.world, self.client, self.sender, self.producer = world, client, sender, producer
        self.body = body
        self.sent = 0
        self.most_credit = 0
        self.most_outstanding = 0  # sent, no outcome yet: what the gateway holds for us
        self.most_held_bytes = 0
        self.windows: list[int] = []

    async def burst(self, what: str) -> int:
        await self.world.until(lambda: self.sender.credit > 0, what=f"credit ({what}, {self.sent} sent)")
        credit = self.sender.credit
        self.most_credit = max(self.most_credit, credit)
        for _ in range(credit):
            self.sender.send(self.body, message_id=f"m{self.sent}", flush=False)
            self.sent += 1
        self.client.flush()
        self.note()
        return credit

    def note(self) -> None:
        outstanding = self.sent - len(self.sender.outcomes)
        self.most_outstanding = max(self.most_outstanding, outstanding)
        self.most_held_bytes = max(self.most_held_bytes, held_bytes(self.producer))
        self.windows.append(self.producer.window)

    async def until_window(self, predicate, what: str, most: int = 20_000) -> None:
        while not predicate(self.producer.window):
            assert self.sent < most, f"{what}: windows {self.windows[-20:]}"
            await self.burst(what)

    async def all_accepted(self) -> None:
        await self.world.until(lambda: self.sender.accepted() == self.sent,
                               what=f"all {self.sent} accepted")


async def receive_all_then_drain(world, node: str, address: str, count: int) -> None:
    """Every message once, through the gateway; then a drain is answered (§2.6.7)."""
    consumer = await world.client(node)
    receiver = consumer.receiver(address, credit=1000)
    while len(receiver.received) < count:
        before = len(receiver.received)
        await world.until(lambda: len(receiver.received) > before, what=f"messages ({before} of {count})")
        receiver.settle()
        if receiver.credit < 500:
            receiver.flow(1000 - receiver.credit)
    await world.quiet(0.5)  # and no more
    ids = Counter(message.id for message, _ in receiver.received)
    assert ids == Counter(f"m{i}" for i in range(count))
    receiver.drain(0)
    await world.until(lambda: receiver.credit == 0, timeout=5, what="the drain answered")


def test_the_window_grows_while_the_primary_keeps_up(tmp_path):
    async def play():
        world = World(tmp_path)
        await world.node("primary")
        await world.node("gw", rules=[PROXY_RULE],
                         queues={"credit_window": 10, "producer_window_growth": 8})
        client = await world.client("gw")
        sender = client.sender("work.grow")
        await world.until(lambda: sender.credit > 0, what="credit")
        sending = Sending(world, client, sender, producer_of(world.nodes["gw"]), "g" * 100)
        assert sending.producer.window == 10
        await sending.until_window(lambda w: w == 80, "the window grown to 8 x 10")
        for _ in range(20):  # and it stays at its bound
            await sending.burst("at the bound")
        await sending.all_accepted()
        assert max(sending.windows) == 80
        assert sending.most_outstanding <= 80 and sending.most_credit <= 80
        await receive_all_then_drain(world, "gw", "work.grow", sending.sent)
        await world.close()

    run(play)


def test_a_fixed_window_does_not_grow(tmp_path):
    async def play():
        world = World(tmp_path)
        await world.node("primary")
        await world.node("gw", rules=[PROXY_RULE],
                         queues={"credit_window": 10, "producer_window_growth": 1})
        client = await world.client("gw")
        sender = client.sender("work.fixed")
        await world.until(lambda: sender.credit > 0, what="credit")
        sending = Sending(world, client, sender, producer_of(world.nodes["gw"]), "f" * 100)
        for _ in range(100):
            await sending.burst("fixed window")
        await sending.all_accepted()
        assert set(sending.windows) == {10} and sending.most_outstanding <= 10
        await receive_all_then_drain(world, "gw", "work.fixed", sending.sent)
        await world.close()

    run(play)


def test_the_window_never_takes_more_than_the_primarys_credit(tmp_path):
    async def play():
        world = World(tmp_path)
        await world.node("primary", queues={"credit_window": 25})  # the primary grants 25
        await world.node("gw", rules=[PROXY_RULE],
                         queues={"credit_window": 10, "producer_window_growth": 8})
        client = await world.client("gw")
        sender = client.sender("work.primary-credit")
        await world.until(lambda: sender.credit > 0, what="credit")
        sending = Sending(world, client, sender, producer_of(world.nodes["gw"]), "p" * 100)
        for _ in range(300):
            await sending.burst("behind a primary granting 25")
        await sending.all_accepted()
        assert sending.most_outstanding <= 25 and sending.most_credit <= 25
        await receive_all_then_drain(world, "gw", "work.primary-credit", sending.sent)
        await world.close()

    run(play)


def test_the_window_above_credit_window_is_bounded_in_bytes(tmp_path):
    """max_memory 400 KB: 100 KB of 1 KB messages at most above credit_window (10)."""
    async def play():
        world = World(tmp_path)
        await world.node("primary")
        await world.node("gw", rules=[PROXY_RULE], limits={"max_memory": 400_000},
                         queues={"credit_window": 10, "producer_window_growth": 64})
        client = await world.client("gw")
        sender = client.sender("work.bytes")
        await world.until(lambda: sender.credit > 0, what="credit")
        sending = Sending(world, client, sender, producer_of(world.nodes["gw"]), "b" * 1000)
        for _ in range(300):
            await sending.burst("bounded in bytes")
        await sending.all_accepted()
        size = sending.producer.largest
        assert 1000 < size < 1100
        assert sending.most_outstanding > 10  # it grew ...
        assert sending.most_held_bytes <= 100_000  # ... within its bytes
        assert sending.most_outstanding <= 100_000 // size
        assert max(sending.windows) <= 2 * (100_000 // size)  # the bytes bound the growth
        await receive_all_then_drain(world, "gw", "work.bytes", sending.sent)
        await world.close()

    run(play, wall_limit=30.0)  # 300 bursts: 6-10 s of real time on 2 busy cores


def test_the_window_shrinks_when_the_primary_stops_keeping_up(tmp_path):
    """The primary stops reading the gateway's connection for a while: what waits to be
    written to it (1 KB messages, a window of 80) passes max_output_buffer (16 KB), and the
    window halves."""
    async def play():
        world = World(tmp_path, socket_buffer=8192)
        await world.node("primary")
        await world.node("gw", rules=[PROXY_RULE], limits={"max_output_buffer": 16384},
                         queues={"credit_window": 10, "producer_window_growth": 8})
        client = await world.client("gw")
        sender = client.sender("work.shrink")
        await world.until(lambda: sender.credit > 0, what="credit")
        sending = Sending(world, client, sender, producer_of(world.nodes["gw"]), "s" * 100)
        await sending.until_window(lambda w: w == 80, "grown while the primary keeps up")
        await sending.all_accepted()
        sending.body = "S" * 1000
        upstream = [p.server for p in world.network.pipes
                    if p.client_host == "gw" and p.server_host == "primary"]
        for transport in upstream:
            transport.pause_reading()
        for _ in range(20):  # the gateway takes what the window allows, no more
            if sending.sender.credit:
                await sending.burst("the primary not reading")
            await world.quiet(0.2)
        sending.note()
        assert sending.sender.credit == 0 and sending.most_outstanding <= 80
        for transport in upstream:
            transport.resume_reading()
        await sending.until_window(lambda w: w < 80, "the window shrunk")
        assert min(sending.windows[-1:]) >= 10
        await sending.all_accepted()
        await receive_all_then_drain(world, "gw", "work.shrink", sending.sent)
        await world.close()

    run(play)
