"""A link the owner refused, sent to it again at once without end (issue #42, docs/nemesis.md
finding 19), on a virtual clock.

A fragment whose member died is served by a backup as ``<queue>@<member>``; when the member is
back and in sync it gets the fragment back, and the backup's clients of that queue wait for
the new owner, then go on there. They were sent to the home member under the backup's name
(``jobs@a``), which the home does not serve (it serves its fragment as ``jobs``): refused
(``amqp:not-found``, "it moved"), and the refusal made the link look for the owner again at
once, find the same one, and attach again (23,000 refused attaches a minute in the nemesis;
here 307,681 in two virtual seconds when the client sends nothing, and with a message waiting
it was never accepted and the playbook ran past its real-time limit). Now a link goes to the
home under the name it serves, and an owner's refusal is looked into again after a pause
(``REFUSED_RETRY``), never at once.
"""

from __future__ import annotations

import pytest

from playbook import World, run
from test_replication_playbooks import FRAGMENTED, etcd_cluster, service

pytestmark = pytest.mark.timeout(60)


def serves(node, member: str) -> bool:
    return any(item.get("resource") == f"fragment/jobs/{member}" and item.get("role") == "primary"
               for item in service(node).describe())


def test_a_link_on_an_adopted_fragment_goes_on_at_its_home_once_handed_back(tmp_path):
    """a dies; its backup serves its fragment as jobs@a, and a producer there sends to jobs@a.
    a comes back and gets its fragment back: the producer's link goes on at a (its next
    message is accepted within 5 s, into a's own fragment), and the link is refused no more
    than a few times on the way (refused and sent again at once, without end, before)."""
    async def play():
        world = World(tmp_path)
        etcd, nodes = await etcd_cluster(world, rule=FRAGMENTED)
        for name in "abc":  # every member serves its own fragment
            (await world.client(name, f"producer-{name}")).sender("jobs")
        await world.until(lambda: all(serves(nodes[n], n) for n in "abc"), what="fragments served")
        world.network.kill("a")
        nodes["a"].coordinator.store.partition()
        await world.until(lambda: any(serves(nodes[n], "a") for n in "bc"), timeout=30,
                          what="a's fragment adopted")
        adopter = next(n for n in "bc" if serves(nodes[n], "a"))
        sender = (await world.client(adopter, "direct")).sender("jobs@a")
        await world.until(lambda: sender.credit > 0, what="credit on jobs@a")
        sender.send("before", message_id="before")
        await world.until(lambda: sender.accepted() == 1, what="accepted on jobs@a")

        world.network.revive("a")
        nodes["a"].coordinator.store.heal()
        await world.until(lambda: serves(nodes["a"], "a") and nodes[adopter].queues.get("jobs@a")
                          is None, timeout=30, what="the fragment handed back to a")
        start = len(world.tap.frames)
        sender.send("after", message_id="after")
        # (a refusal loop sends thousands of frames a virtual millisecond: stop looking then)
        await world.until(lambda: sender.accepted() == 2 or len(world.tap.frames) - start > 20_000,
                          timeout=5, what="accepted at a")
        refused = [f for f in world.tap.frames[start:]
                   if f.name == "detach" and f.condition == "amqp:not-found"]
        assert len(refused) <= 5, len(refused)
        assert sender.accepted() == 2
        assert sender.closed_with is None
        assert nodes["a"].queues.get("jobs").depth >= 1  # in a's own fragment
        await world.close()

    run(play, wall_limit=60)
