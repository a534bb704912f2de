"""Random mixes of message sizes through real node processes over TCP (issue #33).

The same mixes as ``tests/protocol/test_large_messages_random.py`` (sizes 1 B
to 16 MiB in random order, 1-3 links on 1-2 sessions of one connection, a
client whose socket reading stops and starts at random), here over real
sockets into a ``fedgate serve`` process, so the kernel's socket buffers and
the node's TCP transport are the real ones: on a local queue of one process,
and on a node with ``workers = 2`` (each queue owned by one worker: a link to
a queue of the other worker is forwarded over the workers' Unix socket).
Every message arrives exactly once, in order per link, whole; the client's
close is answered. The seed is in the test's id (``FEDGATE_LARGE_SEED``,
``FEDGATE_LARGE_RUNS``: see ``tests/support/large_mix.py``).
"""

from __future__ import annotations

import asyncio
import random

import pytest
from proton import Connection

from large_mix import draw, runs, seeds
from playbook import PlaybookClient

pytestmark = pytest.mark.timeout(180)

LAYOUTS = {"one process": {}, "workers = 2": {"workers": 2}}


async def until(predicate, timeout: float, what: str):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        await asyncio.sleep(0.005)


async def connect(port: int, name: str) -> PlaybookClient:
    _, client = await asyncio.get_running_loop().create_connection(
        lambda: PlaybookClient(name), "127.0.0.1", port)
    await until(lambda: client.connection.state & Connection.REMOTE_ACTIVE, 10, f"{name} open")
    return client


async def read_at_random_speeds(client, rng: random.Random, done) -> None:
    transport = client.transport_io
    while not done():
        transport.pause_reading()
        await asyncio.sleep(rng.uniform(0, 0.03))
        transport.resume_reading()
        await asyncio.sleep(rng.uniform(0, 0.01))
    transport.resume_reading()


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("seed", seeds(runs(1)))
def test_a_random_mix_arrives_whole_once_and_in_order_over_tcp(start_node, layout, seed):
    mix = draw(seed, budget=30_000_000)
    rng = random.Random(seed)
    node = start_node({"node": LAYOUTS[layout]})
    prefix = f"large{seed}"

    async def main():
        producer = await connect(node.port, "producer")
        senders = [producer.sender(f"{prefix}.q{index}") for index in range(mix.links)]
        for n, (index, size) in enumerate(mix.sizes):
            sender = senders[index]
            await until(lambda: sender.credit > 0, 30, "producer credit")
            sender.send(b"." * size, message_id=f"m{n}")
        for index, sender in enumerate(senders):
            await until(lambda: sender.accepted() == len(mix.per_link(index)), 60,
                        f"stored (seed {seed})")

        client = await connect(node.port, "consumer")
        sessions = [None] + [client.new_session() for _ in range(mix.sessions - 1)]
        receivers = [client.receiver(f"{prefix}.q{index}", credit=rng.randint(1, 20),
                                     session=sessions[index % mix.sessions])
                     for index in range(mix.links)]
        wanted = [mix.per_link(index) for index in range(mix.links)]

        def complete() -> bool:
            for receiver in receivers:
                if receiver.credit == 0:
                    receiver.settle()
                    receiver.flow(rng.randint(1, 20))
            return all(len(r.received) >= len(w) for r, w in zip(receivers, wanted))

        reader = asyncio.ensure_future(read_at_random_speeds(client, rng, complete))
        try:
            await until(complete, 120, f"every message (seed {seed})")
        finally:
            await reader
        for receiver, expected in zip(receivers, wanted):
            got = [(m.id, len(m.body)) for m, _ in receiver.received]
            assert got == expected, f"seed {seed}: {got[:5]} != {expected[:5]}"
            receiver.settle()
        for endpoint in (client, producer):
            endpoint.connection.close()
            endpoint.flush()
        await until(lambda: client.connection.state & Connection.REMOTE_CLOSED, 10,
                    f"close answered (seed {seed})")
        client.transport_io.close()
        producer.transport_io.close()

    asyncio.run(main())
