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

``episodes(history, faults)``: for each fault ``{"fault", "target", "start", "end"}`` the
seconds from its start to the first acceptance after it, the longest time without an
acceptance from its start to 10 s after its end, and p50/p99 of invoke -> ok latency
of the enqueues invoked during it.
"""

from __future__ import annotations

import collections


def check(history: list[dict]) -> dict:
    invoked, outcome = set(), {}
    dequeued = collections.Counter()
    for op in history:
        f, kind, value = op.get("f"), op.get("type"), op.get("value")
        if f == "enqueue":
            if kind == "invoke":
                invoked.add(value)
            elif kind in ("ok", "fail", "info"):
                outcome[value] = kind
        elif f == "dequeue" and kind == "ok":
            dequeued[value] += 1
    accepted = {v for v, k in outcome.items() if k == "ok"}
    unknown = {v for v, k in outcome.items() if k == "info"} | (invoked - set(outcome))
    lost = sorted(accepted - set(dequeued))
    unexpected = sorted(set(dequeued) - invoked)
    return {
        "attempted": len(invoked),
        "accepted": len(accepted),
        "failed": sum(1 for k in outcome.values() if k == "fail"),
        "unknown": len(unknown),
        "dequeued": sum(dequeued.values()),
        "lost": len(lost),
        "lost_values": lost[:20],
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


def episodes(history: list[dict], faults: list[dict], *, after: float = 10.0) -> list[dict]:
    oks = sorted(op["time"] for op in history if op.get("f") == "enqueue" and op.get("type") == "ok")
    invokes = {}
    latency = []  # (invoke time, seconds to ok)
    for op in history:
        if op.get("f") != "enqueue":
            continue
        if op.get("type") == "invoke":
            invokes[op["value"]] = op["time"]
        elif op.get("type") == "ok" and op["value"] in invokes:
            latency.append((invokes[op["value"]], op["time"] - invokes[op["value"]]))
    out = []
    for fault in faults:
        start, end = fault["start"], fault["end"]
        first = next((t for t in oks if t >= start), None)
        window = [start] + [t for t in oks if start <= t <= end + after] + [min(end + after, oks[-1] if oks else end)]
        gap = max((b - a for a, b in zip(window, window[1:])), default=None)
        during = [s for t, s in latency if start <= t <= end]
        out.append({**fault,
                    "first_ok_s": None if first is None else round(first - start, 3),
                    "longest_gap_s": None if gap is None else round(gap, 3),
                    "latency_p50_s": _round(_percentile(during, 0.5)),
                    "latency_p99_s": _round(_percentile(during, 0.99))})
    return out


def _round(value):
    return None if value is None else round(value, 3)
