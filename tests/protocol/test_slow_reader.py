"""A client that does not read its socket: deliveries stay on the queue, not in the node's buffers.

Before this, a consumer granting much credit and never reading made the node
hand it the whole queue into proton's and the socket's buffers (3 GiB in the
attack of issue #21). Now a connection's output is bounded: a session holding
more than ``[limits] max_output_buffer`` bytes, or a socket past its write
high-water mark, makes that connection's consumers report no credit, so the
messages wait on the queue (the primary's, through a proxy rule); and the node
stops reading a socket it cannot write to. The memory network backs up as TCP
does when a reader stops reading.
"""

from __future__ import annotations

import pytest

from playbook import World, run
from proxy.server import AmqpProtocol

pytestmark = pytest.mark.timeout(60)

BODY = b"x" * 10_000
COUNT = 300
BOUND = 2 * 1024 * 1024  # what may be on the way: buffers of the node and of the pipe


def server_side(world: World, node: str, client_name: str):
    """The node's end of the client's pipe (its transport)."""
    return next(p.server for p in world.network.pipes
                if p.client_host == client_name and p.server_host == node)


async def fill(world: World, node: str, address: str) -> None:
    producer = await world.client(node, "producer")
    sender = producer.sender(address)
    for i in range(COUNT):
        await world.until(lambda: sender.credit > 0, what="producer credit")
        sender.send(BODY, message_id=i)
    await world.until(lambda: sender.accepted() == COUNT, what="all stored")


async def slow_reader_then_reads(world: World, node: str, address: str, waiting) -> None:
    """A consumer with credit for everything that stops reading; then reads; every id once, in order."""
    slow = await world.client(node, "slow")
    slow.transport_io.pause_reading()  # never reads: the pipe backs up as a socket would
    receiver = slow.receiver(address, credit=COUNT * 10)
    await world.quiet(2.0)
    handed_out = COUNT - waiting()
    assert handed_out * len(BODY) <= BOUND, f"{handed_out} of {COUNT} messages left the queue"
    # its input is read on for a while (a leaving client's detach or close is heard), but not
    # for long: it sends on, the node soon stops reading (what it reads makes it write)
    session = slow.new_session()
    for i in range(100):  # attaches need no credit: about 2 KB each, each answered
        link = session.receiver(f"side-{i}-" + "n" * 2000)
        link.source.address = "side"
        link.open()
        slow.flush()
    await world.quiet(1.0)
    assert not server_side(world, node, "slow").is_reading()
    read = server_side(world, node, "slow").protocol.handler.links_held() - 1  # less the receiver
    assert 0 < read * 2000 <= AmqpProtocol.READ_WHILE_BLOCKED + 2 * 2000, read

    other = await world.client(node, "other")  # another client on the node is served meanwhile
    side = other.sender("side")
    await world.until(lambda: side.credit > 0)
    side.send(b"ok")
    await world.until(lambda: side.accepted() == 1, what="another client served")

    slow.transport_io.resume_reading()
    await world.until(lambda: len(receiver.received) == COUNT, what="every message")
    receiver.settle()
    ids = [message.id for message, _ in receiver.received]
    assert ids == list(range(COUNT))  # each id once, in order
    await world.until(lambda: server_side(world, node, "slow").is_reading(), what="reading again")


def test_a_consumer_that_does_not_read_leaves_the_messages_on_a_local_queue(tmp_path):
    async def play():
        world = World(tmp_path)
        node = await world.node("a")
        await fill(world, "a", "q")
        await slow_reader_then_reads(world, "a", "q", lambda: len(node.queues.get("q").messages))
        await world.close()

    run(play)


def test_a_consumer_that_does_not_read_leaves_the_messages_on_the_primary(tmp_path):
    async def play():
        world = World(tmp_path)
        primary = await world.node("primary")
        await world.node("gw", rules=[{"name": "w", "match": "work.#", "kind": "proxy",
                                       "primary": "amqp://primary:5672"}])
        await fill(world, "primary", "work.q")
        await slow_reader_then_reads(world, "gw", "work.q",
                                     lambda: len(primary.queues.get("work.q").messages))
        await world.close()

    run(play)
