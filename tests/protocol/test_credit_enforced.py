"""A sender that ignores link credit is stopped: its link ends with amqp:link:transfer-limit-exceeded.

Without this, transfers beyond credit were all accepted: 60 into a queue that
had granted 20, so no queue or proxy buffer was bounded by the credit it gave
(issue #21). A raw client (hand-built frames, ``tests/fuzz/frames.py``) opens
a sender, waits for the node's answer, then writes 60 transfers at once with
credit 20. Others on the node go on being served.
"""

from __future__ import annotations

import pytest
from fuzz import frames as f

from playbook import AMQP_HEADER as HEADER
from playbook import RawClient, World, run

pytestmark = pytest.mark.timeout(20)


async def flood(world: World, node: str, address: str, count: int) -> None:
    """Attach a sender to ``address`` and send ``count`` transfers without waiting for credit."""
    _, raw = await world.network.host("raw").connect(RawClient, node, 5672)
    raw.transport.write(HEADER + f.open_frame() + f.begin_frame() + f.attach_frame("s", 0, False, address))
    await world.until(lambda: world.frames(node, "raw", "flow"), what="the node's credit")
    raw.transport.write(b"".join(f.transfer_frame(0, i, str(i).encode(), f.message(b"x"))
                                 for i in range(count)))


def detached_with(world: World, node: str) -> list:
    return [frame.condition for frame in world.frames(node, "raw", "detach")]


@pytest.mark.parametrize("credit_window", [20, 1])
def test_transfers_beyond_credit_end_the_link_on_a_local_queue(tmp_path, credit_window):
    async def play():
        world = World(tmp_path)
        node = await world.node("a", queues={"credit_window": credit_window})
        await flood(world, "a", "q", 60)
        await world.until(lambda: detached_with(world, "a"), what="the link ended")
        assert detached_with(world, "a") == ["amqp:link:transfer-limit-exceeded"]
        assert len(node.queues.lookup_or_create("q").messages) <= credit_window  # none beyond credit
        # a well-behaved client on the same node is served as before
        client = await world.client("a")
        sender = client.sender("q2")
        await world.until(lambda: sender.credit > 0)
        sender.send("ok")
        await world.until(lambda: sender.accepted() == 1)
        await world.close()

    run(play)


def test_transfers_beyond_credit_end_the_link_through_a_proxy(tmp_path):
    async def play():
        world = World(tmp_path)
        primary = await world.node("primary", queues={"credit_window": 20})
        await world.node("gw", rules=[{"name": "w", "match": "work.#", "kind": "proxy",
                                       "primary": "amqp://primary:5672"}])
        await flood(world, "gw", "work.flood", 500)
        await world.until(lambda: detached_with(world, "gw"), what="the link ended")
        assert detached_with(world, "gw") == ["amqp:link:transfer-limit-exceeded"]
        granted = max(frame["link-credit"] for frame in world.frames("gw", "raw", "flow")
                      if frame["link-credit"] is not None)
        await world.quiet(1.0)
        stored = len(primary.queues.lookup_or_create("work.flood").messages)
        assert stored <= granted <= 20  # the proxy forwarded nothing beyond the credit it gave
        await world.close()

    run(play)
