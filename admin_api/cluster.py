"""Cluster-wide routing rules: push on change, anti-entropy pull, last writer wins.

How this works
--------------
``[admin] cluster`` maps node ids to admin URLs (the same table may be used on
every node: a node skips its own id). Each rules record carries a key
``(version, updated_at, origin)``; the greatest key wins everywhere:

* a change accepted here is at once POSTed to every other node
  (``/api/v1/cluster/rules``), which adopts it if its key is greater than
  its own and it validates there;
* every ``interval`` seconds (+-50% jitter, so nodes do not pull in lockstep)
  each node GETs ``/api/v1/rules`` from every other node, adopts a greater
  record and pushes its own to a node that is behind. A node that was down
  converges on its first pull after it comes back.

Version 0 means "this node's config file, never changed through the API":
it is never sent nor adopted, so nodes keep their own ``[[rules]]`` until
someone changes rules through the API. Two changes made at the same time on
two nodes get the same version; the later ``updated_at`` (then the greater
node id) wins and the other change is overwritten on every node.

A record that wins but does not validate here (a peer id this node does not
know, a proxy rule pointing at this very node) is refused and kept in
``rejected``; ``GET /api/v1/cluster`` shows it, with each node's version and
digest and whether they diverge. Node-to-node calls carry this node's admin
token; every call is bounded by ``timeout``.

All that is for a static cluster. On etcd (``[cluster] etcd``) the rules record
lives in etcd and every node follows its watch (``RulesManager.follow``,
started by ``follow_etcd``); ``GET /api/v1/cluster`` then says whether this
node serves the record etcd holds. In both cases it lists the ``members`` (id,
AMQP and admin URLs, workers, version, ``lease_age_s``) and the
``coordinator`` (kind, endpoints, healthy, revision, this node's lease).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from typing import Any

import aiohttp
from aiohttp import web

from proxy.config.rules_store import RecordError, RulesRecord
from routing import RuleError

from .errors import ApiError, invalid_rules, json_response
from .inputs import read_json
from .inspect_api import ADMIN_URL
from .replication import peer_session
from .rules_manager import RulesManager

log = logging.getLogger("fedgate.admin.cluster")

RULES_PATH = "/api/v1/rules"
PUSH_PATH = "/api/v1/cluster/rules"


def summary(record: RulesRecord) -> dict[str, Any]:
    return {"version": record.version, "updated_at": record.updated_at,
            "origin": record.origin, "digest": record.digest}


class ClusterSync:
    def __init__(self, manager: RulesManager, peers: dict[str, str], token: str | None, *,
                 interval: float = 1.0, timeout: float = 1.0) -> None:
        self.manager = manager
        self.node_id = manager.node.node_id
        self.peers = {pid: url.rstrip("/") for pid, url in peers.items() if pid != self.node_id}
        self.token = token
        self.interval = interval
        self.timeout = timeout
        self.session: aiohttp.ClientSession | None = None
        self.rejected: dict[str, Any] | None = None
        self._rejected_keys: set[tuple] = set()
        self._tasks: set[asyncio.Task] = set()

    # -- lifecycle (aiohttp cleanup_ctx) ---------------------------------------
    async def context(self, app: web.Application):
        if not self.peers:
            yield
            return
        self.session = peer_session(self.token, self.timeout)
        self.manager.listeners.append(self.on_local_change)
        puller = asyncio.create_task(self._pull_loop(), name="fedgate-cluster-pull")
        try:
            yield
        finally:
            self.manager.listeners.remove(self.on_local_change)
            puller.cancel()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(puller, *self._tasks, return_exceptions=True)
            await self.session.close()
            self.session = None

    def _spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- push ----------------------------------------------------------------------
    def on_local_change(self, record: RulesRecord) -> None:
        for peer_id, url in self.peers.items():
            self._spawn(self._push(peer_id, url, record))

    async def _push(self, peer_id: str, url: str, record: RulesRecord) -> None:
        try:
            async with self.session.post(url + PUSH_PATH, json=record.to_dict()) as response:
                body = await response.json(content_type=None)
                if response.status >= 400:
                    log.warning("node %s refused rules version %d: %s %s", peer_id,
                                record.version, response.status, body)
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
            log.info("push of rules version %d to %s failed (%s); anti-entropy will retry",
                     record.version, peer_id, exc.__class__.__name__)

    # -- anti-entropy pull -------------------------------------------------------------
    async def _pull_loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval * random.uniform(0.5, 1.5))
            results = await asyncio.gather(
                *(self._pull(pid, url) for pid, url in self.peers.items()), return_exceptions=True)
            for result in results:
                if isinstance(result, Exception):
                    log.error("anti-entropy pull failed", exc_info=result)

    async def fetch(self, url: str) -> RulesRecord:
        async with self.session.get(url + RULES_PATH) as response:
            if response.status != 200:
                raise ValueError(f"HTTP {response.status}")
            return RulesRecord.from_dict(await response.json(content_type=None))

    async def _pull(self, peer_id: str, url: str) -> None:
        try:
            remote = await self.fetch(url)
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            return  # down or unreachable: it pulls from us when it is back
        local = self.manager.current
        if remote.version > 0 and remote.key() > local.key():
            try:
                await self.take(remote, peer_id)
            except RuleError:
                pass  # kept in self.rejected, logged once
        elif local.version > 0 and local.key() > remote.key():
            await self._push(peer_id, url, local)

    async def take(self, record: RulesRecord, source: str) -> bool:
        """Adopt ``record`` if it wins; remember (and log once) a refusal."""
        try:
            return await self.manager.adopt(record)
        except RuleError as exc:
            problems = getattr(exc, "problems", None) or [exc]
            self.rejected = {**summary(record), "from": source, "field": problems[0].field,
                             "detail": "; ".join(f"{p.field}: {p.detail}" for p in problems)}
            if record.key() not in self._rejected_keys:
                self._rejected_keys.add(record.key())
                log.warning("rules version %d from %s do not validate here: %s",
                            record.version, source, exc)
            raise

    # -- view ------------------------------------------------------------------------------
    async def describe(self) -> dict[str, Any]:
        local = self.manager.current
        nodes = [{"id": self.node_id, "url": None, "self": True, "reachable": True,
                  "error": None, **summary(local)}]

        async def one(peer_id: str, url: str) -> dict[str, Any]:
            item: dict[str, Any] = {"id": peer_id, "url": url, "self": False}
            try:
                item.update(reachable=True, error=None, **summary(await self.fetch(url)))
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
                item.update(reachable=False, error=str(exc) or exc.__class__.__name__,
                            version=None, updated_at=None, origin=None, digest=None)
            return item

        if self.session is not None:
            nodes += await asyncio.gather(*(one(pid, url) for pid, url in sorted(self.peers.items())))
        reachable = [n for n in nodes if n["reachable"]]
        newest = max(reachable, key=lambda n: (n["version"], n["updated_at"], n["origin"]))
        behind = [n["id"] for n in reachable
                  if (n["version"], n["digest"]) != (newest["version"], newest["digest"])]
        return {
            "node": self.node_id,
            "version": newest["version"],
            "digest": newest["digest"],
            "converged": not behind and len(reachable) == len(nodes),
            "divergent": behind,
            "unreachable": [n["id"] for n in nodes if not n["reachable"]],
            "rejected": self.rejected,
            "nodes": nodes,
        }


CLUSTER = web.AppKey("cluster_sync", ClusterSync)


def follow_etcd(manager: RulesManager):
    """cleanup_ctx: the rules manager follows the rules record in etcd."""
    async def context(app: web.Application):
        coordinator = manager.coordinator
        following = {"on": True}

        def follow(value, revision) -> None:
            if following["on"]:
                manager.follow(value, revision)
        coordinator.on_rules(follow)
        follow(*coordinator.rules_record())  # a change made between the node's start and now
        try:
            yield
        finally:
            following["on"] = False
    return context


def etcd_view(manager: RulesManager) -> dict[str, Any]:
    """On etcd: does this node serve the record etcd holds?"""
    local = manager.current
    coordinator = manager.coordinator
    value, revision = coordinator.rules_record()
    held = None
    if value is not None:
        try:
            record = RulesRecord.from_dict(json.loads(value))
            held = {"version": record.version, "digest": record.digest, "revision": revision}
        except (ValueError, RecordError):
            held = {"version": None, "digest": None, "revision": revision}
    same = held is None or (held["version"], held["digest"]) == (local.version, local.digest)
    return {"converged": bool(coordinator.healthy and same), "etcd_rules": held,
            "divergent": [] if same else [manager.node.node_id], "rejected": manager.rejected}


async def get_cluster(request: web.Request) -> web.Response:
    sync = request.app[CLUSTER]
    body = await sync.describe()
    manager = sync.manager
    coordinator = manager.coordinator
    if manager.on_etcd:
        body.update(etcd_view(manager))
    body["members"] = [m.to_dict() for m in coordinator.members()]
    body["coordinator"] = coordinator.describe()
    return json_response(body)


async def push_rules(request: web.Request) -> web.Response:
    sync = request.app[CLUSTER]
    # on etcd only worker 0 hands records to the node's other workers (on their Unix sockets)
    if sync.manager.on_etcd and not request.app[ADMIN_URL]["url"].startswith("unix:"):
        raise ApiError(409, "rules_in_etcd", "this cluster keeps its rules in etcd: change them "
                       "through /api/v1/rules", field="body")
    try:
        record = RulesRecord.from_dict(await read_json(request))
    except RecordError as exc:
        raise ApiError(400, "invalid_body", exc.detail, field=exc.field or "body") from None
    try:
        accepted = await sync.take(record, record.origin)
    except RuleError as exc:
        raise invalid_rules(exc) from None
    return json_response({"accepted": accepted, **summary(sync.manager.current)})
