"""HTTP errors of the admin API: one JSON shape for every 4xx/5xx.

Every error body is ``{"error": "<code>", "detail": "...", "field": "<path>"}``
(``field`` only when one input field is to blame). Handlers raise
``ApiError``; the middleware in ``admin_api.app`` turns it, and aiohttp's own
``HTTPException``s (404 unknown path, 405 wrong method), into that shape.
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from routing import RuleError, RuleValidationError


class ApiError(Exception):
    def __init__(self, status: int, error: str, detail: str, *, field: str | None = None,
                 headers: dict[str, str] | None = None, **extra: Any) -> None:
        super().__init__(f"{status} {error}: {detail}")
        self.status = status
        self.error = error
        self.detail = detail
        self.field = field
        self.headers = headers or {}
        self.extra = extra

    def response(self) -> web.Response:
        body: dict[str, Any] = {"error": self.error, "detail": self.detail}
        if self.field is not None:
            body["field"] = self.field
        body.update(self.extra)
        return json_response(body, status=self.status, headers=self.headers)


def json_response(body: Any, *, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, headers=headers,
                        content_type="application/json")


def invalid_rules(exc: RuleError, *, rename: tuple[str, str] | None = None) -> ApiError:
    """422 naming the first bad field; every problem listed in ``problems``.

    ``rename`` re-roots a field prefix (``rules[3]`` -> ``rule`` when the
    client sent one rule).
    """
    problems = exc.problems if isinstance(exc, RuleValidationError) else [exc]

    def name(field: str) -> str:
        if rename and (field == rename[0] or field.startswith(rename[0] + ".")):
            return rename[1] + field[len(rename[0]):]
        return field

    listed = [{"field": name(p.field), "detail": p.detail} for p in problems]
    first = listed[0] if listed else {"field": "rules", "detail": str(exc)}
    detail = "; ".join(f"{p['field']}: {p['detail']}" for p in listed) or str(exc)
    return ApiError(422, "invalid_rules", detail, field=first["field"], problems=listed)


STATUS_CODES = {
    400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
    405: "method_not_allowed", 409: "conflict", 411: "length_required", 412: "precondition_failed",
    413: "payload_too_large", 415: "unsupported_media_type", 422: "invalid", 428: "precondition_required",
}


def from_http_exception(exc: web.HTTPException) -> web.Response:
    code = STATUS_CODES.get(exc.status, "error" if exc.status >= 500 else "bad_request")
    headers = {k: v for k, v in exc.headers.items() if k.lower() in ("allow", "www-authenticate")}
    return json_response({"error": code, "detail": exc.reason or code}, status=exc.status,
                         headers=headers)
