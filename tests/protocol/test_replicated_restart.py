"""A replicated durable queue whose backlog is larger than memory, every node restarted (issue
#44, docs/paging-restart.md, "A replicated queue's recovered backlog"), on the virtual clock.

Each node journals its copy. Restarted, each node's journal brings the backlog back, bodies
beyond half the budget left in the journal (journal pages); the node that claims serves from
them, the others become its backups: their recovered pages let go, their records dequeued,
and they catch up from the primary. Checked as a user would: memory held near the budget
through the restart, every id once, in order, bodies intact, across a failover after it.
"""

from __future__ import annotations

import tracemalloc

import pytest
from memory_etcd import MemoryEtcd
from playbook import World, run
from proton import Message
from test_paging_replicated import BUDGET, PAGING, body, drain
from test_replication_playbooks import TTL, lose_node, make_primary, view

pytestmark = pytest.mark.timeout(120)

COUNT = 200  # about ten budgets of bodies
RULE = {"name": "orders", "match": "orders.*", "kind": "replicated", "replicas": 3,
        "durable": True}
JOURNAL = {"fsync": False, "segment_size": 16384}
CLUSTER = {"etcd": ["http://memory:2379"], "lease_ttl": TTL}


async def durable_node(world: World, etcd, name: str):
    return await world.node(name, etcd=etcd, rules=[RULE], journal=JOURNAL,
                            limits={"max_memory": BUDGET}, paging=PAGING,
                            queues={"durable": True}, cluster=CLUSTER)


async def send_durable(world: World, client, address: str, count: int, priority: int = 4) -> None:
    sender = client.sender(address)
    for i in range(count):
        await world.until(lambda: sender.credit > 0, what=f"credit for message {i}")
        sender.link.delivery(f"d{i}")
        sender.link.send(Message(body=body(i), id=i, durable=True, priority=priority).encode())
        sender.link.advance()
        client.flush()
    await world.until(lambda: sender.accepted() == count, what=f"{count} accepted")


def primary_of(nodes: dict, address: str) -> str | None:
    return next((n for n, node in nodes.items() if view(node, address).get("role") == "primary"),
                None)


async def restarted_cluster(world: World, address: str, count: int = COUNT,
                            priority: int = 4) -> tuple[dict, int]:
    """Three durable nodes, a backlog of ``count`` accepted, every node stopped and started
    again; (the nodes, the peak of memory allocated while they started and one claimed)."""
    etcd = MemoryEtcd()
    nodes = {name: await durable_node(world, etcd, name) for name in "abc"}
    primary = await make_primary(world, nodes, address)
    await send_durable(world, await world.client(primary, "producer"), address, count, priority)
    await world.quiet(0.1)
    for name in "abc":
        assert nodes[name].broker.journal.live >= count, f"{name}'s copy is not journaled"
        await lose_node(world, nodes, name)
    await world.quiet(TTL + 2)  # every lease gone
    tracemalloc.start()
    try:
        for name in "abc":
            world.network.reboot(name)
            nodes[name] = await durable_node(world, etcd, name)
        await world.until(lambda: primary_of(nodes, address), timeout=TTL + 5,
                          what="a primary after the restart")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return nodes, peak


@pytest.mark.parametrize("priority", [4, 0])
def test_a_replicated_durable_backlog_of_ten_budgets_restarts_within_its_budget(tmp_path, priority):
    """Every node restarted: the claiming node serves from the journal (its queue's bodies
    in memory within the budget, nothing written again to its page store), the others are
    its backups (their recovered journal pages let go) and catch up from it; half the
    backlog drained, the primary lost, the new one serves the rest: every id once, in order.
    Priority 0 too (as go-amqp sends: recovered in journal runs per level). (Before: each
    node read the whole backlog into memory to hold it until the claim, and the claiming
    node wrote it again to its page store.)"""
    address = "orders.r"

    async def play():
        world = World(tmp_path)
        nodes, peak = await restarted_cluster(world, address, COUNT, priority)
        empty = World(tmp_path / "empty")  # the same restart without a backlog
        _, baseline = await restarted_cluster(empty, address, 1)
        await empty.close()
        # each node used to hold its copy's bodies until the claim: more than the three copies'
        # bodies together (what is left: the messages' index, a journal page each)
        assert peak - baseline < 3 * COUNT * 1000, f"{peak - baseline} bytes more at the restart"
        primary = primary_of(nodes, address)
        node = nodes[primary]
        queue = node.queues.get(address)
        assert queue.depth == COUNT
        assert queue.paged_count >= COUNT // 2, "the recovered backlog is not left on disk"
        assert node.queues.memory.resident <= node.queues.memory.ceiling
        assert node.pager.store.writes == 0, "the claim wrote the backlog to the page store"
        others = [n for n in "abc" if n != primary]
        await world.until(lambda: all(view(nodes[n], address).get("copy", {}).get("in_sync")
                                      for n in others), timeout=20, what="backups in sync")
        for name in others:
            assert nodes[name].journal_pages.live == 0, f"{name} holds its recovered pages"
            assert not nodes[name].journal_pages.files, f"{name} pins journal segments"
        assert node.queues.memory.resident <= node.queues.memory.ceiling

        consumer = await world.client(primary, "consumer")
        first = await drain(world, consumer, address, COUNT // 2)
        assert first == list(range(COUNT // 2))
        await world.quiet(0.2)
        await lose_node(world, nodes, primary)
        await world.until(lambda: primary_of({n: nodes[n] for n in others}, address),
                          timeout=TTL + 5, what="a new primary after the failover")
        new = primary_of({n: nodes[n] for n in others}, address)
        late = await world.client(new, "late")
        rest = await drain(world, late, address, COUNT - COUNT // 2)
        assert first + rest == list(range(COUNT)), "an id lost, repeated or out of order"
        await world.close()

    run(play)


async def backup_restarted(world: World, address: str, count: int) -> tuple[dict, str, int]:
    """Three durable nodes, ``count`` accepted, one backup stopped and started again while the
    primary serves; (the nodes, that node, the peak of memory allocated by its start: its
    journal recovered, the queue not claimed yet), once it is a backup again."""
    etcd = MemoryEtcd()
    nodes = {name: await durable_node(world, etcd, name) for name in "abc"}
    primary = await make_primary(world, nodes, address)
    await send_durable(world, await world.client(primary, "producer"), address, count)
    await world.quiet(0.1)
    name = next(n for n in "abc" if n != primary)
    assert nodes[name].broker.journal.live >= count, f"{name}'s copy is not journaled"
    await lose_node(world, nodes, name)
    await world.quiet(0.5)
    world.network.reboot(name)
    tracemalloc.start()
    try:
        nodes[name] = await durable_node(world, etcd, name)  # journal recovered, not claimed
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    await world.until(lambda: view(nodes[name], address).get("role") not in
                      (None, "proxy", "primary"), timeout=20, what=f"{name} a backup again")
    return nodes, name, peak


def test_a_node_restarting_into_a_backup_lets_its_recovered_pages_go(tmp_path):
    """A backup restarted while its primary serves: its journal brings the backlog back, bodies
    beyond half its budget left there (not read into memory to wait for the claim); it becomes
    a backup: its recovered pages die (no journal segment pinned), it catches up; a failover
    to it after that serves every id once, in order. (Before: it read the whole backlog into
    memory at its start.)"""
    address = "orders.b"

    async def play():
        world = World(tmp_path)
        nodes, name, peak = await backup_restarted(world, address, COUNT)
        empty = World(tmp_path / "empty")  # the same restart without a backlog
        _, _, baseline = await backup_restarted(empty, address, 1)
        await empty.close()
        # it used to read its copy's bodies (COUNT) into memory to wait for the claim
        assert peak - baseline < COUNT * 1000, f"{peak - baseline} bytes more at its start"
        node = nodes[name]
        await world.until(lambda: view(node, address).get("copy", {}).get("in_sync"),
                          timeout=20, what=f"{name} in sync")
        assert node.journal_pages.made >= COUNT // 2, f"{name} recovered no journal page"
        assert node.journal_pages.live == 0, f"{name} holds its recovered pages"
        assert not node.journal_pages.files, f"{name} pins journal segments"
        primary = primary_of(nodes, address)
        await lose_node(world, nodes, primary)
        await world.until(lambda: primary_of(nodes, address), timeout=TTL + 5,
                          what="a new primary")
        new = primary_of(nodes, address)
        consumer = await world.client(new, "consumer")
        assert await drain(world, consumer, address, COUNT) == list(range(COUNT))
        await world.close()

    run(play)
