"""The audit log of admin changes: who, what, when, the result (docs/operations.md).

How this works
--------------
``audit_middleware`` sits outside the error middleware, so it sees every answer,
refusals included. Every request that may change something (any method but GET, HEAD,
OPTIONS) becomes one entry:

``{"time", "node", "who", "role", "method", "path", "body", "status", "result"}``

* ``who``: the token's ``name`` from ``[admin] tokens`` when it has one, else
  ``token:<first 12 hex digits of its sha256>`` (``printf %s TOKEN | sha256sum`` finds
  which); an OAuth token's ``sub:<subject>``; ``anonymous`` without a token. A request
  another node forwarded says on whose behalf (``X-Fedgate-On-Behalf-Of``, believed only
  from an admin token).
* ``body``: the first ``BODY_CHARS`` characters of the request body; ``result``: the
  answer's error code and detail, or its top-level numbers, flags and short strings.

Each entry is one ``fedgate.audit`` log line and one JSON line in
``<data_dir>/audit.jsonl``; at ``MAX_FILE`` bytes the file becomes ``audit.jsonl.1``
(the one before is dropped), so the log on disk stays under twice that. The last ``KEEP``
entries are kept in memory (read back from the files at start) for ``GET /api/v1/audit``.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import time
from collections import deque
from pathlib import Path

import orjson
from aiohttp import web

from .errors import json_response
from .inputs import query_int
from .keys import NODE

log = logging.getLogger("fedgate.audit")

KEEP = 1000
MAX_FILE = 1024 * 1024
BODY_CHARS = 512
READS = frozenset({"GET", "HEAD", "OPTIONS"})
WHO = "fedgate.who"  # request key: (who, role), set by the auth middleware
ON_BEHALF = "X-Fedgate-On-Behalf-Of"


def token_who(token: str, names: dict[bytes, str]) -> str:
    digest = hashlib.sha256(token.encode()).digest()
    return names.get(digest) or "token:" + digest.hex()[:12]


def jwt_who(token: str) -> str:
    try:
        import jwt

        claims = jwt.decode(token, options={"verify_signature": False})
    except Exception:
        return "oauth:?"
    return f"sub:{claims.get('sub', '?')}"


class AuditLog:
    def __init__(self, path: Path | None, node_id: str) -> None:
        self.path = path
        self.node_id = node_id
        self.entries: deque = deque(maxlen=KEEP)
        self.recorded = 0
        if path is not None:
            self._load()

    def _load(self) -> None:
        for name in (self.path.with_name(self.path.name + ".1"), self.path):
            try:
                lines = name.read_bytes().splitlines()
            except OSError:
                continue
            for line in lines[-KEEP:]:
                try:
                    self.entries.append(orjson.loads(line))
                except orjson.JSONDecodeError:
                    continue  # a line cut by a crash

    def record(self, entry: dict) -> None:
        self.entries.append(entry)
        self.recorded += 1
        line = orjson.dumps(entry)
        log.info("%s", line.decode())
        if self.path is None:
            return
        try:
            if self.path.exists() and self.path.stat().st_size + len(line) > MAX_FILE:
                os.replace(self.path, self.path.with_name(self.path.name + ".1"))
            with open(self.path, "ab") as out:
                out.write(line + b"\n")
        except OSError as exc:
            log.warning("audit log %s not written: %s", self.path, exc)


AUDIT = web.AppKey("audit", AuditLog)


def _result(response: web.StreamResponse) -> dict:
    body = getattr(response, "body", None)
    if not isinstance(body, (bytes, bytearray)) or not body:
        return {}
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return {}
    if not isinstance(doc, dict):
        return {}
    if response.status >= 400:
        return {k: doc.get(k) for k in ("error", "detail", "field") if doc.get(k) is not None}
    return {k: v for k, v in doc.items()
            if isinstance(v, (bool, int, float)) or (isinstance(v, str) and len(v) <= 200)}


@web.middleware
async def audit_middleware(request: web.Request, handler):
    if request.method in READS or AUDIT not in request.app:
        return await handler(request)
    response = await handler(request)
    body = b""
    if request.body_exists:
        try:  # what the handler read is cached; one it did not read is not waited for long
            body = await asyncio.wait_for(request.read(), 1.0)
        except (asyncio.TimeoutError, web.HTTPException, ConnectionError):
            body = b"(not read)"
    who, role = request.get(WHO, ("anonymous", None))
    behalf = request.headers.get(ON_BEHALF)
    if behalf and role == "admin":
        who = f"{behalf[:200]} via {who}"
    audit = request.app[AUDIT]
    audit.record({
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "node": audit.node_id, "who": who, "role": role, "method": request.method,
        "path": request.path_qs, "body": body[:BODY_CHARS].decode("utf-8", "replace") or None,
        "status": response.status, "result": _result(response)})
    return response


async def get_audit(request: web.Request) -> web.Response:
    """The newest entries last; ``limit`` (default 100, at most ``KEEP``)."""
    limit = min(query_int(request, "limit", minimum=1, default=100), KEEP)
    audit = request.app.get(AUDIT)
    entries = list(audit.entries)[-limit:] if audit is not None else []
    return json_response({"node": request.app[NODE].node_id, "entries": entries,
                          "kept": KEEP, "recorded": audit.recorded if audit else 0,
                          "file": str(audit.path) if audit and audit.path else None})
