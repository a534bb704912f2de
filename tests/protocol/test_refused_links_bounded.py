"""Refused links and sessions count against the limits while the client keeps them (issue #21).

A refused attach is answered with attach + detach(error) and its handle stays
in use until the client answers with its own detach (§2.6.4); proton keeps the
link until then. A client that never answers used to make the node keep every
refusal (5,850 links on one connection with ``max_links_per_connection``
1024). Now unanswered refusals count against the limit, and once they alone
reach it the connection ends with ``amqp:resource-limit-exceeded``. The same
for sessions. A client that answers its refusals keeps its connection.
"""

from __future__ import annotations

import pytest
from fuzz import frames as f

from playbook import AMQP_HEADER as HEADER
from playbook import RawClient, World, run

pytestmark = pytest.mark.timeout(20)


async def raw_client(world: World, node: str) -> RawClient:
    _, raw = await world.network.host("raw").connect(RawClient, node, 5672)
    raw.transport.write(HEADER + f.open_frame() + f.begin_frame())
    await world.until(lambda: world.frames(node, "raw", "begin"), what="the node's begin")
    return raw


def closed_with(world: World, node: str) -> list:
    return [frame.condition for frame in world.frames(node, "raw", "close")]


def test_unanswered_link_refusals_end_the_connection(tmp_path):
    async def play():
        world = World(tmp_path)
        node = await world.node("a", limits={"max_links_per_connection": 4})
        raw = await raw_client(world, "a")
        for handle in range(40):  # never answers a detach
            raw.transport.write(f.attach_frame(f"l{handle}", handle, True, f"q{handle}"))
            await world.quiet(0.01)
        await world.until(lambda: closed_with(world, "a"), what="the connection closed")
        assert closed_with(world, "a") == ["amqp:resource-limit-exceeded"]
        refusals = [f.condition for f in world.frames("a", "raw", "detach")]
        assert refusals == ["amqp:resource-limit-exceeded"] * 4  # 4 open, 4 refused, then the end
        await world.until(lambda: raw.lost and not node.connections)
        await world.close()

    run(play)


def test_a_client_that_answers_its_refusals_keeps_its_connection(tmp_path):
    async def play():
        world = World(tmp_path)
        await world.node("a", limits={"max_links_per_connection": 4})
        raw = await raw_client(world, "a")
        for handle in range(4):
            raw.transport.write(f.attach_frame(f"l{handle}", handle, True, f"q{handle}"))
        for attempt in range(20):  # refused each time; answered each time, handle reused
            raw.transport.write(f.attach_frame(f"x{attempt}", 10, True, "qx"))
            await world.until(lambda: len(world.frames("a", "raw", "detach")) == attempt + 1)
            raw.transport.write(f.frame(f.performative(0x16, [f.uint(10), f.boolean(True)])))
            await world.quiet(0.01)
        await world.quiet(0.5)
        assert closed_with(world, "a") == [] and not raw.lost
        await world.close()

    run(play)


def test_unanswered_session_refusals_end_the_connection(tmp_path):
    async def play():
        world = World(tmp_path)
        node = await world.node("a", limits={"max_sessions_per_connection": 2})
        raw = await raw_client(world, "a")  # one session: channel 0
        for channel in range(1, 30):  # never ends a refused one
            raw.transport.write(f.begin_frame(channel=channel))
            await world.quiet(0.01)
        await world.until(lambda: closed_with(world, "a"), what="the connection closed")
        assert closed_with(world, "a") == ["amqp:resource-limit-exceeded"]
        assert len(world.frames("a", "raw", "begin")) <= 5
        await world.until(lambda: raw.lost and not node.connections)
        await world.close()

    run(play)
