"""Every drain request is answered, on every kind of sending link the node has (issue #33).

A receiver's drain (AMQP 1.0 §2.6.7) asks the sender to send what it has,
then use up the credit left and send its flow state back. go-amqp's
``DrainCredit`` waits for that flow, also when it drains with no credit at
all (proton, as a sender, sends nothing then: ``proxy.amqp.drain``). Each
playbook drains (a) at credit 0 on an empty queue, (b) after taking 3 of 10
credits' worth, (c) after every credit was used by transfers, and checks that
one flow with ``drain`` set came back for the link within 100 ms, with no
credit left and nothing lost.
"""

from __future__ import annotations

import asyncio

import pytest

from playbook import World, run

pytestmark = pytest.mark.timeout(30)

PROXY_RULE = {"name": "work", "match": "work.#", "kind": "proxy", "primary": "amqp://primary:5672"}
SHARED_RULE = {**PROXY_RULE, "mirror_auto_delete": True}
PEERS = {"a": "amqp://a:5672", "b": "amqp://b:5672"}
FRAGMENT_RULE = {"name": "fq", "match": "fq.#", "kind": "fragmented", "fragments": ["a", "b"]}


async def local(world):
    await world.node("a")
    return "a", "a", "q", {}


async def browser(world):
    await world.node("a")
    return "a", "a", "q", {"browse": True}


async def proxy(world):
    await world.node("primary")
    await world.node("gw", rules=[PROXY_RULE])
    return "gw", "primary", "work.q", {}


async def shared(world):
    await world.node("primary")
    await world.node("gw", rules=[SHARED_RULE])
    return "gw", "primary", "work.q", {}


async def fragment(world):
    await world.node("a", peers=PEERS, rules=[FRAGMENT_RULE])
    await world.node("b", peers=PEERS, rules=[FRAGMENT_RULE])
    return "a", "a", "fq.q", {}


KINDS = {"local queue consumer": local, "browser": browser, "proxy consumer": proxy,
         "shared proxy consumer": shared, "fragment consumer": fragment}


def answers(world: World, node: str, client: str, link_name: str) -> list:
    """Flows with drain set that ``node`` sent ``client`` for the link called ``link_name``."""
    handles = {f["handle"] for f in world.frames(node, client, "attach") if f["name"] == link_name}
    return [f for f in world.frames(node, client, "flow")
            if f["handle"] in handles and f["drain"]]


async def fill(world: World, node: str, address: str, count: int) -> None:
    producer = await world.client(node, "producer")
    sender = producer.sender(address)
    await world.until(lambda: sender.credit >= count, what="producer credit")
    for i in range(count):
        sender.send(f"m{i}", message_id=i)
    await world.until(lambda: sender.accepted() == count, what="stored")


async def drain_and_wait(world: World, node: str, receiver, before: int) -> float:
    loop = asyncio.get_running_loop()
    started = loop.time()
    receiver.drain(0)
    name = receiver.link.name
    await world.until(lambda: len(answers(world, node, "consumer", name)) > before, timeout=5.0,
                      what="the drain answered")
    return loop.time() - started


@pytest.mark.parametrize("kind", KINDS)
def test_a_drain_at_credit_0_on_an_empty_queue_is_answered_at_once(tmp_path, kind):
    async def play():
        world = World(tmp_path)
        node, _, address, options = await KINDS[kind](world)
        client = await world.client(node, "consumer")
        receiver = client.receiver(address, **options)
        await world.until(lambda: world.frames(node, "consumer", "attach"), what="attached")
        await world.quiet(0.2)
        took = await drain_and_wait(world, node, receiver, 0)
        assert took < 0.1
        flow = answers(world, node, "consumer", receiver.link.name)[-1]
        assert flow["link-credit"] == 0 and receiver.credit == 0
        await world.quiet(0.5)
        assert len(answers(world, node, "consumer", receiver.link.name)) == 1  # once per request
        await world.close()

    run(play)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("credit,waiting", [(10, 3), (5, 5)], ids=["credit-left", "credit-used-up"])
def test_a_drain_after_messages_took_some_or_all_credit_is_answered(tmp_path, kind, credit, waiting):
    async def play():
        world = World(tmp_path)
        node, home, address, options = await KINDS[kind](world)
        await fill(world, home, address, waiting)
        client = await world.client(node, "consumer")
        receiver = client.receiver(address, credit=credit, **options)
        await world.until(lambda: len(receiver.received) == waiting, what="the waiting messages")
        await world.quiet(0.2)
        before = len(answers(world, node, "consumer", receiver.link.name))
        took = await drain_and_wait(world, node, receiver, before)
        assert took < 0.1
        assert receiver.credit == 0
        assert [m.id for m, _ in receiver.received] == list(range(waiting))  # each once, in order
        receiver.settle()
        await world.quiet(0.5)
        assert len(receiver.received) == waiting
        await world.close()

    run(play)
