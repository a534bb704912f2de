"""A rule's ``pool_size`` connections all carry links: each new link goes to the least-loaded one."""

from __future__ import annotations

from collections import Counter

import pytest
from proton import Delivery, Message

from playbook import World, run
from proxy.upstream.member import MemberState
from proxy.upstream.pool import choose_member

pytestmark = pytest.mark.timeout(30)

POOL = 3
PROXY_RULE = {"name": "work", "match": "work.#", "kind": "proxy", "primary": "amqp://primary:5672",
              "upstream": {"pool_size": POOL}}


def members(world, role: str) -> list[dict]:
    (pool,) = world.nodes["gw"].broker.upstreams.describe()
    return [m for m in pool["members"] if m["role"] == role]


def test_links_of_a_warm_node_spread_over_every_connection_of_the_pool(tmp_path):
    async def play():
        world = World(tmp_path)
        await world.node("primary")
        await world.node("gw", rules=[PROXY_RULE])
        client = await world.client("gw")
        senders, receivers = [], []
        for i in range(2 * POOL):  # one at a time: each finds the pool warm (a member up)
            senders.append(client.sender(f"work.q{i}"))
            await world.until(lambda: senders[-1].credit > 0, what=f"credit for sender {i}")
            receivers.append(client.receiver(f"work.q{i}", credit=10))
            await world.until(lambda: sum(m["links"] for m in members(world, "receive")) == i + 1,
                              what=f"receiver {i} attached upstream")
        for role in ("send", "receive"):
            placed = [(m["state"], m["links"]) for m in members(world, role)]
            assert placed == [("up", 2)] * POOL, (role, placed)
        for i, sender in enumerate(senders):  # and every connection carries its messages
            for n in range(5):
                sender.link.delivery(f"q{i}-{n}")
                sender.link.send(Message(id=f"q{i}-{n}", body="x").encode())
                sender.link.advance()
        client.flush()
        await world.until(lambda: all(len(r.received) == 5 for r in receivers), what="5 messages each")
        for i, receiver in enumerate(receivers):
            assert Counter(message.id for message, _ in receiver.received) == \
                Counter(f"q{i}-{n}" for n in range(5))
            receiver.settle(Delivery.ACCEPTED)
        await world.until(lambda: all(s.accepted() == 5 for s in senders), what="all accepted")
        await world.close()

    run(play)


class _Member:
    """What ``choose_member`` reads of a pool member."""

    def __init__(self, state: str, links: int) -> None:
        self.state = MemberState(state)
        self.endpoints = set(range(links))


@pytest.mark.parametrize("members, chosen", [
    ([("up", 3), ("down", 0), ("down", 0)], 1),        # an idle connection before a loaded one
    ([("up", 2), ("connecting", 1), ("down", 1)], 1),  # the fewest links (first of equals)
    ([("down", 1), ("up", 1)], 1),                     # among equals, the connected one
    ([("up", 5), ("backoff", 0)], 0),                  # not the one failing to connect
    ([("backoff", 2), ("backoff", 1)], 1),             # all failing: the fewest links
])
def test_a_new_link_goes_to_the_least_loaded_member_that_is_not_failing(members, chosen):
    side = [_Member(state, links) for state, links in members]
    assert choose_member(side) is side[chosen]
