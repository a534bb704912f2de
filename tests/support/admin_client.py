"""The one HTTP client the tests use for a node's admin API (plain urllib, bounded waits)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

ADMIN_TOKEN = "test-admin-token-0123456789"
READ_TOKEN = "test-read-token-0123456789"
ADMIN = {"tokens": [{"token": ADMIN_TOKEN, "role": "admin"}]}  # an [admin] section
TOKENS = [{"token": ADMIN_TOKEN, "role": "admin"}, {"token": READ_TOKEN, "role": "read"}]


def http(method: str, url: str, body=None, token: str | None = ADMIN_TOKEN, headers=None,
         timeout: float = 5.0):
    """(status, parsed JSON or text) of one request; HTTP errors are answers, not exceptions."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers=dict(headers or {}))
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, raw, kind = response.status, response.read(), response.headers.get("Content-Type", "")
    except urllib.error.HTTPError as exc:
        status, raw, kind = exc.code, exc.read(), exc.headers.get("Content-Type", "")
    return status, (json.loads(raw) if kind.startswith("application/json") else raw.decode())


def admin(node, path: str, *, method: str = "GET", body=None, headers=None,
          token: str = ADMIN_TOKEN, timeout: float = 10.0):
    """The JSON answer of one admin call; an HTTP error raises ``urllib.error.HTTPError``."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(node.admin_url + path, data=data, method=method, headers={
        "Authorization": f"Bearer {token}", "Content-Type": "application/json", **(headers or {})})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read() or b"null")


def admin_get(node, path: str):
    return admin(node, path, timeout=5.0)


def upstream_pools(node, token: str = ADMIN_TOKEN) -> list[dict]:
    body = admin(node, "/api/v1/upstreams", token=token)
    return body if isinstance(body, list) else body.get("upstreams", [])


def upstream_members(node) -> list[dict]:
    return [member for pool in upstream_pools(node) for member in pool.get("members", [])]


def admin_node(start_node, name: str = "n1", admin: dict | None = None, **sections):
    """A node whose admin API takes ``ADMIN_TOKEN`` (admin) and ``READ_TOKEN`` (read)."""
    return start_node({"admin": {"tokens": TOKENS, **(admin or {})}, **sections}, name)


def wait_for(predicate, timeout: float = 5.0, what: str = "condition", interval: float = 0.05):
    """``predicate()``'s first true value, polled until ``timeout`` seconds have passed."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)
