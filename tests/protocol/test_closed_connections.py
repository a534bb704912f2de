"""A closed client connection leaves nothing behind (issue #21).

Before, every closed connection stayed reachable from the broker's shared
event pump (its table held the handler, the handler the protocol, the protocol
the proton pipe): about 27 KB per connection for the node's whole life, so a
gateway with steady connection churn grew without end. Connections here are
real ones (a node built by the factory, clients over the in-memory network),
each attaching a receiver and a sender, sending one message, then closing.
"""

from __future__ import annotations

import gc
import tracemalloc

import pytest

from playbook import World, run
from proxy.amqp.connection import ServerConnection
from proxy.broker.handler import ClientHandler
from proxy.server import AmqpProtocol

pytestmark = pytest.mark.timeout(60)


async def churn(world: World, node: str, cycles: int) -> None:
    for _ in range(cycles):
        client = await world.client(node)
        client.receiver("churn", credit=1)
        sender = client.sender("churn")
        await world.until(lambda: sender.credit > 0)
        sender.send("x")
        await world.until(lambda: sender.accepted() == 1)
        client.connection.close()
        client.flush()
        await world.quiet(0.01)
        client.transport_io.close()
        await world.until(lambda: client.lost)
    world.clients.clear()
    await world.quiet(0.5)
    gc.collect()


def live(cls) -> int:
    return sum(1 for o in gc.get_objects() if isinstance(o, cls))


def test_closed_connections_are_freed(tmp_path):
    async def play():
        world = World(tmp_path)
        world.network.taps.clear()  # keep no frames: only the node's memory is measured
        node = await world.node("a")
        await churn(world, "a", 50)  # warm: caches, pools, the queue
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            await churn(world, "a", 400)
            grown = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        assert not node.connections and not node.broker.handlers
        assert not node.broker.client_events._handlers  # the shared pump forgets them
        for cls in (ClientHandler, AmqpProtocol, ServerConnection):
            assert live(cls) <= 1, cls.__name__  # at most the last one, not yet collected
        # 400 connections at ~27 KB each were ~10.8 MB; now what is left is noise
        assert grown < 400 * 1024, f"{grown / 400:.0f} bytes per closed connection"
        await world.close()

    run(play)
