"""A priority queue in runs (docs/paging.md, "A priority queue in runs"): each priority level
keeps its paged messages in runs, one object per run, none per message. On the virtual
clock, with a budget of about 20 messages so that most of a backlog is in runs.

Each test checks what a user would: the order of delivery is the in-memory priority queue's
(the same steps played on a node without a budget, side by side), every id once, the depth
and ``by_priority`` the admin API shows, the node's bytes and the page store's live bytes
back to zero, and that the backlog waited in runs without being read back one by one
(no synchronous read while it filled).
"""

from __future__ import annotations

import asyncio
import random

import pytest
from proton import Delivery, Message
from test_paging import BODY, BUDGET, READ_AHEAD, ids_of, page_files, paging_node, take

from memory import put_selector
from playbook import ClientLink, World, run

import proxy.queues.local as local_queues
from admin_api.inspect_api import queue_info
from proxy.broker import operations
from proxy.queues.level_runs import LevelRuns
from proxy.queues.runs import RunQueue

pytestmark = pytest.mark.timeout(60)


def in_runs(queue) -> int:
    """Messages of a priority queue in runs (no object each); 0 when it keeps none."""
    messages = queue.messages
    return messages.count if type(messages) is LevelRuns else 0


def objects(queue) -> int:
    """Message objects the queue holds for its ready messages."""
    messages = queue.messages
    if type(messages) is not LevelRuns:
        return len(messages)
    held = 0
    for level in messages.levels:
        held += len(level.head) + len(level.tail)
        held += sum(len(c.messages) for c in level.runs if c.messages is not None)
    return held


def all_back(node, queue) -> None:
    memory = node.queues.memory
    assert (queue.paged_count, queue.paged_bytes, memory.paged, memory.used) == (0, 0, 0, 0)
    assert node.pager.store.live_bytes == 0, "page records left live"


def plan(count: int, start: int = 0, seed: int = 7, levels=range(10)) -> list:
    """``count`` (id, priority) pairs, the priorities a random mix (seeded)."""
    pick = random.Random(seed + start)
    return [(i, pick.choice(list(levels))) for i in range(start, start + count)]


async def send(world: World, sender, steps: list, **fields) -> None:
    """Each (id, priority) as credit allows; every one accepted (bounded waits)."""
    before = sender.accepted()
    for i, priority in steps:
        await world.until(lambda: sender.credit > 0, what=f"credit for message {i}")
        sender.link.delivery(str(next(sender.client.tags)))
        sender.link.send(Message(id=i, body=f"{i}:{BODY}", priority=priority,
                                 **fields).encode())
        sender.link.advance()
        sender.client.flush()
    await world.until(lambda: sender.accepted() == before + len(steps),
                      what=f"{len(steps)} accepted")


def in_memory_order(steps: list) -> list:
    """The ids in the order an in-memory priority queue gives them (all waiting at once)."""
    return [i for i, _ in sorted(steps, key=lambda s: (-s[1], s[0]))]


async def nodes(world: World, **queue_settings):
    """Node "a" pages (budget of 20 messages), node "b" keeps all in memory; a client each."""
    queue = [{"name": "prio", **queue_settings}] if queue_settings else []
    paged = await paging_node(world, queue=queue)
    plain = await world.node("b", queue=list(queue), queues={"credit_window": 50})
    return paged, plain, await world.client("a"), await world.client("b")


def test_a_priority_backlog_keeps_runs_per_level_and_no_object_per_paged_message(tmp_path):
    async def play():
        world = World(tmp_path)
        node = await paging_node(world)
        client = await world.client("a")
        steps = plan(400)
        await send(world, client.sender("prio"), steps)
        await world.quiet(0.05)
        queue = node.queues.get("prio")
        assert type(queue.messages) is LevelRuns, "a priority queue pages in runs per level"
        assert queue.depth == 400 and queue_info(queue)["depth"] == 400
        assert in_runs(queue) >= 350, "the backlog is not in runs"
        assert objects(queue) == 400 - in_runs(queue), "an object per paged message"
        chunks = sum(len(level.runs) for level in queue.messages.levels)
        # a round writes a few messages here (a budget of 20, segments of 16 KB), spread over
        # ten levels: a run per level per round per segment, still several messages each
        assert chunks <= in_runs(queue) // 3, "one run per level per write, not per message"
        assert queue.paged_count == in_runs(queue)
        assert node.pager.store.reads_now == 0, "nothing read back while it filled (no unrun)"
        assert node.queues.memory.resident <= BUDGET
        got = ids_of(await take(world, client.receiver("prio"), 400, credit=25))
        assert got == in_memory_order(steps)
        await world.quiet(0.1)
        all_back(node, queue)
        assert len(page_files(tmp_path)) <= 1
        await world.close()

    run(play)


def test_the_order_of_delivery_is_the_in_memory_queue_s_for_a_random_mix(tmp_path):
    """Fill, drain part, more arrive (higher and lower levels), drain the rest: node "a"
    (runs per level) and node "b" (no budget) give the same ids in the same order."""
    async def play():
        world = World(tmp_path)
        paged, plain, ca, cb = await nodes(world)
        got = {}
        for name, client in (("a", ca), ("b", cb)):
            sender = client.sender("prio")
            receiver = client.receiver("prio")
            await send(world, sender, plan(250, seed=3))
            await world.quiet(0.05)
            if name == "a":
                assert in_runs(paged.queues.get("prio")) > 180
            await take(world, receiver, 90, credit=9)
            await send(world, sender, plan(150, 250, seed=5, levels=(0, 2, 4, 8, 9)))
            await world.quiet(0.05)
            if name == "a":
                assert in_runs(paged.queues.get("prio")) > 150
                assert paged.pager.store.reads_now == 0
            await take(world, receiver, 400, credit=10)
            got[name] = ids_of(receiver)
        assert sorted(got["a"]) == list(range(400)), "an id lost or twice"
        assert got["a"] == got["b"], "the paged queue's order differs from the in-memory one"
        await world.quiet(0.1)
        all_back(paged, paged.queues.get("prio"))
        await world.close()

    run(play)


def test_released_and_modified_go_back_to_the_head_of_their_level(tmp_path):
    async def play():
        world = World(tmp_path)
        paged, plain, ca, cb = await nodes(world)
        seen = {}
        for name, client in (("a", ca), ("b", cb)):
            await send(world, client.sender("prio"), plan(200, seed=11))
            await world.quiet(0.05)
            if name == "a":
                assert in_runs(paged.queues.get("prio")) > 150
            first = client.receiver("prio", credit=30)
            await world.until(lambda: len(first.received) == 30, what="30 out")
            for index, (_, delivery) in enumerate(first.received):
                if index % 3 == 0:
                    delivery.update(Delivery.RELEASED)
                elif index % 3 == 1:  # delivery-failed: the count goes up
                    delivery.local.failed = True
                    delivery.update(Delivery.MODIFIED)
                else:
                    delivery.update(Delivery.ACCEPTED)
                delivery.settle()
            client.flush()
            await world.quiet(0.05)
            again = await take(world, client.receiver("prio"), 190, credit=9)
            seen[name] = [(m.id, m.delivery_count) for m, _ in again.received]
            ids_of(again)
        assert seen["a"] == seen["b"]
        accepted = in_memory_order(plan(200, seed=11))[2:30:3]
        assert sorted(i for i, _ in seen["a"]) == sorted(set(range(200)) - set(accepted))
        assert sum(1 for _, count in seen["a"] if count == 1) == 10, "modified: one more"
        await world.quiet(0.1)
        all_back(paged, paged.queues.get("prio"))
        await world.close()

    run(play)


def test_expired_messages_in_a_level_s_runs_are_dead_lettered_when_read_back(tmp_path,
                                                                             monkeypatch):
    monkeypatch.setattr(local_queues, "monotonic", lambda: asyncio.get_running_loop().time())

    async def play():
        world = World(tmp_path)
        node = await paging_node(world, queue=[{"name": "prio", "dead_letter": "dlq"}])
        client = await world.client("a")
        sender = client.sender("prio")
        await send(world, sender, [(i, 7) for i in range(40)])
        await send(world, sender, [(i, 2) for i in range(40, 120)], ttl=1.0)  # expire in runs
        await send(world, sender, [(i, 2) for i in range(120, 160)])
        await world.quiet(0.05)
        queue = node.queues.get("prio")
        assert in_runs(queue) > 120 and queue.messages.levels[2].count > 60
        await world.quiet(1.5)
        assert queue.depth == 160, "expired messages in runs count until read back"
        assert queue_info(queue)["by_priority"] == {"7": 40, "2": 120}
        kept = ids_of(await take(world, client.receiver("prio"), 80, credit=10))
        assert kept == list(range(40)) + list(range(120, 160))
        assert queue.stats.expired == 80 and queue.depth == 0
        dead = ids_of(await take(world, client.receiver("dlq"), 80, credit=20))
        assert dead == list(range(40, 120))
        await world.quiet(0.1)
        all_back(node, queue)
        await world.close()

    run(play)


def test_purge_drops_every_level_s_runs_without_reading_them(tmp_path):
    async def play():
        world = World(tmp_path)
        node = await paging_node(world)
        client = await world.client("a")
        sender = client.sender("prio")
        await send(world, sender, plan(300, seed=13))
        await world.quiet(0.05)
        queue = node.queues.get("prio")
        assert in_runs(queue) > 250
        assert operations.purge(node.broker, queue) == 300
        assert node.pager.store.reads_now == 0, "purge read the runs"
        assert queue.depth == 0 and queue_info(queue)["depth"] == 0
        assert queue_info(queue)["by_priority"] == {}
        all_back(node, queue)
        await world.quiet(0.1)
        assert len(page_files(tmp_path)) <= 1, "segments of purged runs are deleted"
        steps = plan(100, 300, seed=13)
        await send(world, sender, steps)  # the queue pages again after a purge
        await world.quiet(0.05)
        assert in_runs(queue) > 50
        got = ids_of(await take(world, client.receiver("prio"), 100, credit=20))
        assert got == in_memory_order(steps)
        await world.quiet(0.1)
        all_back(node, queue)
        await world.close()

    run(play)


def test_a_browser_sees_the_levels_in_order_and_leaves_the_runs_on_disk(tmp_path):
    async def play():
        world = World(tmp_path)
        paged, plain, ca, cb = await nodes(world)
        browsed = {}
        steps = plan(150, seed=17)
        for name, client in (("a", ca), ("b", cb)):
            await send(world, client.sender("prio"), steps)
            await world.quiet(0.05)
            browser = client.receiver("prio", credit=200, browse=True)
            await world.until(lambda: len(browser.received) == 150, what="150 browsed")
            browsed[name] = ids_of(browser)
        queue = paged.queues.get("prio")
        assert browsed["a"] == browsed["b"] == in_memory_order(steps)
        assert queue.depth == 150 and in_runs(queue) > 100, "browsing leaves the runs on disk"
        assert type(queue.messages) is LevelRuns
        got = ids_of(await take(world, ca.receiver("prio"), 150, credit=20))
        assert got == in_memory_order(steps)
        await world.quiet(0.1)
        all_back(paged, queue)
        await world.close()

    run(play)


def test_a_selector_at_a_priority_queue_with_runs_sees_the_same_as_in_memory(tmp_path):
    """A selective consumer needs message objects: the runs are turned back (docs/paging.md,
    "what still leaves runs"); the order is kept, what it selects and what it leaves."""
    async def play():
        world = World(tmp_path)
        paged, plain, ca, cb = await nodes(world)
        steps = plan(120, seed=19)
        got = {}
        for name, client in (("a", ca), ("b", cb)):
            sender = client.sender("prio")
            for i, priority in steps:
                await world.until(lambda: sender.credit > 0)
                sender.link.delivery(str(next(sender.client.tags)))
                sender.link.send(Message(id=i, body=f"{i}:{BODY}", priority=priority,
                                         properties={"even": i % 2 == 0}).encode())
                sender.link.advance()
                sender.client.flush()
            await world.until(lambda: sender.accepted() == 120, what="120 accepted")
            await world.quiet(0.05)
            if name == "a":
                assert in_runs(paged.queues.get("prio")) > 80
            link = client._session().receiver("even")
            link.source.address = "prio"
            put_selector(link.source, "even = true")
            link.open()
            even = client.links[link] = ClientLink(client, link)
            even.flow(100)
            await world.until(lambda: len(even.received) == 60, what="60 selected")
            even.settle()
            rest = ids_of(await take(world, client.receiver("prio"), 60, credit=10))
            got[name] = (ids_of(even), rest)
        order = in_memory_order(steps)
        assert got["a"] == got["b"]
        assert got["a"] == ([i for i in order if i % 2 == 0], [i for i in order if i % 2])
        await world.quiet(0.1)
        all_back(paged, paged.queues.get("prio"))
        await world.close()

    run(play)


def test_competing_consumers_with_little_credit_share_the_levels_each_id_once(tmp_path):
    async def play():
        world = World(tmp_path)
        node = await paging_node(world)
        client = await world.client("a")
        steps = plan(300, seed=23)
        await send(world, client.sender("prio"), steps)
        await world.quiet(0.05)
        queue = node.queues.get("prio")
        assert in_runs(queue) > 250
        one, two = client.receiver("prio"), client.receiver("prio")
        while len(one.received) + len(two.received) < 300:
            got = len(one.received) + len(two.received)
            one.flow(3)
            two.flow(READ_AHEAD)
            await world.until(lambda: len(one.received) + len(two.received) > got,
                              what="more of 300")
            one.settle()
            two.settle()
        await world.quiet(0.1)
        ids = ids_of(one) + ids_of(two)
        assert sorted(ids) == list(range(300)), "each id once"
        rank = {i: n for n, i in enumerate(in_memory_order(steps))}
        for receiver in (one, two):
            mine = [rank[i] for i in ids_of(receiver)]
            assert mine == sorted(mine), "a consumer got a lower priority before a higher"
        all_back(node, queue)
        await world.close()

    run(play)


def test_the_admin_api_counts_each_level_runs_included(tmp_path):
    async def play():
        world = World(tmp_path)
        node = await paging_node(world)
        client = await world.client("a")
        steps = plan(300, seed=29, levels=(1, 4, 6, 9))
        await send(world, client.sender("prio"), steps)
        await world.quiet(0.05)
        queue = node.queues.get("prio")
        assert in_runs(queue) > 250
        counts = {}
        for _, priority in steps:
            counts[str(priority)] = counts.get(str(priority), 0) + 1
        info = queue_info(queue)
        assert info["by_priority"] == counts and info["depth"] == 300
        assert info["paged_messages"] == in_runs(queue)
        got = ids_of(await take(world, client.receiver("prio"), 120, credit=20))
        assert got == in_memory_order(steps)[:120]
        for i in got:
            priority = str(dict(steps)[i])
            counts[priority] -= 1
            if not counts[priority]:
                del counts[priority]
        assert queue_info(queue)["by_priority"] == counts
        assert queue_info(queue)["depth"] == 180
        await world.close()

    run(play)


def test_a_priority_message_at_a_fifo_queue_with_runs_keeps_them_as_level_4(tmp_path):
    async def play():
        world = World(tmp_path)
        node = await paging_node(world)
        client = await world.client("a")
        sender = client.sender("mixed")
        await send(world, sender, [(i, 4) for i in range(150)])
        await world.quiet(0.05)
        queue = node.queues.get("mixed")
        assert type(queue.messages) is RunQueue and queue.messages.count > 120
        runs = queue.messages
        await send(world, sender, [(150, 9), (151, 0), (152, 9)])
        await world.quiet(0.05)
        assert type(queue.messages) is LevelRuns and queue.messages.levels[4] is runs
        assert in_runs(queue) > 120 and node.pager.store.reads_now == 0, "no unrun"
        got = ids_of(await take(world, client.receiver("mixed"), 153, credit=20))
        assert got == [150, 152] + list(range(150)) + [151]
        await world.quiet(0.1)
        all_back(node, queue)
        await world.close()

    run(play)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_sends_takes_and_outcomes_give_what_the_in_memory_queue_gives(tmp_path, seed):
    """Batches of random priorities, takes with random credit, each delivery accepted,
    released or modified (delivery-failed) at random: node "a" (runs per level, no read on
    the loop) and node "b" (no budget) deliver the same ids, counts and order."""
    async def play():
        world = World(tmp_path)
        paged, plain, ca, cb = await nodes(world)
        seen = {}
        deepest = 0
        for name, client in (("a", ca), ("b", cb)):
            pick = random.Random(seed)
            sender = client.sender("prio")
            receiver = client.receiver("prio")
            queue = (paged if name == "a" else plain).queues.get
            sent = 0
            for _ in range(14):
                count = pick.randint(10, 90)
                await send(world, sender, plan(count, sent, seed=seed * 100 + sent))
                sent += count
                await world.quiet(0.05)
                if name == "a":
                    deepest = max(deepest, in_runs(queue("prio")))
                credit = pick.randint(1, 40)
                before = len(receiver.received)
                receiver.drain(credit)  # as many as wait, then the credit is used up
                await world.until(lambda: receiver.credit == 0, what="the drain answered")
                for _, delivery in receiver.received[before:]:
                    roll = pick.random()
                    if roll < 0.2:
                        delivery.update(Delivery.RELEASED)
                    elif roll < 0.35:
                        delivery.local.failed = True
                        delivery.update(Delivery.MODIFIED)
                    else:
                        delivery.update(Delivery.ACCEPTED)
                    delivery.settle()
                client.flush()
                await world.quiet(0.05)
            left = queue("prio").depth
            rest = await take(world, client.receiver("prio"), left, credit=1)
            seen[name] = [(m.id, m.delivery_count) for m, _ in receiver.received] + \
                [(m.id, m.delivery_count) for m, _ in rest.received]
        assert seen["a"] == seen["b"], "the paged queue's order or counts differ"
        assert deepest > 100, "the backlog was never in runs"
        assert paged.pager.store.reads_now == 0, "runs read on the loop (an unrun)"
        await world.quiet(0.1)
        all_back(paged, paged.queues.get("prio"))
        await world.close()

    run(play)
