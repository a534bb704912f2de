"""Reading request input: JSON bodies and query parameters, with 400s that name the field."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from aiohttp import web

from .errors import ApiError
from .slow_clients import SLOW_CLIENTS


async def read_json(request: web.Request) -> Any:
    slow = request.app.get(SLOW_CLIENTS)
    try:
        body = await asyncio.wait_for(request.read(), slow.body_timeout if slow else None)
    except asyncio.TimeoutError:
        raise ApiError(408, "body_timeout", "the request body did not arrive in time") from None
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
