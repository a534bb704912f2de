"""Proxy, upstream and fragment behaviour without sockets: playbooks on a virtual clock.

Each test builds its nodes with the factory ``fedgate serve`` uses, wired by an
in-memory network (``tests/support/playbook.py``): events in (clients attach,
grant credit, send; the network cuts or loses a host), frames out (what
crossed each wire) and message sets at the end. Every wait is bounded in
virtual time; reconnect backoffs and retry timers take no wall time.
"""

from __future__ import annotations

from collections import Counter

import pytest
from proton import Delivery

from playbook import World, run

PROXY_RULE = {"name": "work", "match": "work.#", "kind": "proxy", "primary": "amqp://primary:5672"}
PEERS = {"a": "amqp://a:5672", "b": "amqp://b:5672"}
FRAGMENT_RULE = {"name": "fq", "match": "fq.#", "kind": "fragmented", "fragments": ["a", "b"]}

pytestmark = pytest.mark.timeout(20)


def depth(node, address: str) -> tuple[int, int]:
    """(messages waiting, delivered but unsettled) of a local queue."""
    queue = node.queues.lookup_or_create(address)
    return len(queue.messages), queue.unacked


async def fill(world: World, node: str, address: str, bodies: list) -> None:
    """Put ``bodies`` on ``address`` at ``node`` and wait until each is accepted."""
    client = await world.client(node)
    sender = client.sender(address)
    await world.until(lambda: sender.credit > 0, what="credit to fill")
    for body in bodies:
        sender.send(body)
    await world.until(lambda: sender.accepted() == len(bodies), what="fill accepted")


async def gateway_and_primary(world: World, **primary_sections):
    primary = await world.node("primary", **primary_sections)
    gateway = await world.node("gw", rules=[PROXY_RULE])
    return gateway, primary


# -- credit -----------------------------------------------------------------------------------
def test_credit_passes_through_and_a_drain_is_answered(tmp_path):
    async def play():
        world = World(tmp_path)
        _, primary = await gateway_and_primary(world)
        await fill(world, "primary", "work.a", [f"m{i}" for i in range(10)])
        client = await world.client("gw")
        receiver = client.receiver("work.a")
        await world.until(lambda: world.frames("primary", "gw", "attach"), what="upstream attach")

        receiver.flow(3)
        await world.until(lambda: len(receiver.received) == 3)
        await world.quiet(1.0)
        # no stuck messages: the primary was never given more credit than the client had
        upstream_flows = world.frames("gw", "primary", "flow")
        assert upstream_flows and max(f["link-credit"] for f in upstream_flows) == 3
        assert len(receiver.received) == 3 and depth(primary, "work.a") == (7, 3)

        receiver.settle(Delivery.ACCEPTED)
        await world.until(lambda: depth(primary, "work.a") == (7, 0), what="settled upstream")

        receiver.drain(20)  # take what there is, then the credit is given back (§2.6.7)
        await world.until(lambda: len(receiver.received) == 10 and receiver.credit == 0)
        assert any(f["drain"] for f in world.frames("gw", "primary", "flow"))
        assert receiver.bodies() == [f"m{i}" for i in range(10)]

        receiver.settle(Delivery.ACCEPTED)
        receiver.drain(5)  # nothing left: the drain is answered at once, credit back to 0
        await world.until(lambda: receiver.credit == 0, what="empty drain answered")
        assert len(receiver.received) == 10
        await world.until(lambda: depth(primary, "work.a") == (0, 0))
        await world.close()

    run(play)


# -- batching ---------------------------------------------------------------------------------
def test_a_bursts_outcomes_cross_the_proxy_in_ranges_both_ways(tmp_path):
    """100 sends in one write and 100 acceptances in one write: each hop settles them with one
    disposition covering first..last (§2.7.6), not one frame per message."""
    async def play():
        world = World(tmp_path)
        _, primary = await gateway_and_primary(world)
        client = await world.client("gw")
        sender = client.sender("work.burst")
        await world.until(lambda: sender.credit >= 100)
        for i in range(100):
            sender.send(f"m{i}", flush=False)
        client.flush()
        await world.until(lambda: sender.accepted() == 100)
        receiver = client.receiver("work.burst", credit=100)
        await world.until(lambda: len(receiver.received) == 100)
        receiver.settle(Delivery.ACCEPTED)
        await world.until(lambda: depth(primary, "work.burst") == (0, 0))
        for source, target in (("gw", "primary"), ("primary", "gw"), ("gw", "client1")):
            assert len(world.frames(source, target, "transfer")) == 100
            ranges = [(f["first"], f["last"] if f["last"] is not None else f["first"])
                      for f in world.frames(source, target, "disposition")]
            assert sum(last - first + 1 for first, last in ranges) == 100, (source, target)
            assert len(ranges) <= 2, (source, target, ranges)
        await world.close()

    run(play)


# -- reconnects -------------------------------------------------------------------------------
def test_sends_lost_with_the_upstream_connection_are_replayed_after_it_reconnects(tmp_path):
    async def play():
        world = World(tmp_path)
        _, primary = await gateway_and_primary(world)
        client = await world.client("gw")
        sender = client.sender("work.b")
        await world.until(lambda: sender.credit > 0)
        for i in range(5):
            sender.send(f"m{i}")
        await world.until(lambda: sender.accepted() == 5)

        world.network.partition("gw", "primary")  # these five go nowhere ...
        for i in range(5, 10):
            sender.send(f"m{i}")
        await world.quiet(0.2)
        world.network.heal("gw", "primary")
        assert world.network.cut("gw", "primary") >= 1  # ... and the connection breaks
        await world.until(lambda: sender.accepted() == 10, what="every send accepted")

        queue = primary.queues.lookup_or_create("work.b")
        counts = Counter(primary_body(m) for m in queue.messages)
        assert set(counts) == {f"m{i}" for i in range(10)}  # nothing lost
        assert sum(counts.values()) - 10 <= 5  # duplicates only among those in flight
        assert not [o for o in sender.outcomes.values() if o != Delivery.ACCEPTED]
        await world.close()

    run(play)


def test_deliveries_lost_with_the_upstream_connection_come_again(tmp_path):
    async def play():
        world = World(tmp_path)
        _, primary = await gateway_and_primary(world)
        await fill(world, "primary", "work.c", [f"m{i}" for i in range(8)])
        client = await world.client("gw")
        receiver = client.receiver("work.c", credit=5)
        await world.until(lambda: len(receiver.received) == 5)
        world.network.cut("gw", "primary")  # five unsettled upstream: the primary takes them back
        await world.until(lambda: depth(primary, "work.c") == (8, 0), what="requeued on the primary")
        receiver.settle(Delivery.ACCEPTED)  # too late: their upstream deliveries are gone
        receiver.flow(20)
        await world.until(lambda: len(receiver.received) == 13, what="redelivered after reconnect")
        counts = Counter(receiver.bodies())
        assert set(counts) == {f"m{i}" for i in range(8)}
        assert sum(counts.values()) - 8 == 5  # the five in flight, counted once more
        receiver.settle(Delivery.ACCEPTED)
        await world.until(lambda: depth(primary, "work.c") == (0, 0))
        await world.close()

    run(play)


# -- refusals ---------------------------------------------------------------------------------
def test_not_found_on_the_primary_reaches_the_client_by_name(tmp_path):
    async def play():
        world = World(tmp_path)
        await gateway_and_primary(world, queues={"auto_create": False})
        client = await world.client("gw")
        receiver = client.receiver("work.missing", credit=1)
        sender = client.sender("work.missing")
        await world.until(lambda: receiver.closed_with and sender.closed_with)
        assert (receiver.closed_with, sender.closed_with) == ("amqp:not-found", "amqp:not-found")
        refused = [f.condition for f in world.frames("primary", "gw", "detach")]
        assert refused.count("amqp:not-found") == 2
        # the gateway and its shared connection go on serving others
        other = await world.client("gw")
        probe = other.receiver("local.q", credit=1)
        await world.quiet(0.5)
        assert probe.closed_with is None
        await world.close()

    run(play)


# -- fragments --------------------------------------------------------------------------------
async def two_fragments(world: World):
    a = await world.node("a", peers=PEERS, rules=[FRAGMENT_RULE])
    b = await world.node("b", peers=PEERS, rules=[FRAGMENT_RULE])
    return a, b


def test_a_consumer_on_an_empty_fragment_steals_from_the_other(tmp_path):
    async def play():
        world = World(tmp_path)
        a, b = await two_fragments(world)
        await fill(world, "b", "fq.x", [f"m{i}" for i in range(6)])
        assert depth(b, "fq.x") == (6, 0)
        client = await world.client("a")
        receiver = client.receiver("fq.x", credit=10)
        await world.until(lambda: len(receiver.received) == 6, what="stolen from b")
        assert receiver.bodies() == [f"m{i}" for i in range(6)]  # one producer: its order
        # a steal is a drain request on a marked link, so no credit stays parked on b
        steal_flows = world.frames("a", "b", "flow")
        assert steal_flows and any(f["drain"] for f in steal_flows)
        receiver.settle(Delivery.ACCEPTED)
        await world.until(lambda: depth(b, "fq.x") == (0, 0), what="settled at home")
        await world.close()

    run(play)


def test_a_peer_cut_off_during_a_steal_loses_nothing(tmp_path):
    async def play():
        world = World(tmp_path)
        a, b = await two_fragments(world)
        await fill(world, "b", "fq.y", [f"m{i}" for i in range(6)])
        client = await world.client("a")
        receiver = client.receiver("fq.y", credit=3)
        await world.until(lambda: len(receiver.received) == 3, what="first steal")
        world.network.cut("a", "b")  # mid-steal: three unsettled at home
        await world.until(lambda: depth(b, "fq.y") == (6, 0), what="b takes its three back")
        receiver.settle(Delivery.ACCEPTED)  # their home deliveries went with the link
        receiver.flow(20)
        await world.until(lambda: len(set(receiver.bodies())) == 6, what="every message")
        counts = Counter(receiver.bodies())
        assert sum(counts.values()) - 6 <= 3  # only the three in flight come twice
        receiver.settle(Delivery.ACCEPTED)
        await world.until(lambda: depth(b, "fq.y") == (0, 0))
        await world.close()

    run(play)


def test_a_peer_gone_during_a_steal_leaves_local_consumers_served(tmp_path):
    async def play():
        world = World(tmp_path)
        a, b = await two_fragments(world)
        await fill(world, "b", "fq.z", [f"b{i}" for i in range(4)])
        client = await world.client("a")
        receiver = client.receiver("fq.z", credit=2)
        await world.until(lambda: len(receiver.received) == 2, what="first steal")
        world.network.kill("b")  # b is gone for good, with what it held
        receiver.settle(Delivery.ACCEPTED)
        receiver.flow(10)
        await fill(world, "a", "fq.z", [f"a{i}" for i in range(3)])
        await world.until(lambda: {"a0", "a1", "a2"} <= set(receiver.bodies()),
                          what="local messages despite the lost peer")
        (group,) = a.describe_fragments()
        assert [(p["member"], p["attached"]) for p in group["peers"]] == [("b", False)]
        receiver.settle(Delivery.ACCEPTED)
        await world.until(lambda: depth(a, "fq.z") == (0, 0))
        world.network.dead.discard("b")
        await world.close()

    run(play)


def primary_body(stored) -> str:
    from proton import Message

    message = Message()
    message.decode(stored.payload)
    return message.body
