"""Metric primitives for the node's hot paths (no external dependencies).

How this works
--------------
``Histogram`` keeps cumulative-style buckets as plain counts: ``observe`` is
one ``bisect`` into the sorted upper bounds and two additions, so the broker
can call it on every accepted settlement. Reading (``snapshot``) turns the
per-bucket counts into the cumulative counts the Prometheus text format wants
(``le`` buckets, ``+Inf`` = count). Rendering the exposition text is the admin
API's job; this module only holds numbers, so ``proxy`` never imports it.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

# Seconds from enqueue to accepted settlement: 100 us .. 60 s.
LATENCY_BUCKETS: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)


@dataclass(frozen=True)
class HistogramSnapshot:
    bounds: tuple[float, ...]
    cumulative: tuple[int, ...]  # one per bound: observations <= bound
    count: int
    total: float


class Histogram:
    """Fixed-bucket histogram; ``observe`` costs one bisect."""

    __slots__ = ("bounds", "counts", "count", "total")

    def __init__(self, bounds: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        if list(bounds) != sorted(set(bounds)) or not bounds:
            raise ValueError("histogram bounds must be distinct and increasing")
        self.bounds = tuple(float(b) for b in bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # last slot: above every bound
        self.count = 0
        self.total = 0.0

    def observe(self, value: float) -> None:
        # bisect_left: a value equal to a bound belongs to that bound (le = "<=")
        self.counts[bisect_left(self.bounds, value)] += 1
        self.count += 1
        self.total += value

    def snapshot(self) -> HistogramSnapshot:
        running = 0
        cumulative = []
        for n in self.counts[:-1]:
            running += n
            cumulative.append(running)
        return HistogramSnapshot(self.bounds, tuple(cumulative), self.count, self.total)
