"""Queues larger than memory (issue #44, docs/paging.md): the paging boundaries, on the
virtual clock, with a budget of a few messages so that most of a backlog is on disk.

Each test checks what a user would: every id sent is received once and in the order the
queue promises, bodies intact, and the node's memory for bodies held near the budget while
the backlog is many times larger. The page store's I/O runs on the loop here
(``[paging] io_thread = false``); tests/paging/ runs it in its thread with real processes.
"""

from __future__ import annotations

import asyncio

import pytest
from proton import Delivery, Message

from memory import put_selector
from playbook import ClientLink, World, run

import proxy.queues.local as local_queues

pytestmark = pytest.mark.timeout(60)

BODY = "x" * 1000
BUDGET = 20_000  # about 20 messages of BODY in memory
READ_AHEAD = 8


def paging(**more) -> dict:
    return {"io_thread": False, "read_ahead": READ_AHEAD, "segment_size": 16384, **more}


async def paging_node(world: World, *, queue=(), **limits):
    return await world.node("a", limits={"max_memory": BUDGET, **limits}, paging=paging(),
                            queue=list(queue), queues={"credit_window": 50})


def send_message(sender, message: Message) -> None:
    sender.link.delivery(str(next(sender.client.tags)))
    sender.link.send(message.encode())
    sender.link.advance()
    sender.client.flush()


async def fill(world: World, sender, count: int, start: int = 0, **fields) -> None:
    """``count`` numbered messages, as credit allows; every one accepted (bounded waits)."""
    before = sender.accepted()
    for i in range(start, start + count):
        await world.until(lambda: sender.credit > 0, what=f"credit for message {i}")
        send_message(sender, Message(id=i, body=f"{i}:{BODY}", **fields))
    await world.until(lambda: sender.accepted() == before + count, what=f"{count} accepted")


def ids_of(receiver) -> list:
    for message, _ in receiver.received:
        assert message.body == f"{message.id}:{BODY}", "a body came back changed"
    return [message.id for message, _ in receiver.received]


async def take(world: World, receiver, count: int, credit: int = 10):
    """``count`` messages on ``receiver``, ``credit`` at a time, settled as they come."""
    while len(receiver.received) < count:
        receiver.flow(credit)
        got = len(receiver.received)
        await world.until(lambda: len(receiver.received) >= min(count, got + credit),
                          what=f"{min(count, got + credit)} of {count} messages")
        receiver.settle()
    await world.quiet(0.2)
    assert len(receiver.received) == count, "more than was sent"
    return receiver


async def drain(world: World, client, address: str, count: int, credit: int = 10) -> list:
    """Receive ``count`` messages ``credit`` at a time, settling as they come."""
    return ids_of(await take(world, client.receiver(address), count, credit))


def page_files(tmp_path) -> list:
    return sorted((tmp_path / "a" / "paging").glob("*.page"))


def test_a_backlog_of_ten_budgets_pages_out_and_comes_back_in_order(tmp_path):
    async def play():
        world = World(tmp_path)
        node = await paging_node(world)
        memory = node.queues.memory
        client = await world.client("a")
        sender = client.sender("big")
        peak = 0
        for start in range(0, 200, 20):
            await fill(world, sender, 20, start)
            await world.quiet(0.01)
            peak = max(peak, memory.resident)
        queue = node.queues.get("big")
        assert queue.depth == 200 and memory.used > 10 * BUDGET
        assert peak <= memory.ceiling, "memory for bodies went past the ceiling"
        assert memory.resident <= BUDGET, "a quiet node is back under its budget"
        assert queue.paged_count >= 170 and memory.paged == queue.paged_bytes
        assert page_files(tmp_path), "no page files"

        assert await drain(world, client, "big", 200) == list(range(200))
        assert (queue.paged_count, queue.paged_bytes, memory.paged, memory.used) == (0, 0, 0, 0)
        assert node.pager.store.live_bytes == 0
        assert len(page_files(tmp_path)) <= 1, "segments with no live record are deleted"
        await world.close()
        assert not (tmp_path / "a" / "paging").exists()

    run(play)


def test_producers_are_not_stopped_at_the_budget_only_at_the_disk_bound(tmp_path):
    async def play():
        world = World(tmp_path)
        node = await paging_node(world, max_disk=60_000)
        client = await world.client("a")
        sender = client.sender("q")
        await fill(world, sender, 60)  # three budgets: paged, not refused
        sent = 60
        while sender.credit > 0 and sent < 400:
            send_message(sender, Message(id=sent, body=f"{sent}:{BODY}"))
            sent += 1
            await world.quiet(0.005)
        assert sent < 400, "credit went on past max_disk"
        await world.until(lambda: len(sender.outcomes) == sent, what="every outcome")
        assert sender.accepted() == sent, "what was sent on credit given is taken"
        assert node.pager.bound == "disk"
        # past the budget by no more than the credit given before the bound (50 messages)
        assert node.queues.memory.resident <= BUDGET + 50 * 1100
        assert await drain(world, client, "q", sent, credit=20) == list(range(sent))
        await world.until(lambda: node.pager.bound is None, what="the bound lifted")
        await world.until(lambda: sender.credit > 0, what="credit again")
        await world.close()

    run(play)


def test_priority_order_holds_across_the_paged_part(tmp_path):
    async def play():
        world = World(tmp_path)
        node = await paging_node(world)
        client = await world.client("a")
        sender = client.sender("prio")
        await fill(world, sender, 60, priority=4)
        await fill(world, sender, 60, 60, priority=7)
        await world.quiet(0.05)
        assert node.queues.get("prio").paged_count > 40
        ids = await drain(world, client, "prio", 120, credit=7)
        assert ids == list(range(60, 120)) + list(range(60))
        await world.close()

    run(play)


def test_competing_consumers_share_a_paged_backlog_each_id_once(tmp_path):
    async def play():
        world = World(tmp_path)
        await paging_node(world)
        client = await world.client("a")
        sender = client.sender("shared")
        await fill(world, sender, 150)
        first, second = client.receiver("shared"), client.receiver("shared")
        while len(first.received) + len(second.received) < 150:
            first.flow(3)
            second.flow(5)
            got = len(first.received) + len(second.received)
            await world.until(lambda: len(first.received) + len(second.received) > got,
                              what="more messages")
            await world.quiet(0.01)
            first.settle()
            second.settle()
        both = ids_of(first) + ids_of(second)
        assert sorted(both) == list(range(150)), "an id lost or received twice"
        assert ids_of(first) == sorted(ids_of(first)) and ids_of(second) == sorted(ids_of(second))
        await world.close()

    run(play)


def test_released_and_modified_paged_messages_come_back_with_the_right_body(tmp_path):
    async def play():
        world = World(tmp_path)
        node = await paging_node(world)
        client = await world.client("a")
        sender = client.sender("back")
        await fill(world, sender, 100)
        await world.quiet(0.05)
        receiver = client.receiver("back", credit=30)
        await world.until(lambda: len(receiver.received) == 30, what="30 messages")
        for index, (_, delivery) in enumerate(receiver.received):
            if index < 10:
                delivery.update(Delivery.RELEASED)
            elif index < 20:  # delivery-failed: the count goes up
                delivery.local.failed = True
                delivery.update(Delivery.MODIFIED)
            else:
                delivery.update(Delivery.ACCEPTED)
            delivery.settle()
        client.flush()
        await world.quiet(0.05)
        again = await take(world, client.receiver("back"), 90)
        ids = ids_of(again)
        assert sorted(ids[:20]) == list(range(20)) and ids[20:] == list(range(30, 100))
        counts = {m.id: m.delivery_count for m, _ in again.received[:20]}
        assert counts == {i: 0 if i < 10 else 1 for i in range(20)}, \
            "released: the count kept; modified with delivery-failed: one more"
        await world.quiet(0.1)
        queue = node.queues.get("back")
        assert queue.bytes == 0 and node.pager.store.live_bytes == 0
        await world.close()

    run(play)


def test_expired_paged_messages_are_dead_lettered_with_their_bodies(tmp_path, monkeypatch):
    monkeypatch.setattr(local_queues, "monotonic", lambda: asyncio.get_running_loop().time())

    async def play():
        world = World(tmp_path)
        node = await paging_node(world, queue=[{"name": "short", "dead_letter": "dlq"}])
        client = await world.client("a")
        sender = client.sender("short")
        await fill(world, sender, 50, ttl=1.0)
        await fill(world, sender, 50, 50)
        await world.quiet(0.05)
        assert node.queues.get("short").paged_count > 30
        await world.quiet(1.5)
        assert await drain(world, client, "short", 50) == list(range(50, 100))
        dead = await drain(world, client, "dlq", 50)
        assert dead == list(range(50))
        await world.close()

    run(play)


def test_a_browser_and_a_selector_see_paged_bodies(tmp_path):
    async def play():
        world = World(tmp_path)
        node = await paging_node(world)
        client = await world.client("a")
        sender = client.sender("look")
        for i in range(80):
            await world.until(lambda: sender.credit > 0)
            send_message(sender, Message(id=i, body=f"{i}:{BODY}",
                                         properties={"even": i % 2 == 0}))
        await world.until(lambda: sender.accepted() == 80, what="80 accepted")
        await world.quiet(0.05)
        assert node.queues.get("look").paged_count > 50
        browser = client.receiver("look", credit=100, browse=True)
        await world.until(lambda: len(browser.received) == 80, what="80 browsed")
        assert ids_of(browser) == list(range(80))
        assert node.queues.get("look").depth == 80, "a browser takes nothing"

        link = client._session().receiver("even")
        link.source.address = "look"
        put_selector(link.source, "even = true")
        link.open()
        even = client.links[link] = ClientLink(client, link)
        even.flow(100)
        await world.until(lambda: len(even.received) == 40, what="40 selected")
        even.settle()
        assert ids_of(even) == list(range(0, 80, 2))
        rest = await drain(world, client, "look", 40)
        assert rest == list(range(1, 80, 2))
        await world.close()

    run(play)


def test_purge_on_temporary_queue_deletion_frees_the_pages(tmp_path):
    async def play():
        world = World(tmp_path)
        node = await paging_node(world)
        client = await world.client("a")
        sender = client.sender("gone")
        await fill(world, sender, 100)
        await world.quiet(0.05)
        queue = node.queues.get("gone")
        assert queue.paged_count > 50
        assert queue.purge() == 100
        assert (queue.paged_count, queue.paged_bytes, node.queues.memory.paged) == (0, 0, 0)
        assert node.pager.store.live_bytes == 0
        await world.close()

    run(play)


def test_a_transaction_over_paged_messages_rolls_back_and_commits_whole(tmp_path):
    """Five paged messages taken and five posted in a transaction (held postings and messages
    out count against the budget): a rollback puts the five back and posts nothing; the same
    again committed takes the five and adds the others."""
    from test_transactions_playbooks import Txn

    async def play():
        world = World(tmp_path)
        node = await paging_node(world)
        client = await world.client("a")
        await fill(world, client.sender("tx"), 100)
        await world.quiet(0.05)
        queue = node.queues.get("tx")
        assert queue.paged_count > 70
        txn_ctl = Txn(world, client)
        poster = client.sender("tx")
        await world.until(lambda: poster.credit > 0)

        for commit in (False, True):
            txn = await txn_ctl.declare()
            receiver = client.receiver("tx", credit=5)
            await world.until(lambda: len(receiver.received) == 5, what="5 taken")
            assert ids_of(receiver) == list(range(5))
            txn_ctl.retire(receiver, txn)
            for i in range(1000, 1005):
                await world.until(lambda: poster.credit > 0, what="credit to post")
                txn_ctl.send(poster, txn, f"{i}:{BODY}")
            await world.quiet(0.05)
            answer = await txn_ctl.discharge(txn, fail=not commit)
            assert answer.remote_state == Delivery.ACCEPTED
            receiver.link.close()
            client.flush()
            await world.quiet(0.1)
            assert queue.depth == 100, "rollback or commit not whole"  # 100, or 95 + 5

        rest = await take(world, client.receiver("tx"), 100)
        bodies = [m.body for m, _ in rest.received]
        assert bodies == [f"{i}:{BODY}" for i in [*range(5, 100), *range(1000, 1005)]]
        await world.close()

    run(play)
