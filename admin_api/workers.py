"""One admin API for a node of several workers (``[node] workers``, issue #18).

How this works
--------------
Every worker runs the admin app. Worker 0 serves it on ``[admin] listen`` as a
single-process node does; each other worker serves it only on a Unix socket of
its own (``<data_dir>/workers/admin-K.sock``), where the one token accepted is
the node's internal one (made by the supervisor for this run, passed to the
workers in ``FEDGATE_WORKER_TOKEN``).

On worker 0, ``aggregate_middleware`` answers the inspection views for the
whole node: it asks every other worker the same question (bounded by
``TIMEOUT``) and merges the answers with ``merge``: lists are concatenated with
a ``worker`` key on each item, numbers summed, flags or-ed, other values (ids,
versions, URLs) are worker 0's. ``/metrics`` gets a ``worker`` label on every
sample. A worker that does not answer is named in ``workers_unreachable``.
Closing a connection goes to the worker that has it (connection ids are unique
on the node: worker K of N numbers its connections K+1, K+1+N, ...).

Rule changes reach every worker through the cluster sync (``admin_api.cluster``):
worker 0 counts the other workers among its peers, so a change is pushed to
them at once and a worker that missed it converges on the next pull.

The run-time wiring (``admin_api.wiring``) likewise, in a static cluster: worker 0
keeps the node's record and hands each new one to the other workers
(``POST /api/v1/cluster/wiring`` on their sockets, each keeps it in its own state
file); once a second it compares their versions with its own and hands it again to
one behind (restarted). A queue deleted on the worker that keeps it: worker 0
takes its declaration out of the record. On etcd every worker follows etcd itself.
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from .cluster import PUSH_PATH
from .wiring import PUSH_PATH as WIRING_PATH
from .wiring import forget_queue
from .errors import ApiError, json_response
from .keys import NODE

log = logging.getLogger("fedgate.admin.workers")

TIMEOUT = 5.0
BASE = "http://worker"  # the host part of a URL sent over a Unix socket

# views answered for the whole node, and the values that are worker 0's alone
AGGREGATED = ("/api/v1/node", "/api/v1/connections", "/api/v1/links", "/api/v1/queues",
              "/api/v1/fragments", "/api/v1/upstreams", "/api/v1/exchanges",
              "/api/v1/subscriptions")
FIRST_ONLY = {"rules_version", "routing_table_version", "uptime_s", "id", "url", "admin_url",
              "declared"}


def admin_socket(data_dir, worker: int) -> str:
    return str(data_dir / "workers" / f"admin-{worker}.sock")


def merge(parts: list[tuple[int, Any]]) -> Any:
    """The node's answer from each worker's (``(worker, body)``, worker 0 first)."""
    first = parts[0][1]
    if not isinstance(first, dict):
        return first
    out: dict[str, Any] = {}
    for key, value in first.items():
        values = [(k, body[key]) for k, body in parts if isinstance(body, dict) and key in body]
        if key in FIRST_ONLY:
            out[key] = value
        elif isinstance(value, list):
            out[key] = [dict(item, worker=k) if isinstance(item, dict) else item
                        for k, items in values for item in (items or [])]
        elif isinstance(value, bool):
            out[key] = any(v for _, v in values)
        elif isinstance(value, (int, float)):
            out[key] = sum(v for _, v in values if isinstance(v, (int, float)) and not isinstance(v, bool))
        elif isinstance(value, dict):
            out[key] = merge([(k, v) for k, v in values])
        else:
            out[key] = value
    return out


def merge_history(parts: list[tuple[int, Any]]) -> Any:
    """The node's last hour from each worker's (``/api/v1/history``). Workers sample on their
    own clocks, ``interval`` apart: the k-th latest samples are summed (counts, bytes, depths,
    rates), at worker 0's times; a worker restarted lately adds to the latest only."""
    first = parts[0][1]
    samples = [dict(item) for item in first.get("samples", [])]
    for _, body in parts[1:]:
        theirs = body.get("samples", []) if isinstance(body, dict) else []
        for mine, other in zip(reversed(samples), reversed(theirs)):
            for key, value in other.items():
                if key == "t":
                    continue
                if key == "depths" and isinstance(value, dict):
                    depths = dict(mine.get("depths") or {})
                    for name, depth in value.items():
                        depths[name] = depths.get(name, 0) + depth
                    mine["depths"] = depths
                elif isinstance(value, (int, float)) and not isinstance(value, bool):
                    mine[key] = (mine.get(key) or 0) + value
    return {**first, "samples": samples, "count": len(samples)}


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?(\s.*)$")


def label_metrics(text: str, worker: int, *, keep_comments: bool) -> list[str]:
    """Prometheus text with ``worker="K"`` on every sample."""
    lines = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            if keep_comments and line:
                lines.append(line)
            continue
        match = _SAMPLE.match(line)
        if match is None:
            continue
        name, labels, rest = match.groups()
        inner = labels[1:-1] if labels else ""
        inner = f'worker="{worker}"' + (f",{inner}" if inner else "")
        lines.append(f"{name}{{{inner}}}{rest}")
    return lines


class WorkerPeers:
    """Worker 0's sessions to the other workers' admin sockets."""

    def __init__(self, sockets: dict[int, str], token: str, manager, wiring=None) -> None:
        self.sockets = sockets
        self.token = token
        self.manager = manager
        self.wiring = wiring if wiring is not None and wiring.static else None
        self.sessions: dict[int, aiohttp.ClientSession] = {}
        self._tasks: set[asyncio.Task] = set()

    async def context(self, app: web.Application):
        headers = {"Authorization": f"Bearer {self.token}"}
        timeout = aiohttp.ClientTimeout(total=TIMEOUT)
        for worker, path in self.sockets.items():
            self.sessions[worker] = aiohttp.ClientSession(
                connector=aiohttp.UnixConnector(path=path), headers=headers, timeout=timeout)
        self.manager.followers.append(self.on_rules)
        if self.wiring is not None:
            self.wiring.followers.append(self.on_wiring)
        puller = asyncio.create_task(self._keep_in_step(), name="fedgate-workers-rules")
        try:
            yield
        finally:
            self.manager.followers.remove(self.on_rules)
            if self.wiring is not None:
                self.wiring.followers.remove(self.on_wiring)
            puller.cancel()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(puller, *self._tasks, return_exceptions=True)
            for session in self.sessions.values():
                await session.close()
            self.sessions.clear()

    # -- rules: every worker routes by worker 0's ----------------------------------------
    def on_rules(self, record) -> None:
        for worker in self.sessions:
            self._spawn(self._push(worker, record))

    async def _push(self, worker: int, record) -> bool:
        try:
            async with self.sessions[worker].post(BASE + PUSH_PATH, json=record.to_dict()) as response:
                if response.status >= 400:
                    log.error("worker %d refused rules version %d: %s %s", worker, record.version,
                              response.status, await response.text())
                return response.status < 400
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            log.info("rules version %d not yet on worker %d (%r); retried", record.version, worker, exc)
            return False

    # -- the run-time wiring (static clusters): every worker applies worker 0's ------------
    def on_wiring(self, raw: bytes | None) -> None:
        for worker in self.sessions:
            self._spawn(self._push_wiring(worker, raw))

    def _spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _push_wiring(self, worker: int, raw: bytes | None) -> bool:
        if not raw:
            return True  # nothing declared yet
        answer = await self.ask(worker, "POST", WIRING_PATH, body=raw,
                                headers={"Content-Type": "application/json"})
        if answer is not None and answer[0] >= 400:
            log.error("worker %d refused the run-time wiring: %s %s", worker, answer[0],
                      answer[1][:300])
        return answer is not None and answer[0] < 400

    async def _wiring_in_step(self, known: dict[int, int]) -> None:
        wiring = self.wiring
        version = wiring.record["version"] if wiring is not None else 0
        if not version or wiring.applied is None:
            return
        for worker, answer in (await self.ask_all("GET", "/api/v1/bindings")).items():
            if answer is None or answer[0] != 200:
                known.pop(worker, None)
                continue
            theirs = orjson.loads(answer[1]).get("version")
            if theirs != version and known.get(worker) != version:
                if await self._push_wiring(worker, wiring.applied):
                    known[worker] = version

    async def _keep_in_step(self) -> None:
        """A worker restarted, or one a push missed: it gets worker 0's rules (and run-time
        wiring) again."""
        known: dict[int, int] = {}
        wired: dict[int, int] = {}
        while True:
            await asyncio.sleep(1.0)
            await self._wiring_in_step(wired)
            record = self.manager.current
            if record.version == 0:
                continue
            for worker, answer in (await self.ask_all("GET", "/api/v1/rules")).items():
                if answer is None or answer[0] != 200:
                    known.pop(worker, None)
                    continue
                version = orjson.loads(answer[1]).get("version")
                if version != record.version and known.get(worker) != record.version:
                    if await self._push(worker, record):
                        known[worker] = record.version

    async def ask(self, worker: int, method: str, path_qs: str, *, body: bytes | None = None,
                  headers: dict | None = None) -> tuple[int, bytes] | None:
        try:
            async with self.sessions[worker].request(method, BASE + path_qs, data=body,
                                                     headers=headers) as response:
                return response.status, await response.read()
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            log.warning("worker %d's admin did not answer %s %s: %r", worker, method, path_qs, exc)
            return None

    async def ask_all(self, method: str, path_qs: str) -> dict[int, tuple[int, bytes] | None]:
        workers = sorted(self.sessions)
        answers = await asyncio.gather(*(self.ask(k, method, path_qs) for k in workers))
        return dict(zip(workers, answers))


WORKER_PEERS = web.AppKey("worker_peers", WorkerPeers)


@web.middleware
async def aggregate_middleware(request: web.Request, handler):
    peers = request.app.get(WORKER_PEERS)
    if peers is None:
        return await handler(request)
    path = request.path
    if request.method == "GET" and path in AGGREGATED:
        response = await handler(request)
        if response.status != 200:
            return response
        parts = [(0, orjson.loads(response.body))]
        unreachable = []
        for worker, answer in (await peers.ask_all("GET", request.path_qs)).items():
            if answer is None or answer[0] != 200:
                unreachable.append(worker)
            else:
                parts.append((worker, orjson.loads(answer[1])))
        body = merge(parts)
        body["workers"] = 1 + len(peers.sockets)
        body["workers_unreachable"] = unreachable
        return json_response(body)
    if request.method == "GET" and path == "/api/v1/history":
        response = await handler(request)
        if response.status != 200:
            return response
        parts = [(0, orjson.loads(response.body))]
        for worker, answer in sorted((await peers.ask_all("GET", request.path_qs)).items()):
            if answer is not None and answer[0] == 200:
                parts.append((worker, orjson.loads(answer[1])))
        body = merge_history(parts)
        body["workers"] = 1 + len(peers.sockets)
        return json_response(body)
    if request.method == "GET" and path == "/metrics":
        response = await handler(request)
        if response.status != 200:
            return response
        lines = label_metrics(response.body.decode(), 0, keep_comments=True)
        for worker, answer in (await peers.ask_all("GET", "/metrics")).items():
            if answer is not None and answer[0] == 200:
                lines += label_metrics(answer[1].decode(), worker, keep_comments=False)
        return web.Response(body=("\n".join(lines) + "\n").encode(),
                            headers={"Content-Type": response.headers.get("Content-Type", "text/plain")})
    if request.method in ("POST", "DELETE", "GET") and (owner := await _owner_worker(request)):
        response = await _to_owner(request, peers, owner)
        if request.method == "DELETE" and response.status == 200 and \
                (match := QUEUE_OPS["DELETE"].match(path)):
            version = await forget_queue(request, match.group(1))  # worker 0 keeps the record
            if version is not None:
                body = orjson.loads(response.body)
                response = json_response({**body, "version": version})
        return response
    if request.method == "GET" and path == "/api/v1/resolve" and (owner := _resolve_owner(request)):
        answer = await peers.ask(owner, "GET", request.path_qs)
        if answer is None:
            raise ApiError(502, "worker_unreachable", f"worker {owner} of this node, which keeps "
                           "the queue, did not answer", field="address")
        return web.Response(body=answer[1], status=answer[0], content_type="application/json")
    if request.method == "DELETE" and path.startswith(("/api/v1/connections/",
                                                       "/api/v1/subscriptions/")):
        try:
            return await handler(request)
        except ApiError as exc:
            if exc.status != 404:
                raise
            for answer in (await peers.ask_all("DELETE", request.path_qs)).values():
                if answer is not None and answer[0] != 404:  # the worker that has it
                    return web.Response(body=answer[1], status=answer[0],
                                        content_type="application/json")
            raise
    return await handler(request)


CALLER = "X-Fedgate-Caller"  # the caller's Authorization, for a worker that asks other nodes
# a queue's operations (admin_api.queue_ops): the worker that keeps the queue does them
QUEUE_OPS = {"POST": re.compile(r"^/api/v1/queues/([^/]+)/(promote|purge|move|resend)$"),
             "DELETE": re.compile(r"^/api/v1/queues/([^/]+)$"),
             "GET": re.compile(r"^/api/v1/queues/([^/]+)(/messages)?$")}


async def _owner_worker(request: web.Request) -> int:
    """The worker that keeps the replicated queue a POST is about (its promote, or another
    node telling its new primary; issue #45); 0: this one, or not such a request."""
    worker = getattr(request.app[NODE], "worker", None)
    if worker is None or worker.count < 2:
        return 0
    pattern = QUEUE_OPS.get(request.method)
    match = pattern.match(request.path) if pattern is not None else None
    if match is not None:
        return worker.owners.owner(request.match_info.get("name") or match.group(1))
    if request.method == "POST" and request.path == "/api/v1/replication/owner":
        try:
            address = orjson.loads(await request.read()).get("address")
        except (orjson.JSONDecodeError, AttributeError):
            return 0  # the handler says what is wrong with it
        return worker.owners.owner(address) if isinstance(address, str) and address else 0
    return 0


def _resolve_owner(request: web.Request) -> int:
    """``resolve`` of a replicated queue: the worker that keeps it knows its primary."""
    node = request.app[NODE]
    worker = getattr(node, "worker", None)
    address = request.query.get("address")
    if worker is None or worker.count < 2 or not address:
        return 0
    try:
        decision = node.routing.resolve(address)
    except Exception:  # the handler says what is wrong with it
        return 0
    return worker.owners.owner(address) if decision.kind == "replicated" else 0


async def _to_owner(request: web.Request, peers: WorkerPeers, owner: int) -> web.Response:
    headers = {"Content-Type": "application/json", CALLER: request.headers.get("Authorization", "")}
    for name in ("X-Fedgate-Forwarded-By",):
        if name in request.headers:
            headers[name] = request.headers[name]
    body = await request.read() if request.body_exists else None
    answer = await peers.ask(owner, request.method, request.path_qs, body=body, headers=headers)
    if answer is None:
        raise ApiError(502, "worker_unreachable", f"worker {owner} of this node, which keeps the "
                       "queue, did not answer", field="name")
    return web.Response(body=answer[1], status=answer[0], content_type="application/json")
