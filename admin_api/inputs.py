"""Reading request input: JSON bodies and query parameters, with 400s that name the field."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from .errors import ApiError


async def read_json(request: web.Request) -> Any:
    body = await request.read()
    if not body.strip():
        raise ApiError(400, "invalid_json", "the request body is empty; expected JSON")
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, "invalid_json", f"the request body is not JSON: {exc}") from None


def query_int(request: web.Request, name: str, *, minimum: int = 0, default: int | None = None) -> int | None:
    text = request.query.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise ApiError(400, "invalid_parameter", f"{name} must be an integer, got {text!r}",
                       field=name) from None
    if value < minimum:
        raise ApiError(400, "invalid_parameter", f"{name} must be >= {minimum}", field=name)
    return value


def path_int(request: web.Request, name: str) -> int:
    text = request.match_info[name]
    try:
        return int(text)
    except ValueError:
        raise ApiError(400, "invalid_parameter", f"{name} must be an integer, got {text!r}",
                       field=name) from None
