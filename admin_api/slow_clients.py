"""Slow HTTP clients are timed out (issue #21: admin clients that send slowly were kept for ever).

How this works
--------------
aiohttp times out neither a request head sent a byte at a time nor a body
that never ends. ``SlowClients`` wraps the server's protocol factory, so it
knows every connection from its start, and checks each every
``header_timeout`` seconds: a connection that is not handling a request and
started no new one since the last check (a head still incomplete, or idle
between keep-alive requests) is closed. The ``middleware`` tells it when a
request starts and ends. A request's body must arrive within
``body_timeout`` (``admin_api.inputs.read_json``): 408 otherwise.
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web

log = logging.getLogger("fedgate.admin")

SLOW_CLIENTS = web.AppKey("slow_clients", object)


class _Watched:
    __slots__ = ("requests", "seen", "busy")

    def __init__(self) -> None:
        self.requests = 0  # requests started on this connection
        self.seen = 0  # ``requests`` at the last check
        self.busy = 0  # requests being handled now


class SlowClients:
    def __init__(self, header_timeout: float, body_timeout: float) -> None:
        self.header_timeout = header_timeout
        self.body_timeout = body_timeout
        self.watched: dict = {}  # aiohttp RequestHandler -> _Watched

    def factory(self, server):
        """``server`` (aiohttp's protocol factory) with every connection watched."""
        def make():
            protocol = server()
            self.watched[protocol] = _Watched()
            asyncio.get_running_loop().call_later(self.header_timeout, self._check, protocol)
            return protocol
        return make

    def _check(self, protocol) -> None:
        watched = self.watched.get(protocol)
        if watched is None:
            return
        transport = protocol.transport
        if transport is None or transport.is_closing():
            del self.watched[protocol]
            return
        if not watched.busy and watched.requests == watched.seen:
            peer = transport.get_extra_info("peername")
            log.info("admin HTTP: %s sent no complete request within %.0f s; closed",
                     peer[0] if peer else "?", self.header_timeout)
            del self.watched[protocol]
            transport.close()
            return
        watched.seen = watched.requests
        asyncio.get_running_loop().call_later(self.header_timeout, self._check, protocol)

    @web.middleware
    async def middleware(self, request: web.Request, handler):
        watched = self.watched.get(request.protocol)
        if watched is None:  # a server we do not watch (aiohttp's test server)
            return await handler(request)
        watched.requests += 1
        watched.busy += 1
        try:
            return await handler(request)
        finally:
            watched.busy -= 1
