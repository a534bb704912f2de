"""The web console: static files (HTML, ES modules, CSS) served as they are.

No build step and no data in the files: the page asks for a token and calls
the JSON API like any other client, so the files need no authentication.
Only the files listed in ``ASSETS`` are served.
"""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

from .errors import ApiError

ROOT = Path(__file__).resolve().parent / "console"
ASSETS = {
    "app.js": "text/javascript",
    "api.js": "text/javascript",
    "queues.js": "text/javascript",
    "style.css": "text/css",
}
HEADERS = {"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff",
           "Content-Security-Policy": "default-src 'self'; img-src 'self' data:"}


async def index(request: web.Request) -> web.Response:
    return web.Response(body=(ROOT / "index.html").read_bytes(), content_type="text/html",
                        charset="utf-8", headers=HEADERS)


async def asset(request: web.Request) -> web.Response:
    name = request.match_info["file"]
    content_type = ASSETS.get(name)
    if content_type is None:
        raise ApiError(404, "not_found", f"no console file {name!r}", field="file")
    return web.Response(body=(ROOT / name).read_bytes(), content_type=content_type,
                        charset="utf-8", headers=HEADERS)
