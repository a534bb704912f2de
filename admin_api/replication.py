"""Replicated queues in the admin API: who is primary, the backups and their lag, promote.

How this works
--------------
The replication service (``proxy.replication``, a ``fedgate.services`` plug-in)
registers as the node's handler of the ``replicated`` kind and as its
``replicated`` view; everything here reads those two, and is empty when the
node runs without it. Only replicated queues (resources ``queue/<address>``)
are shown: fragments' copies belong to ``/api/v1/fragments``.

* ``queue_items``: the replicated queues this node knows (primary, backup or
  proxy), for ``GET /api/v1/queues``; ``owner``: the primary this node knows,
  else the preferred node (the first of the replica set), for ``resolve``.
* ``promote`` (``POST /api/v1/queues/{name}/promote``): ``{"node", "force"}``.
  This node: the service's ``promote``; then, in a static cluster (no etcd:
  nobody else hears of ownership), the new owner is pushed to every other
  node's admin API (``POST /api/v1/replication/owner``, best effort, bounded by
  ``PUSH_TIMEOUT``) so their proxies leave the old primary. Another node: the
  request is forwarded to its admin API (``[admin] cluster``, or the members'
  advertised admin URLs) with the node-to-node token, and its answer returned;
  a node that cannot be reached is a 502, one whose admin URL is not known a 409.
"""

from __future__ import annotations

import asyncio
import logging
import urllib.parse
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from proxy.config.version import version as release_version
from routing import RuleError

from .errors import ApiError, json_response
from .inputs import read_json
from .keys import NODE

log = logging.getLogger("fedgate.admin.replication")

OWNER_PATH = "/api/v1/replication/owner"
FORWARDED = "X-Fedgate-Forwarded-By"  # a promote forwarded once is never forwarded again
FORWARD_TIMEOUT = 10.0  # seconds for another node to promote (a claim, an fsync)
PUSH_TIMEOUT = 2.0  # seconds for each node told of a new owner
ROLES = ("primary", "catching-up", "ready", "lagging", "proxy")  # a node's role for a queue


def service_of(node):
    """The replication service of ``node``, or None (not loaded)."""
    broker = getattr(node, "broker", None)
    handlers = getattr(broker, "kind_handlers", {}) if broker is not None else {}
    return handlers.get("replicated")


def described(node) -> list[dict]:
    """The node's ``replicated`` view, queues only (not fragments' copies)."""
    describe = getattr(node, "views", {}).get("replicated")
    if describe is None:
        return []
    return [item for item in describe()
            if str(item.get("resource", "queue/")).startswith("queue/")]


def summary(item: dict) -> dict[str, Any]:
    """The replication object of one queue: the view as it is, plus what a reader sums up
    (``in_sync_backups``, the largest ``lag_messages`` and ``lag_ms`` of its backups)."""
    out = {key: value for key, value in item.items() if key not in ("address", "resource")}
    backups = item.get("backups") or []
    if item.get("role") == "primary":
        out["in_sync_backups"] = len(item.get("in_sync") or [])
        out["lag_messages"] = max((b.get("lag_messages") or 0 for b in backups), default=0)
        out["lag_ms"] = max((b.get("lag_ms") or 0 for b in backups), default=0.0)
    return out


def queue_items(node, local_names: set[str]) -> tuple[dict[str, dict], list[dict]]:
    """(replication object by the name of a local queue, items of those not held here)."""
    on_local: dict[str, dict] = {}
    elsewhere: list[dict] = []
    for item in described(node):
        name = item["address"]
        replication = summary(item)
        if item.get("role") == "primary" and name in local_names:
            on_local[name] = replication
        else:
            elsewhere.append({"name": name, "role": item.get("role"), "replication": replication})
    return on_local, elsewhere


def owner(node, address: str, decision) -> dict[str, Any] | None:
    """For ``resolve``: the primary of a replicated ``address`` as this node knows it, else its
    preferred node; None when the node runs no replication service."""
    service = service_of(node)
    if service is None:
        return None
    entry = service.addresses.get(address)
    if entry is not None:
        placement, known, role = entry.placement(), entry.owner, entry.describe()["role"]
    else:  # never attached here: nothing is made for a question
        from proxy.replication.address import ReplicationSettings

        placement = service.placement(address, ReplicationSettings.of(decision.rule))
        claim = service.coordinator.current_owner("queue/" + address)
        known, role = ((claim.owner, claim.epoch) if claim is not None else None), None
    preferred = placement[0] if placement else node.node_id
    primary = known[0] if known else preferred
    return {"primary": primary, "primary_known": known is not None,
            "epoch": known[1] if known else None, "preferred": preferred,
            "placement": placement, "role": role or "proxy",
            "primary_url": service.url_of(primary)}


# -- peers' admin APIs ---------------------------------------------------------------
def peer_admins(node) -> dict[str, str]:
    """Other nodes' admin URLs: the members' advertised ones, then ``[admin] cluster``."""
    urls = {m.id: m.admin for m in node.coordinator.members() if m.admin}
    urls.update(node.config.admin.cluster)
    urls.pop(node.node_id, None)
    return {peer: url.rstrip("/") for peer, url in urls.items()}


def _callers_token(request: web.Request) -> str | None:
    """The caller's own token: what a node presents to the others when it has no node-to-node
    token (``[admin] cluster_token``, or an admin token in ``tokens``: a first-run node)."""
    # forwarded by worker 0 to the worker that keeps the queue (admin_api.workers): the
    # caller's own, not the workers' token
    header = request.headers.get("X-Fedgate-Caller") or request.headers.get("Authorization", "")
    return header.partition(" ")[2].strip() or None


VERSION_HEADER = "Fedgate-Version"


def peer_session(token: str | None, timeout: float):
    """An HTTP session for calls to the other nodes' admin APIs (rules, wiring): the cluster
    token and this node's release on every request."""
    return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout),
                                 headers=_headers(token))


def _headers(token: str | None) -> dict[str, str]:
    """A node-to-node call's headers: the cluster token, and this node's release (read by
    nobody yet: a newer node may; docs/upgrades.md)."""
    headers = {VERSION_HEADER: release_version()}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return headers


async def push_owner(node, token: str | None, address: str, owner_id: str,
                     epoch: int) -> dict[str, str]:
    """Tell every other node's admin API that ``owner_id`` serves ``address`` at ``epoch``;
    ``{node: "learned" | "ignored" | "failed: why"}``. Best effort: failures are logged."""
    peers = peer_admins(node)
    if not peers:
        return {}
    body = {"address": address, "owner": owner_id, "epoch": epoch}

    async def one(session: aiohttp.ClientSession, peer: str, url: str) -> str:
        try:
            async with session.post(url + OWNER_PATH, json=body) as response:
                answer = await response.json(content_type=None)
                if response.status != 200:
                    why = answer.get("detail") if isinstance(answer, dict) else answer
                    raise ValueError(f"HTTP {response.status}: {why}")
                return "learned" if answer.get("learned") else "ignored"
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
            why = str(exc) or exc.__class__.__name__
            log.warning("queue %s: node %s not told of its new primary %s (epoch %d): %s",
                        address, peer, owner_id, epoch, why)
            return f"failed: {why}"

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=PUSH_TIMEOUT),
                                     headers=_headers(token)) as session:
        answers = await asyncio.gather(*(one(session, p, u) for p, u in sorted(peers.items())))
    told = dict(zip(sorted(peers), answers))
    log.info("queue %s: primary %s (epoch %d) told to %s", address, owner_id, epoch,
             ", ".join(f"{p} ({a})" for p, a in told.items()))
    return told


# -- handlers --------------------------------------------------------------------------
def _replicated(node, address: str, field: str):
    """The service and the routing decision of ``address``: 404 unless it is replicated."""
    try:
        decision = node.routing.resolve(address)
    except RuleError as exc:
        raise ApiError(400, "invalid_parameter", exc.detail, field=field) from None
    service = service_of(node)
    if decision.kind != "replicated":
        raise ApiError(404, "not_replicated", f"{address!r} is not a replicated queue: it routes "
                       f"as {decision.kind} ({decision.reason})", field=field)
    if service is None:
        raise ApiError(404, "not_replicated", f"{address!r} routes to a replicated rule but this "
                       "node runs no replication service", field=field)
    return service, decision


def _promote_body(raw: Any) -> tuple[str | None, bool]:
    if not isinstance(raw, dict):
        raise ApiError(400, "invalid_body", "expected an object {\"node\", \"force\"}", field="body")
    for key in raw:
        if key not in ("node", "force"):
            raise ApiError(400, "invalid_body", f"unknown key {key!r} (expected node, force)",
                           field=key)
    target = raw.get("node")
    if target is not None and (not isinstance(target, str) or not target):
        raise ApiError(400, "invalid_body", "node must be a node id", field="node")
    force = raw.get("force", False)
    if not isinstance(force, bool):
        raise ApiError(400, "invalid_body", "force must be true or false", field="force")
    return target, force


async def promote(request: web.Request) -> web.Response:
    node = request.app[NODE]
    target, force = _promote_body(await read_json(request) if request.body_exists else {})
    token = node.config.admin.node_token() or _callers_token(request)
    status, body = await promote_queue(node, request.match_info["name"], target, force, token,
                                       forwarded_by=request.headers.get(FORWARDED))
    return json_response(body, status=status)


async def promote_queue(node, name: str, target: str | None, force: bool, token: str | None, *,
                        forwarded_by: str | None = None) -> tuple[int, dict]:
    """(status, body) of a promote of ``name`` on ``target`` (default: this node); ApiError
    when refused (409), not replicated (404), or ``target`` cannot be reached (502).
    ``token``: what this node presents to another one."""
    service, _ = _replicated(node, name, "name")
    target = target or node.node_id
    if target != node.node_id:
        return await _forward(node, name, target, force, token, forwarded_by)
    from proxy.replication.address import PromoteRefused

    try:
        item = await service.promote(name, force=force)
    except PromoteRefused as exc:
        raise ApiError(409, "promote_refused", str(exc), field="node") from None
    log.warning("queue %s: promoted to primary on this node by an operator (epoch %s%s)", name,
                item.get("epoch"), ", forced" if force else "")
    told: dict[str, str] = {}
    if node.coordinator.kind != "etcd" and item.get("epoch") is not None:
        told = await push_owner(node, token, name, node.node_id, item["epoch"])
    return 200, {"name": name, "node": node.node_id, "role": item.get("role"), "forced": force,
                 "replication": summary(item), "told": told}


async def _forward(node, name: str, target: str, force: bool, token: str | None,
                   forwarded_by: str | None) -> tuple[int, dict]:
    if forwarded_by:
        raise ApiError(502, "misrouted", f"forwarded by {forwarded_by} for node {target}, but "
                       f"this is node {node.node_id}: check [admin] cluster there", field="node")
    url = peer_admins(node).get(target)
    if url is None:
        members = sorted(m.id for m in node.coordinator.members())
        if target not in members:
            raise ApiError(404, "node_not_found", f"no node {target!r} in the cluster (members: "
                           f"{', '.join(members)})", field="node")
        raise ApiError(409, "no_admin_url", f"no admin URL known here for node {target}: set "
                       "[admin] cluster (or, on etcd, its [cluster] advertise_admin)", field="node")
    path = f"/api/v1/queues/{urllib.parse.quote(name, safe='')}/promote"
    headers = {**_headers(token), FORWARDED: node.node_id}
    return await call_node("POST", url, path, target, headers=headers, field="node",
                           body=orjson.dumps({"node": target, "force": force}),
                           timeout=FORWARD_TIMEOUT)


async def call_node(method: str, url: str, path_qs: str, target: str, *, headers: dict,
                    field: str, body: bytes | None = None,
                    timeout: float = FORWARD_TIMEOUT) -> tuple[int, Any]:
    """(status, JSON answer) of one request to node ``target``'s admin API at ``url`` on this
    node's behalf; 502 (``node_unreachable``, ``bad_gateway``, ``node_refused``: this node's
    token, not the caller's) when it gives no usable answer."""
    if body is not None:
        headers = {**headers, "Content-Type": "application/json"}
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session:
            async with session.request(method, url + path_qs, data=body,
                                       headers=headers) as response:
                status = response.status
                answer = await response.json(content_type=None)
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        raise ApiError(502, "node_unreachable", f"node {target} at {url}: "
                       f"{str(exc) or exc.__class__.__name__}", field=field) from None
    except ValueError:
        raise ApiError(502, "bad_gateway", f"node {target} at {url} answered HTTP {status} "
                       "without JSON", field=field) from None
    if status in (401, 403):  # this node's token, not the caller's: say whose
        raise ApiError(502, "node_refused", f"node {target} refused this node's token: set the "
                       "same [admin] cluster_token on both", field=field)
    return status, answer


async def post_owner(request: web.Request) -> web.Response:
    """Node to node: ``{"address", "owner", "epoch"}``: the primary of a replicated queue now."""
    node = request.app[NODE]
    raw = await read_json(request)
    if not isinstance(raw, dict):
        raise ApiError(400, "invalid_body", "expected an object {\"address\", \"owner\", \"epoch\"}",
                       field="body")
    for key in ("address", "owner"):
        if not isinstance(raw.get(key), str) or not raw[key]:
            raise ApiError(400, "invalid_body", f"{key} must be a non-empty string", field=key)
    epoch = raw.get("epoch")
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 1:
        raise ApiError(400, "invalid_body", "epoch must be an integer >= 1", field="epoch")
    service, _ = _replicated(node, raw["address"], "address")
    learned = service.learn_owner(raw["address"], raw["owner"], epoch)
    if learned:
        log.info("queue %s: primary %s (epoch %d), as another node said", raw["address"],
                 raw["owner"], epoch)
    item = next((i for i in described(node) if i["address"] == raw["address"]), {})
    return json_response({"learned": learned, "node": node.node_id,
                          "replication": summary(item) if item else None})
