"""The admin application's shared state keys (aiohttp ``web.AppKey``), in a module of their own
so that every handler module can read them without importing another handler module."""

from __future__ import annotations

from aiohttp import web

NODE = web.AppKey("node", object)
STARTED = web.AppKey("started_at", float)
ADMIN_URL = web.AppKey("admin_url", dict)  # {"url": ...}, filled in once bound
