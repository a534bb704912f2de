"""Queue operations of the admin API: delete, purge, peek, move, resend (docs/operations.md).

How this works
--------------
Each handler finds the local queue the name stands for on this node
(``_locate``), then calls ``proxy.broker.operations``, which works through the
queue's own outcome calls (journal and backups told as for a consumer).

* a local queue: this node's;
* a fragmented queue: this node's fragment (the answer says ``scope: "fragment"``;
  the other members' fragments are reached through their own admin APIs);
* a replicated queue: its primary does it, and its backups follow through the
  replication stream. On another node the request is forwarded to the primary's
  admin API (``X-Fedgate-Forwarded-By``, at most once) and its answer returned; a
  primary not known or without an admin URL answers 409 ``not_primary`` naming it;
* a proxied address (its queue is on a primary broker): 409 ``not_local``.

Move and resend are at-least-once: a message is taken out as a consumer would take it,
sent to its target, and removed from the source only once the target accepted it; a
refusal or no answer within ``SEND_TIMEOUT`` puts it back at the head of the source.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import web
from cproton import PN_ACCEPTED

from proxy.broker import operations
from proxy.selectors import SelectorError
from proxy.selectors import parse as parse_selector
from routing import RuleError

from .audit import ON_BEHALF, WHO
from .errors import ApiError, json_response
from .inputs import query_int, read_json
from .keys import NODE
from .replication import FORWARDED, _callers_token, _headers, call_node, owner, peer_admins
from .wiring import forget_queue

log = logging.getLogger("fedgate.admin.queues")

SEND_TIMEOUT = 30.0  # seconds for the targets of a move to answer
FORWARD_TIMEOUT = SEND_TIMEOUT + 5.0
MAX_COUNT = 10_000  # messages per move or resend, per peek
DEFAULT_PEEK = 10


def _decision(node, name: str):
    try:
        return node.routing.resolve(name)
    except RuleError as exc:
        raise ApiError(400, "invalid_parameter", exc.detail, field="name") from None


async def _locate(request: web.Request):
    """(queue, scope) for the request's queue on this node, or a ``web.Response``: the
    primary's answer to the forwarded request."""
    node = request.app[NODE]
    name = request.match_info["name"]
    decision = _decision(node, name)
    queue = node.queues.get(name)
    if decision.kind == "replicated":
        if queue is not None and queue.replica_set is not None:
            return queue, "replicated"
        return await _to_primary(request, node, name, decision)
    if decision.kind == "proxy":
        raise ApiError(409, "not_local", f"{name!r} is on primary {decision.primary} "
                       f"({decision.reason}): operate on it there", field="name")
    if decision.kind == "deny":
        raise ApiError(409, "denied", f"{name!r} is denied by rule {decision.rule.name}",
                       field="name")
    if queue is None:
        raise ApiError(404, "queue_not_found", f"no queue {name!r} on node {node.node_id}",
                       field="name")
    return queue, "fragment" if decision.kind == "fragmented" else "local"


async def _to_primary(request: web.Request, node, name: str, decision) -> web.Response:
    said = owner(node, name, decision) or {}
    primary = said.get("primary")
    where = {"primary": primary, "primary_known": said.get("primary_known", False)}
    if primary == node.node_id or not said.get("primary_known"):
        raise ApiError(409, "not_primary", f"replicated queue {name!r} has no primary serving "
                       f"on this node yet (known primary: {primary if said.get('primary_known') else 'none'}): "
                       "try again once it is served", field="name", **where)
    forwarded_by = request.headers.get(FORWARDED)
    url = peer_admins(node).get(primary)
    if forwarded_by or url is None:
        why = (f"forwarded by {forwarded_by}, but this node is not the primary either"
               if forwarded_by else "no admin URL known here for it")
        raise ApiError(409, "not_primary", f"replicated queue {name!r}: its primary is node "
                       f"{primary} ({why}); ask that node", field="name",
                       primary_admin_url=url, **where)
    token = node.config.admin.node_token() or _callers_token(request)
    headers = {**_headers(token), FORWARDED: node.node_id,
               ON_BEHALF: f"{request.get(WHO, ('anonymous',))[0]} at {node.node_id}"}
    body = await request.read() if request.body_exists else None
    status, answer = await call_node(request.method, url, request.path_qs, primary,
                                     headers=headers, field="name", body=body,
                                     timeout=FORWARD_TIMEOUT)
    if isinstance(answer, dict):
        answer.setdefault("forwarded_to", primary)
    return json_response(answer, status=status)


def _answer(queue, scope: str, node, **fields) -> web.Response:
    return json_response({"name": queue.name, "node": node.node_id, "scope": scope, **fields})


# -- handlers -----------------------------------------------------------------------------
async def delete_queue(request: web.Request) -> web.Response:
    force = _flag(request, "force")
    located = await _locate(request)
    if isinstance(located, web.Response):
        return located
    queue, scope = located
    node = request.app[NODE]
    if scope != "local":
        raise ApiError(409, "not_deletable", f"{queue.name!r} is a {scope} queue: it exists as "
                       "long as its rule routes it there; purge it, or change the rule",
                       field="name")
    if queue.temporary:
        raise ApiError(409, "not_deletable", f"{queue.name!r} is a temporary queue: it goes "
                       "with its link", field="name")
    try:
        result = operations.delete(node.broker, queue, force=force)
    except operations.Refused as exc:
        raise ApiError(409, "queue_in_use", str(exc), field="name", consumers=len(queue.consumers),
                       messages=queue.depth + queue.scheduled.total + queue.unacked) from None
    version = await forget_queue(request, queue.name)  # declared at run time: not any more
    if version is not None:
        result["version"] = version
    return _answer(queue, scope, node, **result)


async def purge_queue(request: web.Request) -> web.Response:
    located = await _locate(request)
    if isinstance(located, web.Response):
        return located
    queue, scope = located
    node = request.app[NODE]
    return _answer(queue, scope, node, purged=operations.purge(node.broker, queue),
                   depth=queue.depth, unacked=queue.unacked)


async def get_messages(request: web.Request) -> web.Response:
    count = query_int(request, "count", minimum=1, default=DEFAULT_PEEK)
    if count > MAX_COUNT:
        raise ApiError(400, "invalid_parameter", f"count must be <= {MAX_COUNT}", field="count")
    located = await _locate(request)
    if isinstance(located, web.Response):
        return located
    queue, scope = located
    return _answer(queue, scope, request.app[NODE], depth=queue.depth,
                   scheduled=queue.scheduled.total, unacked=queue.unacked,
                   messages=operations.peek(queue, count))


def _flag(request: web.Request, name: str) -> bool:
    text = request.query.get(name, "false").lower()
    if text not in ("true", "false", "1", "0"):
        raise ApiError(400, "invalid_parameter", f"{name} must be true or false", field=name)
    return text in ("true", "1")


async def _body(request: web.Request, keys: dict[str, tuple]) -> dict[str, Any]:
    raw = await read_json(request) if request.body_exists else {}
    if not isinstance(raw, dict):
        raise ApiError(400, "invalid_body", f"expected an object with {', '.join(keys)}",
                       field="body")
    for key in raw:
        if key not in keys:
            raise ApiError(400, "invalid_body", f"unknown key {key!r} (expected "
                           f"{', '.join(keys)})", field=key)
    for key, value in raw.items():
        types = keys[key]
        if value is not None and (not isinstance(value, types) or isinstance(value, bool)):
            raise ApiError(400, "invalid_body", f"{key} must be a "
                           f"{' or '.join(t.__name__ for t in types)}", field=key)
    return raw


def _count(raw: dict) -> int:
    count = raw.get("count")
    if count is None:
        return MAX_COUNT
    if not 1 <= count <= MAX_COUNT:
        raise ApiError(400, "invalid_body", f"count must be between 1 and {MAX_COUNT}",
                       field="count")
    return count


async def move_messages(request: web.Request) -> web.Response:
    raw = await _body(request, {"to": (str,), "count": (int,), "selector": (str,)})
    to = raw.get("to")
    if not to:
        raise ApiError(400, "invalid_body", "to (the address to move messages to) is required",
                       field="to")
    count = _count(raw)
    selector = None
    if raw.get("selector"):
        try:
            selector = parse_selector(raw["selector"])
        except SelectorError as exc:
            raise ApiError(400, "invalid_selector", str(exc), field="selector") from None
    located = await _locate(request)
    if isinstance(located, web.Response):
        return located
    queue, scope = located
    if to == queue.name:
        raise ApiError(400, "invalid_body", "to is the queue itself", field="to")
    node = request.app[NODE]
    taken = operations.take(queue, count, selector=selector)
    moved, failures = await _transfer(node.broker, queue, [(m, to, m.payload) for m in taken])
    log.info("queue %s: %d of %d messages moved to %s by an operator", queue.name, moved,
             len(taken), to)
    return _answer(queue, scope, node, to=to, selected=len(taken), moved=moved,
                   returned=len(taken) - moved, failures=failures, depth=queue.depth)


async def resend_messages(request: web.Request) -> web.Response:
    raw = await _body(request, {"count": (int,)})
    count = _count(raw)
    located = await _locate(request)
    if isinstance(located, web.Response):
        return located
    queue, scope = located
    node = request.app[NODE]
    taken = operations.take(queue, count,
                            where=lambda payload: operations.dead_letter_origin(payload) is not None)
    items = [(m, operations.dead_letter_origin(m.payload),
              operations.without_dead_letter_marks(m.payload)) for m in taken]
    moved, failures = await _transfer(node.broker, queue, items)
    targets: dict[str, int] = {}
    for _, to, _ in items:
        targets[to] = targets.get(to, 0) + 1
    log.info("queue %s: %d of %d dead-lettered messages resent by an operator (%s)", queue.name,
             moved, len(taken), ", ".join(f"{t}: {n}" for t, n in sorted(targets.items())))
    return _answer(queue, scope, node, selected=len(taken), resent=moved,
                   returned=len(taken) - moved, targets=targets, failures=failures,
                   depth=queue.depth)


async def _transfer(broker, queue, items: list) -> tuple[int, list[dict]]:
    """Send each (message, address, payload); settle each at the source with its outcome.
    (moved, the failures by address and reason)."""
    loop = asyncio.get_running_loop()
    futures = []
    for _, address, payload in items:
        future = loop.create_future()

        def done(state, condition=None, future=future) -> None:
            if not future.done():
                future.set_result((state, condition))

        futures.append(future)
        try:
            operations.send(broker, address, payload, done)
        except Exception as exc:  # e.g. an address the routing rules refuse to resolve
            done(None, str(exc))
    if futures:
        await asyncio.wait(futures, timeout=SEND_TIMEOUT)
    moved = 0
    failures: dict[tuple, int] = {}
    back = []
    for (stored, address, _), future in zip(items, futures):
        state, condition = future.result() if future.done() else (None, "no answer in time")
        if state == PN_ACCEPTED:
            operations.settle(broker, queue, stored, True)
            moved += 1
        else:
            back.append(stored)
            why = getattr(condition, "description", None) or str(condition or "released")
            name = getattr(condition, "name", None)
            key = (address, f"{name}: {why}" if name else why)
            failures[key] = failures.get(key, 0) + 1
    for stored in reversed(back):  # back at the head, in their order
        operations.settle(broker, queue, stored, False)
    broker.run_pending()
    return moved, [{"to": to, "reason": why, "count": n} for (to, why), n in failures.items()]
