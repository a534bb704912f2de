"""Consumers with JMS selectors on a fragmented queue (docs/fragments.md, "Selectors"):
playbooks on a virtual clock with three member nodes (``tests/support/playbook.py``).

A consumer with a selector is served from its node's fragment and, when that holds nothing
it selects, steals with its selector from the other members: every selected message comes
once, what no consumer selects stays in its fragment, and a plain consumer takes it after.
"""

from __future__ import annotations

from collections import Counter

import pytest
from proton import Delivery

from playbook import World, run

PEERS = {"a": "amqp://a:5672", "b": "amqp://b:5672", "c": "amqp://c:5672"}
RULE = {"name": "fq", "match": "fq.#", "kind": "fragmented", "fragments": ["a", "b", "c"]}

pytestmark = pytest.mark.timeout(30)


async def members(world: World, names=("a", "b", "c")) -> dict:
    return {name: await world.node(name, peers=PEERS, rules=[RULE]) for name in names}


async def fill(world: World, node: str, address: str, messages: dict) -> None:
    """``messages``: id -> colour, sent by one producer on ``node`` and accepted."""
    client = await world.client(node)
    sender = client.sender(address)
    await world.until(lambda: sender.credit > 0, what="credit to fill")
    for mid, colour in messages.items():
        sender.send(mid, properties={"colour": colour})
    await world.until(lambda: sender.accepted() == len(messages), what="fill accepted")


def coloured(prefix: str, count: int) -> dict:
    return {f"{prefix}{i}": ("red", "blue", "green")[i % 3] for i in range(count)}


def depth(node, address: str) -> int:
    return len(node.queues.lookup_or_create(address).messages)


def test_a_selector_steals_only_what_it_selects_and_the_rest_waits_for_a_plain_consumer(tmp_path):
    async def play():
        world = World(tmp_path)
        nodes = await members(world)
        on_b, on_c = coloured("b", 12), coloured("c", 9)
        await fill(world, "b", "fq.s", on_b)
        await fill(world, "c", "fq.s", on_c)
        red = {i for i, colour in {**on_b, **on_c}.items() if colour == "red"}
        client = await world.client("a")
        reds = client.receiver("fq.s", credit=50, selector="colour = 'red'")
        await world.until(lambda: set(reds.bodies()) == red, what="every red message")
        reds.settle(Delivery.ACCEPTED)
        await world.quiet(3.0)  # retries come and go: nothing more is red
        assert Counter(reds.bodies()) == Counter(red)
        # the rest stayed at home, nothing was moved or held for nobody
        assert depth(nodes["b"], "fq.s") == 8 and depth(nodes["c"], "fq.s") == 6
        (group,) = nodes["a"].describe_fragments()
        assert group["stolen_in"] == len(red) and group["returned_home"] == 0
        rest = client.receiver("fq.s", credit=50)
        others = set(on_b) | set(on_c)
        await world.until(lambda: set(rest.bodies()) == others - red, what="the rest, plainly")
        rest.settle(Delivery.ACCEPTED)
        assert len(rest.bodies()) == len(others - red)
        await world.until(lambda: depth(nodes["b"], "fq.s") + depth(nodes["c"], "fq.s") == 0)
        await world.close()

    run(play)


def test_local_messages_it_does_not_select_do_not_stop_a_steal(tmp_path):
    async def play():
        world = World(tmp_path)
        nodes = await members(world, ("a", "b"))
        await fill(world, "a", "fq.l", {f"a{i}": "blue" for i in range(5)})
        await fill(world, "b", "fq.l", {"b0": "red", "b1": "blue", "b2": "red"})
        client = await world.client("a")
        reds = client.receiver("fq.l", credit=10, selector="colour = 'red'")
        await world.until(lambda: sorted(reds.bodies()) == ["b0", "b2"], what="b's reds")
        assert reds.bodies() == ["b0", "b2"]  # one producer: its order
        reds.settle(Delivery.ACCEPTED)
        await world.until(lambda: depth(nodes["b"], "fq.l") == 1, what="settled at home")
        assert depth(nodes["a"], "fq.l") == 5
        await world.close()

    run(play)


def test_consumers_with_different_selectors_each_get_theirs_once(tmp_path):
    async def play():
        world = World(tmp_path)
        nodes = await members(world)
        on_b, on_c = coloured("b", 30), coloured("c", 30)
        await fill(world, "b", "fq.d", on_b)
        await fill(world, "c", "fq.d", on_c)
        everything = {**on_b, **on_c}
        client = await world.client("a")
        by_colour = {colour: client.receiver("fq.d", credit=4, selector=f"colour = '{colour}'")
                     for colour in ("red", "blue")}

        def settle_and_top_up() -> bool:
            for receiver in by_colour.values():
                if receiver.credit == 0:
                    receiver.settle(Delivery.ACCEPTED)
                    receiver.flow(4)
            return all(len(r.bodies()) == 20 for r in by_colour.values())

        await world.until(settle_and_top_up, what="20 of each colour, 4 at a time")
        for colour, receiver in by_colour.items():
            assert sorted(receiver.bodies()) == sorted(i for i, c in everything.items() if c == colour)
            receiver.settle(Delivery.ACCEPTED)
        await world.until(lambda: depth(nodes["b"], "fq.d") + depth(nodes["c"], "fq.d") == 20)
        await world.close()

    run(play)


def test_a_selective_consumer_gone_with_stolen_messages_gives_them_back(tmp_path):
    async def play():
        world = World(tmp_path)
        nodes = await members(world, ("a", "b"))
        await fill(world, "b", "fq.g", {f"b{i}": "red" for i in range(6)})
        client = await world.client("a")
        reds = client.receiver("fq.g", credit=3, selector="colour = 'red'")
        await world.until(lambda: len(reds.bodies()) == 3, what="three stolen")
        reds.link.close()  # unsettled: home takes them back (delivery-count + 1)
        client.flush()
        await world.until(lambda: depth(nodes["b"], "fq.g") == 6, what="back at home")
        other = await world.client("b")
        plain = other.receiver("fq.g", credit=10)
        await world.until(lambda: len(plain.bodies()) == 6, what="all six at home")
        assert sorted(plain.bodies()) == [f"b{i}" for i in range(6)]
        await world.close()

    run(play)


def test_a_selector_on_a_node_without_a_fragment_goes_to_a_member_that_steals_for_it(tmp_path):
    """Node d has no fragment: its consumer is proxied to a member, selector and all (the
    member applies it, and steals with it from the others)."""
    rule = {**RULE, "fragments": ["a", "b"]}
    peers = {**PEERS, "d": "amqp://d:5672"}

    async def play():
        world = World(tmp_path)
        nodes = {n: await world.node(n, peers=peers, rules=[rule]) for n in "abd"}
        on_a, on_b = coloured("a", 9), coloured("b", 9)
        await fill(world, "a", "fq.e", on_a)
        await fill(world, "b", "fq.e", on_b)
        red = {i for i, colour in {**on_a, **on_b}.items() if colour == "red"}
        client = await world.client("d")
        reds = client.receiver("fq.e", credit=20, selector="colour = 'red'")
        await world.until(lambda: set(reds.bodies()) == red, what="every red, through a member")
        reds.settle(Delivery.ACCEPTED)
        await world.quiet(2.0)
        assert sorted(reds.bodies()) == sorted(red)
        assert depth(nodes["a"], "fq.e") + depth(nodes["b"], "fq.e") == 12
        await world.close()

    run(play)
