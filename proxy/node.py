"""A fedgate node: configuration, broker, listener and shutdown in one object.

How this works
--------------
``build_node(config)`` is the one factory: it gives ``Node`` the network
(``proxy.net.network``: TCP, or in-process pipes for socket-free tests) and
the plug-in services (``fedgate.services``: fragments, the admin API), and
``Node`` builds every part with what it needs in its constructor (the broker,
its upstream pools and exchanges, the journal of durable queues, each
service), so nothing is patched on later. ``start`` recovers durable queues,
binds the listener (TLS-only when ``[tls]`` is configured) and starts the
services; ``stop`` stops the services, then ends every client connection
(``amqp:connection:forced``, §2.8.15, as a TCP reset: clients fail over on a
broken connection, and python-qpid-proton's Container does not after a close
frame, ``AmqpProtocol.close``), waits a bounded time, and aborts what is left. ``admit`` applies the
connection-count limits (total, per source IP) before a connection gets any
state; ``admit_user`` applies the per-user limit when SASL succeeds;
``release`` forgets a closed connection. ``[[acl]]`` becomes the broker's
``authorize`` hook (``proxy.auth.acl``).

The cluster (``proxy.cluster``, issue #34): the node builds its coordinator
(static, or on etcd with ``[cluster] etcd``) and starts it before it listens:
on etcd that registers the node (a live node with the same id fails the start)
and brings the rules record kept there. Every change of the live members
rebuilds the routing table with their URLs as peers and ``fragments = "*"``
expanded to them (``build_ruleset``), and the open frame's
``failover-server-list`` lists them. Stopping, a node marks itself draining
while it still holds messages of ``"*"`` queues (at most ``drain_timeout``),
then revokes its lease last. Nothing of this runs per message.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import logging
import ssl
from pathlib import Path
from typing import Callable

from proxy.amqp import drain, engine
from proxy.amqp.connection import ConnectionSettings
from proxy.amqp.cbs import CBS_KIND, CbsNode, with_cbs
from proxy.auth.acl import Acl
from proxy.auth.oauth import token_authorizer
from proxy.config.oauth import oauth_validator
from proxy.auth.mechanisms import Authenticator
from proxy.auth.users import UsersFile
from proxy.broker import relay as anonymous_relay
from proxy.broker.broker import Broker
from proxy.cluster import CoordinatorError, build_coordinator
from proxy.config.rules_store import RecordError, RulesRecord, RulesStore
from proxy.config.settings import Config
from proxy.journal.journal import JournalError
from proxy import plugins
from proxy.links.redirects import apply_rules_change
from proxy.net.network import Network, TcpNetwork
from proxy.queues.durable import open_journal, restore
from proxy.queues.journal_pages import JournalPages
from proxy.paging.pager import Pager
from proxy.paging.store import PageStore
from proxy.queues.registry import QueueRegistry
from proxy.server import AmqpProtocol
from proxy.workers.ownership import replicated_fragments
from proxy.workers.placement import Placement
from proxy.admission import Admission
from routing import RoutingTable, RuleSet, RuleValidationError

log = logging.getLogger("fedgate.node")

SHUTDOWN_GRACE = 2.0  # seconds for close frames to reach clients
# a client's output that waits this long without moving is reported stuck (admin API,
# /metrics: issue #33); connections are checked every OUTPUT_CHECK seconds
OUTPUT_STALLED = 10.0
OUTPUT_CHECK = 2.0


# bytes a proxied sender's window may hold for its primary above [queues] credit_window
# (proxy.links.proxy_producer): this, or a quarter of [limits] max_memory when that is less
PRODUCER_WINDOW_BYTES = 4 * 1024 * 1024


def producer_window_bytes(max_memory: int) -> int:
    return min(PRODUCER_WINDOW_BYTES, max_memory // 4) if max_memory else PRODUCER_WINDOW_BYTES


def build_tls_context(config: Config) -> ssl.SSLContext | None:
    tls = config.tls
    if tls is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(config.resolve_path(tls.cert), config.resolve_path(tls.key))
    if tls.ca:
        context.load_verify_locations(config.resolve_path(tls.ca))
    if tls.verify_client:
        context.verify_mode = ssl.CERT_REQUIRED
    elif tls.ca and "EXTERNAL" in config.sasl.mechanisms:
        # certificate optional, verified when given: EXTERNAL for those who have one
        context.verify_mode = ssl.CERT_OPTIONAL
    else:
        context.verify_mode = ssl.CERT_NONE
    return context


def offered_mechanisms(config: Config) -> tuple[str, ...]:
    """PLAIN sends the password in the clear: only over TLS unless explicitly allowed."""
    mechanisms = config.sasl.mechanisms
    for clear in ("PLAIN", "OAUTHBEARER"):  # a bearer token is a password too
        if clear in mechanisms and config.tls is None and not config.sasl.allow_plain_without_tls:
            log.warning("%s not offered: the listener has no TLS "
                        "(set [sasl] allow_plain_without_tls = true to allow it)", clear)
            mechanisms = tuple(m for m in mechanisms if m != clear)
    return mechanisms


def failover_properties(config: Config, urls: list[str] | None = None) -> dict | None:
    """The open frame's ``failover-server-list`` (the other nodes: ``urls``, the live members
    on etcd, else those in ``[peers]``), in the form Qpid JMS and Dispatch Router read: a list
    of maps with ``network-host``, ``port``, ``scheme`` and ``hostname``."""
    from urllib.parse import urlsplit

    from proton import symbol

    servers = []
    if urls is None:
        urls = [url for _, url in sorted(config.peers.items())]
    for url in urls:
        parts = urlsplit(url)
        servers.append({
            symbol("network-host"): parts.hostname,
            symbol("port"): str(parts.port or (5671 if parts.scheme == "amqps" else 5672)),
            symbol("scheme"): parts.scheme,
            symbol("hostname"): parts.hostname,
        })
    return {symbol("failover-server-list"): servers} if servers else None


def build_node(config: Config, *, network: Network | None = None, services=None,
               worker=None, coordinator=None) -> "Node":
    """A node as ``fedgate serve`` runs it: every ``fedgate.services`` plug-in (or those
    named in ``services``), on ``network`` (default: TCP); ``worker`` (a
    ``proxy.workers.worker.WorkerContext``) when it is one worker process of a node;
    ``coordinator`` instead of the one the config says (playbooks: etcd in memory)."""
    return Node(config, network=network,
                service_factories=plugins.load("fedgate.services", services), worker=worker,
                coordinator=coordinator)


class Node:
    def __init__(self, config: Config, *, network: Network | None = None,
                 service_factories=(), worker=None, coordinator=None) -> None:
        self.config = config
        self.worker = worker  # proxy.workers.worker.WorkerContext, or None: a single process
        self.network = network or TcpNetwork()
        self.node_id = config.node.id
        self.data_dir = Path(config.node.data_dir)
        # static ([peers]) or on etcd: members, fencing, ownership (proxy.cluster)
        self.coordinator = coordinator or build_coordinator(
            config, worker_index=worker.index if worker else 0,
            worker_count=worker.count if worker else 1)
        self._routing_generation = 0
        # rules changed through the admin API (<data_dir>/rules.json) win over [[rules]]
        self.rules_store = RulesStore(self.data_dir)
        self.routing = RoutingTable(self.rules_store.initial_ruleset(config))
        declared = {q.name: q for q in config.queue}
        defaults = config.queues

        def queue_options(name: str) -> dict:
            """A queue's options: its [[queue]], else its rule's, else [queues]."""
            decl = declared.get(name)
            try:
                rule = self.routing.resolve(name).rule
            except Exception:  # no rule matches (the default kind)
                rule = None

            def pick(key: str, default):
                value = getattr(decl, key, None) if decl else None
                if value:
                    return value
                value = getattr(rule, key, None) if rule is not None else None
                return value if value else default

            return {
                "max_depth": pick("max_depth", defaults.max_depth),
                "dead_letter": pick("dead_letter", defaults.dead_letter),
                "durable": decl.durable if decl and decl.durable is not None else defaults.durable,
                "max_bytes": decl.max_bytes if decl and decl.max_bytes else defaults.max_bytes,
                "overflow": decl.overflow if decl and decl.overflow else defaults.overflow,
                "delivery_limit": pick("delivery_limit", defaults.delivery_limit),
            }

        self.queue_options = queue_options
        # [[queue]] by name; queues declared through the admin API are added here too
        self.declared_queues = declared
        self.queues = QueueRegistry(
            auto_create=defaults.auto_create, defaults=queue_options,
            max_memory=config.limits.max_memory,
            temporary_defaults={"max_depth": defaults.max_depth, "max_bytes": defaults.max_bytes,
                                "overflow": defaults.overflow})
        for name in declared:
            self.queues.declare(name, **queue_options(name))
        engine.partial_transfers.memory = self.queues.memory  # incomplete transfers count too
        # the journal of durable queues (opened, and the queues refilled, by start)
        wanted = defaults.durable or any(q.durable for q in config.queue) or any(
            r.durable for r in self.routing.current.rules if r.kind == "replicated")
        journal_dir = self.data_dir / "journal"
        if worker is not None and worker.count > 1:  # each worker journals the queues it owns
            journal_dir = self.data_dir / "workers" / str(worker.index) / "journal"
        self.journal = open_journal(journal_dir, config.journal, wanted=wanted)
        self.pager = None  # bodies on disk beyond max_memory (proxy.paging, docs/paging.md)
        self.journal_pages = None  # recovered durable bodies read from the journal (the same)
        if config.limits.max_memory and config.paging.enabled:
            self.pager = Pager(
                PageStore(journal_dir.parent / "paging", segment_size=config.paging.segment_size,
                          threads=config.paging.io_thread),
                self.queues.memory, lambda: self.queues.queues.values(),
                read_ahead=config.paging.read_ahead,
                read_ahead_bytes=config.paging.read_ahead_bytes,
                max_disk=config.limits.max_disk, min_free_disk=config.limits.min_free_disk,
                runs=config.paging.runs)
        self.broker = Broker(
            node_id=self.node_id,
            queues=self.queues,
            resolve=self._resolver(config, worker),
            credit_window=defaults.credit_window,
            producer_window_growth=defaults.producer_window_growth,
            producer_window_bytes=producer_window_bytes(config.limits.max_memory),
            max_message_size=config.limits.max_message_size,
            max_output_buffer=config.limits.max_output_buffer,
            max_temporary_queues=config.limits.max_temp_queues_per_connection,
            authorize=self._authorizer(config, config.oauth is not None),
            exchange_config=config,
            queue_options=queue_options,
            relay_limit=config.limits.max_relay_destinations,
            max_transactions=config.limits.max_transactions_per_connection,
            transaction_timeout=config.limits.transaction_timeout,
            journal=self.journal,
            network=self.network,
        )
        if worker is not None:
            from proxy.workers.ownership import temp_prefix

            self.broker.temp_prefix = temp_prefix(self.node_id, worker.index)
            # connection ids unique on the node: worker K of N numbers K+1, K+1+N, ...
            self.broker.connection_ids = itertools.count(worker.index + 1, worker.count)
        if self.journal is not None:
            self.journal.on_progress.append(self.broker.run_pending)
        if self.pager is not None:
            self.pager.on_loaded = self.broker.queue_loaded
            self.pager.run_pending = self.broker.run_pending
        self.run_pending = self.broker.run_pending  # shared by every client connection
        self.upstreams = self.broker.upstreams
        self.routing.subscribe(
            lambda old, new, version: apply_rules_change(self.broker, old, new))
        self.exchanges = self.broker.exchanges
        self.exchanges.kind_of = lambda address: self.routing.resolve(address).kind
        # topic subscriptions (proxy.exchanges.subscriptions): durable ones kept in the data
        # dir; with workers, each on one worker, known to all (proxy.exchanges.across_workers)
        if worker is None or worker.count == 1:
            self.exchanges.topic_subscriptions.configure(self.data_dir / "subscriptions.json")
        else:
            self.exchanges.topic_subscriptions.configure(
                self.data_dir / "workers" / str(worker.index) / "subscriptions.json", worker=worker)
        users = None
        if config.sasl.users_file:
            users = UsersFile.load(config.resolve_path(config.sasl.users_file), missing_ok=True)
        # [oauth]: JWT bearer tokens (proxy.auth.oauth, docs/oauth.md); None without it
        self.oauth = oauth_validator(config)
        self.authenticator = Authenticator(users, self.oauth)
        if self.oauth is not None:  # $cbs: a token login renews its token in band
            self.broker.kind_handlers[CBS_KIND] = CbsNode(self.oauth)
        limits = config.limits
        self.tls_context = build_tls_context(config)
        self.websocket = config.websocket.settings()  # None: [websocket] enabled = false
        self.connection_settings = ConnectionSettings(
            container_id=self.node_id,
            max_frame_size=limits.max_frame_size,
            idle_timeout=limits.idle_timeout,
            handshake_timeout=limits.handshake_timeout,
            sasl_mechanisms=offered_mechanisms(config),
            sasl_required=config.sasl.require,
            max_sessions=limits.max_sessions_per_connection,
            properties=failover_properties(config),
            # DELAYED_DELIVERY: messages held until x-opt-delivery-time (docs/queue-semantics.md);
            # SHARED-SUBS: JMS 2.0 shared subscriptions (docs/exchanges.md). Qpid JMS refuses a
            # delivery delay or a shared consumer to a peer that does not offer them
            offered_capabilities=(anonymous_relay.CAPABILITY, "DELAYED_DELIVERY", "SHARED-SUBS"),
        )
        # links forwarded by the node's other workers (proxy.workers): trusted, no SASL, no limits
        self.internal_settings = ConnectionSettings(
            container_id=self.node_id, max_frame_size=limits.max_frame_size, idle_timeout=0.0,
            handshake_timeout=limits.handshake_timeout, max_sessions=0)
        self.internal_server = None
        self.internal_connections: set[AmqpProtocol] = set()  # from the other workers
        self.connections: set[AmqpProtocol] = set()  # clients
        self._output_timer = None  # _check_output's next run
        self.placement = Placement(self, AmqpProtocol)  # with workers: hand connections on
        # connection limits, TLS handshakes under way, SASL failures (proxy.admission)
        self.admission = Admission(config.limits, worker, lambda: len(self.connections),
                                   closed=self.placement.closed)
        self.views: dict[str, Callable[[], list]] = {}  # add_view (extensions)
        self.server = None  # the listener (proxy.net.network.Listener) once started
        self.address: tuple[str, int] | None = None
        # plug-ins last: they register through serve_kind / add_view (below)
        self.services = [factory(self) for factory in service_factories]

    def _resolver(self, config: Config, worker):
        resolve = self.routing.resolve if worker is None else worker.resolver(self.routing.resolve)
        return with_cbs(resolve) if config.oauth is not None else resolve

    @staticmethod
    def _authorizer(config: Config, tokens: bool = False):
        acl = Acl(config.acl)
        if tokens:  # token logins: their grants (and [[acl]]); $cbs for them only
            return token_authorizer(acl)
        return acl.allows if acl.enabled else None

    def release(self, protocol: AmqpProtocol) -> None:
        """A connection is gone: out of the node's sets and limits (``admission``)."""
        self.connections.discard(protocol)
        self.internal_connections.discard(protocol)
        self.admission.release(protocol)

    # -- extensions (``fedgate.services`` plugins such as fragments) ---------------
    # a declared interface: a service calls these from its constructor; nothing of the
    # node is replaced or patched on from outside
    def serve_kind(self, kind: str, handler) -> None:
        """Attaches whose routing decision is ``kind`` go to ``handler.attach(client, link, decision)``."""
        self.broker.kind_handlers[kind] = handler

    def add_view(self, name: str, describe: Callable[[], list]) -> None:
        """An inspection view (``describe_fragments`` reads the one named ``fragments``)."""
        self.views[name] = describe

    # -- the cluster (proxy.cluster) ----------------------------------------------------
    def live_members(self) -> dict[str, bool]:
        """Member id -> draining, this node included (``fragments = "*"``)."""
        members = {m.id: m.draining for m in self.coordinator.members()}
        members.setdefault(self.node_id, False)  # before it registers, or a worker that watches
        return members

    def peer_urls(self) -> dict[str, str]:
        """``[peers]``, and on etcd every live member's AMQP URL (a live one wins)."""
        peers = dict(self.config.peers)
        if self.coordinator.kind == "etcd":
            peers.update({m.id: m.amqp for m in self.coordinator.members() if m.id != self.node_id})
        return peers

    def build_ruleset(self, rules: list) -> RuleSet:
        """Validate ``rules`` for this node as the cluster is now (RuleValidationError)."""
        return RuleSet.build(rules, peers=self.peer_urls(), node_id=self.node_id,
                             members=self.live_members(), open_peers=self.config.cluster.enabled)

    def refresh_routing(self) -> None:
        """Rebuild the routing table when the members it was built with have changed."""
        current = self.routing.current
        peers, members = self.peer_urls(), self.live_members()
        if dict(current.peers) == peers and dict(current.members) == members:
            return
        rules = list(self.rules_store.current.rules)
        self._routing_generation += 1
        generation = self._routing_generation

        def build() -> RuleSet | None:
            try:
                return RuleSet.build(rules, peers=peers, node_id=self.node_id, members=members,
                                     open_peers=self.config.cluster.enabled)
            except RuleValidationError as exc:
                log.error("rules no longer valid with the cluster's members: %s", exc)
                return None

        if len(rules) < 100:
            ruleset = build()
            if ruleset is not None:
                self.routing.replace(ruleset)
            return

        async def in_thread() -> None:  # a large rule set: the loop keeps serving (issue #21)
            ruleset = await asyncio.to_thread(build)
            if ruleset is not None and generation == self._routing_generation:
                self.routing.replace(ruleset)
        asyncio.get_running_loop().create_task(in_thread())

    def _members_changed(self, members) -> None:
        others = [m.amqp for m in members if m.id != self.node_id]
        self.connection_settings = dataclasses.replace(
            self.connection_settings, properties=failover_properties(self.config, others))
        log.info("cluster members: %s", ", ".join(m.id for m in members) or "none")
        self.refresh_routing()

    async def _join_cluster(self) -> None:
        coordinator = self.coordinator
        if coordinator.kind != "etcd":
            await coordinator.start()
            return
        coordinator.on_members(self._members_changed)
        await coordinator.start()  # CoordinatorError: etcd unreachable, or our id is taken
        self._adopt_cluster_rules()
        self._members_changed(coordinator.members())

    def _adopt_cluster_rules(self) -> None:
        """At start: the rules record in etcd, when there is one, wins over the local one."""
        value, _ = self.coordinator.rules_record()
        if value is None:
            return
        try:
            record = RulesRecord.from_dict(json.loads(value))
        except (ValueError, RecordError) as exc:
            log.error("the rules record in etcd is not one fedgate wrote (%s); serving the local "
                      "rules", exc)
            return
        current = self.rules_store.current
        if (record.version, record.digest) == (current.version, current.digest):
            return
        try:
            ruleset = self.build_ruleset(list(record.rules))
        except RuleValidationError as exc:
            log.error("rules version %d in etcd do not validate here (%s); serving the local "
                      "rules", record.version, exc)
            return
        self.rules_store.save(RulesRecord(record.version, record.updated_at, record.origin,
                                          tuple(ruleset.to_list())))
        self.routing.replace(ruleset)
        log.info("rules version %d from etcd", record.version)

    def _holds_every_member_fragments(self) -> bool:
        every = self.routing.current.every_member_rules
        return any(group.get("local") and group.get("rule") in every
                   and group.get("depth", 0) + group.get("unacked", 0) > 0
                   for group in self.describe_fragments())

    async def _drain_before_leaving(self) -> None:
        """Stopping on etcd with messages in fragments of "*" queues: marked draining, the other
        members steal them (and take its producers) for at most ``drain_timeout``."""
        coordinator, timeout = self.coordinator, self.config.cluster.drain_timeout
        if coordinator.kind != "etcd" or not timeout or not coordinator.healthy \
                or not self._holds_every_member_fragments():
            return
        try:
            await coordinator.set_draining(True)
        except CoordinatorError as exc:
            log.warning("could not mark this node draining: %s", exc)
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self._holds_every_member_fragments() and loop.time() < deadline:
            await asyncio.sleep(0.05)
        left = sum(g.get("depth", 0) for g in self.describe_fragments() if g.get("local"))
        log.info("drained for leaving: %d messages left in local fragments", left)

    def describe_fragments(self) -> list[dict]:
        describe = self.views.get("fragments")
        return list(describe()) if describe is not None else []

    def describe_upstreams(self) -> list[dict]:
        return self.upstreams.describe()

    def describe_exchanges(self) -> dict:
        return self.exchanges.describe()

    def upstreams_ready(self) -> bool:
        return all(pool.connected or not any(m.endpoints for m in pool.members)
                   for pool in self.upstreams.pools.values())

    @property
    def url(self) -> str:
        host, port = self.address
        scheme = "amqps" if self.tls_context else "amqp"
        host = f"[{host}]" if ":" in host else host
        return f"{scheme}://{host}:{port}"

    async def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        host, port = self.config.listen
        loop = asyncio.get_running_loop()
        if self.pager is not None:
            self.pager.start(loop)
        self._recover_durable_queues(loop)
        self.exchanges.start()
        await self._join_cluster()
        worker = self.worker
        if worker is not None:  # links forwarded by the other workers come on our Unix socket
            path = worker.socket_path(worker.index)
            Path(path).parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            self.internal_server, _ = await self.network.serve_unix(
                lambda: AmqpProtocol(self, internal=True), path)
        if worker is not None and worker.channel is not None:
            # the supervisor listens and accepts; it passes us our share of the connections
            self.server = self._adopting_server()
            self.address = (host, port)
            worker.listen(self._adopt, self.placement.adopt)
            log.info("fedgate node %s worker %d of %d serving %s", self.node_id, worker.index,
                     worker.count, self.url)
        else:
            self.server, self.address = await self.network.serve(
                lambda: AmqpProtocol(self), host, port, ssl_context=self.tls_context,
                handshake_timeout=self.config.limits.handshake_timeout)
            log.info("fedgate node %s listening on %s", self.node_id, self.url)
        if not engine.fastpath_loaded:
            log.warning("the proxy's C fast path (proxy.amqp._fastpath) is %s: proxied messages cost "
                        "about twice the CPU", "switched off" if engine.fastpath_off else "not built")
        self._output_timer = asyncio.get_running_loop().call_later(OUTPUT_CHECK, self._check_output)
        if self.oauth is not None:
            await self.oauth.keys.start()  # the JWKS document, then refreshed
        if not drain.answer_drain_at_zero:
            log.warning("this python-qpid-proton keeps its assertions: a receiver's drain at link "
                        "credit 0 is not answered (proxy.amqp.drain; go-amqp's DrainCredit waits)")
        for service in self.services:
            await service.start()

    def _check_output(self) -> None:
        """Every OUTPUT_CHECK seconds: which clients' output moved (AmqpProtocol.check_output)."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        for protocol in list(self.connections):
            protocol.check_output(now)
        self._output_timer = loop.call_later(OUTPUT_CHECK, self._check_output)

    def output_stalled(self) -> list:
        """(protocol, seconds) of clients whose output has waited over OUTPUT_STALLED seconds."""
        now = asyncio.get_running_loop().time()
        stalled = ((p, p.output_stalled_s(now)) for p in list(self.connections))
        return [(p, s) for p, s in stalled if s > OUTPUT_STALLED]

    async def stop(self) -> None:
        if self._output_timer is not None:
            self._output_timer.cancel()
            self._output_timer = None
        if self.oauth is not None:
            await self.oauth.keys.stop()
        await self._drain_before_leaving()
        for service in reversed(self.services):
            await service.stop()
        if self.server is not None:
            self.server.close()
        if self.internal_server is not None:
            self.internal_server.close()
        for protocol in [*self.connections, *self.internal_connections]:
            protocol.close("amqp:connection:forced", "node shutting down", reset=True)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SHUTDOWN_GRACE
        while (self.connections or self.internal_connections) and loop.time() < deadline:
            await asyncio.sleep(0.02)
        for protocol in [*self.connections, *self.internal_connections]:
            protocol.abort()
        self.exchanges.close()
        self.upstreams.close()
        if self.pager is not None:
            self.pager.close()
        if self.journal_pages is not None:
            self.journal_pages.close()
        if self.journal is not None:
            try:
                self.journal.close()
            except JournalError as exc:
                log.error("journal: %s", exc)
        if self.server is not None:
            await self.server.wait_closed()
        await self.coordinator.stop()  # last: a member until it no longer serves
        log.info("fedgate node %s stopped", self.node_id)

    def _adopting_server(self):
        from proxy.net.tcp_server import TcpServer

        return TcpServer.without_listener(lambda: AmqpProtocol(self))

    def _adopt(self, sock) -> None:
        """A client connection the supervisor accepted and passed to this worker."""
        if self.tls_context is None:
            self.server.adopt(sock)
        else:  # asyncio's transport, which start_tls can upgrade (AmqpProtocol)
            sock.setblocking(False)
            asyncio.get_running_loop().create_task(
                asyncio.get_running_loop().connect_accepted_socket(lambda: AmqpProtocol(self), sock))

    def _recover_durable_queues(self, loop) -> None:
        """Open the journal under the data dir and refill durable queues, before listening."""
        if self.journal is None:
            return
        pages = budget = None
        if self.pager is not None:  # beyond half the budget, bodies stay in the journal
            pages = self.journal_pages = JournalPages(self.journal, self.pager.store)
            budget = self.config.limits.max_memory // 2
        options = pages.open_options() if pages is not None else {}  # the headers' fields
        restored = restore(self.journal.open(loop=loop, body_budget=budget, **options),
                           self.queues, self.queue_options, pages)
        if restored:
            log.info("durable queues: %d messages restored", restored)
        worker = self.worker
        if worker is not None and worker.count > 1 and worker.owner_channel is not None:
            # the supervisor's table names this worker the owner of what its journal holds
            # (it does already, unless the table was lost: proxy.workers.ownership); a
            # fragment of a fragmented queue with replicas, adopted or its own: that queue
            resolve = self.routing.resolve
            for name, queue in list(self.queues.queues.items()):
                if queue.messages and not name.startswith("tmp."):
                    worker.owners.claim(replicated_fragments(resolve, resolve(name), name) or name)
