"""Exchanges, bindings, queues and ACL grants at run time through the admin API,
cluster-wide (docs/operations.md).

How this works
--------------
The run-time wiring is one record, ``{"version", "updated_at", "origin", "exchanges",
"bindings", "queues", "acl"}``, the bodies as the ``[[exchanges]]`` / ``[[bindings]]`` /
``[[queue]]`` / ``[[acl]]`` tables' keys (a binding also has its ``id``; remote sources
included). It lives in the cluster coordinator's state under ``wiring``: in etcd on an
etcd cluster (every node and worker follows it: the watch keeps ``coordinator.view``
current and ``follow`` looks at it every ``FOLLOW_INTERVAL``), else in the node's own
state file (``<data_dir>/cluster/state.json``), pushed to and pulled from the
``[admin] cluster`` peers (``admin_api.wiring_sync``; the greater ``(version,
updated_at, origin)`` wins) and handed by worker 0 to its workers (``admin_api.workers``,
through ``followers``).

A change: read the record, check ``If-Match`` (412 with the current ETag when stale), edit,
validate the whole set with the configuration's (``proxy.config.exchanges``: a problem is a
422 naming the field), write it by compare-and-swap (another writer first: 412 with
``If-Match``, else the edit again on the new record), apply it here
(``proxy.exchanges.declared``; the grants: ``admin_api.grants``). The configuration's
exchanges, bindings, queues and ACL subjects stay as they are: the API may bind queues to
its exchanges but not change or delete them (409 ``in_config``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from typing import Any

import orjson
from aiohttp import web

from proxy.cluster.model import CoordinatorError
from proxy.config import compat
from proxy.config.errors import ConfigError
from proxy.config.exchanges import parse_bindings, parse_exchanges
from proxy.config.settings import parse_queue
from proxy.exchanges import declared

from . import grants

from .errors import ApiError, json_response
from .inputs import read_json
from .inspect_api import get_exchanges as inspect_exchanges
from .inspect_api import queue_info
from .keys import NODE

log = logging.getLogger("fedgate.admin.wiring")

KEY = "wiring"
PUSH_PATH = "/api/v1/cluster/wiring"
FOLLOW_INTERVAL = 0.2
ATTEMPTS = 5
EMPTY = {"version": 0, "updated_at": 0.0, "origin": None, "exchanges": [], "bindings": [],
         "queues": [], "acl": []}
WIRING = web.AppKey("wiring", object)


def binding_id(raw: dict) -> str:
    """The same binding has the same id everywhere: exchange, queue and key; for a remote
    source, queue, primary and address."""
    source = raw.get("source")
    if isinstance(source, dict):
        text = f"{raw.get('queue')}\0source\0{source.get('primary')}\0{source.get('address')}"
    else:
        text = f"{raw.get('exchange')}\0{raw.get('queue')}\0{raw.get('key')}"
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def etag(record: dict) -> str:
    return f'"{record["version"]}"'


class Wiring:
    def __init__(self, node) -> None:
        self.node = node
        self.record = dict(EMPTY)
        self.applied: bytes | None = None
        self.refused: str | None = None
        # called with each new record this node follows (worker 0 hands it to its workers)
        self.followers: list = []
        self.sync = None  # static clusters: admin_api.wiring_sync.WiringSync
        self.grants: tuple = ()  # the ACL grants applied (admin_api.grants)

    @property
    def static(self) -> bool:
        return getattr(self.node.coordinator, "kind", "static") != "etcd"

    @property
    def second_worker(self) -> bool:
        """A worker other than 0 of a node with workers: worker 0 keeps the record for the node
        in a static cluster and hands it on (``admin_api.workers``)."""
        worker = getattr(self.node, "worker", None)
        return worker is not None and worker.count > 1 and worker.index != 0

    # -- validation and applying --------------------------------------------------------
    def parsed(self, record: dict) -> tuple[tuple, tuple, tuple, tuple]:
        """(exchanges, bindings, queues, ACL grants) of ``record``, checked with the
        configuration's; ConfigError."""
        config = self.node.config
        peers = dict(config.peers)
        mine = parse_exchanges(record["exchanges"], peers)
        for index, decl in enumerate(mine):
            if any(e.name == decl.name for e in config.exchanges):
                raise ConfigError(f"exchanges[{index}].name", f"{decl.name!r} is declared in the "
                                  "configuration file")
        for index, binding in enumerate(record["bindings"]):
            if not isinstance(binding, dict):
                raise ConfigError(f"bindings[{index}]", "expected a table (an object)")
        raw_bindings = [{k: v for k, v in b.items() if k != "id"} for b in record["bindings"]]
        bindings = parse_bindings(raw_bindings, tuple(config.exchanges) + mine, peers)
        queues = record.get("queues", [])
        if not isinstance(queues, list):
            raise ConfigError("queues", "expected a list of [[queue]] tables")
        decls = []
        for index, raw in enumerate(queues):
            decl = parse_queue(raw, f"queues[{index}]")
            if any(q.name == decl.name for q in config.queue):
                raise ConfigError(f"queues[{index}].name", f"{decl.name!r} is declared in the "
                                  "configuration file")
            if any(q.name == decl.name for q in decls):
                raise ConfigError(f"queues[{index}].name", f"{decl.name!r} is declared twice")
            decls.append(decl)
        return mine, bindings, tuple(decls), grants.parse(record.get("acl", []), config)

    def apply(self, record: dict, raw: bytes | None = None) -> None:
        exchanges, bindings, queues, acl = self.parsed(record)
        self._apply_queues(queues)  # first: bindings declare their queues with these options
        declared.apply(self.node.broker.exchanges, exchanges, bindings)
        if acl != self.grants:
            grants.apply(self.node, acl)
            self.grants = acl
        self.record = {**record, "queues": record.get("queues", []), "acl": record.get("acl", [])}
        self.applied = raw

    def _apply_queues(self, decls: tuple) -> None:
        """Declared queues: their options for every use of the name; made (local ones) or
        changed in place now."""
        node = self.node
        wanted = {d.name: d for d in decls}
        for name in getattr(self, "runtime_queues", set()) - set(wanted):
            node.declared_queues.pop(name, None)
        node.declared_queues.update(wanted)
        self.runtime_queues = set(wanted)
        for name in wanted:
            if node.broker.resolve(name).kind != "local":
                # its options apply where the queue is made (a primary, a fragment, the
                # worker that owns it)
                continue
            options = node.queue_options(name)
            queue = node.queues.get(name)
            if queue is None:
                node.queues.declare(name, **options)
            else:
                for key, value in options.items():
                    setattr(queue, key, value)
                node.broker.dirty_queues.add(queue)
        node.broker.run_pending()

    def follow_raw(self, raw: bytes | None) -> None:
        """A record read from the store (start, the watch, a push)."""
        if raw == self.applied:
            return
        try:
            record = orjson.loads(raw) if raw else dict(EMPTY)
            self.apply(record, raw)
            self.refused = None
        except (ConfigError, orjson.JSONDecodeError, KeyError, TypeError) as exc:
            self.applied = raw  # not again until it changes
            self.refused = str(exc)
            log.error("run-time exchanges and bindings not applied here: %s", exc)
        for follower in list(self.followers):
            follower(raw)

    # -- the store ---------------------------------------------------------------------
    async def read(self) -> bytes | None:
        try:
            return (await self.node.coordinator.get_state(KEY)).get(KEY)
        except CoordinatorError as exc:
            raise ApiError(503, "coordinator_unavailable", f"the cluster state cannot be read: "
                           f"{exc}", headers={"Retry-After": "1"}) from None

    async def change(self, edit, if_match: str | None, *, removal: bool = False) -> tuple[dict, Any]:
        """Apply ``edit(record) -> answer`` (it changes the record given) by compare-and-swap
        (``removal``: only takes away what older members never had; not refused for them)."""
        if not removal:
            self._refuse_mixed_versions()
        for _ in range(ATTEMPTS):
            raw = await self.read()
            current = orjson.loads(raw) if raw else dict(EMPTY)
            if if_match is not None and if_match.strip() != "*" and \
                    if_match.strip().strip('"').removeprefix("W/").strip('"') != str(current["version"]):
                raise ApiError(412, "version_conflict", f"If-Match {if_match} does not match the "
                               f"current wiring (version {current['version']}, ETag "
                               f"{etag(current)})", field="If-Match", version=current["version"],
                               headers={"ETag": etag(current)})
            record = {**current, "exchanges": [dict(e) for e in current["exchanges"]],
                      "bindings": [dict(b) for b in current["bindings"]],
                      "queues": [dict(q) for q in current.get("queues", [])],
                      "acl": [dict(a) for a in current.get("acl", [])]}
            answer = edit(record)
            record.update(version=current["version"] + 1, updated_at=time.time(),
                          origin=self.node.node_id)
            try:
                _, _, queues, _ = self.parsed(record)
            except ConfigError as exc:
                raise ApiError(422, "invalid_wiring", exc.detail, field=exc.key) from None
            for index, decl in enumerate(queues):
                if decl.durable and self.node.journal is None:
                    raise ApiError(409, "no_journal", f"queue {decl.name!r} cannot be durable "
                                   "here: this node keeps no journal (none of its configured "
                                   "queues is durable); set [queues] durable or a durable "
                                   "[[queue]] in its configuration first",
                                   field=f"queues[{index}].durable")
            body = orjson.dumps(record)
            try:
                written = await self.node.coordinator.swap_state(KEY, raw, body)
            except CoordinatorError as exc:
                raise ApiError(503, "coordinator_unavailable", f"the change was not stored: {exc}",
                               headers={"Retry-After": "1"}) from None
            if written:
                self.follow_raw(body)
                log.info("run-time exchanges and bindings: version %d", record["version"])
                return record, answer
            if if_match is not None:
                continue  # checked again against what won: 412 then
        raise ApiError(503, "coordinator_busy", "other changes kept winning; try again",
                       headers={"Retry-After": "1"})

    # -- following the cluster -------------------------------------------------------------
    def _refuse_mixed_versions(self) -> None:
        """A live member without the ``wiring`` feature (0.5.0: it would neither follow the
        record nor answer the push) leaves the cluster's wiring unchanged until it is
        upgraded (docs/upgrades.md). A static peer's version is not known: not refused."""
        coordinator = self.node.coordinator
        if getattr(coordinator, "kind", "static") != "etcd":
            return
        lacking = compat.cluster_lacks("wiring", coordinator.members())
        if lacking:
            names = ", ".join(f"{m.id} ({m.version or 'unknown'})" for m in lacking)
            raise ApiError(409, "mixed_versions", f"members {names} have no run-time wiring: "
                           "change it once every node is upgraded (docs/upgrades.md)",
                           members=[{"id": m.id, "version": m.version} for m in lacking])

    async def context(self, app: web.Application):
        with contextlib.suppress(ApiError):
            self.follow_raw(await self.read())
        task = None
        if getattr(self.node.coordinator, "kind", "static") == "etcd":
            task = asyncio.create_task(self._follow())
        yield
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _follow(self) -> None:
        view = self.node.coordinator.view
        while True:
            await asyncio.sleep(FOLLOW_INTERVAL)
            raw = view.state.get(KEY)
            if raw is not None and raw != self.applied:
                self.follow_raw(raw)

    async def push(self, record: dict, token: str | None = None) -> None:
        """Static clusters: the new record to every ``[admin] cluster`` peer
        (``admin_api.wiring_sync``)."""
        if self.sync is not None:
            await self.sync.push(record)


# -- handlers -------------------------------------------------------------------------------
def _wiring(request: web.Request) -> Wiring:
    return request.app[WIRING]


def _config_bindings(node) -> list[dict]:
    found = []
    for b in node.config.bindings:
        if b.exchange is not None:
            raw = {"exchange": b.exchange, "queue": b.queue, "key": b.key}
        else:
            raw = {"queue": b.queue, "source": {"primary": b.source.primary,
                                                "address": b.source.address,
                                                "window": b.source.window}}
        found.append({"id": binding_id(raw), **raw, "origin": "config"})
    return found


def _declared(node, wiring: Wiring) -> dict:
    exchanges = [{"name": e.name, "type": e.type, "origin": "config"} for e in node.config.exchanges]
    exchanges += [{**e, "origin": "api"} for e in wiring.record["exchanges"]]
    bindings = _config_bindings(node) + [{**b, "origin": "api"} for b in wiring.record["bindings"]]
    return {"version": wiring.record["version"], "exchanges": exchanges, "bindings": bindings,
            "refused": wiring.refused}


async def get_exchanges(request: web.Request) -> web.Response:
    response = await inspect_exchanges(request)
    body = orjson.loads(response.body)
    wiring = _wiring(request)
    body["declared"] = _declared(request.app[NODE], wiring)
    return json_response(body, headers={"ETag": etag(wiring.record)})


async def _edit(request: web.Request, edit, status: int = 200) -> web.Response:
    wiring = _wiring(request)
    record, answer = await wiring.change(edit, request.headers.get("If-Match"))
    node = request.app[NODE]
    await wiring.push(record, node.config.admin.node_token())
    return json_response({**answer, "version": record["version"]}, status=status,
                         headers={"ETag": etag(record)})


def _object(raw: Any, what: str) -> dict:
    if not isinstance(raw, dict):
        raise ApiError(400, "invalid_body", f"expected an object ({what})", field="body")
    return raw


def _in_config(node, name: str) -> bool:
    return any(e.name == name for e in node.config.exchanges)


async def _post(request: web.Request, what: str, describe: str, in_config) -> web.Response:
    """POST of one run-time ``what`` (exchange, queue): added (201), or 409 when a run-time one
    or the configuration's (``in_config(node, name)``) has that name."""
    raw = _object(await read_json(request), describe)
    name = raw.get("name")
    node = request.app[NODE]
    items = what + "s"  # the record's "exchanges" or "queues"

    def edit(record: dict) -> dict:
        if isinstance(name, str) and (in_config(node, name) or
                                      any(item.get("name") == name for item in record[items])):
            raise ApiError(409, f"{what}_exists", f"{what} {name!r} is declared already",
                           field="name")
        record[items].append(raw)
        return {what: raw}
    return await _edit(request, edit, 201)


async def post_exchange(request: web.Request) -> web.Response:
    return await _post(request, "exchange", "an exchange: name, type, upstream_fanout", _in_config)


async def get_exchange(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    declared_now = _declared(request.app[NODE], _wiring(request))
    found = next((e for e in declared_now["exchanges"] if e["name"] == name), None)
    if found is None:
        raise ApiError(404, "exchange_not_found", f"no exchange {name!r}", field="name")
    exchange = request.app[NODE].broker.exchanges.get(name)
    return json_response({"exchange": found, "version": declared_now["version"],
                          "bindings": [b for b in declared_now["bindings"] if b.get("exchange") == name],
                          "stats": dict(vars(exchange.stats)) if exchange is not None else None},
                         headers={"ETag": etag(_wiring(request).record)})


async def _put(request: web.Request, what: str, in_config: bool) -> web.Response:
    """PUT of one run-time ``what`` (exchange, queue) named by the path: replaced, or added
    (201)."""
    name = request.match_info["name"]
    raw = _object(await read_json(request), f"a {what}: the [[{what}]] keys")
    if raw.get("name", name) != name:
        raise ApiError(400, "invalid_body", "name differs from the path", field="name")
    raw = {**raw, "name": name}
    if in_config:
        raise ApiError(409, "in_config", f"{what} {name!r} is declared in the configuration "
                       "file: change it there", field="name")
    items, created = what + "s", []  # the record's "exchanges" or "queues"

    def edit(record: dict) -> dict:
        for index, item in enumerate(record[items]):
            if item.get("name") == name:
                record[items][index] = raw
                return {what: raw}
        record[items].append(raw)
        created.append(True)
        return {what: raw}
    response = await _edit(request, edit)
    if created:
        response.set_status(201)
    return response


async def put_exchange(request: web.Request) -> web.Response:
    return await _put(request, "exchange", _in_config(request.app[NODE], request.match_info["name"]))


async def delete_exchange(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    if _in_config(request.app[NODE], name):
        raise ApiError(409, "in_config", f"exchange {name!r} is declared in the configuration "
                       "file: remove it there", field="name")

    def edit(record: dict) -> dict:
        before = len(record["exchanges"])
        record["exchanges"] = [e for e in record["exchanges"] if e.get("name") != name]
        if len(record["exchanges"]) == before:
            raise ApiError(404, "exchange_not_found", f"no exchange {name!r}", field="name")
        gone = [b for b in record["bindings"] if b.get("exchange") == name]
        record["bindings"] = [b for b in record["bindings"] if b.get("exchange") != name]
        return {"deleted": name, "bindings_deleted": len(gone)}
    return await _edit(request, edit)


async def get_bindings(request: web.Request) -> web.Response:
    wiring = _wiring(request)
    declared_now = _declared(request.app[NODE], wiring)
    return json_response({"version": declared_now["version"], "bindings": declared_now["bindings"]},
                         headers={"ETag": etag(wiring.record)})


async def post_binding(request: web.Request) -> web.Response:
    raw = _object(await read_json(request), "a binding: exchange, queue, key; or queue, source")
    if "id" in raw:
        raise ApiError(400, "invalid_body", "id is given by the node", field="id")
    ident = binding_id(raw)
    node = request.app[NODE]

    def edit(record: dict) -> dict:
        config_ids = {b["id"] for b in _config_bindings(node)}
        if ident in config_ids or any(b.get("id") == ident for b in record["bindings"]):
            raise ApiError(409, "binding_exists", f"this binding exists (id {ident})", field="body",
                           id=ident)
        binding = {**raw, "id": ident}
        record["bindings"].append(binding)
        return {"binding": binding}
    return await _edit(request, edit, 201)


async def delete_binding(request: web.Request) -> web.Response:
    ident = request.match_info["id"]
    node = request.app[NODE]
    if any(b["id"] == ident for b in _config_bindings(node)):
        raise ApiError(409, "in_config", f"binding {ident} is declared in the configuration "
                       "file: remove it there", field="id")

    def edit(record: dict) -> dict:
        before = len(record["bindings"])
        record["bindings"] = [b for b in record["bindings"] if b.get("id") != ident]
        if len(record["bindings"]) == before:
            raise ApiError(404, "binding_not_found", f"no binding {ident!r}", field="id")
        return {"deleted": ident}
    return await _edit(request, edit)


# -- declared queues --------------------------------------------------------------------------
def _config_queue(node, name: str) -> bool:
    return any(q.name == name for q in node.config.queue)


def declared_queue(wiring: Wiring, node, name: str) -> dict | None:
    if _config_queue(node, name):
        decl = next(q for q in node.config.queue if q.name == name)
        return {**{k: v for k, v in vars(decl).items() if v not in (None, 0, "")},
                "origin": "config"}
    found = next((q for q in wiring.record.get("queues", []) if q.get("name") == name), None)
    return {**found, "origin": "api"} if found is not None else None


async def post_queue(request: web.Request) -> web.Response:
    return await _post(request, "queue", "a queue: the [[queue]] keys", _config_queue)


async def get_queue(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    node = request.app[NODE]
    wiring = _wiring(request)
    queue = node.queues.get(name)
    found = declared_queue(wiring, node, name)
    if queue is None and found is None:
        raise ApiError(404, "queue_not_found", f"no queue {name!r} on node {node.node_id}",
                       field="name")
    body = queue_info(queue) if queue is not None else {"name": name}
    body.update(declared=found, version=wiring.record["version"])
    return json_response(body, headers={"ETag": etag(wiring.record)})


async def put_queue(request: web.Request) -> web.Response:
    return await _put(request, "queue", _config_queue(request.app[NODE], request.match_info["name"]))


async def forget_queue(request: web.Request, name: str) -> int | None:
    """A deleted queue's run-time declaration removed too; the new version, or None."""
    wiring = request.app.get(WIRING)
    if wiring is not None and wiring.static and wiring.second_worker:
        return None  # worker 0 keeps the node's record: it edits it (admin_api.workers)
    if wiring is None or not any(q.get("name") == name for q in wiring.record.get("queues", [])):
        return None

    def edit(record: dict) -> dict:
        record["queues"] = [q for q in record["queues"] if q.get("name") != name]
        return {}
    record, _ = await wiring.change(edit, None, removal=True)
    await wiring.push(record, request.app[NODE].config.admin.node_token())
    return record["version"]
