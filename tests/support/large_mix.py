"""Random mixes of message sizes for the large-message tests (issue #33).

A mix is drawn from a seed: sizes from 1 B to just under 16 MiB (log-uniform,
so small and huge ones both come often), each assigned to one of the
consumer's links, and a total kept under ``budget`` bytes so one run takes
about a second. ``FEDGATE_LARGE_SEED`` fixes the first seed; the test prints
the seed of a failing run, so it can be run again alone.
"""

from __future__ import annotations

import math
import os
import random
from dataclasses import dataclass

MAX_BODY = 16 * 1024 * 1024 - 4096  # under [limits] max_message_size with the message's overhead


@dataclass(frozen=True)
class Mix:
    seed: int
    links: int  # the consumer's receivers (one queue each)
    sessions: int  # the consumer's sessions, links spread over them
    sizes: list  # (link index, body size) in send order

    def per_link(self, link: int) -> list[tuple[str, int]]:
        return [(f"m{n}", size) for n, (index, size) in enumerate(self.sizes) if index == link]


def draw(seed: int, *, budget: int = 40_000_000, count: int = 12) -> Mix:
    rng = random.Random(seed)
    links = rng.randint(1, 3)
    sessions = rng.randint(1, min(2, links))
    sizes, total = [], 0
    while len(sizes) < count:
        size = int(math.exp(rng.uniform(0, math.log(MAX_BODY))))
        if total + size > budget:
            size = rng.randint(1, 1000)
        total += size
        sizes.append((rng.randrange(links), size))
    return Mix(seed, links, sessions, sizes)


def seeds(runs: int) -> list[int]:
    first = int(os.environ.get("FEDGATE_LARGE_SEED") or random.SystemRandom().randrange(1 << 30))
    return [first + n for n in range(runs)]


def runs(default: int) -> int:
    """How many mixes: ``default`` in ``make test``, more with FEDGATE_LARGE_RUNS (opt-in)."""
    return int(os.environ.get("FEDGATE_LARGE_RUNS") or default)
