"""A restart with a durable backlog larger than memory, in the process (issue #44,
docs/paging.md "Durable messages: the journal as page store"): the journal's recovery scan
and the restore into a real queue, pager and page store (the I/O on the loop), timed; and
the memory held after the restore per message, traced with tracemalloc: all of it
(``bytes_per_message``), the journal's entry per live message
(``journal_bytes_per_message``) and what the queue keeps per message beyond the body budget
(``queue_bytes_per_paged_message``); the most traced at once (``peak_bytes_per_message``:
recovery reads one journal segment whole at a time, 64 MiB by default).

    .venv/bin/python bench/paging_restore.py [--messages 80000] [--body 1024] [--budget MB]
        [--ttl MS] [--priority P] [--no-runs]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def restore_figures(messages: int = 80_000, body_bytes: int = 1024,
                    budget: int = 8 * 1024 * 1024, ttl: int = 0, runs: bool = True,
                    priority: int | None = None) -> dict:
    import asyncio
    import tracemalloc

    from proton import Message

    from proxy.journal.journal import Journal
    from proxy.paging.pager import Pager
    from proxy.paging.store import PageStore
    from proxy.queues.durable import restore
    from proxy.queues.journal_pages import JournalPages
    from proxy.queues.registry import QueueRegistry

    directory = Path(tempfile.mkdtemp(prefix="fedgate-restore-"))
    message = Message(body=bytes(body_bytes), durable=True)
    if priority is not None:  # in every header (go-amqp sends priority 0)
        message.priority = priority
    if ttl:
        message.ttl = ttl / 1000.0
    payload = message.encode()
    journal = Journal(directory / "journal", fsync=False)
    journal.open()
    for _ in range(messages):
        journal.enqueue("backlog", payload)
    journal.close()

    async def measure(trace: bool) -> dict:
        registry = QueueRegistry(max_memory=budget)
        pager = Pager(PageStore(directory / "paging", threads=False), registry.memory,
                      lambda: registry.queues.values(), runs=runs)
        pager.start(asyncio.get_running_loop())
        journal = Journal(directory / "journal", fsync=False)
        pages = JournalPages(journal, pager.store)
        if trace:
            tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        started = time.perf_counter()
        # the header's fields kept by the scan (the code before read each body again)
        options = pages.open_options() if hasattr(pages, "open_options") else {}
        recovered = journal.open(loop=asyncio.get_running_loop(), body_budget=budget // 2,
                                 **options)
        scanned = time.perf_counter()
        reads = [0]
        pread = os.pread

        def counted(*args):
            reads[0] += 1
            return pread(*args)
        os.pread = counted
        try:
            restored = restore(recovered, registry, lambda name: {"durable": True}, pages)
        finally:
            os.pread = pread
        done = time.perf_counter()
        del recovered
        queue = registry.get("backlog")
        for _ in range(20):
            await asyncio.sleep(0)
        held, peak = tracemalloc.get_traced_memory()
        held -= base
        peak -= base
        journal_bytes = queue_bytes = 0
        if trace:  # by the module that allocated it: the journal's, the queues' and pages'
            snapshot = tracemalloc.take_snapshot()
            for stat in snapshot.statistics("filename"):
                name = stat.traceback[0].filename
                if "/proxy/journal/" in name:
                    journal_bytes += stat.size
                elif "/proxy/queues/" in name or "/proxy/paging/" in name:
                    queue_bytes += stat.size
            tracemalloc.stop()
        beyond = queue.paged_count
        resident = registry.memory.resident
        figures = {
            "runs": runs, "priority": priority, "messages": messages,
            "body_bytes": body_bytes, "budget": budget,
            "restored": restored, "beyond_budget": beyond,
            "kind": type(queue.messages).__name__,
            "scan_seconds": round(scanned - started, 3),
            "restore_seconds": round(done - scanned, 3),
            "restore_us_per_message": round((done - scanned) / max(1, restored) * 1e6, 2),
            # all held after the restore but the bodies kept in memory, per message
            "bytes_per_message": round((held - resident) / messages, 1),
            # the journal's entry per live message (the kept bodies, cut from the segments
            # recovery read, are counted there too: taken out)
            "journal_bytes_per_message": round((journal_bytes - resident) / messages, 1),
            # what the queue, its runs and pages keep per message beyond the budget
            "queue_bytes_per_paged_message": round(queue_bytes / max(1, beyond), 1),
            # the most traced at once (recovery's and restore's passing objects included)
            "peak_bytes_per_message": round((peak - resident) / messages, 1),
            "preads_at_restore": reads[0],
        }
        journal.close()
        pages.close()
        pager.close()
        return figures

    try:
        timed = asyncio.run(measure(False))
        traced = asyncio.run(measure(True))
        for key in ("bytes_per_message", "journal_bytes_per_message",
                    "queue_bytes_per_paged_message",
                    "peak_bytes_per_message"):
            timed[key] = traced[key]
        return timed
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=80_000)
    parser.add_argument("--body", type=int, default=1024)
    parser.add_argument("--budget", type=int, default=8, help="MB")
    parser.add_argument("--ttl", type=int, default=0, help="ms, each message's header ttl")
    parser.add_argument("--no-runs", action="store_true", help="[paging] runs = false")
    parser.add_argument("--priority", type=int, default=None, help="each message's priority")
    args = parser.parse_args()
    print(json.dumps(restore_figures(args.messages, args.body, args.budget * 1024 * 1024,
                                     args.ttl, not args.no_runs, args.priority), indent=2))


if __name__ == "__main__":
    main()
