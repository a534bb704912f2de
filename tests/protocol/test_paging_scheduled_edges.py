"""Scheduled messages beyond the budget, the edges (docs/paging-scheduled.md): priorities,
redeliveries a consumer delays (modified with a delivery time), a run whose time comes
while it is still being written, a write that fails. The first two on the virtual clock
against a node without a budget (``test_paging_scheduled``'s helpers); the last two on a
queue, pager and page store in this process, their I/O on the loop.
"""

from __future__ import annotations

import asyncio
import random

import pytest
from proton import Delivery, symbol
from test_paging import BUDGET, paging
from test_paging_scheduled import (Peak, all_back, clock, collect, in_runs, on_time, same,  # noqa: F401
                                   scheduled, send, two_nodes)

from playbook import World, run

import proxy.queues.schedule as schedule
from proxy.paging.pager import Pager
from proxy.paging.store import STORED, PageStore
from proxy.queues.local import LocalQueue, StoredMessage
from proxy.queues.memory import MemoryUse
from proxy.queues.schedule_pages import WRITING_RUN

pytestmark = pytest.mark.timeout(60)


def test_scheduled_messages_with_priorities_come_in_the_in_memory_node_s_order(tmp_path,
                                                                                 clock):
    """Ten budgets at random priorities and times, some times shared: when several are due
    the higher priority goes first, as on a node without a budget."""
    async def play():
        world = World(tmp_path)
        paged, plain = await two_nodes(world)
        start = schedule.clock()
        pick = random.Random(11)
        times = {i: start + 10 + pick.randrange(40) * 0.25 for i in range(200)}
        messages = [scheduled(i, times[i], priority=pick.randrange(10)) for i in range(200)]
        ca, cb = await world.client("a"), await world.client("b")
        for client in (ca, cb):
            await send(world, client.sender("prio"), messages)
        await world.quiet(0.1)
        assert in_runs(paged, "prio") >= 170
        peak = Peak(paged.queues.memory)
        got_a, got_b = await asyncio.gather(collect(ca.receiver("prio"), 200, 40, credit=5),
                                            collect(cb.receiver("prio"), 200, 40, credit=5))
        assert peak.stop() <= paged.queues.memory.ceiling
        same(got_a, got_b)
        assert sorted(i for i, _ in got_a) == list(range(200))
        for got in (got_a, got_b):  # (a priority released at its time waited for the next
            for i, at in got:           # dispatch before: found without a budget too)
                assert times[i] - 1e-6 <= at <= times[i] + 0.05, f"{i} at {at}"
        all_back(paged, "prio")
        await world.close()

    run(play)


def test_redeliveries_a_consumer_delays_page_and_come_back_at_their_times(tmp_path, clock):
    """A consumer takes ten budgets of ready messages and answers each with modified and a
    delivery time (a redelivery later): they wait paged, then come back at those times."""
    async def play():
        world = World(tmp_path)
        paged, plain = await two_nodes(world)
        ca, cb = await world.client("a"), await world.client("b")
        for client in (ca, cb):
            await send(world, client.sender("retry"), [scheduled(i, 0.0) for i in range(200)])
        await world.quiet(0.1)
        start = schedule.clock()
        later = {i: start + 15 + ((i * 13) % 200) * 0.05 for i in range(200)}
        for client in (ca, cb):
            receiver = client.receiver("retry")
            receiver.flow(200)
            await world.until(lambda: len(receiver.received) == 200, what="200 first tries")
            for message, delivery in receiver.received:
                delivery.local.annotations = {
                    symbol("x-opt-delivery-time"): int(round(later[message.id] * 1000))}
                delivery.update(Delivery.MODIFIED)
                delivery.settle()
            client.flush()
            receiver.link.close()
            client.flush()
        await world.quiet(0.5)
        assert paged.queues.get("retry").scheduled.total == 200
        assert in_runs(paged, "retry") >= 170, "the delayed redeliveries are not paged"
        assert paged.queues.memory.resident <= BUDGET
        got_a, got_b = await asyncio.gather(collect(ca.receiver("retry"), 200, 40),
                                            collect(cb.receiver("retry"), 200, 40))
        on_time(got_a, later)
        same(got_a, got_b)
        all_back(paged, "retry")
        all_back(plain, "retry")
        await world.close()

    run(play)


class Sink:
    consumer_id = 1
    credit = 1 << 20

    def __init__(self) -> None:
        self.out = []

    def deliver(self, message) -> None:
        self.out.append(message)


async def in_process(tmp_path, now: list, budget: int = 20_000, **settings):
    memory = MemoryUse(budget)
    queues = []
    pager = Pager(PageStore(tmp_path / "paging", segment_size=16384, threads=False), memory,
                  lambda: queues, read_ahead=8, **settings)
    pager.start(asyncio.get_running_loop())
    queue = LocalQueue("q", memory=memory)
    queues.append(queue)
    pager.on_loaded = lambda q: q.dispatch()
    return pager, queue


def payload(i: int, at: float) -> bytes:
    return scheduled(i, at).encode()


def test_a_run_whose_time_comes_while_it_is_written_hands_its_messages_over(tmp_path,
                                                                            monkeypatch):
    now = [1_800_000_000.0]
    monkeypatch.setattr(schedule, "clock", lambda: now[0])

    async def play():
        pager, queue = await in_process(tmp_path, now)
        for i in range(100):
            queue.enqueue(StoredMessage(payload(i, now[0] + 10 + i * 0.01)))
        await asyncio.sleep(0)  # the pager's round: runs placed, their write not yet done
        runs = queue.scheduled.runs
        assert runs and all(run.state == WRITING_RUN for run in runs)
        sink = Sink()
        queue.add_consumer(sink)
        now[0] += 11  # every one due, their runs still being written
        queue.dispatch()
        assert [m.seq for m in sink.out] == list(range(1, 101)), \
            "not every one, in order, at once"
        for _ in range(20):
            await asyncio.sleep(0)  # the writes report
        assert all(m.page is None or m.page.state == STORED for m in sink.out)
        assert not queue.scheduled.runs and queue.scheduled.total == 0
        for message in sink.out:
            queue.settled_accepted(message)
        assert pager.store.live_bytes == 0 and pager.memory.used == 0
        pager.close()

    asyncio.run(play())


def test_a_failed_write_keeps_the_scheduled_messages_in_memory(tmp_path, monkeypatch):
    now = [1_800_000_000.0]
    monkeypatch.setattr(schedule, "clock", lambda: now[0])

    async def play():
        pager, queue = await in_process(tmp_path, now)

        def fail(items):
            raise OSError(28, "No space left on device")
        monkeypatch.setattr(pager.store, "_write", fail)
        for i in range(60):
            queue.enqueue(StoredMessage(payload(i, now[0] + 10 + (59 - i) * 0.01)))
        for _ in range(20):
            await asyncio.sleep(0)
        scheduled_ = queue.scheduled
        assert pager.bound == "error" and not scheduled_.runs
        assert scheduled_.total == 60 and scheduled_.in_runs == 0 and scheduled_.paged == 0
        assert pager.memory.paged == 0 and queue.paged_bytes == 0
        sink = Sink()
        queue.add_consumer(sink)
        now[0] += 11
        queue.dispatch()
        assert [m.seq for m in sink.out] == list(range(60, 0, -1)), "in the order of times"
        for message in sink.out:
            queue.settled_accepted(message)
        assert pager.memory.used == 0 and pager.store.live_bytes == 0
        pager.close()

    asyncio.run(play())


def test_a_scheduled_message_with_a_priority_is_dispatched_when_its_time_comes(monkeypatch):
    """No budget: the dispatch that releases it delivers it (before, the release turned the
    FIFO order into a priority store after dispatch had taken the old one: it waited for the
    next dispatch)."""
    from memory import Harness

    now = [1_800_000_000.0]
    monkeypatch.setattr(schedule, "clock", lambda: now[0])
    h = Harness()
    c = h.client()
    snd = c.sender("q")
    for i, priority in enumerate((2, 9, 5)):
        c.send(snd, scheduled(i, now[0] + 5, priority=priority))
    h.pump()
    rcv = c.receiver("q", credit=10)
    assert c.received(rcv) == []
    now[0] += 6
    queue = h.queues.get("q")
    h.broker.dirty_queues.add(queue)
    h.pump()
    assert [r.message.id for r in c.received(rcv)] == [1, 2, 0]


def test_a_purge_of_paged_durable_scheduled_messages_is_journaled(tmp_path, clock):
    """The admin API's purge on a durable queue with scheduled runs: each message's journal
    dequeue is written (the runs' records read for their ids), so none comes back after a
    restart."""
    from test_paging_scheduled import JOURNAL

    from proxy.broker import operations

    async def play():
        world = World(tmp_path)
        paged = await world.node("a", limits={"max_memory": BUDGET}, paging=paging(),
                                 queues={"credit_window": 50, "durable": True}, journal=JOURNAL)
        client = await world.client("a")
        start = schedule.clock()
        await send(world, client.sender("gone"), [
            scheduled(i, start + 30 + i * 0.01, durable=True) for i in range(150)])
        await world.quiet(0.1)
        queue = paged.queues.get("gone")
        assert in_runs(paged, "gone") >= 120
        assert operations.purge(paged.broker, queue) == 150
        all_back(paged, "gone")
        stopped = schedule.clock()
        await world.close()
        return stopped

    stopped = run(play)

    async def again():
        clock[0] = stopped + 1.0 - asyncio.get_running_loop().time()
        world = World(tmp_path)
        node = await world.node("a", limits={"max_memory": BUDGET}, paging=paging(),
                                queues={"credit_window": 50, "durable": True}, journal=JOURNAL)
        queue = node.queues.get("gone")
        assert queue is None or queue.scheduled.total == 0, "purged messages came back"
        await world.close()

    run(again)


def test_large_scheduled_bodies_page_and_read_back_whole(tmp_path, monkeypatch):
    """Bodies larger than a segment and than half the read-ahead's bytes: a read back of a
    run's front asks for the whole first record; a peek reads each run in growing steps."""
    from proton import Message

    now = [1_800_000_000.0]
    monkeypatch.setattr(schedule, "clock", lambda: now[0])

    def big(i: int) -> bytes:
        return Message(id=i, body=bytes([i]) * 40_000, annotations={
            symbol("x-opt-delivery-time"): int((now[0] + 10 + (9 - i)) * 1000)}).encode()

    async def play():
        pager, queue = await in_process(tmp_path, now, budget=100_000, read_ahead_bytes=8192)
        for i in range(10):
            queue.enqueue(StoredMessage(big(i)))
        for _ in range(20):
            await asyncio.sleep(0)
        assert queue.scheduled.paged >= 1 and pager.memory.resident <= 100_000
        assert [m.seq for m in queue.waiting()] == list(range(10, 0, -1))
        assert pager.store.reads_now >= queue.scheduled.paged
        sink = Sink()
        queue.add_consumer(sink)
        got = []
        for step in range(21):  # (a read waits while the bodies in memory pass the budget:
            now[0] += 1         # each is settled as it comes)
            for _ in range(10):
                queue.dispatch()
                for message in sink.out:
                    got.append((message.seq, message.payload[-1]))
                    queue.settled_accepted(message)
                sink.out.clear()
                await asyncio.sleep(0)
        assert got == [(10 - i, 9 - i) for i in range(10)]
        assert pager.store.live_bytes == 0 and pager.memory.used == 0
        pager.close()

    asyncio.run(play())


def test_a_consumer_holding_more_than_the_budget_unsettled_does_not_starve_the_schedule(
        tmp_path, clock):
    """Another queue's consumer holds 22 messages unsettled (more than the budget of 20,
    under the ceiling): paged scheduled messages still come at their times, read back as
    room under the ceiling allows (as producers would be let in)."""
    async def play():
        world = World(tmp_path)
        paged, plain = await two_nodes(world)
        start = schedule.clock()
        times = {i: start + 10 + i * 0.05 for i in range(100)}
        ca, cb = await world.client("a"), await world.client("b")
        holders = []
        for client in (ca, cb):
            await send(world, client.sender("sched"), [scheduled(i, times[i])
                                                       for i in range(100)])
            await send(world, client.sender("busy"), [scheduled(i, 0.0)
                                                      for i in range(100, 122)])
            holder = client.receiver("busy", credit=22)
            holders.append(holder)
            await world.until(lambda: len(holder.received) == 22, what="22 held")
        await world.quiet(0.1)
        assert in_runs(paged, "sched") >= 80
        assert paged.queues.memory.resident > BUDGET, "the held bodies are not over the budget"
        got_a, got_b = await asyncio.gather(collect(ca.receiver("sched"), 100, 30),
                                            collect(cb.receiver("sched"), 100, 30))
        on_time(got_a, times)
        same(got_a, got_b)
        for holder in holders:
            holder.settle()
        await world.quiet(0.1)
        all_back(paged, "sched")
        await world.close()

    run(play)


def test_ready_and_scheduled_messages_mixed_under_a_consumer_keep_the_in_memory_order(
        tmp_path, clock):
    """A producer sends ready and scheduled messages mixed (due 0.5 to 8 s on) while a
    consumer takes them slower than they come, so the ready order and the schedule both
    page: the same ids in the same order, at the same times, as on the node without a
    budget; each scheduled one not before its time."""
    async def play():
        world = World(tmp_path)
        paged, plain = await two_nodes(world)
        ca, cb = await world.client("a"), await world.client("b")
        pick = random.Random(5)
        plan = [(i, pick.random() < 0.6, 0.5 + pick.random() * 7.5) for i in range(400)]
        times = {"a": {}, "b": {}}
        in_runs_seen = [0]

        async def produce(client, node: str) -> None:
            sender = client.sender("mixed")
            for start in range(0, 400, 20):
                batch = []
                for i, later, delay in plan[start:start + 20]:
                    if later:
                        times[node][i] = round(schedule.clock() + delay, 3)
                        batch.append(scheduled(i, times[node][i]))
                    else:
                        batch.append(scheduled(i, 0.0))
                await send(world, sender, batch)
                await asyncio.sleep(0.1)
                queue = paged.queues.get("mixed")
                in_runs_seen[0] = max(in_runs_seen[0], queue.scheduled.in_runs if queue else 0)

        async def consume(client) -> list:
            receiver = client.receiver("mixed")
            got = []
            while len(got) < 400:
                receiver.flow(3)
                await asyncio.sleep(0.05)  # about 60 a second: slower than they come
                new = receiver.received[len(got):]
                got.extend((m.id, schedule.clock()) for m, _ in new)
                receiver.settle()
            return got

        peak = Peak(paged.queues.memory)
        results = await asyncio.gather(produce(ca, "a"), produce(cb, "b"), consume(ca),
                                       consume(cb))
        got_a, got_b = results[2], results[3]
        assert peak.stop() <= paged.queues.memory.ceiling + 4 * 1100
        assert in_runs_seen[0] >= 50, "the schedule did not page: the test asks nothing of it"
        assert paged.pager.paged_out > in_runs_seen[0], "the ready order did not page"
        assert [i for i, _ in got_a] == [i for i, _ in got_b], "the nodes' orders differ"
        assert sorted(i for i, _ in got_a) == list(range(400))
        for node, got in (("a", got_a), ("b", got_b)):
            for i, at in got:
                if i in times[node]:
                    assert at >= times[node][i] - 1e-6, f"{i} came before its time"
        all_back(paged, "mixed")
        all_back(plain, "mixed")
        await world.close()

    run(play)


def test_a_restored_journal_run_peeks_purges_and_lets_its_pins_go(tmp_path, clock):
    """After a restart the scheduled backlog is a journal run: the admin API's peek reads
    the first bodies from the journal (nothing taken), a purge while a read of its front is
    under way lets every pin go (the journal may compact those segments again), and nothing
    comes back after another restart."""
    from test_paging_scheduled import JOURNAL

    from proxy.broker import operations

    async def durable_node(world):
        return await world.node("a", limits={"max_memory": BUDGET}, paging=paging(),
                                queues={"credit_window": 50, "durable": True}, journal=JOURNAL)

    async def fill():
        world = World(tmp_path)
        await durable_node(world)
        client = await world.client("a")
        start = schedule.clock()
        await send(world, client.sender("jr"), [
            scheduled(i, start + 60 + (149 - i) * 0.01, durable=True) for i in range(150)])
        await world.quiet(0.1)
        stopped = schedule.clock()
        await world.close()
        return stopped

    stopped = run(fill)

    async def restarted():
        clock[0] = stopped + 1.0 - asyncio.get_running_loop().time()
        world = World(tmp_path)
        node = await durable_node(world)
        queue = node.queues.get("jr")
        assert queue.scheduled.total == 150 and queue.next_due
        assert [run.journal for run in queue.scheduled.runs] == [True]
        assert node.journal.pinned, "the journal run's segments are not pinned"
        peeked = operations.peek(queue, 3)
        assert [m["properties"]["message_id"] for m in peeked] == [149, 148, 147]
        assert peeked[0]["body"].startswith("149:")
        queue.scheduled.release(queue, schedule.clock() + 1000)  # its front's read asked
        assert queue.scheduled.reading
        assert operations.purge(node.broker, queue) == 150  # while the read is under way
        await world.quiet(0.1)
        assert not node.journal.pinned and node.journal_pages.live == 0, "pins left"
        all_back(node, "jr")
        await world.close()

    run(restarted)

    async def again():
        clock[0] = stopped + 2.0 - asyncio.get_running_loop().time()
        world = World(tmp_path)
        node = await durable_node(world)
        queue = node.queues.get("jr")
        assert queue is None or queue.scheduled.total == 0, "purged messages came back"
        await world.close()

    run(again)
