"""The last hour of a node, sampled every few seconds, for the console's charts (issue #23).

How this works
--------------
``History`` keeps at most ``HOUR / interval`` samples in a ``deque`` (720 at
the default 5 s: bounded memory, about 200 KB with 20 queues). A task started
with the admin app (``context``, an aiohttp ``cleanup_ctx``) takes one every
``interval`` seconds: time, message totals in and out (their differences over
time are the rates the console draws), connections, queued bytes, the depths
of the ``TOP_QUEUES`` deepest queues, and the upstreams up and down.
``GET /api/v1/history`` returns them, oldest first, with the rates computed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque

from aiohttp import web

from .errors import json_response
from .inspect_api import NODE, describe_upstreams

log = logging.getLogger("fedgate.admin")

HOUR = 3600.0
TOP_QUEUES = 20


class History:
    def __init__(self, node, interval: float = 5.0) -> None:
        self.node = node
        self.interval = interval
        self.samples: deque = deque(maxlen=max(2, int(HOUR / interval)))

    def sample(self, now: float | None = None) -> dict:
        node = self.node
        totals = node.queues.totals()
        queues = sorted(node.queues.queues.values(), key=lambda q: q.depth, reverse=True)[:TOP_QUEUES]
        upstreams = describe_upstreams(node)
        item = {
            "t": round(time.time() if now is None else now, 3),
            "messages_in": totals.enqueued,
            "messages_out": totals.delivered,
            "connections": len(node.connections),
            "queued_bytes": node.queues.memory.used,
            "depths": {q.name: q.depth for q in queues},
            "upstreams_up": sum(1 for u in upstreams if u.get("state") == "up"),
            "upstreams_down": sum(1 for u in upstreams if u.get("state") != "up"),
        }
        self.samples.append(item)
        return item

    def series(self) -> list[dict]:
        """The samples, oldest first, each with rates (per second) since the one before."""
        out, previous = [], None
        for item in self.samples:
            item = dict(item)
            span = item["t"] - previous["t"] if previous else 0.0
            for name in ("messages_in", "messages_out"):
                item[f"{name}_per_s"] = (round((item[name] - previous[name]) / span, 1)
                                         if previous and span > 0 else None)
            out.append(item)
            previous = item
        return out

    async def context(self, app: web.Application):
        task = asyncio.create_task(self._run(), name="fedgate-history")
        try:
            yield
        finally:
            task.cancel()

    async def _run(self) -> None:
        while True:
            try:
                self.sample()
            except Exception:  # a sample is a view: never let it stop the loop
                log.exception("admin history: sample failed")
            await asyncio.sleep(self.interval)


HISTORY = web.AppKey("history", History)


async def get_history(request: web.Request) -> web.Response:
    history = request.app[HISTORY]
    samples = history.series()
    return json_response({"interval_s": history.interval, "count": len(samples), "samples": samples})
