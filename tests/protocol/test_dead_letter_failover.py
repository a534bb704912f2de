"""Delivery limit and dead-lettering on replicated queues across a failover (issue #43;
docs/queue-semantics.md, "Delivery limit"): playbooks on a virtual clock, etcd in memory.

A consumer modifies a message (delivery-failed) short of the queue's ``delivery_limit``, the
primary is lost: on the new primary the count goes on where it was (the message's
delivery-count, which every copy holds), and the next failure dead-letters it. And the move
to a replicated dead-letter queue is at least once: the original leaves its queue's copies
only once the dead-letter queue's in-sync copies hold the dead-lettered one, so a primary lost
in between leaves the message in its queue (delivered again), never in neither.
"""

from __future__ import annotations

import pytest
from memory_etcd import MemoryEtcd
from proton import Delivery

from playbook import World, run
from test_replication_playbooks import TTL, backups_ready, view

pytestmark = pytest.mark.timeout(60)

LIMIT = 3


def rules(orders_nodes: str, dead_nodes: str) -> list[dict]:
    """``orders.*`` and its dead-letter queue ``dead.q``, each replicated on the nodes given
    (the first is the preferred primary)."""
    return [{"name": "orders", "match": "orders.*", "kind": "replicated", "replicas": len(orders_nodes),
             "nodes": list(orders_nodes), "delivery_limit": LIMIT, "dead_letter": "dead.q",
             "catchup_timeout": 30.0},
            {"name": "dead", "match": "dead.*", "kind": "replicated", "replicas": len(dead_nodes),
             "nodes": list(dead_nodes), "catchup_timeout": 30.0}]


async def cluster(world: World, orders_nodes: str, dead_nodes: str) -> dict:
    etcd = MemoryEtcd()
    return {name: await world.node(name, etcd=etcd, rules=rules(orders_nodes, dead_nodes),
                                   cluster={"etcd": ["http://memory:2379"], "lease_ttl": TTL})
            for name in "abc"}


async def serving(world: World, nodes: dict, address: str, primary: str, backups: str) -> None:
    """A link on ``primary`` makes it claim ``address``; its backups in sync and told so."""
    starter = await world.client(primary, f"starter-{address}")
    starter.receiver(address)
    await world.until(lambda: view(nodes[primary], address).get("role") == "primary",
                      what=f"{primary} primary of {address}")
    await world.until(lambda: sorted(view(nodes[primary], address).get("in_sync", [])) ==
                      sorted(backups), what=f"{address}: backups in sync")
    await backups_ready(world, nodes, list(backups), address)


async def lose(world: World, nodes: dict, name: str) -> None:
    world.network.kill(name)
    nodes[name].coordinator.store.partition()
    await nodes[name].stop()


def fail(receiver) -> None:
    """Modified, delivery-failed (§3.4.5), for every unsettled delivery."""
    for _, delivery in receiver.received:
        if not delivery.settled:
            delivery.local.failed = True
            delivery.update(Delivery.MODIFIED)
            delivery.settle()
    receiver.client.flush()


async def one_more(world: World, receiver, count: int) -> None:
    receiver.flow(1)
    await world.until(lambda: len(receiver.received) == count, what=f"delivery {count}")


def test_the_delivery_count_goes_on_on_the_new_primary_and_the_limit_dead_letters(tmp_path):
    async def play():
        world = World(tmp_path)
        nodes = await cluster(world, "abc", "abc")
        await serving(world, nodes, "orders.p", "a", "bc")
        await serving(world, nodes, "dead.q", "a", "bc")
        producer = (await world.client("c", "producer")).sender("orders.p")
        await world.until(lambda: producer.credit > 0, what="credit")
        producer.send("poison", message_id="poison")
        await world.until(lambda: producer.accepted() == 1, what="accepted")
        receiver = (await world.client("c", "consumer")).receiver("orders.p")
        for attempt in range(1, LIMIT):  # one short of the limit
            await one_more(world, receiver, attempt)
            fail(receiver)
        await world.until(lambda: view(nodes["b"], "orders.p")["copy"]["depth"] == 1,
                          what="the backup holds it, released")
        await lose(world, nodes, "a")

        def new_primary(address: str):
            return next((n for n in "bc" if view(nodes[n], address).get("role") == "primary"), None)

        await world.until(lambda: new_primary("orders.p"), timeout=TTL + 3, what="a new primary")
        await one_more(world, receiver, LIMIT)
        message, _ = receiver.received[-1]
        assert message.delivery_count == LIMIT - 1  # the header's count went on
        fail(receiver)  # the limit: dead-lettered now, not delivered again
        await world.until(lambda: new_primary("dead.q"), timeout=TTL + 3,
                          what="a new primary of the dead-letter queue")
        dead = (await world.client("c", "dead-reader")).receiver("dead.q", credit=5)
        await world.until(lambda: len(dead.received) == 1, what="the dead-lettered copy")
        copy, _ = dead.received[0]
        assert copy.id == "poison"
        assert copy.annotations["x-opt-dead-letter-reason"] == "delivery-limit"
        receiver.flow(5)
        await world.quiet(2.0)
        assert len(receiver.received) == LIMIT  # nothing more for the consumer
        await world.close()

    run(play)


@pytest.mark.parametrize("outcome", ["delivery-limit", "rejected"])
def test_a_primary_lost_before_the_dead_letter_copy_is_replicated_keeps_the_original(tmp_path,
                                                                                  outcome):
    """``orders.p`` kept on a and b, ``dead.q`` on a and c; a cannot reach c (the dead-letter
    copy's batch does not get through, c stays in the in-sync set for catchup_timeout). The
    consumer reaches the limit (or rejects the message), then a is lost: b serves
    ``orders.p`` with the message still there (its removal waited for c), and the consumer
    gets it again."""
    async def play():
        world = World(tmp_path)
        nodes = await cluster(world, "ab", "ac")
        await serving(world, nodes, "orders.p", "a", "b")
        await serving(world, nodes, "dead.q", "a", "c")
        producer = (await world.client("b", "producer")).sender("orders.p")
        await world.until(lambda: producer.credit > 0, what="credit")
        producer.send("poison", message_id="poison")
        await world.until(lambda: producer.accepted() == 1, what="accepted")
        receiver = (await world.client("b", "consumer")).receiver("orders.p")
        for attempt in range(1, LIMIT):
            await one_more(world, receiver, attempt)
            fail(receiver)
        await one_more(world, receiver, LIMIT)
        world.network.partition("a", "c")  # dead.q's batches from a stop reaching c
        if outcome == "rejected":
            _, delivery = receiver.received[-1]
            delivery.update(Delivery.REJECTED)
            delivery.settle()
            receiver.client.flush()
        else:
            fail(receiver)  # the limit: into dead.q on a, which c does not acknowledge
        await world.quiet(1.0)
        assert view(nodes["b"], "orders.p")["copy"]["depth"] == 1  # not removed from b yet
        await lose(world, nodes, "a")
        await world.until(lambda: view(nodes["b"], "orders.p").get("role") == "primary",
                          timeout=TTL + 3, what="b takes over")
        receiver.flow(1)
        await world.until(lambda: len(receiver.received) == LIMIT + 1, timeout=10,
                          what="the message again (at least once)")
        assert receiver.received[-1][0].id == "poison"
        await world.close()

    run(play)
