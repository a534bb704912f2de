"""A purge of a queue with runs on the event loop (issue #44, docs/paging_purge.md): the
time a purge holds the loop for a queue of paged durable messages, the way before (the
journal's dequeues and a replicated primary's dequeue events named by reading every record
of the runs, ``queue.waiting()``) and now (from what each run keeps: ``waiting_names()``),
on the same kind of queue, in this process, with a real pager and page store (the I/O on
the loop, as in ``bench/paging_index.py``); and the bytes a paged durable message costs with
and without the journal ids a run now keeps.

    .venv/bin/python bench/paging_purge.py [--count 300000] [--budget BYTES] [--out FILE]
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


class Journal:
    """The journal's side of a purge: its dequeues counted (the real one queues a record
    each; the same for both ways)."""

    def __init__(self) -> None:
        self.dequeued = 0

    def dequeue(self, journal_id: int) -> None:
        self.dequeued += 1


def purge_on_loop(count: int, way: str, replicated: bool, body_bytes: int = 1024,
                  budget: int = 16 * 1024 * 1024) -> dict:
    """A queue filled with ``count`` durable messages (journal ids given), most in runs, then
    purged as the admin API does: ``way`` "before" names them by reading the runs' records,
    "now" from memory. ``replicated``: a ``ReplicatedQueue`` whose replica set gets a
    dequeue for each (its purge), else a plain queue and the journal's dequeues."""
    import asyncio
    import tracemalloc

    from proxy.paging.pager import Pager
    from proxy.paging.store import PageStore
    from proxy.queues import durable
    from proxy.queues.local import LocalQueue, StoredMessage
    from proxy.queues.memory import MemoryUse
    from proxy.queues.runs import RunQueue
    from proxy.replication.primary import ReplicaSet
    from proxy.replication.queue import ReplicatedQueue

    payload = bytes(body_bytes)

    async def measure() -> dict:
        directory = Path(tempfile.mkdtemp(prefix="fedgate-purge-"))
        memory = MemoryUse(budget)
        queues = []
        pager = Pager(PageStore(directory / "paging", threads=False), memory, lambda: queues)
        pager.start(asyncio.get_running_loop())
        if replicated:
            queue = ReplicatedQueue("purge", memory=memory)
            rs = ReplicaSet("purge", 1, time.monotonic)
            queue.serve_replicas(rs, lambda queue: None)
        else:
            queue = LocalQueue("purge", memory=memory)
        queues.append(queue)
        tracemalloc.start()
        t0, p0 = tracemalloc.get_traced_memory()[0], 0
        for i in range(count):
            queue.enqueue(StoredMessage(payload, journal_id=i + 1))
            if i % 2000 == 0:
                for _ in range(5):
                    await asyncio.sleep(0)
            if i == count // 3:
                t0, p0 = tracemalloc.get_traced_memory()[0], queue.paged_count
        for _ in range(200):  # the pager's last rounds and writes
            await asyncio.sleep(0)
        t1, p1 = tracemalloc.get_traced_memory()[0], queue.paged_count
        tracemalloc.stop()
        runs = queue.messages.runs if type(queue.messages) is RunQueue else []
        ids = sum(c.ids.buffer_info()[1] * c.ids.itemsize for c in runs if getattr(c, "ids", None) is not None)
        rids = sum(c.rids.buffer_info()[1] * c.rids.itemsize for c in runs
                   if getattr(c, "rids", None) is not None)
        in_runs = sum(c.count for c in runs)
        run_objects = len(runs)
        journal = Journal()
        reads = pager.store.reads_now
        depth = queue.depth
        started = time.perf_counter()
        if replicated:
            if way == "before":  # ReplicatedQueue.purge before: each record read and named
                for message in list(queue.waiting()):
                    rs.dequeued(message, in_run=True)
                queue.changed(queue)
                LocalQueue.purge(queue)
            else:
                queue.purge()
        else:
            if way == "before":  # operations.purge before: journal ids read from the records
                for message in queue.waiting():
                    durable.dequeued(journal, message)
            else:
                durable.purged(journal, queue)
            queue.purge()
        seconds = time.perf_counter() - started
        result = {"way": way, "replicated": replicated, "messages": depth, "in_runs": in_runs,
                  "run_objects": run_objects, "purge_seconds_on_loop": round(seconds, 4),
                  "reads_on_loop": pager.store.reads_now - reads,
                  "journal_dequeues": journal.dequeued,
                  "bytes_per_paged_message": round((t1 - t0) / max(1, p1 - p0), 2),
                  "id_array_bytes_per_message_in_runs": round(ids / max(1, in_runs), 2),
                  "rid_array_bytes_per_message_in_runs": round(rids / max(1, in_runs), 2)}
        for _ in range(50):  # the dead segments' deletes, before the directory goes
            await asyncio.sleep(0)
        pager.close()
        shutil.rmtree(directory, ignore_errors=True)
        return result

    return asyncio.run(measure())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=300_000)
    parser.add_argument("--budget", type=int, default=16 * 1024 * 1024)
    parser.add_argument("--ways", default="before,now",
                        help="before: also runs on the code before (its bytes per message)")
    parser.add_argument("--out", help="the results as JSON, to this file")
    args = parser.parse_args()
    results = []
    for replicated in (False, True):
        for way in args.ways.split(","):
            result = purge_on_loop(args.count, way, replicated, budget=args.budget)
            print(json.dumps(result), flush=True)
            results.append(result)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
