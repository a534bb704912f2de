"""The nemesis's checker (tests/nemesis/checker.py): Jepsen's total-queue counts, and the
losses the docs allow (a queue that is not durable when every node loses power) kept apart."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "nemesis"))

import checker  # noqa: E402


def op(kind, f, value, t, process="p-q-n1"):
    return {"type": kind, "f": f, "value": value, "time": t, "process": process}


HISTORY = [
    op("invoke", "enqueue", "a", 1.0), op("ok", "enqueue", "a", 1.1),
    op("invoke", "enqueue", "b", 2.0), op("ok", "enqueue", "b", 2.1),
    op("invoke", "enqueue", "c", 3.0), op("info", "enqueue", "c", 4.0),
    op("invoke", "enqueue", "d", 5.0), op("ok", "enqueue", "d", 5.1, process="p-durable-n2"),
    op("ok", "dequeue", "a", 6.0), op("ok", "dequeue", "a", 6.5), op("ok", "dequeue", "c", 7.0),
    op("ok", "dequeue", "zz", 8.0),
]


def test_counts_as_jepsen_total_queue_does():
    result = checker.check(HISTORY)
    assert (result["accepted"], result["lost"], result["unexpected"], result["duplicated"],
            result["recovered"], result["unknown"]) == (3, 2, 1, 1, 1, 1)
    assert result["lost_values"] == ["b", "d"] and not result["valid"]


def test_a_loss_the_docs_allow_is_counted_apart_and_only_that_one():
    def may_lose(ok):  # queue "q" is not durable and lost power after 2.1
        return ok["process"] == "p-q-n1" and ok["time"] <= 2.5
    result = checker.check(HISTORY, may_lose)
    assert result["lost"] == 1 and result["lost_values"] == ["d"]
    assert result["lost_by_design"] == 1
