"""The in-process part of ``bench/paging.py --index`` (issue #44, docs/paging.md): bytes
in memory per waiting paged message, measured with tracemalloc on a real queue, pager and
page store (the I/O on the loop), with runs and message by message; a priority queue in
runs per level; a priority arriving at a queue with runs (the unrun it no longer does);
and a backup's copy in runs and entry by entry. ``bench/paging.py`` calls these."""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def index_bytes(count: int = 100_000) -> float:
    """Bytes in memory per paged message paged one by one: its StoredMessage, its Page, in a
    deque (the figure before runs; still the cost in priority and replicated queues)."""
    import tracemalloc
    from collections import deque

    from proxy.paging.store import PAGED, Page
    from proxy.queues.local import StoredMessage

    class FakeSegment:
        number = 1
    segment = FakeSegment()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    messages = deque()
    for i in range(count):
        page = Page(segment, i * 1032, 1024)
        page.state = PAGED
        message = StoredMessage(page, seq=i + 1000, page=page)
        messages.append(message)
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return (after - before) / count


def queue_index_bytes(runs: bool, body_bytes: int = 1024, first: int = 100_000,
                      then: int = 300_000, budget: int = 16 * 1024 * 1024,
                      priorities: bool = False) -> dict:
    """A real queue, pager and page store (the I/O on the loop) filled in this process: the
    memory traced per paged message between ``first`` and ``then`` messages (the resident
    part is the same at both: the budget), with runs or message by message; ``priorities``:
    each message's priority drawn from 0-9 (seeded), a priority queue (runs per level)."""
    import asyncio
    import random
    import tracemalloc

    from proton import Message

    from proxy.paging.pager import Pager
    from proxy.paging.store import PageStore
    from proxy.queues.local import LocalQueue, StoredMessage
    from proxy.queues.memory import MemoryUse

    payload = bytes(body_bytes)
    by_level = [Message(body=payload, priority=p).encode() for p in range(10)]
    pick = random.Random(44)

    async def fill(queue, count: int) -> None:
        for i in range(count):
            queue.enqueue(StoredMessage(by_level[pick.randrange(10)] if priorities
                                        else payload))
            if i % 2000 == 0:
                for _ in range(5):
                    await asyncio.sleep(0)
        for _ in range(50):
            await asyncio.sleep(0)

    async def measure() -> dict:
        directory = Path(tempfile.mkdtemp(prefix="fedgate-index-"))
        memory = MemoryUse(budget)
        queues = []
        pager = Pager(PageStore(directory / "paging", threads=False), memory, lambda: queues,
                      runs=runs)
        pager.start(asyncio.get_running_loop())
        queue = LocalQueue("index", memory=memory)
        queues.append(queue)
        tracemalloc.start()
        await fill(queue, first)
        t1, p1 = tracemalloc.get_traced_memory()[0], queue.paged_count
        await fill(queue, then - first)
        t2, p2 = tracemalloc.get_traced_memory()[0], queue.paged_count
        tracemalloc.stop()
        levels = getattr(queue.messages, "levels", None)
        chunks = sum(len(getattr(level, "runs", ()) or ()) for level in levels) \
            if levels is not None else len(getattr(queue.messages, "runs", ()))
        pager.close()
        shutil.rmtree(directory, ignore_errors=True)
        return {"runs": runs, "priorities": priorities, "messages": then, "paged": p2,
                "kind": type(queue.messages).__name__, "run_objects": chunks,
                "bytes_per_paged_message": round((t2 - t1) / max(1, p2 - p1), 2)}

    return asyncio.run(measure())


def priority_at_runs(count: int = 300_000, body_bytes: int = 1024,
                     budget: int = 16 * 1024 * 1024) -> dict:
    """A FIFO queue with ``count`` messages, most in runs, then one message of priority 9:
    the loop's time for that enqueue (the runs become level 4 as they are, docs/paging.md "A
    priority queue in runs"), and the time the same runs took to turn back into messages
    paged one by one (``RunQueue.unrun``, what that enqueue did before)."""
    import asyncio

    from proton import Message

    from proxy.paging.pager import Pager
    from proxy.paging.store import PageStore
    from proxy.queues.local import LocalQueue, StoredMessage
    from proxy.queues.memory import MemoryUse
    from proxy.queues.runs import RunQueue

    payload = bytes(body_bytes)

    async def fill(queue, count: int) -> None:
        for i in range(count):
            queue.enqueue(StoredMessage(payload))
            if i % 2000 == 0:
                for _ in range(5):
                    await asyncio.sleep(0)
        for _ in range(50):
            await asyncio.sleep(0)

    async def measure() -> dict:
        directory = Path(tempfile.mkdtemp(prefix="fedgate-index-"))
        memory = MemoryUse(budget)
        queues = []
        pager = Pager(PageStore(directory / "paging", threads=False), memory, lambda: queues)
        pager.start(asyncio.get_running_loop())
        result = {"messages": count}
        for name in ("before", "after"):
            queue = LocalQueue(name, memory=memory)
            queues[:] = [queue]
            await fill(queue, count)
            assert type(queue.messages) is RunQueue
            paged = queue.paged_count
            reads = pager.store.reads_now
            started = time.perf_counter()
            if name == "before":  # what a priority at a queue with runs did before
                queue.messages.unrun()
            queue.enqueue(StoredMessage(Message(body=payload, priority=9).encode()))
            seconds = time.perf_counter() - started
            result[name] = {"paged": paged, "kind": type(queue.messages).__name__,
                            "enqueue_seconds": round(seconds, 4),
                            "synchronous_reads": pager.store.reads_now - reads}
            queue.purge()
            for _ in range(20):  # the purged segments' deletions run before the store closes
                await asyncio.sleep(0)
        pager.close()
        shutil.rmtree(directory, ignore_errors=True)
        return result

    return asyncio.run(measure())


def priority_drain(runs: bool, count: int = 300_000, body_bytes: int = 1024,
                   budget: int = 16 * 1024 * 1024) -> dict:
    """A priority queue (priorities 0-9, seeded) of ``count`` messages paged beyond the
    budget, drained in this process by a consumer with unbounded credit, each message settled
    as it comes (the read-back on the loop): the drain's CPU per message, in runs per level
    or message by message."""
    import asyncio
    import random

    from proton import Message

    from proxy.paging.pager import Pager
    from proxy.paging.store import PageStore
    from proxy.queues.local import LocalQueue, StoredMessage
    from proxy.queues.memory import MemoryUse

    class Consumer:
        consumer_id = 1
        credit = 1 << 40

        def __init__(self) -> None:
            self.out = []

        def deliver(self, message) -> None:
            self.out.append(message)

    async def measure() -> dict:
        by_level = [Message(body=bytes(body_bytes), priority=p).encode() for p in range(10)]
        pick = random.Random(44)
        directory = Path(tempfile.mkdtemp(prefix="fedgate-index-"))
        memory = MemoryUse(budget)
        queue = LocalQueue("drain", memory=memory)
        pager = Pager(PageStore(directory / "paging", threads=False), memory, lambda: [queue],
                      runs=runs)
        pager.start(asyncio.get_running_loop())
        for i in range(count):
            queue.enqueue(StoredMessage(by_level[pick.randrange(10)]))
            if i % 2000 == 0:
                for _ in range(5):
                    await asyncio.sleep(0)
        for _ in range(50):
            await asyncio.sleep(0)
        result = {"runs": runs, "kind": type(queue.messages).__name__,
                  "paged": queue.paged_count}
        consumer = Consumer()
        queue.add_consumer(consumer)
        got = 0
        last = 10
        in_order = True

        def drain(_=None) -> None:
            nonlocal got, last, in_order
            queue.dispatch()
            out, consumer.out = consumer.out, []
            for message in out:
                in_order = in_order and message.priority <= last
                last = message.priority
                queue.settled_accepted(message)
            got += len(out)

        pager.on_loaded = drain
        cpu, started = time.process_time(), time.perf_counter()
        while got < count:
            drain()
            await asyncio.sleep(0)
        result.update(drain_seconds=round(time.perf_counter() - started, 2),
                      cpu_us_per_message=round((time.process_time() - cpu) / count * 1e6, 2),
                      priority_order=in_order)
        pager.close()
        shutil.rmtree(directory, ignore_errors=True)
        return result

    return asyncio.run(measure())


def copy_index_bytes(runs: bool, durable: bool = False, body_bytes: int = 1024,
                     first: int = 100_000, then: int = 300_000,
                     budget: int = 16 * 1024 * 1024) -> dict:
    """A backup's copy (``ReplicaImage``) with a real pager and page store (the I/O on the
    loop), given batches of 512 enqueue events as a primary sends them: the memory traced
    per paged message between ``first`` and ``then`` messages, in runs (docs/paging.md, "A
    backup's copy in runs") or entry by entry; ``durable``: each entry gets a journal id."""
    import asyncio
    import tracemalloc

    from proxy.paging.pager import Pager
    from proxy.paging.store import PageStore
    from proxy.queues.memory import MemoryUse
    from proxy.replication.events import ENQUEUE, Batch, Event, rid
    from proxy.replication.replica import ReplicaImage

    payload = bytes(body_bytes)
    image = ReplicaImage("index")
    state = {"n": 0, "batch": 0}

    async def fill(pager, count: int) -> None:
        for _ in range(count // 512):
            state["batch"] += 1
            events = []
            for _ in range(512):
                state["n"] += 1
                events.append(Event(ENQUEUE, rid(1, state["n"]), payload))
            changes = image.apply(Batch(1, state["batch"], events))
            pager.image_changes(image, changes)
            if durable:
                for _, entry in changes.added:
                    entry.journal_id = state["n"] + 1_000_000_000
            for _ in range(3):
                await asyncio.sleep(0)
        for _ in range(20):
            await asyncio.sleep(0)

    def paged(pager) -> int:
        return image.run_count + sum(1 for e in image.messages.values() if e.page is not None)

    async def measure() -> dict:
        directory = Path(tempfile.mkdtemp(prefix="fedgate-index-"))
        pager = Pager(PageStore(directory / "paging", threads=False), MemoryUse(budget),
                      lambda: (), runs=runs)
        pager.images = lambda: [image]
        pager.start(asyncio.get_running_loop())
        tracemalloc.start()
        await fill(pager, first)
        t1, p1 = tracemalloc.get_traced_memory()[0], paged(pager)
        await fill(pager, then - first)
        t2, p2 = tracemalloc.get_traced_memory()[0], paged(pager)
        tracemalloc.stop()
        result = {"runs": runs, "durable": durable, "messages": image.depth, "paged": p2,
                  "run_objects": len(image.runs),
                  "bytes_per_paged_message": round((t2 - t1) / max(1, p2 - p1), 2)}
        if runs:  # what a promotion does first: the runs back as entries paged one by one
            started = time.perf_counter()
            image.unrun(pager.store)
            result["unrun_seconds"] = round(time.perf_counter() - started, 3)
        pager.close()
        shutil.rmtree(directory, ignore_errors=True)
        return result

    return asyncio.run(measure())
