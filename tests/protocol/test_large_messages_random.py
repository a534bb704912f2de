"""Random mixes of message sizes through a node, a client reading at random speeds (issue #33).

Each run draws a mix from its seed (``tests/support/large_mix.py``: sizes 1 B
to 16 MiB in random order, 1-3 receiving links on 1-2 sessions of one
connection), stores it, then a consumer whose socket reading stops and starts
at random takes it, with a random credit per link and a random socket buffer,
on a local queue, through a proxy rule, and on a fragmented queue (half the
mix on each fragment, the consumer on one of them). Every message must
arrive exactly once, in order per link, whole; then the client's close is
answered. The seed is in the test's id: ``FEDGATE_LARGE_SEED=N`` runs that
mix again, ``FEDGATE_LARGE_RUNS=N`` runs more (``make fuzz-large``).
"""

from __future__ import annotations

import asyncio
import random

import pytest
from proton import Connection

from large_mix import draw, runs, seeds
from playbook import World, run

pytestmark = pytest.mark.timeout(120)

PROXY_RULE = {"name": "work", "match": "work.#", "kind": "proxy", "primary": "amqp://primary:5672"}
PEERS = {"a": "amqp://a:5672", "b": "amqp://b:5672"}
FRAGMENT_RULE = {"name": "fq", "match": "fq.#", "kind": "fragmented", "fragments": ["a", "b"]}


async def local(world):
    await world.node("a")
    return "a", lambda index: ("a", f"q{index}")


async def proxy(world):
    await world.node("primary")
    await world.node("gw", rules=[PROXY_RULE])
    return "gw", lambda index: ("primary", f"work.q{index}")


async def fragments(world):
    await world.node("a", peers=PEERS, rules=[FRAGMENT_RULE])
    await world.node("b", peers=PEERS, rules=[FRAGMENT_RULE])
    # stored on both fragments (by link), taken through a: local first, then stolen from b
    return "a", lambda index: ("ab"[index % 2], f"fq.q{index}")


KINDS = {"local queue": local, "proxy rule": proxy, "fragmented queue": fragments}


async def store(world: World, mix, where) -> None:
    producers = {}
    for index in range(mix.links):
        node, address = where(index)
        if node not in producers:
            producers[node] = await world.client(node, f"producer-{node}")
    senders = {index: producers[where(index)[0]].sender(where(index)[1]) for index in range(mix.links)}
    for n, (index, size) in enumerate(mix.sizes):
        sender = senders[index]
        await world.until(lambda: sender.credit > 0, what="producer credit")
        sender.send(b"%d" % n + b"." * (size - len(b"%d" % n)) if size > 8 else b"x" * size,
                    message_id=f"m{n}")
    for index, sender in senders.items():
        await world.until(lambda: sender.accepted() == len(mix.per_link(index)), what="stored")


async def read_at_random_speeds(client, rng: random.Random, done) -> None:
    """Stop and start reading the socket at random (virtual) moments until ``done()``."""
    transport = client.transport_io
    while not done():
        transport.pause_reading()
        await asyncio.sleep(rng.uniform(0, 0.05))
        transport.resume_reading()
        await asyncio.sleep(rng.uniform(0, 0.02))
    transport.resume_reading()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("seed", seeds(runs(1)))
def test_a_random_mix_arrives_whole_once_and_in_order(tmp_path, kind, seed):
    mix = draw(seed)
    rng = random.Random(seed)

    async def play():
        world = World(tmp_path, socket_buffer=rng.choice([64 * 1024, 256 * 1024, 1 << 20, 4 << 20]))
        node, where = await KINDS[kind](world)
        await store(world, mix, where)
        client = await world.client(node, "consumer")
        sessions = [None] + [client.new_session() for _ in range(mix.sessions - 1)]
        receivers = [client.receiver(where(index)[1], credit=rng.randint(1, 20),
                                     session=sessions[index % mix.sessions])
                     for index in range(mix.links)]
        wanted = [mix.per_link(index) for index in range(mix.links)]

        def complete() -> bool:
            for receiver in receivers:  # keep credit coming, as a client does
                if receiver.credit == 0 and receiver.link.state & receiver.link.LOCAL_ACTIVE:
                    receiver.settle()
                    receiver.flow(rng.randint(1, 20))
            return all(len(r.received) >= len(w) for r, w in zip(receivers, wanted))

        reader = asyncio.ensure_future(read_at_random_speeds(client, rng, complete))
        await world.until(complete, timeout=120.0, what=f"every message (seed {seed})")
        await reader
        for receiver, expected in zip(receivers, wanted):
            got = [(m.id, len(m.body)) for m, _ in receiver.received]
            assert got == expected, f"seed {seed}: {got[:5]} ... != {expected[:5]} ..."
            receiver.settle()
        client.connection.close()
        client.flush()
        await world.until(lambda: client.connection.state & Connection.REMOTE_CLOSED,
                          what=f"close answered (seed {seed})")
        await world.close()

    run(play)
