"""A promotion with a paged backlog, in this process (issue #44, docs/paging_failover.md):
a backup's copy (``ReplicaImage``) with a real pager and page store (the I/O on the loop)
is given a primary's batches (512 enqueues of ``body_bytes`` each) until it holds
``count`` messages, most of them in runs; then it is promoted into a ``ReplicatedQueue``
on the same node, either as before (``kept=False``: ``image_runs.unrun``, every entry a
message paged one by one, ``restore`` reading each record's header) or keeping the runs
(``promote_runs``). Measured: the promotion's time on the loop, the page store's
synchronous reads during it, and (``traced``, a second fill: tracemalloc slows it) the new
primary's bytes in memory per paged message (everything traced since before the fill,
the copy gone: between a promotion of a third of ``count`` and one of ``count``, divided
by the difference in paged messages).

    .venv/bin/python bench/paging_promote.py [count]
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def promotion(kept: bool, traced: bool = False, count: int = 300_000,
              body_bytes: int = 1024, budget: int = 16 * 1024 * 1024) -> dict:
    import asyncio
    import gc
    import tracemalloc

    from proxy.amqp.message_header import delivery_count
    from proxy.paging.pager import Pager
    from proxy.paging.store import PageStore
    from proxy.queues.local import StoredMessage
    from proxy.queues.memory import MemoryUse
    from proxy.queues.runs import RunQueue
    from proxy.replication import promote_runs
    from proxy.replication.events import ENQUEUE, Batch, Event, rid
    from proxy.replication.queue import ReplicatedQueue
    from proxy.replication.replica import ReplicaImage

    payload = bytes(body_bytes)

    async def measure() -> dict:
        directory = Path(tempfile.mkdtemp(prefix="fedgate-promote-"))
        memory = MemoryUse(budget)
        queues: list = []
        pager = Pager(PageStore(directory / "paging", threads=False), memory, lambda: queues)
        image = ReplicaImage("promote")
        pager.images = lambda: [image] if image is not None else []
        pager.start(asyncio.get_running_loop())
        if traced:
            tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0] if traced else 0
        n = 0
        for number in range(1, count // 512 + 1):
            events = []
            for _ in range(512):
                n += 1
                events.append(Event(ENQUEUE, rid(1, n), payload))
            pager.image_changes(image, image.apply(Batch(1, number, events)))
            for _ in range(3):
                await asyncio.sleep(0)
        for _ in range(20):
            await asyncio.sleep(0)
        result = {"kept": kept, "messages": image.depth, "copy_in_runs": image.run_count}
        queue = ReplicatedQueue("promote", memory=memory)
        queues.append(queue)
        store = pager.store
        reads = store.reads_now
        preads = [0]
        real = os.pread

        def counted(*args):
            preads[0] += 1
            return real(*args)
        os.pread = counted
        started = time.perf_counter()
        try:
            if kept:
                content = promote_runs.promote(image, pager)
            else:  # as before: every run back as entries paged one by one
                pager.image_paged += image.unrun(store)
                content = []
                for value, entry in image.promote():
                    page = pager.hand_over(entry)
                    attempts = delivery_count(entry.payload) if type(entry.payload) is bytes \
                        else 0
                    content.append(StoredMessage(entry.payload, journal_id=entry.journal_id,
                                                 rid=value, page=page, attempts=attempts))
                image.messages.clear()
            for item in content:
                queue.restore(item)
            seconds = time.perf_counter() - started
        finally:
            os.pread = real
        del content
        image = None
        gc.collect()
        messages = queue.messages
        result.update(promotion_seconds=round(seconds, 3), preads=preads[0],
                      range_reads=store.reads_now - reads, depth=queue.depth,
                      paged=queue.paged_count,
                      in_runs=messages.count if type(messages) is RunQueue else 0,
                      run_objects=len(messages.runs) if type(messages) is RunQueue else 0)
        if traced:
            result["traced_bytes"] = tracemalloc.get_traced_memory()[0] - base
            tracemalloc.stop()
        pager.close()
        shutil.rmtree(directory, ignore_errors=True)
        return result

    return asyncio.run(measure())


def both(count: int = 300_000) -> dict:
    """Before and after; the bytes per paged message between a promotion of ``count / 3``
    and one of ``count`` messages (the resident part, the budget's, is the same in both)."""
    out = {}
    for kept in (False, True):
        timed = promotion(kept, count=count)
        small, large = promotion(kept, True, count=count // 3), promotion(kept, True, count=count)
        timed["new_primary_bytes_per_paged_message"] = round(
            (large["traced_bytes"] - small["traced_bytes"]) / max(1, large["paged"] - small["paged"]), 2)
        out["keeping_runs" if kept else "before_unrun"] = timed
    return out


if __name__ == "__main__":
    print(json.dumps(both(int(sys.argv[1]) if len(sys.argv) > 1 else 300_000), indent=1))
