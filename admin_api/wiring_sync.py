"""The run-time wiring record in a static cluster: push on change, pull to converge.

How this works
--------------
Without etcd each node keeps the record (``admin_api.wiring``) in its own state file; the
``[admin] cluster`` table names the other nodes' admin APIs. The greatest
``(version, updated_at, origin)`` wins everywhere, as for rules (``admin_api.cluster``):

* a change made here is POSTed at once to every peer (``POST /api/v1/cluster/wiring``),
  which adopts it when it wins and validates there (``take``), else answers
  ``accepted: false`` with its own version; a peer that answers so with a greater version
  is pulled from at once;
* a pull (``GET /api/v1/cluster/wiring`` of each peer, every ``PULL_INTERVAL`` +-50%, the
  first as the node starts) adopts a greater record and pushes this node's to a peer that is
  behind. So a node that was down when a change was pushed has it within about a second of
  starting (its first pull), and two nodes that each missed the other's change converge.

A record that wins but does not validate here (an exchange the configuration declares
too, ...) is refused: answered 422 to a push, logged once and shown in ``declared.refused``
for a pull. Node-to-node calls carry ``[admin] cluster_token`` (else the first admin
token) and are bounded by ``TIMEOUT``. With ``[node] workers`` worker 0 does all this and
hands the record to its workers (``admin_api.workers``).
"""

from __future__ import annotations

import asyncio
import logging
import random

import aiohttp
import orjson
from aiohttp import web

from proxy.config.errors import ConfigError

from .errors import ApiError, json_response
from .inputs import read_json
from .keys import NODE
from .replication import peer_session
from .wiring import EMPTY, KEY, WIRING

log = logging.getLogger("fedgate.admin.wiring")

PATH = "/api/v1/cluster/wiring"
TIMEOUT = 2.0
PULL_INTERVAL = 1.0


def order(record: dict) -> tuple:
    return (record.get("version", 0), record.get("updated_at", 0.0), record.get("origin") or "")


def check_shape(record) -> dict:
    """A record from another node, checked before it is compared; ApiError 400."""
    if not isinstance(record, dict):
        raise ApiError(400, "invalid_body", "expected an object (a wiring record)", field="body")
    updated_at, origin = record.get("updated_at", 0.0), record.get("origin")
    if not isinstance(record.get("version"), int) or not isinstance(record.get("exchanges"), list) \
            or not isinstance(record.get("bindings"), list) or isinstance(updated_at, bool) \
            or not isinstance(updated_at, (int, float)) or not isinstance(origin, (str, type(None))):
        raise ApiError(400, "invalid_body", "expected version (an integer), updated_at (a number), "
                       "origin (a node id), exchanges and bindings (lists)", field="body")
    for key in ("queues", "acl"):
        if not isinstance(record.get(key, []), list):
            raise ApiError(400, "invalid_body", f"{key} must be a list", field=key)
    return record


class WiringSync:
    def __init__(self, wiring, peers: dict[str, str], token: str | None) -> None:
        self.wiring = wiring
        self.peers = {p: u.rstrip("/") for p, u in peers.items() if p != wiring.node.node_id}
        self.token = token
        self.session: aiohttp.ClientSession | None = None
        self._refused: set[tuple] = set()
        self._tasks: set[asyncio.Task] = set()

    async def context(self, app: web.Application):
        if not self.peers:
            yield
            return
        self.session = peer_session(self.token, TIMEOUT)
        self.wiring.sync = self
        puller = asyncio.create_task(self._pull_loop(), name="fedgate-wiring-pull")
        try:
            yield
        finally:
            self.wiring.sync = None
            puller.cancel()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(puller, *self._tasks, return_exceptions=True)
            await self.session.close()
            self.session = None

    # -- adopting a record ---------------------------------------------------------------
    async def take(self, record: dict) -> bool:
        """Adopt ``record`` when it wins over this node's; ApiError 422 when it does not
        validate here."""
        wiring = self.wiring
        if order(record) <= order(wiring.record):
            return False
        try:
            wiring.parsed(record)
        except ConfigError as exc:
            raise ApiError(422, "invalid_wiring", exc.detail, field=exc.key) from None
        body = orjson.dumps(record)
        await wiring.node.coordinator.put_state(KEY, body)
        wiring.follow_raw(body)
        return True

    # -- push ----------------------------------------------------------------------------
    async def push(self, record: dict) -> None:
        if self.session is None:
            return
        await asyncio.gather(*(self._push(peer, url, record) for peer, url in sorted(self.peers.items())))

    async def _push(self, peer: str, url: str, record: dict) -> None:
        try:
            async with self.session.post(url + PATH, json=record) as response:
                body = await response.json(content_type=None)
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
            log.warning("run-time wiring version %d not pushed to %s (%s); it pulls it when back",
                        record["version"], peer, exc or exc.__class__.__name__)
            return
        if response.status == 404:  # a release without run-time wiring
            log.warning("run-time wiring version %d not taken by %s: it has no run-time wiring "
                        "(a release before 0.6.0?)", record["version"], peer)
        elif response.status >= 400:
            log.warning("node %s refused run-time wiring version %d: %s %s", peer,
                        record["version"], response.status, body)
        elif isinstance(body, dict) and body.get("accepted") is False and \
                isinstance(body.get("version"), int) and body["version"] >= record["version"]:
            self._spawn(self._pull(peer, url))  # it has a greater one: ours is behind

    def _spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- pull ----------------------------------------------------------------------------
    async def _pull_loop(self) -> None:
        while True:
            results = await asyncio.gather(*(self._pull(peer, url) for peer, url in self.peers.items()),
                                           return_exceptions=True)
            for result in results:
                if isinstance(result, Exception):
                    log.error("run-time wiring pull failed", exc_info=result)
            await asyncio.sleep(PULL_INTERVAL * random.uniform(0.5, 1.5))

    async def _pull(self, peer: str, url: str) -> None:
        try:
            async with self.session.get(url + PATH) as response:
                if response.status != 200:
                    return  # an older node without the endpoint, a token it does not take
                remote = check_shape(await response.json(content_type=None))
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, ApiError):
            return  # down or unreachable: it pulls from us when it is back
        local = self.wiring.record
        if order(remote) > order(local):
            try:
                if await self.take(remote):
                    log.info("run-time wiring version %d pulled from %s", remote["version"], peer)
            except ApiError as exc:
                key = order(remote)
                if key not in self._refused:
                    self._refused.add(key)
                    self.wiring.refused = f"version {remote['version']} from {peer}: {exc.detail}"
                    log.error("run-time wiring version %d from %s not applied here: %s",
                              remote["version"], peer, exc.detail)
        elif local["version"] > 0 and order(local) > order(remote):
            await self._push(peer, url, local)


# -- handlers (node to node) ------------------------------------------------------------------
def _static(request: web.Request):
    wiring = request.app[WIRING]
    if not wiring.static:
        raise ApiError(409, "on_etcd", "the wiring lives in etcd in this cluster")
    return wiring


async def get_record(request: web.Request) -> web.Response:
    """The record this node holds (what a peer pulls): as stored, applied here or not."""
    raw = await _static(request).read()
    return web.Response(body=raw or orjson.dumps(EMPTY), content_type="application/json")


async def push_record(request: web.Request) -> web.Response:
    """A record another node stored; adopted if it wins."""
    wiring = _static(request)
    record = check_shape(await read_json(request))
    sync = wiring.sync or WiringSync(wiring, {}, None)
    accepted = await sync.take(record)
    return json_response({"accepted": accepted, "version": wiring.record["version"]})


def sync_for(app: web.Application, wiring) -> WiringSync | None:
    """The static cluster's sync for worker 0 or a single process, as a ``cleanup_ctx``."""
    node = app[NODE]
    if not wiring.static or wiring.second_worker:
        return None
    sync = WiringSync(wiring, dict(node.config.admin.cluster), node.config.admin.node_token())
    app.cleanup_ctx.append(sync.context)
    return sync
