"""Jepsen's total-queue checker over a nemesis history, and what each fault episode cost.

A history is a list of operations ``{"process", "type", "f", "value", "time"}`` (client.py).
``check(history)`` counts, as Jepsen's ``total-queue`` does:

* attempted: values with an enqueue invocation; accepted: those with an ``ok``;
  unknown: those whose enqueue ended ``info`` (no outcome: a timeout, a lost connection);
* lost: accepted and never dequeued (after the final drain);
* unexpected: dequeued and never attempted;
* duplicated: dequeued more often than once (the count of the extra dequeues);
* recovered: unknown, yet dequeued.

Valid means no lost and no unexpected; duplicates are allowed and reported.

``may_lose(op)`` (the ``ok`` of an enqueue): True where the docs promise nothing for that
message, e.g. a queue that is not durable, accepted before every node lost power; such a
message not dequeued counts as ``lost_by_design``, apart from ``lost``.

``episodes(history, faults)``: for each fault ``{"fault", "target", "start", "end"}`` the
seconds from its start to the first acceptance after it, the longest time without an
acceptance from its start to 10 s after its end or the next fault's start, whichever comes
first (per queue: by any of its producers; and per producer: one client's own wait,
docs/nemesis.md finding 15), and p50/p99 of invoke -> ok latency of the enqueues invoked
during it.
"""

from __future__ import annotations

import collections


def check(history: list[dict], may_lose=None) -> dict:
    invoked, outcome, oks = set(), {}, {}
    dequeued = collections.Counter()
    for op in history:
        f, kind, value = op.get("f"), op.get("type"), op.get("value")
        if f == "enqueue":
            if kind == "invoke":
                invoked.add(value)
            elif kind in ("ok", "fail", "info"):
                outcome[value] = kind
                if kind == "ok":
                    oks[value] = op
        elif f == "dequeue" and kind == "ok":
            dequeued[value] += 1
    accepted = {v for v, k in outcome.items() if k == "ok"}
    unknown = {v for v, k in outcome.items() if k == "info"} | (invoked - set(outcome))
    lost = sorted(accepted - set(dequeued))
    by_design = [v for v in lost if may_lose is not None and may_lose(oks[v])]
    if by_design:
        lost = sorted(set(lost) - set(by_design))
    unexpected = sorted(set(dequeued) - invoked)
    return {
        "attempted": len(invoked),
        "accepted": len(accepted),
        "failed": sum(1 for k in outcome.values() if k == "fail"),
        "unknown": len(unknown),
        "dequeued": sum(dequeued.values()),
        "lost": len(lost),
        "lost_values": lost[:20],
        "lost_by_design": len(by_design),
        "unexpected": len(unexpected),
        "unexpected_values": unexpected[:20],
        "duplicated": sum(c - 1 for c in dequeued.values() if c > 1),
        "recovered": len(unknown & set(dequeued)),
        "valid": not lost and not unexpected,
    }


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _queue(op: dict) -> str:
    """The queue an operation is on: its process is ``<p|c>-<address>-<node>``."""
    return op.get("process", "").split("-", 1)[-1].rsplit("-", 1)[0]


def episodes(history: list[dict], faults: list[dict], *, after: float = 10.0,
             consumer_credit: int = 50) -> list[dict]:
    """Per fault: first acceptance after its start, and the longest time without one from its
    start to ``after`` seconds past its end, or to the last enqueue sent if sooner (the worst
    queue's, each queue on its own);
    p50/p99 invoke -> ok latency of enqueues invoked during it; duplicates (dequeues of a value
    seen before) from its start to ``after`` past its end, against what was in flight during
    it: the most enqueues without an outcome at any moment of it, plus every consumer's credit."""
    oks: dict = {}
    by_producer: dict = {}
    invokes, outcome_at, latency = {}, {}, []
    consumers = set()
    seen, repeats = set(), []
    for op in history:
        f, kind = op.get("f"), op.get("type")
        if f == "enqueue":
            if kind == "invoke":
                invokes.setdefault(op["value"], op["time"])
            elif kind in ("ok", "fail", "info"):
                outcome_at.setdefault(op["value"], op["time"])
                if kind == "ok":
                    oks.setdefault(_queue(op), []).append(op["time"])
                    by_producer.setdefault(op.get("process", ""), []).append(op["time"])
                    if op["value"] in invokes:
                        latency.append((invokes[op["value"]], op["time"] - invokes[op["value"]]))
        elif f == "dequeue" and kind == "ok":
            consumers.add(op.get("process"))
            if op["value"] in seen:
                repeats.append(op["time"])
            seen.add(op["value"])
    out = []
    starts = sorted(f["start"] for f in faults)
    # nothing is sent after the workload's last invocation (the producers stop): no wait then
    last_sent = max(invokes.values(), default=None)
    for fault in faults:
        start, end = fault["start"], fault["end"]
        # a wait caused by the next fault is that fault's, not this one's
        until = min([end + after] + [s for s in starts if s > start])
        if last_sent is not None and start < last_sent < until:
            until = last_sent
        first = min((t for times in oks.values() for t in times if t >= start), default=None)
        worst, worst_queue = _longest_gap(oks, start, until)
        producer_gap, producer = _longest_gap(by_producer, start, until)
        during = [s for t, s in latency if start <= t <= end]
        in_flight = _most_open(invokes, outcome_at, start, end)
        out.append({**fault,
                    "first_ok_s": None if first is None else round(first - start, 3),
                    "longest_gap_s": _round(worst), "gap_queue": worst_queue,
                    "producer_gap_s": _round(producer_gap), "gap_producer": producer,
                    "latency_p50_s": _round(_percentile(during, 0.5)),
                    "latency_p99_s": _round(_percentile(during, 0.99)),
                    "duplicated": sum(1 for t in repeats if start <= t <= until),
                    "in_flight": in_flight + consumer_credit * len(consumers)})
    return out


def _longest_gap(times_by: dict, start: float, end: float) -> tuple:
    """The longest time without an acceptance from ``start`` to ``end``, and whose (a queue, or
    a producer), over the keys of ``times_by`` (acceptance times)."""
    worst, whose = None, None
    for key, times in times_by.items():
        window = [start] + [t for t in times if start <= t <= end] + [end]
        gap = max(b - a for a, b in zip(window, window[1:]))
        if worst is None or gap > worst:
            worst, whose = gap, key
    return worst, whose


def _most_open(invokes: dict, outcome_at: dict, start: float, end: float) -> int:
    """The most enqueues without an outcome at any moment from ``start`` to ``end``: what was
    in flight during the fault (a message sent during it and answered only after counts)."""
    changes = []
    for value, at in invokes.items():
        done = outcome_at.get(value, 1e18)
        if at <= end and done > start:
            changes.append((max(at, start), 1))
            changes.append((done, -1))
    most = open_now = 0
    for _, step in sorted(changes):
        open_now += step
        most = max(most, open_now)
    return most


def _round(value):
    return None if value is None else round(value, 3)
