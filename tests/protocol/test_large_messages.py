"""A large message never wedges a connection (issue #33).

A large delivery fills the socket: the node's transport keeps what the kernel
does not take and pauses the connection's output. The queue's next message
goes out from ``resume_writing``; the TCP transport used to drop that write
(it looked at its old, emptied buffer after calling the protocol), the stream
lost bytes mid-frame, the connection stayed paused for good and not even the
client's close was answered. The memory network writes through the same
``WriteBuffer`` as the TCP transport, in front of a socket buffer of its own,
so these playbooks go through that path: each failing order from the issue,
on one link, on two links of one session and on two sessions.
"""

from __future__ import annotations

import pytest
from proton import Connection

from playbook import World, run

pytestmark = pytest.mark.timeout(60)

MB = 1_000_000
ORDERS = [(10 * MB, 500_000), (5 * MB, MB), (10 * MB, MB), (16 * MB, 10)]
LAYOUTS = ["one link", "two links of one session", "two sessions"]
# the kernel's socket buffer: the larger it is, the likelier a resume finds the transport's
# buffer empty (Linux grows a loopback socket's to a few MiB)
SOCKET_BUFFERS = [256 * 1024, 1024 * 1024, 4 * 1024 * 1024]


async def store(world: World, address: str, sizes: list[int]) -> None:
    producer = await world.client("a", f"producer-{address}")
    sender = producer.sender(address)
    for index, size in enumerate(sizes):
        await world.until(lambda: sender.credit > 0, what="producer credit")
        sender.send(b"x" * size, message_id=f"{address}-{index}")
    await world.until(lambda: sender.accepted() == len(sizes), what="stored")


@pytest.mark.parametrize("socket_buffer", SOCKET_BUFFERS, ids=lambda size: f"kernel-{size >> 10}k")
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("first,second", ORDERS, ids=[f"{a}-then-{b}" for a, b in ORDERS])
def test_a_large_message_then_a_smaller_one_both_arrive_and_close_is_answered(tmp_path, layout,
                                                                               first, second,
                                                                               socket_buffer):
    async def play():
        world = World(tmp_path, socket_buffer=socket_buffer)
        await world.node("a")
        client = await world.client("a", "consumer")
        if layout == "one link":
            await store(world, "q", [first, second])
            receivers = [client.receiver("q", credit=10)]
            expected = [[("q-0", first), ("q-1", second)]]
        else:
            await store(world, "big", [first])
            await store(world, "small", [second])
            other = client.new_session() if layout == "two sessions" else None
            receivers = [client.receiver("big", credit=10), client.receiver("small", credit=10,
                                                                            session=other)]
            expected = [[("big-0", first)], [("small-0", second)]]
        await world.until(lambda: all(len(r.received) == len(e) for r, e in zip(receivers, expected)),
                          what="every message")
        for receiver, messages in zip(receivers, expected):
            assert [(m.id, len(m.body)) for m, _ in receiver.received] == messages
            receiver.settle()
        client.connection.close()
        client.flush()
        await world.until(lambda: client.connection.state & Connection.REMOTE_CLOSED,
                          what="the node's answer to close")
        await world.close()

    run(play)


@pytest.mark.parametrize("leaving", ["detach", "close"])
def test_a_client_leaving_while_its_output_is_blocked_gives_its_messages_back(tmp_path, leaving):
    """The client stops reading in the middle of a large message, then detaches (or closes):
    the node hears it though its output is blocked; another consumer gets every message,
    and the leaving client gets its answer once it reads again."""
    async def play():
        world = World(tmp_path, socket_buffer=256 * 1024)
        node = await world.node("a")
        await store(world, "q", [10 * MB, MB, 10])
        slow = await world.client("a", "slow")
        slow.transport_io.pause_reading()  # reads nothing of what comes now
        receiver = slow.receiver("q", credit=10)
        await world.until(lambda: node.queues.get("q").unacked >= 1, what="the large one sent")
        await world.quiet(0.5)
        assert not receiver.received
        if leaving == "detach":
            receiver.link.close()
        else:
            slow.connection.close()
        slow.flush()
        await world.until(lambda: node.queues.get("q").unacked == 0, what="its messages back")

        other = await world.client("a", "other")
        taker = other.receiver("q", credit=10)
        await world.until(lambda: len(taker.received) == 3, what="every message, elsewhere")
        assert [(m.id, len(m.body)) for m, _ in taker.received] == [
            ("q-0", 10 * MB), ("q-1", MB), ("q-2", 10)]
        taker.settle()

        slow.transport_io.resume_reading()
        if leaving == "detach":
            await world.until(lambda: receiver.closed_with is not None, what="the detach answered")
        else:
            await world.until(lambda: slow.connection.state & Connection.REMOTE_CLOSED,
                              what="the close answered")
        await world.close()

    run(play)


def test_a_connection_whose_output_does_not_move_is_shown_stuck(tmp_path):
    """Output waiting without moving for over 10 s: the admin API's connection shows how long,
    /metrics counts it; once the client reads again it is not stuck any more."""
    from admin_api import prometheus
    from admin_api.inspect_api import _connection

    async def play():
        world = World(tmp_path)
        node = await world.node("a")
        await store(world, "q", [5 * MB])
        slow = await world.client("a", "slow")
        slow.transport_io.pause_reading()
        slow.receiver("q", credit=10)
        other = await world.client("a", "other")  # reads: never stuck
        other.receiver("side", credit=10)
        await world.until(lambda: node.queues.get("q").unacked == 1, what="sent")
        await world.quiet(5.0)
        assert node.output_stalled() == []  # waiting, but not for 10 s yet
        await world.quiet(8.0)
        (stuck, seconds), = node.output_stalled()
        assert stuck.handler.peer.startswith("slow") and 10 < seconds <= 15
        shown = _connection(stuck, stuck.handler)
        assert shown["output_pending_bytes"] > 1 * MB and shown["output_stalled_s"] > 10
        assert "fedgate_connections_output_stalled 1\n" in prometheus.render(node)

        slow.transport_io.resume_reading()
        await world.until(lambda: len(slow.links) and all(
            len(link.received) == 1 for link in slow.links.values()), what="the message read")
        await world.quiet(3.0)
        assert node.output_stalled() == []
        assert "fedgate_connections_output_stalled 0\n" in prometheus.render(node)
        await world.close()

    run(play)
