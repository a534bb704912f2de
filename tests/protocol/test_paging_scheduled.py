"""Scheduled messages beyond the budget (issue #44, docs/paging-scheduled.md), on the virtual
clock: the schedule's wall clock moves with the loop.

Each scenario is played on node "a" (a budget of about 20 messages: most of a scheduled
backlog in runs on disk) and node "b" (no budget) side by side, and checks what a user
would: every id once, each delivered at its time (not before, and within a few virtual ms
after), in the order of the times (then of arrival), the same ids, order and times on both
nodes; the paging node's bodies in memory bounded by its ceiling throughout and by the
budget once quiet; its bytes and page records back to zero at the end.
"""

from __future__ import annotations

import asyncio
import random

import pytest
from proton import Message, symbol

from playbook import World, run
from test_paging import BODY, BUDGET, READ_AHEAD, paging

import proxy.queues.local as local_queues
import proxy.queues.schedule as schedule
from admin_api.inspect_api import queue_info
from proxy.broker import operations

pytestmark = pytest.mark.timeout(60)

EPOCH = 1_800_000_000.0  # the wall clock at the loop's start (virtual)
SLACK = 0.05  # seconds after its time a message may arrive (the poll's step, dispatch)
JOURNAL = {"fsync": False, "segment_size": 16384}


@pytest.fixture
def clock(monkeypatch):
    """The schedule's wall clock tied to the running loop's virtual time (``offset``: moved
    on at a restart, a new loop starting at its own zero)."""
    offset = [EPOCH]
    monkeypatch.setattr(schedule, "clock",
                        lambda: offset[0] + asyncio.get_running_loop().time())
    return offset


async def two_nodes(world: World, *, durable: bool = False, queue=()):
    """Node "a" pages beyond a budget of 20 messages, node "b" keeps all in memory."""
    more = {"journal": JOURNAL} if durable else {}
    queues = {"credit_window": 50, "durable": durable}
    paged = await world.node("a", limits={"max_memory": BUDGET}, paging=paging(),
                             queue=list(queue), queues=queues, **more)
    plain = await world.node("b", queue=list(queue), queues=queues, **more)
    return paged, plain


def scheduled(i: int, at: float, **fields) -> Message:
    return Message(id=i, body=f"{i}:{BODY}", annotations={
        symbol("x-opt-delivery-time"): int(round(at * 1000))}, **fields)


async def send(world: World, sender, messages: list) -> None:
    """Each message as credit allows; every one accepted (bounded waits)."""
    before = sender.accepted()
    for message in messages:
        await world.until(lambda: sender.credit > 0, what=f"credit for {message.id}")
        sender.link.delivery(str(next(sender.client.tags)))
        sender.link.send(message.encode())
        sender.link.advance()
        sender.client.flush()
    await world.until(lambda: sender.accepted() == before + len(messages),
                      what=f"{len(messages)} accepted")


class Peak:
    """The highest resident body bytes of a node's memory, sampled every virtual ms."""

    def __init__(self, memory) -> None:
        self.memory = memory
        self.value = 0
        self.task = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        while True:
            self.value = max(self.value, self.memory.resident)
            await asyncio.sleep(0.001)

    def stop(self) -> int:
        self.task.cancel()
        return self.value


async def collect(receiver, count: int, within: float, credit: int = 20) -> list:
    """``(id, wall time received)`` for ``count`` messages, ``credit`` at a time, settled as
    they come; fails past ``within`` virtual seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    got = []
    receiver.flow(credit)
    while len(got) < count:
        assert loop.time() < deadline, f"{len(got)} of {count} received in {within}s"
        await asyncio.sleep(0.005)
        new = receiver.received[len(got):]
        for message, _ in new:
            assert message.body == f"{message.id}:{BODY}", "a body came back changed"
            got.append((message.id, schedule.clock()))
        if new:
            receiver.settle()
            if receiver.credit < credit:
                receiver.flow(credit - receiver.credit)
    await asyncio.sleep(0.2)
    assert len(receiver.received) == count, "more than was sent"
    return got


def on_time(got: list, times: dict) -> None:
    """Each id once, at or just after its time, in the order of the times (then of ids:
    they were sent in id order)."""
    ids = [i for i, _ in got]
    assert len(set(ids)) == len(ids), "an id came twice"
    assert ids == sorted(times, key=lambda i: (times[i], i)), "not in the order of the times"
    for i, at in got:
        assert times[i] - 1e-6 <= at <= times[i] + SLACK, f"{i} due {times[i]}, came {at}"


def same(got_a: list, got_b: list) -> None:
    assert [i for i, _ in got_a] == [i for i, _ in got_b], "the nodes' orders differ"
    for (i, at_a), (_, at_b) in zip(got_a, got_b):
        assert abs(at_a - at_b) <= SLACK, f"{i} came at {at_a} and at {at_b}"


def all_back(node, name: str) -> None:
    queue = node.queues.get(name)
    memory = node.queues.memory
    assert queue.scheduled.total == 0 and not queue.scheduled.runs
    assert (queue.paged_bytes, memory.paged, memory.used) == (0, 0, 0)
    if node.pager is not None:
        assert node.pager.store.live_bytes == 0, "page records left live"


def in_runs(node, name: str) -> int:
    return node.queues.get(name).scheduled.paged


def test_a_backlog_of_ten_budgets_of_scheduled_messages_pages_and_comes_at_its_times(
        tmp_path, clock):
    async def play():
        world = World(tmp_path)
        paged, plain = await two_nodes(world)
        start = schedule.clock()
        order = list(range(200))
        random.Random(3).shuffle(order)  # sent in another order than their times
        times = {i: start + 20 + (i % 100) * 0.1 + (i // 100) * 0.05 for i in range(200)}
        ca, cb = await world.client("a"), await world.client("b")
        peak = Peak(paged.queues.memory)
        for client in (ca, cb):
            await send(world, client.sender("sched"), [scheduled(i, times[i]) for i in order])
        await world.quiet(0.1)
        queue = paged.queues.get("sched")
        memory = paged.queues.memory
        assert queue.scheduled.total == 200 and queue.depth == 0
        assert in_runs(paged, "sched") >= 170, "the scheduled backlog is not paged"
        assert memory.used == 200 * len(scheduled(0, 0).encode()) or memory.used > 10 * BUDGET
        assert memory.resident <= BUDGET, "a quiet node is back under its budget"
        assert len(queue.scheduled.runs) <= 60, "a run per write, not per message"
        info = queue_info(queue)
        assert info["scheduled"] == 200 and info["scheduled_paged"] == in_runs(paged, "sched")
        assert info["scheduled_paged_bytes"] == queue.scheduled.paged_bytes > 10 * BUDGET - 30_000
        assert info["memory_bytes"] <= BUDGET
        got_a, got_b = await asyncio.gather(collect(ca.receiver("sched"), 200, 60),
                                            collect(cb.receiver("sched"), 200, 60))
        assert peak.stop() <= memory.ceiling, "memory for bodies went past the ceiling"
        on_time(got_a, times)
        on_time(got_b, times)
        same(got_a, got_b)
        assert paged.pager.read_back >= 170 and paged.pager.store.reads_now == 0
        all_back(paged, "sched")
        all_back(plain, "sched")
        await world.close()

    run(play)


def test_many_due_at_once_come_in_the_order_they_arrived_memory_bounded(tmp_path, clock):
    """Ten budgets due at one instant (and a few just before and after): the read-back goes
    half a window at a time, the ready order pages again, the producer is never stopped."""
    async def play():
        world = World(tmp_path)
        paged, plain = await two_nodes(world)
        start = schedule.clock()
        times = {i: start + 15 for i in range(200)}
        times.update({i: start + 14 for i in range(200, 210)})
        times.update({i: start + 16 for i in range(210, 220)})
        ca, cb = await world.client("a"), await world.client("b")
        messages = [scheduled(i, times[i]) for i in [*range(210, 220), *range(200),
                                                      *range(200, 210)]]
        peak = Peak(paged.queues.memory)
        for client in (ca, cb):
            await send(world, client.sender("burst"), messages)
        await world.quiet(0.1)
        assert in_runs(paged, "burst") >= 180
        got_a, got_b = await asyncio.gather(collect(ca.receiver("burst"), 220, 60, credit=10),
                                            collect(cb.receiver("burst"), 220, 60, credit=10))
        # scheduled reads fill up to the ceiling producers stop at; the ready order's own
        # read-ahead (half its window, READ_AHEAD // 2 messages) may come on top of that
        assert peak.stop() <= paged.queues.memory.ceiling + READ_AHEAD // 2 * 1100
        on_time(got_a[:10] + got_a[210:], {i: times[i] for i in [*range(200, 210),
                                                                 *range(210, 220)]})
        assert [i for i, _ in got_a] == [*range(200, 210), *range(200), *range(210, 220)]
        same(got_a, got_b)
        all_back(paged, "burst")
        all_back(plain, "burst")
        await world.close()

    run(play)


def test_paged_scheduled_messages_that_expire_before_their_time_are_dead_lettered(
        tmp_path, clock, monkeypatch):
    monkeypatch.setattr(local_queues, "monotonic", lambda: asyncio.get_running_loop().time())

    async def play():
        world = World(tmp_path)
        paged, plain = await two_nodes(world, queue=[{"name": "exp", "dead_letter": "dlq"}])
        start = schedule.clock()
        times = {i: start + 10 + i * 0.02 for i in range(120)}
        # the odd ones live 5 s: expired when their time comes (10 s on)
        messages = [scheduled(i, times[i], **({"ttl": 5.0} if i % 2 else {}))
                    for i in range(120)]
        ca, cb = await world.client("a"), await world.client("b")
        for client in (ca, cb):
            await send(world, client.sender("exp"), messages)
        await world.quiet(0.1)
        assert in_runs(paged, "exp") >= 90
        live = {i: t for i, t in times.items() if i % 2 == 0}
        got_a, got_b = await asyncio.gather(collect(ca.receiver("exp"), 60, 30),
                                            collect(cb.receiver("exp"), 60, 30))
        on_time(got_a, live)
        same(got_a, got_b)
        for node, client in ((paged, ca), (plain, cb)):
            queue = node.queues.get("exp")
            assert queue.stats.expired == 60 and queue.depth == 0
            dead = await collect(client.receiver("dlq"), 60, 10)
            assert sorted(i for i, _ in dead) == list(range(1, 120, 2))
            all_back(node, "exp")
            all_back(node, "dlq")
        await world.close()

    run(play)


def test_a_purge_drops_paged_scheduled_messages_without_reading_them(tmp_path, clock):
    async def play():
        world = World(tmp_path)
        paged, plain = await two_nodes(world)
        start = schedule.clock()
        times = {i: start + 30 - i * 0.1 for i in range(150)}  # the last sent come first
        ca, cb = await world.client("a"), await world.client("b")
        for client in (ca, cb):
            await send(world, client.sender("purged"), [scheduled(i, times[i])
                                                        for i in range(150)])
        await world.quiet(0.1)
        assert in_runs(paged, "purged") >= 120
        for node in (paged, plain):
            queue = node.queues.get("purged")
            peeked = [m["properties"]["message_id"] for m in operations.peek(queue, 3)]
            assert peeked == [149, 148, 147], "peek shows the scheduled in their times' order"
            assert operations.purge(node.broker, queue) == 150
            all_back(node, "purged")
        assert paged.pager.read_back == 0, "a purge read paged scheduled messages back"
        receivers = (ca.receiver("purged", credit=10), cb.receiver("purged", credit=10))
        await world.quiet(40)  # past every time: nothing comes
        assert [r.received for r in receivers] == [[], []]
        # the queue goes on: scheduled messages sent after the purge come at their times
        later = {i: schedule.clock() + 5 + (i - 150) * 0.1 for i in range(150, 190)}
        for client in (ca, cb):
            await send(world, client.sender("purged"), [scheduled(i, t)
                                                        for i, t in later.items()])
        got = await asyncio.gather(*(collect(r, 40, 20) for r in receivers))
        on_time(got[0], later)
        same(*got)
        await world.close()

    run(play)


def test_a_durable_scheduled_backlog_keeps_its_times_across_a_restart(tmp_path, clock):
    """Ten budgets of durable scheduled messages (200 with a time, 10 with a delay turned
    into a time on arrival), paged, the nodes stopped and started again: each comes at its
    time, in order; after the restart the bodies beyond half the budget stay in the journal
    until near their time (nothing written to the page store)."""
    delayed = range(200, 210)

    async def play():
        world = World(tmp_path)
        paged, plain = await two_nodes(world, durable=True)
        start = schedule.clock()
        times = {i: start + 20 + (i * 37) % 200 * 0.05 for i in range(200)}
        ca, cb = await world.client("a"), await world.client("b")
        for client in (ca, cb):
            await send(world, client.sender("dur"), [
                *(scheduled(i, times[i], durable=True) for i in range(200)),
                *(Message(id=i, body=f"{i}:{BODY}", durable=True, annotations={
                    symbol("x-opt-delivery-delay"): 25_000}) for i in delayed)])
        sent_at = schedule.clock()
        await world.quiet(0.1)
        assert in_runs(paged, "dur") >= 170
        stopped = schedule.clock()
        await world.close()
        return start, sent_at, times, stopped

    start, sent_at, times, stopped = run(play)

    async def again():
        loop = asyncio.get_running_loop()
        clock[0] = stopped + 1.0 - loop.time()  # a second later, in the new process's loop
        world = World(tmp_path)
        paged, plain = await two_nodes(world, durable=True)
        queue = paged.queues.get("dur")
        memory = paged.queues.memory
        assert queue.scheduled.total == 210 and plain.queues.get("dur").scheduled.total == 210
        assert memory.resident <= BUDGET, "the restart kept scheduled bodies in memory"
        # left in the journal: a journal run (40 bytes a message), its segments pinned
        assert queue.scheduled.paged >= 190 and queue.paged_count == 0, "not in a journal run"
        assert paged.journal.pinned and paged.journal_pages.live >= 190
        assert queue_info(queue)["scheduled"] == 210
        assert paged.pager.store.writes == 0, "the restart wrote bodies to the page store"
        runs_were_journal = [queue.next_due and all(run.journal for run in queue.scheduled.runs)
                             and len(queue.scheduled.runs) == 1]
        ca, cb = await world.client("a"), await world.client("b")
        peak = Peak(memory)
        got_a, got_b = await asyncio.gather(collect(ca.receiver("dur"), 210, 60),
                                            collect(cb.receiver("dur"), 210, 60))
        assert peak.stop() <= memory.ceiling
        for got in (got_a, got_b):
            on_time([(i, at) for i, at in got if i not in delayed], times)
            for i, at in got:
                if i in delayed:  # the delay ran from its arrival, before the restart
                    assert start + 25 - 1e-6 <= at <= sent_at + 25 + SLACK, f"{i} came at {at}"
            assert [at for _, at in got] == sorted(at for _, at in got)
        same([e for e in got_a if e[0] not in delayed], [e for e in got_b if e[0] not in delayed])
        assert runs_were_journal[0], "the restored backlog was not a journal run"
        assert not paged.journal.pinned and paged.journal_pages.live == 0, "pins left"
        all_back(paged, "dur")
        all_back(plain, "dur")
        await world.close()

    run(again)
