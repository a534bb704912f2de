"""Runs (docs/paging.md, "Runs"): a FIFO queue's paged messages kept on disk with their index
fields, one object per run in memory. The boundaries of a run, on the virtual clock, with a
budget of about 20 messages so that most of a backlog is in runs.

Each test checks what a user would: every id once and in order, the depth the admin API
shows, the node's bytes and the page store's live bytes back to zero, and that the backlog
was in runs (few objects in memory) while it waited.
"""

from __future__ import annotations

import asyncio

import pytest
from proton import Delivery, Message
from test_paging import BUDGET, READ_AHEAD, drain, fill, ids_of, page_files, paging_node, take

from playbook import World, run

import proxy.queues.local as local_queues
from admin_api.inspect_api import queue_info
from proxy.broker import operations
from proxy.queues.runs import FAILED, RunQueue

pytestmark = pytest.mark.timeout(60)


def in_runs(queue) -> int:
    """Messages of ``queue`` in runs (no object each); 0 when it keeps none."""
    messages = queue.messages
    return messages.count if type(messages) is RunQueue else 0


def objects(queue) -> int:
    """Message objects the queue holds for its ready messages (head, tail, runs not written)."""
    messages = queue.messages
    if type(messages) is not RunQueue:
        return len(messages)
    held = sum(len(c.messages) for c in messages.runs if c.messages is not None)
    return len(messages.head) + len(messages.tail) + held


def all_back(node, queue) -> None:
    memory = node.queues.memory
    assert (queue.paged_count, queue.paged_bytes, memory.paged, memory.used) == (0, 0, 0, 0)
    assert node.pager.store.live_bytes == 0, "page records left live"


async def filled(world, name: str, count: int):
    """A paging node, client "a" and its sender to queue ``name``, ``count`` messages sent and
    paged: (node, client, sender, queue)."""
    node = await paging_node(world)
    client = await world.client("a")
    sender = client.sender(name)
    await fill(world, sender, count)
    await world.quiet(0.05)
    return node, client, sender, node.queues.get(name)


def test_a_backlog_waits_in_runs_with_no_object_per_paged_message(tmp_path):
    async def play():
        world = World(tmp_path)
        node, client, sender, queue = await filled(world, "deep", 400)
        assert queue.depth == 400 and queue_info(queue)["depth"] == 400
        assert in_runs(queue) >= 350, "the backlog is not in runs"
        assert objects(queue) <= 400 - in_runs(queue)
        assert len(queue.messages.runs) <= 40, "one run per write per segment, not per message"
        assert queue.paged_count == in_runs(queue) and queue_info(queue)["paged_messages"] >= 350
        assert node.queues.memory.resident <= BUDGET
        assert await drain(world, client, "deep", 400, credit=25) == list(range(400))
        assert type(queue.messages) is not RunQueue, "runs all read: a plain deque again"
        await world.quiet(0.1)
        all_back(node, queue)
        assert len(page_files(tmp_path)) <= 1
        await world.close()

    run(play)


def test_a_run_read_back_partly_then_a_consumer_leaves_and_another_takes_the_rest(tmp_path):
    async def play():
        world = World(tmp_path)
        node, client, sender, queue = await filled(world, "part", 200)
        before = in_runs(queue)
        first = client.receiver("part")
        await take(world, first, 35, credit=7)  # a few read-aheads: the first run shortened
        assert ids_of(first) == list(range(35))
        first.link.close()
        client.flush()
        await world.quiet(0.1)
        assert not queue.consumers and queue.depth == 165
        assert queue_info(queue)["depth"] == 165
        assert 0 < in_runs(queue) < before, "the run was read back only partly"
        assert in_runs(queue) + objects(queue) == 165
        # more arrive meanwhile: after the runs, in order
        await fill(world, sender, 50, 200)
        await world.quiet(0.05)
        assert queue.depth == 215
        assert await drain(world, client, "part", 215, credit=30) == list(range(35, 250))
        await world.quiet(0.1)
        all_back(node, queue)
        await world.close()

    run(play)


def test_a_consumer_leaving_with_messages_unsettled_puts_them_before_the_runs(tmp_path):
    async def play():
        world = World(tmp_path)
        node, client, sender, queue = await filled(world, "leave", 150)
        assert in_runs(queue) > 100
        gone = client.receiver("leave", credit=12)
        await world.until(lambda: len(gone.received) == 12, what="12 out, unsettled")
        gone.link.close()
        client.flush()
        await world.until(lambda: queue.unacked == 0, what="the 12 back")
        assert queue.depth == 150 and queue_info(queue)["depth"] == 150
        again = await take(world, client.receiver("leave"), 150, credit=20)
        assert ids_of(again) == list(range(150)), "orphaned ones first, then the runs, in order"
        counts = [m.delivery_count for m, _ in again.received]
        assert counts[:12] == [1] * 12 and set(counts[12:]) == {0}
        await world.quiet(0.1)
        all_back(node, queue)
        await world.close()

    run(play)


def test_expired_messages_in_runs_are_taken_out_when_read_back(tmp_path, monkeypatch):
    monkeypatch.setattr(local_queues, "monotonic", lambda: asyncio.get_running_loop().time())

    async def play():
        world = World(tmp_path)
        node = await paging_node(world, queue=[{"name": "ttl", "dead_letter": "ttl-dlq"}])
        client = await world.client("a")
        sender = client.sender("ttl")
        await fill(world, sender, 60)
        await fill(world, sender, 80, 60, ttl=1.0)  # these wait in runs, then expire
        await fill(world, sender, 60, 140)
        await world.quiet(0.05)
        queue = node.queues.get("ttl")
        assert in_runs(queue) > 150
        await world.quiet(1.5)
        assert queue.depth == 200, "expired messages in runs count until read back"
        kept = await drain(world, client, "ttl", 120, credit=20)
        assert kept == list(range(60)) + list(range(140, 200))
        assert queue.stats.expired == 80 and queue.depth == 0
        assert await drain(world, client, "ttl-dlq", 80, credit=20) == list(range(60, 140))
        await world.quiet(0.1)
        all_back(node, queue)
        await world.close()

    run(play)


def test_purge_drops_the_runs_and_their_records(tmp_path):
    async def play():
        world = World(tmp_path)
        node, client, sender, queue = await filled(world, "purged", 300)
        assert in_runs(queue) > 250
        assert operations.purge(node.broker, queue) == 300
        assert queue.depth == 0 and queue_info(queue)["depth"] == 0
        all_back(node, queue)
        await world.quiet(0.1)
        assert len(page_files(tmp_path)) <= 1, "segments of purged runs are deleted"
        await fill(world, sender, 100, 300)  # the queue pages again after a purge
        await world.quiet(0.05)
        assert in_runs(queue) > 50
        assert await drain(world, client, "purged", 100, credit=20) == list(range(300, 400))
        await world.quiet(0.1)
        all_back(node, queue)
        await world.close()

    run(play)


def test_a_priority_message_or_a_browser_at_a_queue_with_runs(tmp_path):
    """A browser reads the runs without taking them; a priority other than the default
    makes the runs level 4 of a priority queue in runs (docs/paging.md), order kept."""
    async def play():
        world = World(tmp_path)
        node, client, sender, queue = await filled(world, "mixed", 120)
        assert in_runs(queue) > 80
        browser = client.receiver("mixed", credit=200, browse=True)
        await world.until(lambda: len(browser.received) == 120, what="120 browsed")
        assert ids_of(browser) == list(range(120)) and queue.depth == 120
        assert in_runs(queue) > 80, "browsing leaves the runs on disk"
        await fill(world, sender, 1, 120, priority=9)
        await world.quiet(0.05)
        assert queue.depth == 121 and queue.messages.count > 80, "the runs kept, as level 4"
        assert queue.paged_count == queue.messages.count
        got = await drain(world, client, "mixed", 121, credit=20)
        assert got == [120] + list(range(120))
        await world.quiet(0.1)
        all_back(node, queue)
        await world.close()

    run(play)


def test_the_depth_limit_counts_the_runs(tmp_path):
    async def play():
        world = World(tmp_path)
        node = await paging_node(world, queue=[{"name": "limited", "max_depth": 150}])
        client = await world.client("a")
        sender = client.sender("limited")
        await fill(world, sender, 150)
        await world.quiet(0.1)
        queue = node.queues.get("limited")
        assert in_runs(queue) > 100
        assert queue.room() == 0 and sender.credit == 0, "no credit past max_depth"
        await take(world, client.receiver("limited"), 10, credit=10)
        await world.until(lambda: sender.credit > 0, what="credit again once 10 are taken")
        assert queue.depth == 140
        await world.close()

    run(play)


def test_competing_consumers_with_little_credit_share_the_runs_each_id_once(tmp_path):
    async def play():
        world = World(tmp_path)
        node, client, sender, queue = await filled(world, "shared", 300)
        assert in_runs(queue) > 250
        one, two = client.receiver("shared"), client.receiver("shared")
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
        assert ids_of(one) == sorted(ids_of(one)) and ids_of(two) == sorted(ids_of(two))
        all_back(node, queue)
        await world.close()

    run(play)


def test_runs_off_keeps_paging_message_by_message(tmp_path):
    async def play():
        world = World(tmp_path)
        node = await world.node("a", limits={"max_memory": BUDGET},
                                paging={"io_thread": False, "read_ahead": READ_AHEAD,
                                        "segment_size": 16384, "runs": False},
                                queues={"credit_window": 50})
        client = await world.client("a")
        await fill(world, client.sender("plain"), 100)
        await world.quiet(0.05)
        queue = node.queues.get("plain")
        assert type(queue.messages) is not RunQueue and queue.paged_count > 50
        assert await drain(world, client, "plain", 100) == list(range(100))
        await world.close()

    run(play)


def test_a_message_never_in_a_run_after_the_window_falls_back_to_one_by_one(tmp_path):
    """Modified undeliverable-here messages (``excluded``) past the read-ahead window: the
    runs cannot start before them, so the queue pages message by message, order kept."""
    async def play():
        world = World(tmp_path)
        node = await paging_node(world)
        client = await world.client("a")
        sender = client.sender("picky")
        await fill(world, sender, 12)
        refused = client.receiver("picky", credit=12)
        await world.until(lambda: len(refused.received) == 12, what="12 out")
        for _, delivery in refused.received:
            delivery.local.undeliverable = True
            delivery.update(Delivery.MODIFIED)
            delivery.settle()
        client.flush()
        queue = node.queues.get("picky")
        await world.until(lambda: queue.unacked == 0, what="the 12 back, excluded there")
        refused.link.close()
        client.flush()
        await fill(world, sender, 100, 12)
        await world.quiet(0.05)
        assert type(queue.messages) is not RunQueue and queue.paged_count > 50
        assert queue.depth == 112 and queue_info(queue)["depth"] == 112
        got = await drain(world, client, "picky", 112, credit=20)
        # each came back to the head as it was settled (the last first), then the rest
        assert sorted(got[:12]) == list(range(12)) and got[12:] == list(range(12, 112))
        await world.quiet(0.1)
        all_back(node, queue)
        await world.close()

    run(play)


def test_drop_head_takes_the_oldest_out_of_the_runs(tmp_path):
    async def play():
        world = World(tmp_path)
        node = await paging_node(world, queue=[{"name": "recent", "max_bytes": 150_000,
                                                "overflow": "drop-head"}])
        client = await world.client("a")
        sender = client.sender("recent")
        await fill(world, sender, 400)
        await world.quiet(0.05)
        queue = node.queues.get("recent")
        kept = queue.depth
        assert 100 < kept < 150 and queue.stats.dropped == 400 - kept
        assert in_runs(queue) > 50 and node.pager.store.reads_now > 0, \
            "the head emptied by drop-head: the first run's front loaded at once"
        assert queue_info(queue)["depth"] == kept and queue.bytes <= 150_000
        assert await drain(world, client, "recent", kept, credit=20) == list(range(400 - kept, 400))
        await world.quiet(0.1)
        all_back(node, queue)
        await world.close()

    run(play)


def test_a_failed_write_keeps_the_run_in_memory_and_loses_nothing(tmp_path, monkeypatch):
    import os

    def failing(*args):
        raise OSError(28, "No space left on device (the test's)")

    monkeypatch.setattr(os, "pwritev", failing)

    async def play():
        world = World(tmp_path)
        node = await paging_node(world)
        client = await world.client("a")
        sender = client.sender("failed")
        await fill(world, sender, 40)  # on the credit given before the write failed
        await world.quiet(0.05)
        queue = node.queues.get("failed")
        assert node.pager.bound == "error" and queue.paged_count == 0
        assert {c.state for c in queue.messages.runs} == {FAILED}, "the runs keep their messages"
        assert queue.depth == 40 and queue_info(queue)["depth"] == 40
        assert await drain(world, client, "failed", 40) == list(range(40))
        await world.quiet(0.1)
        all_back(node, queue)
        await world.close()

    run(play)


def test_a_drain_waits_for_the_run_being_read_and_is_answered_with_messages(tmp_path):
    async def play():
        world = World(tmp_path)
        node = await paging_node(world)
        client = await world.client("a")
        await fill(world, client.sender("drained"), 100)
        await world.quiet(0.05)
        queue = node.queues.get("drained")
        assert in_runs(queue) > 80
        receiver = client.receiver("drained")
        taken = []
        while len(taken) < 100:
            before = len(receiver.received)
            receiver.drain(30)  # §2.6.7: messages as available, then the credit used up
            await world.until(lambda: receiver.credit == 0, what="the drain answered")
            got = len(receiver.received) - before
            assert got == min(30, 100 - len(taken)), "a drain answered before the run was read"
            receiver.settle()
            taken = ids_of(receiver)
        assert taken == list(range(100))
        await world.quiet(0.1)
        all_back(node, queue)
        await world.close()

    run(play)
