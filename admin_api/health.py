"""Liveness, readiness and metrics endpoints."""

from __future__ import annotations

from aiohttp import web

from . import prometheus
from .errors import json_response
from .inspect_api import NODE


async def healthz(request: web.Request) -> web.Response:
    return json_response({"status": "alive"})


async def readyz(request: web.Request) -> web.Response:
    node = request.app[NODE]
    problems = []
    if node.server is None or node.address is None:
        problems.append("the AMQP listener is not bound")
    if not getattr(node, "upstreams_ready", lambda: True)():
        problems.append("configured upstreams are not reachable")
    if problems:
        return json_response({"error": "not_ready", "detail": "; ".join(problems)}, status=503)
    return json_response({"status": "ready"})


async def metrics(request: web.Request) -> web.Response:
    text = prometheus.render(request.app[NODE])
    return web.Response(body=text.encode(), headers={"Content-Type": prometheus.CONTENT_TYPE})
