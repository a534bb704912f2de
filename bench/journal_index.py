"""The journal's index of live messages (issue #44, docs/journal-index.md): bytes per live
durable message held by ``Journal._where`` on a running node (tracemalloc), and CPU per op
of the index alone (set of a new id, get, pop, relocation's update) and of ``Journal.enqueue``
+ ``dequeue`` (fsync off, no loop).

    .venv/bin/python bench/journal_index.py [--messages 1000000] [--ops 200000] [--repeat 5]
        [--index dict|where|both]

``dict`` is the index before (issue #44), measured in the same process for comparison.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


class _Dict(dict):
    """The index before (a dict), with the one method the journal calls beyond a dict's."""

    def settle(self) -> None:
        pass


def _index(kind: str):
    if kind == "dict":
        return _Dict()
    from proxy.journal.where import Where
    return Where()


def index_figures(messages: int, ops: int, kind: str = "where", repeat: int = 5) -> dict:
    """The figures of one kind of index; CPU figures the best of ``repeat`` runs."""
    figures = {"index": kind}
    for _ in range(repeat):
        for key, value in _cpu_figures(ops, kind).items():
            figures[key] = min(value, figures.get(key, value))
    figures.update(_memory_figures(messages, kind))
    figures.update(_journal_memory(messages, kind))
    return figures


def _journal_memory(messages: int, kind: str) -> dict:
    """A real journal (fsync off) given ``messages`` live messages of 100 bytes: what the
    journal's modules hold per live message once the writer has them (tracemalloc)."""
    from proxy.journal.journal import Journal
    directory = Path(tempfile.mkdtemp(prefix="fedgate-index-"))
    try:
        journal = Journal(directory, fsync=False)
        journal._where = _index(kind)
        journal.open()
        payload = bytes(100)
        tracemalloc.start()
        before = _journal_bytes()
        for _ in range(messages):
            journal.enqueue("q", payload)
        journal.sync()
        held = _journal_bytes() - before
        tracemalloc.stop()
        segments = journal.segment_count
        journal.close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return {"journal_bytes_per_live_message": round(held / messages, 1),
            "journal_segments": segments}


def _journal_bytes() -> int:
    snapshot = tracemalloc.take_snapshot()
    return sum(stat.size for stat in snapshot.statistics("filename")
               if "/proxy/journal/" in stat.traceback[0].filename)


def _memory_figures(messages: int, kind: str) -> dict:
    figures = {}
    # the running node's entry: the index as the journal fills it (ascending ids, a 64 MiB
    # segment of 1 KiB records every 60,000 or so)
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    index = _index(kind)
    number, offset = 1, 24
    for message_id in range(1, messages + 1):
        if offset > 64 * 1024 * 1024 - 1100:
            number, offset = number + 1, 24
        index[message_id] = (number << 64) | (offset << 32) | 1100
        offset += 1100
    figures["bytes_per_live_message"] = round(
        (tracemalloc.get_traced_memory()[0] - base) / messages, 1)
    # half of them gone at random: what is left per live message (tombstones included)
    for message_id in range(1, messages + 1, 2):
        index.pop(message_id, None)
    figures["bytes_per_live_message_half_gone"] = round(
        (tracemalloc.get_traced_memory()[0] - base) / len(index), 1)
    tracemalloc.stop()
    return figures


def _cpu_figures(ops: int, kind: str) -> dict:
    figures = {}
    # CPU per op of the index alone: FIFO (a queue's consumer takes the oldest)
    index = _index(kind)
    loc = (7 << 64) | (4096 << 32) | 1100
    started = time.perf_counter()
    for message_id in range(1, ops + 1):
        index[message_id] = loc
    figures["set_ns"] = round((time.perf_counter() - started) / ops * 1e9)
    started = time.perf_counter()
    for message_id in range(1, ops + 1):
        index.get(message_id)
    figures["get_ns"] = round((time.perf_counter() - started) / ops * 1e9)
    started = time.perf_counter()
    for message_id in range(1, ops + 1):
        index[message_id] = loc  # relocation: an existing id's new place
    figures["update_ns"] = round((time.perf_counter() - started) / ops * 1e9)
    started = time.perf_counter()
    for message_id in range(1, ops + 1):
        index.pop(message_id, None)
    figures["pop_fifo_ns"] = round((time.perf_counter() - started) / ops * 1e9)
    # pop in a random order (a backlog consumed out of order: priorities, several queues)
    import random
    for message_id in range(ops + 1, 2 * ops + 1):
        index[message_id] = loc
    order = list(range(ops + 1, 2 * ops + 1))
    random.Random(1).shuffle(order)
    started = time.perf_counter()
    for message_id in order:
        index.pop(message_id, None)
    figures["pop_random_ns"] = round((time.perf_counter() - started) / ops * 1e9)

    # the journal's enqueue + dequeue per message, FIFO, no fsync, no loop
    from proxy.journal.journal import Journal
    directory = Path(tempfile.mkdtemp(prefix="fedgate-index-"))
    try:
        journal = Journal(directory, fsync=False)
        journal._where = _index(kind)
        journal.open()
        payload = bytes(200)
        started = time.perf_counter()
        ids = [journal.enqueue("q", payload)[0] for _ in range(ops)]
        enqueued = time.perf_counter()
        for message_id in ids:
            journal.dequeue(message_id)
        done = time.perf_counter()
        journal.close()
        figures["journal_enqueue_us"] = round((enqueued - started) / ops * 1e6, 2)
        figures["journal_dequeue_us"] = round((done - enqueued) / ops * 1e6, 2)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--ops", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=5, help="CPU figures: the best of")
    parser.add_argument("--index", choices=("dict", "where", "both"), default="both")
    args = parser.parse_args()
    kinds = ("dict", "where") if args.index == "both" else (args.index,)
    print(json.dumps([index_figures(args.messages, args.ops, kind, args.repeat)
                      for kind in kinds], indent=2))


if __name__ == "__main__":
    main()
