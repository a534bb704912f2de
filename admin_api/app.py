"""The admin HTTP application and the service that runs it inside the node.

How this works
--------------
``build_app(node)`` is the factory: one route table (``ROUTES``, mirrored by
``admin_api.openapi``), the middlewares, the run-time wiring's follower
(``admin_api.wiring``) and the cluster sync as a
``cleanup_ctx`` (started with the app, cancelled when it is cleaned up): the
gossip of a static cluster, or on etcd the rules manager following the watch.

* ``audit`` (outside the others): every change, allowed or refused, one entry of the
  audit log (``admin_api.audit``).
* ``errors``: ``ApiError`` and aiohttp's HTTP exceptions become
  ``{"error", "detail", "field"}`` JSON; anything unexpected is logged and
  answered 500 without details.
* ``auth``: a bearer token from ``[admin] tokens`` is required except on
  public routes (health, console files); ``read`` tokens may only read.

Request bodies are capped at ``MAX_BODY`` (1 MiB: 413 beyond), slow clients
are timed out (``admin_api.slow_clients``), and every response, aiohttp's own
400s for requests it cannot parse included, says ``Server: fedgate``.

``AdminService`` is what the ``fedgate.services`` entry point returns: its
``start`` runs the app on ``[admin] listen`` in the node's own event loop
(an ``AppRunner`` + ``TCPSite``), ``stop`` cleans it up.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time

from aiohttp import web, web_response
from aiohttp.http_exceptions import HttpProcessingError

from . import (acl_api, console, first_run, health, inspect_api, openapi, queue_ops, replication,
               rules_api, wiring, wiring_sync)
from .audit import AUDIT, WHO, AuditLog, audit_middleware, get_audit, jwt_who, token_who
from .auth import Tokens, allowed, bearer_token, role_for
from .cluster import CLUSTER, ClusterSync, follow_etcd, get_cluster, push_rules
from .errors import ApiError, from_http_exception, json_response
from .inspect_api import ADMIN_URL, NODE, STARTED
from .rules_api import MANAGER
from .history import HISTORY, History, get_history
from .rules_manager import RulesManager
from .slow_clients import SLOW_CLIENTS, SlowClients
from .workers import WORKER_PEERS, WorkerPeers, admin_socket, aggregate_middleware

log = logging.getLogger("fedgate.admin")

TOKENS = web.AppKey("tokens", Tokens)
MAX_BODY = 1024 * 1024


async def get_openapi(request: web.Request) -> web.Response:
    return json_response(openapi.spec())


# (method, path, handler, public)
ROUTES = [
    ("GET", "/", console.index, True),
    ("GET", "/ui/{file}", console.asset, True),
    ("GET", "/healthz", health.healthz, True),
    ("GET", "/readyz", health.readyz, True),
    ("GET", "/metrics", health.metrics, False),
    ("GET", "/api/v1/openapi.json", get_openapi, False),
    ("GET", "/api/v1/node", inspect_api.get_node, False),
    ("GET", "/api/v1/connections", inspect_api.get_connections, False),
    ("DELETE", "/api/v1/connections/{id}", inspect_api.delete_connection, False),
    ("GET", "/api/v1/links", inspect_api.get_links, False),
    ("GET", "/api/v1/queues", inspect_api.get_queues, False),
    ("POST", "/api/v1/queues/{name}/promote", replication.promote, False),
    ("POST", "/api/v1/queues", wiring.post_queue, False),
    ("GET", "/api/v1/queues/{name}", wiring.get_queue, False),
    ("PUT", "/api/v1/queues/{name}", wiring.put_queue, False),
    ("DELETE", "/api/v1/queues/{name}", queue_ops.delete_queue, False),
    ("POST", "/api/v1/queues/{name}/purge", queue_ops.purge_queue, False),
    ("GET", "/api/v1/queues/{name}/messages", queue_ops.get_messages, False),
    ("POST", "/api/v1/queues/{name}/move", queue_ops.move_messages, False),
    ("POST", "/api/v1/queues/{name}/resend", queue_ops.resend_messages, False),
    ("GET", "/api/v1/audit", get_audit, False),
    ("GET", "/api/v1/fragments", inspect_api.get_fragments, False),
    ("GET", "/api/v1/upstreams", inspect_api.get_upstreams, False),
    ("GET", "/api/v1/exchanges", wiring.get_exchanges, False),
    ("POST", "/api/v1/exchanges", wiring.post_exchange, False),
    ("GET", "/api/v1/exchanges/{name}", wiring.get_exchange, False),
    ("PUT", "/api/v1/exchanges/{name}", wiring.put_exchange, False),
    ("DELETE", "/api/v1/exchanges/{name}", wiring.delete_exchange, False),
    ("GET", "/api/v1/bindings", wiring.get_bindings, False),
    ("POST", "/api/v1/bindings", wiring.post_binding, False),
    ("DELETE", "/api/v1/bindings/{id}", wiring.delete_binding, False),
    ("GET", "/api/v1/acl", acl_api.get_acl, False),
    ("GET", "/api/v1/acl/{subject}", acl_api.get_subject, False),
    ("PUT", "/api/v1/acl/{subject}", acl_api.put_subject, False),
    ("DELETE", "/api/v1/acl/{subject}", acl_api.delete_subject, False),
    ("GET", "/api/v1/cluster/wiring", wiring_sync.get_record, False),
    ("POST", "/api/v1/cluster/wiring", wiring_sync.push_record, False),
    ("GET", "/api/v1/subscriptions", inspect_api.get_subscriptions, False),
    ("DELETE", "/api/v1/subscriptions/{name}", inspect_api.delete_subscription, False),
    ("GET", "/api/v1/history", get_history, False),
    ("GET", "/api/v1/rules", rules_api.get_rules, False),
    ("PUT", "/api/v1/rules", rules_api.put_rules, False),
    ("POST", "/api/v1/rules", rules_api.post_rule, False),
    ("GET", "/api/v1/rules/{name}", rules_api.get_rule, False),
    ("PUT", "/api/v1/rules/{name}", rules_api.put_rule, False),
    ("DELETE", "/api/v1/rules/{name}", rules_api.delete_rule, False),
    ("GET", "/api/v1/resolve", rules_api.resolve, False),
    ("GET", "/api/v1/cluster", get_cluster, False),
    ("POST", "/api/v1/cluster/rules", push_rules, False),
    ("POST", "/api/v1/replication/owner", replication.post_owner, False),
]
PUBLIC = {(method, path) for method, path, _, public in ROUTES if public}


@web.middleware
async def errors_middleware(request: web.Request, handler):
    try:
        return await handler(request)
    except ApiError as exc:
        return exc.response()
    except web.HTTPRequestEntityTooLarge:  # client_max_size: aiohttp's reason names no limit
        return ApiError(413, "payload_too_large",
                        f"the request body is larger than the admin API takes ({MAX_BODY} bytes)"
                        ).response()
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return from_http_exception(exc)
    except Exception:
        log.exception("admin API: %s %s failed", request.method, request.path)
        return json_response({"error": "internal", "detail": "internal error (see the node's log)"},
                             status=500)


@web.middleware
async def auth_middleware(request: web.Request, handler):
    route = request.match_info.route
    resource = route.resource
    path = resource.canonical if resource is not None else None
    method = "GET" if request.method == "HEAD" else request.method
    if (method, path) in PUBLIC:
        return await handler(request)
    token = bearer_token(request.headers.get("Authorization"))
    tokens = request.app[TOKENS]
    role = role_for(tokens, getattr(request.app[NODE], "oauth", None), token) if token else None
    if token is not None:  # who, for the audit log
        digest_known = tokens.role_of(token) is not None
        request[WHO] = (token_who(token, tokens.names) if digest_known or role is None
                        else jwt_who(token), role)
    if role is None:
        raise ApiError(401, "unauthorized", "a bearer token is required"
                       if token is None else "unknown token",
                       headers={"WWW-Authenticate": 'Bearer realm="fedgate"'})
    if not allowed(role, request.method):
        raise ApiError(403, "forbidden", f"a {role!r} token may not {request.method}" if role
                       else "this token grants no admin API role")
    return await handler(request)


class _BadRequestsInOneLine(logging.Filter):
    """aiohttp logs a client's malformed request (a 100 KB URL, a broken header) as an
    error with a traceback; it is the client's fault and answered with 400: one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            record.msg, record.args = "admin HTTP: bad request refused (%s: %.200s)", \
                (type(exc).__name__, exc.message)
            record.exc_info = record.exc_text = None
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


_BAD_REQUESTS = _BadRequestsInOneLine()


SERVER = "fedgate"


def _no_server_version() -> None:
    """``Server: fedgate`` on every response: no versions of aiohttp or Python for a scanner.

    aiohttp gives a response without a ``Server`` header its default, ``Python/3.x
    aiohttp/x.y`` (``web_response.SERVER_SOFTWARE``, read as each response is
    prepared). An ``on_response_prepare`` hook cannot reach the 400 it answers a request
    it could not parse (a 100 KB URL, a broken header): that request never reaches the
    application (aiohttp issue 6463). So the default itself is replaced, for every
    aiohttp server of the process; the admin API is the node's only one.
    """
    web_response.SERVER_SOFTWARE = SERVER


def build_app(node, *, admin_url: str = "", sync_interval: float = 1.0,
              audit: bool = True) -> web.Application:
    """``audit``: keep the audit log (worker 0 does for a node of several workers)."""
    settings = node.config.admin
    slow = SlowClients(settings.header_timeout, settings.body_timeout)
    app = web.Application(middlewares=[slow.middleware, audit_middleware, errors_middleware,
                                       auth_middleware, aggregate_middleware],
                          client_max_size=MAX_BODY)
    if audit:
        data_dir = getattr(node, "data_dir", None)
        app[AUDIT] = AuditLog(data_dir / "audit.jsonl" if data_dir is not None and data_dir.is_dir()
                              else None, node.node_id)
    app[SLOW_CLIENTS] = slow
    manager = RulesManager(node)
    app[NODE] = node
    app[STARTED] = time.monotonic()
    app[ADMIN_URL] = {"url": admin_url}
    app[TOKENS] = Tokens.from_config(settings.tokens)
    app[MANAGER] = manager
    # the gossip is for static clusters: on etcd the rules come with the watch
    peers = {} if manager.on_etcd else dict(settings.cluster)
    sync = ClusterSync(manager, peers, settings.node_token(), interval=sync_interval)
    app[CLUSTER] = sync
    app.cleanup_ctx.append(sync.context)
    if manager.on_etcd:
        app.cleanup_ctx.append(follow_etcd(manager))
    wired = wiring.Wiring(node)  # exchanges and bindings declared at run time
    app[wiring.WIRING] = wired
    app.cleanup_ctx.append(wired.context)
    wiring_sync.sync_for(app, wired)  # a static cluster: push and pull between the nodes
    history = History(node)
    app[HISTORY] = history
    app.cleanup_ctx.append(history.context)
    _no_server_version()
    server_log = logging.getLogger("aiohttp.server")
    if _BAD_REQUESTS not in server_log.filters:
        server_log.addFilter(_BAD_REQUESTS)
    for method, path, handler, _ in ROUTES:
        app.router.add_route(method, path, handler)
    return app


class _WatchedSite(web.TCPSite):
    """aiohttp's TCP site with every connection watched for slow clients (admin_api.slow_clients)."""

    async def start(self) -> None:
        await web.BaseSite.start(self)
        server = self._runner.server
        slow = self._runner.app[SLOW_CLIENTS]
        self._server = await asyncio.get_running_loop().create_server(
            slow.factory(server), self._host, self._port, backlog=self._backlog,
            reuse_address=self._reuse_address)


class AdminService:
    """Runs the admin app on ``[admin] listen`` inside the node's event loop."""

    def __init__(self, node) -> None:
        self.node = node
        self.runner: web.AppRunner | None = None
        self.url: str | None = None

    async def start(self) -> None:
        worker = getattr(self.node, "worker", None)
        if worker is not None and worker.count > 1 and worker.index != 0:
            await self._start_on_socket(worker)
            return
        host, port = self.node.config.admin_listen
        shown = f"[{host}]" if ":" in host else host
        app = build_app(self.node, admin_url=f"http://{shown}:{port}")
        if worker is not None and worker.count > 1:  # worker 0 answers for the whole node
            peers = WorkerPeers({k: admin_socket(worker.data_dir, k) for k in range(1, worker.count)},
                                worker.admin_token, app[MANAGER], app[wiring.WIRING])
            app[WORKER_PEERS] = peers
            app.cleanup_ctx.append(peers.context)
        token_file = None
        if not self.node.config.admin.tokens and first_run.is_loopback(host):
            token, created = first_run.load_or_create(self.node.data_dir)
            app[TOKENS] = Tokens.from_config(({"token": token, "role": "admin"},))
            token_file = first_run.token_path(self.node.data_dir)
            if created:
                log.info("admin token made in %s (owner-only)", token_file)
        self.runner = web.AppRunner(app, access_log=None, handle_signals=False,
                                    keepalive_timeout=self.node.config.admin.header_timeout)
        await self.runner.setup()
        site = _WatchedSite(self.runner, host, port, reuse_address=True)
        try:
            await site.start()
        except OSError as exc:
            await self.runner.cleanup()
            self.runner = None
            raise OSError(exc.errno, f"admin API cannot listen on {host}:{port}: {exc.strerror}") from exc
        bound_port = self.runner.addresses[0][1] if self.runner.addresses else port
        self.url = f"http://{shown}:{bound_port}"
        app[ADMIN_URL]["url"] = self.url
        if token_file is not None:
            log.info("admin console: %s/ -- log in with the token in %s "
                        "(`fedgate admin-token` prints it)", self.url, token_file)
        elif not self.node.config.admin.tokens:
            log.warning("admin API on %s has no tokens configured: every API call will get 401 "
                        "(set [admin] tokens; a token is made only for a loopback listener)",
                        self.url)
        log.info("admin API listening on %s", self.url)

    async def _start_on_socket(self, worker) -> None:
        """Workers other than 0: their admin app answers worker 0 on a Unix socket only."""
        path = admin_socket(worker.data_dir, worker.index)
        app = build_app(self.node, admin_url=f"unix:{path}", audit=False)
        app[TOKENS] = Tokens.from_config(({"token": worker.admin_token, "role": "admin"},))
        app[CLUSTER].peers = {}  # worker 0 syncs rules with other nodes and hands them on
        self.runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self.runner.setup()
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        await web.UnixSite(self.runner, path).start()
        os.chmod(path, 0o600)
        self.url = f"unix:{path}"
        log.info("admin API of worker %d on %s (worker 0's admin API answers for the node)",
                 worker.index, path)

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None


class DisabledService:
    """``[admin] enabled = false``: nothing listens (on etcd, the rules still follow the watch)."""

    def __init__(self, node=None) -> None:
        self.node = node
        self.manager: RulesManager | None = None

    async def start(self) -> None:
        log.info("admin API disabled")
        if self.node is not None and self.node.coordinator.kind == "etcd":
            self.manager = RulesManager(self.node)
            self.node.coordinator.on_rules(self._follow)
            self._follow(*self.node.coordinator.rules_record())

    def _follow(self, value, revision) -> None:
        if self.manager is not None:
            self.manager.follow(value, revision)

    async def stop(self) -> None:
        self.manager = None
