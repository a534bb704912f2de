"""Scheduled messages beyond the budget (issue #44, docs/paging-scheduled.md), in this
process, the method of ``bench/paging_index.py``: a real queue, pager and page store (the
I/O on the loop), filled with scheduled messages due in an hour (their times at random),
the memory traced per paged scheduled message between ``first`` and ``then`` messages
(the resident part is the same at both: the budget); then every one made due at once and
drained by a consumer that settles each as it comes (the avalanche: read back half a
window at a time), its CPU per message.

    .venv/bin/python bench/paging_scheduled.py [--then 300000] [--output FILE]

For comparison it measures the same per-message figure for a scheduled message kept as
a heap entry whose body is on disk one by one (its ``StoredMessage``, ``Page`` and heap
tuple: what a recovered durable one cost in the first version), and for one in a journal
run (a recovered durable one now: its arrays; the journal's own entry not counted).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def heap_entry_bytes(count: int = 100_000) -> float:
    """Bytes per scheduled message paged one by one: a (time, seq, message) tuple in the
    heap, its StoredMessage and its Page (a recovered durable scheduled message)."""
    import heapq
    import tracemalloc

    from proxy.paging.store import PAGED, Page
    from proxy.queues.local import StoredMessage

    class FakeSegment:
        number = 1
    segment = FakeSegment()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    heap = []
    for i in range(count):
        page = Page(segment, i * 1032, 1024)
        page.state = PAGED
        heapq.heappush(heap, (1.8e9 + i * 0.001, i + 1000,
                              StoredMessage(page, seq=i + 1000, page=page)))
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return (after - before) / count


def journal_run_bytes(count: int = 300_000) -> float:
    """Bytes per recovered scheduled message in a journal run (its arrays, filled as a
    restore fills them, then sorted: proxy.queues.schedule_journal)."""
    import random
    import tracemalloc

    from proxy.queues.schedule_journal import JournalRun
    from proxy.queues.schedule_pages import Scheduled

    pick = random.Random(44)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    scheduled = Scheduled()
    run = scheduled.pending = JournalRun(None, 40)
    for i in range(count):
        run.dues.append(1.8e9 + pick.random() * 3600)
        run.seqs.append(i + 1)
        run.ids.append(i + 1000)
        run.numbers.append(i // 8000)
        run.offsets.append(i % 8000 * 1100)
        run.sizes.append(1024)
        run.count += 1
    run.seal(scheduled)
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return (after - before) / count


def scheduled_index(first: int = 100_000, then: int = 300_000, body_bytes: int = 1024,
                    budget: int = 16 * 1024 * 1024) -> dict:
    import asyncio
    import random
    import tracemalloc

    from proton import Message, symbol

    import proxy.queues.schedule as schedule
    from proxy.paging.pager import Pager
    from proxy.paging.store import PageStore
    from proxy.queues.local import LocalQueue, StoredMessage
    from proxy.queues.memory import MemoryUse

    now = [time.time()]
    schedule.clock = lambda: now[0]
    pick = random.Random(44)
    body = bytes(body_bytes)
    # a thousand payloads of distinct times an hour on, used in a random order
    payloads = [Message(body=body, annotations={symbol("x-opt-delivery-time"): int(
        (now[0] + 3600 + pick.random() * 3600) * 1000)}).encode() for _ in range(1000)]

    async def fill(queue, count: int) -> None:
        for i in range(count):
            queue.enqueue(StoredMessage(payloads[pick.randrange(1000)]))
            if i % 2000 == 0:
                for _ in range(5):
                    await asyncio.sleep(0)
        for _ in range(50):
            await asyncio.sleep(0)

    class Sink:
        consumer_id = 1
        credit = 1 << 30

        def __init__(self) -> None:
            self.out = []

        def deliver(self, message) -> None:
            self.out.append(message)

    async def measure() -> dict:
        directory = Path(tempfile.mkdtemp(prefix="fedgate-sched-"))
        memory = MemoryUse(budget)
        queues = []
        pager = Pager(PageStore(directory / "paging", threads=False), memory, lambda: queues)
        pager.start(asyncio.get_running_loop())
        queue = LocalQueue("scheduled", memory=memory)
        queues.append(queue)
        tracemalloc.start()
        await fill(queue, first)
        t1, p1 = tracemalloc.get_traced_memory()[0], queue.scheduled.paged
        await fill(queue, then - first)
        t2, p2 = tracemalloc.get_traced_memory()[0], queue.scheduled.paged
        tracemalloc.stop()
        result = {"messages": then, "paged": p2, "resident_bytes": memory.resident,
                  "paged_bytes": memory.paged, "runs": len(queue.scheduled.runs),
                  "bytes_per_paged_scheduled_message": round((t2 - t1) / max(1, p2 - p1), 2)}
        # the avalanche: every one due now, a consumer settling each as it comes
        sink = Sink()
        delivered = 0
        peak = 0

        def serve(q) -> None:
            nonlocal delivered, peak
            q.dispatch()
            for message in sink.out:
                q.settled_accepted(message)
            delivered += len(sink.out)
            sink.out.clear()
            peak = max(peak, memory.resident)

        pager.on_loaded = serve
        queue.add_consumer(sink)
        now[0] += 7300
        started, cpu = time.perf_counter(), time.process_time()
        serve(queue)
        while delivered < then:
            await asyncio.sleep(0)
            if not queue.scheduled.reading and not queue.reading:
                serve(queue)
        result.update({
            "avalanche_seconds": round(time.perf_counter() - started, 2),
            "avalanche_cpu_us_per_message": round((time.process_time() - cpu) / then * 1e6, 2),
            "avalanche_peak_resident_bytes": peak, "budget": budget,
            "left": len(queue.scheduled), "live_bytes": pager.store.live_bytes})
        for _ in range(50):  # the emptied segments' deletes, before the store is closed
            await asyncio.sleep(0)
        pager.close()
        shutil.rmtree(directory, ignore_errors=True)
        return result

    return asyncio.run(measure())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--first", type=int, default=100_000)
    parser.add_argument("--then", type=int, default=300_000)
    parser.add_argument("--body-bytes", type=int, default=1024)
    parser.add_argument("--budget-mb", type=int, default=16)
    parser.add_argument("--output", default=str(Path(__file__).resolve().parent / "results"
                                                 / "paging_scheduled.json"))
    args = parser.parse_args()
    result = {"scheduled_runs": scheduled_index(args.first, args.then, args.body_bytes,
                                                args.budget_mb * 1024 * 1024),
              "one_by_one_bytes_per_message": round(heap_entry_bytes(), 2),
              "journal_run_bytes_per_message": round(journal_run_bytes(), 2)}
    print(json.dumps(result, indent=2))
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
