"""Connections from the node to primary brokers: a small shared pool per primary.

How this works
--------------
``Upstream`` is the pool for one primary (URL + credentials). It has
``pool_size`` members (default 1) for the links that receive from the primary
and, with ``split_directions`` (the default), ``pool_size`` others for the
links that send to it; each ``PoolMember`` is one AMQP connection with one
session carrying many links: client links proxied to that primary are
multiplexed over it (the connection concentrator). Publishers and consumers
get separate connections because a broker's flow control blocks a whole
connection: RabbitMQ stops reading a publishing connection while its queues
catch up, and consumers on that connection would stall with it (their
dispositions and credit unread) while the backlog grows. Members are opened on
first need and closed after ``idle_timeout`` without links, so clients coming
and going do not open and close upstream connections.

The client side of the protocol is proton's engine in client mode, including
proton's client SASL (ANONYMOUS or PLAIN), driven sans-I/O by
``UpstreamConnection`` and moved by ``UpstreamProtocol`` (``proxy.net.engine_protocol``).
Attaches are paced: at most ``MAX_ATTACHING`` per member are in flight, the
others are opened as answers come back, so a burst of clients (or a reconnect
with thousands of links) reaches the primary as a steady stream.
Heartbeats: the transport's idle timeout is twice the heartbeat, so proton
asks the primary for a frame every heartbeat and declares it dead after two
(§2.4.5). A lost member is reconnected with capped exponential backoff and
jitter; its proxy links are told ``upstream_down`` and later ``upstream_up``
(they keep their client links attached meanwhile).

Proxy link endpoints (``proxy.links.proxy_links``) implement the per-link logic;
this module only routes upstream link events to them by link pointer.
"""

from __future__ import annotations

import asyncio
import logging
import os

from proxy.upstream.management import OK as DECLARED
from proxy.upstream.management import ManagementRequest, declare_body, queue_path
from proxy.upstream.member import MemberState, PoolMember
from proxy.upstream.probe import INCONCLUSIVE, PROBE_TIMEOUT, RemoteProbe
from proxy.upstream.suspects import SuspectSender
from proxy.upstream.target import UpstreamTarget

log = logging.getLogger("fedgate.upstream")


def choose_member(side: list) -> PoolMember:
    """The member a new link goes to: the one with the fewest links, a connected one among
    equals, and one waiting to retry (``backoff``) only when all are. Links spread over all
    ``pool_size`` connections: while a connected member was preferred to an idle one, every
    link of a warm node went to its first connection and the others were never opened."""
    return min(side, key=lambda m: (m.state is MemberState.BACKOFF, len(m.endpoints),
                                    m.state is not MemberState.UP))


class Upstream:
    """The pool of connections to one primary."""

    def __init__(self, target: UpstreamTarget, *, node_id: str, dirty: set, run_pending,
                 network) -> None:
        self.target = target
        self.network = network  # proxy.net.network: where members connect
        self.node_id = node_id
        self.dirty = dirty  # the broker's set of things to flush
        self.run_pending = run_pending
        size = max(1, target.pool_size)
        self.receiving = [PoolMember(self, i, "receive" if target.split_directions else "both")
                          for i in range(size)]
        if target.split_directions:
            self.sending = [PoolMember(self, size + i, "send") for i in range(size)]
            self.members = self.receiving + self.sending
        else:
            self.sending = self.members = self.receiving
        # suspect deliveries are sent alone on a connection of their own (proxy.upstream.suspects);
        # ``disruptions`` counts the other members' lost connections and ended sessions
        self.disruptions = 0
        self.alone = PoolMember(self, len(self.members), "alone")
        self.suspects = SuspectSender(self, limit=target.max_send_failures,
                                      grace=max(1.0, 1.5 * target.heartbeat))
        self._recheck: dict = {}  # endpoint -> [activity seen, quiet since]
        self._recheck_timer: asyncio.TimerHandle | None = None
        self._probes: dict[tuple, RemoteProbe] = {}  # (member, address) -> probe in flight
        self.probes = 0  # probes answered
        # mirror_auto_delete: one upstream receiver per (address, presettled), shared by
        # every client consumer of it (proxy.links.shared_consumers)
        self.shared: dict[tuple, object] = {}
        # RabbitMQ 4 queues declared through the management node (upstream.declare), by
        # remote address; and the owners waiting for a declare under way
        self.declared: set[str] = set()
        self._declaring: dict[str, list] = {}

    def declare_queue(self, member: PoolMember, remote_address: str, spec, done) -> None:
        """Declare ``remote_address`` (``/queues/NAME``) as ``spec`` says; ``done(status,
        description)`` for every owner that asked while the request was under way."""
        waiting = self._declaring.get(remote_address)
        if waiting is not None:
            waiting.append(done)
            return
        self._declaring[remote_address] = [done]
        log.info("upstream %s: declaring %s (%s)", self.target.display, remote_address, spec.type)
        ManagementRequest(member, "PUT", queue_path(remote_address), declare_body(spec),
                          lambda status, text: self._queue_declared(remote_address, status, text))

    def _queue_declared(self, remote_address: str, status: int, description: str) -> None:
        waiting = self._declaring.pop(remote_address, [])
        if status in DECLARED:
            self.declared.add(remote_address)
        elif status >= 0:
            log.warning("upstream %s: declaring %s was answered %d %s", self.target.display,
                        remote_address, status, description)
        for done in waiting:
            done(status, description)
        self.run_pending()

    def add(self, endpoint) -> PoolMember:
        """Assign a link owner to a member of its side (``choose_member``); connect if needed."""
        member = choose_member(self.sending if endpoint.sender_upstream else self.receiving)
        member.endpoints.add(endpoint)
        member._cancel_timer() if member.state is MemberState.UP else None
        if member.state is MemberState.UP:
            endpoint.upstream_up(member)
        else:
            member.connect()
        return member

    def add_alone(self, endpoint) -> PoolMember:
        """Put a link owner on the ``alone`` member (the suspect sender); connect if needed."""
        return self.add_to(endpoint, self.alone)

    def add_to(self, endpoint, member: PoolMember) -> PoolMember:
        """Put a link owner on ``member`` (a transaction's coordinator: on the connection of its
        work, proxy.transactions.forward); connect if needed."""
        member.endpoints.add(endpoint)
        if member.state is MemberState.UP:
            member._cancel_timer()
            endpoint.upstream_up(member)
        else:
            member.connect()
        return member

    def remove(self, endpoint, member: PoolMember) -> None:
        member.endpoints.discard(endpoint)
        self._recheck.pop(endpoint, None)
        member.release_if_idle()

    # -- idle consumers re-check their remote source ---------------------------------
    def watch(self, endpoint) -> None:
        """Re-check ``endpoint``'s remote source whenever it is idle for its interval.

        The endpoint offers ``recheck_interval``, ``activity`` (a counter that
        moves with every message), ``recheck_ready()`` (attached, nothing in
        flight), ``member``, ``remote_address``, ``probe_source()`` and
        ``remote_gone(condition)``. Bookkeeping stays here: nothing is done per
        message. One probe per (member, address) serves every idle endpoint of
        that address.
        """
        self._recheck[endpoint] = [endpoint.activity, asyncio.get_running_loop().time()]
        if self._recheck_timer is None:
            self._schedule_recheck()

    def _schedule_recheck(self) -> None:
        if not self._recheck:
            self._recheck_timer = None
            return
        period = max(0.2, min(e.recheck_interval for e in self._recheck) / 2)
        self._recheck_timer = asyncio.get_running_loop().call_later(period, self._recheck_tick)

    def _recheck_tick(self) -> None:
        now = asyncio.get_running_loop().time()
        due: dict[tuple, list] = {}
        for endpoint, state in list(self._recheck.items()):
            if endpoint.closed:
                del self._recheck[endpoint]
                continue
            activity = endpoint.activity
            if activity != state[0] or not endpoint.recheck_ready():
                state[0], state[1] = activity, now
            elif now - state[1] >= endpoint.recheck_interval:
                due.setdefault((endpoint.member, endpoint.remote_address), []).append(endpoint)
        for key, group in due.items():
            member, address = key
            probe = self._probes.get(key)
            if probe is not None and now - probe.started < PROBE_TIMEOUT:
                continue
            if member.state is not MemberState.UP or member.session is None:
                continue
            for endpoint in group:
                self._recheck[endpoint][1] = now
            self._probes[key] = RemoteProbe(member, address, group[0].probe_source(), now,
                                            lambda condition, key=key: self._probed(key, condition))
        self._schedule_recheck()
        self.run_pending()

    def _probed(self, key: tuple, condition) -> None:
        self._probes.pop(key, None)
        if condition is INCONCLUSIVE:
            return  # asked again at the next tick
        self.probes += 1
        if condition is None:
            return
        member, address = key
        gone = [e for e in member.endpoints
                if e in self._recheck and e.remote_address == address and not e.closed]
        log.info("upstream %s: %s no longer exists (%s); detaching %d idle link(s)",
                 self.target.display, address, condition.name, len(gone))
        for endpoint in gone:
            endpoint.remote_gone(condition)

    @property
    def connected(self) -> int:
        return sum(1 for m in self.members if m.state is MemberState.UP)

    def close(self) -> None:
        if self._recheck_timer is not None:
            self._recheck_timer.cancel()
            self._recheck_timer = None
        self.suspects.close()
        for member in self.members:
            member.close()
        self.alone.close()

    def describe(self) -> dict:
        return {"primary": self.target.display, "pool_size": len(self.receiving),
                "split_directions": self.sending is not self.receiving,
                "connected": self.connected, "rechecks": self.probes,
                "members": [m.describe() for m in self.members],
                # deliveries in flight when a connection or session ended, re-sent alone
                "suspects": {**self.suspects.describe(), "limit": self.suspects.limit,
                             "connection": self.alone.describe()}}



def read_password(rule: str, options) -> str | None:
    """A rule's password for SASL PLAIN: ``password_file`` (first line) or ``password_env``.
    Unreadable: logged, and the primary refuses the login (the rule's links wait)."""
    if options.password_file is not None:
        try:
            with open(options.password_file, encoding="utf-8") as handle:
                return handle.readline().rstrip("\r\n")
        except OSError as exc:
            log.error("rule %s: password_file %s cannot be read (%s)", rule, options.password_file,
                      exc.strerror or exc)
            return None
    if options.password_env is not None:
        password = os.environ.get(options.password_env)
        if password is None:
            log.error("rule %s: environment variable %s (password_env) is not set", rule,
                      options.password_env)
        return password
    return None


class UpstreamRegistry:
    """All pools of a node, by primary; created on first use."""

    def __init__(self, *, node_id: str, dirty: set, run_pending, network) -> None:
        self.node_id = node_id
        self.network = network
        self.dirty = dirty
        self.run_pending = run_pending
        self.pools: dict[tuple, Upstream] = {}

    def for_decision(self, decision) -> Upstream:
        rule = decision.rule
        options = rule.upstream
        extra = {"vhost": options.vhost}
        if options.user is not None:
            extra.update(user=options.user, password=read_password(rule.name, options))
        target = UpstreamTarget.from_url(
            decision.primary_url or decision.primary,
            heartbeat=options.heartbeat, idle_timeout=options.idle_timeout,
            pool_size=options.pool_size, split_directions=options.split_directions,
            max_send_failures=options.max_send_failures,
            tls_ca=options.tls_ca, tls_cert=options.tls_cert,
            tls_key=options.tls_key, **extra,
        )
        return self._pool(target)

    def for_url(self, url: str, options=None) -> Upstream:
        """The pool for a primary named by URL (fragment members, bindings)."""
        from routing import UpstreamOptions

        options = options or UpstreamOptions()
        target = UpstreamTarget.from_url(
            url, heartbeat=options.heartbeat, idle_timeout=options.idle_timeout,
            pool_size=options.pool_size, split_directions=options.split_directions,
            max_send_failures=options.max_send_failures,
            tls_ca=options.tls_ca, tls_cert=options.tls_cert,
            tls_key=options.tls_key,
        )
        return self._pool(target)

    def _pool(self, target: UpstreamTarget) -> Upstream:
        pool = self.pools.get(target.key)
        if pool is None:
            pool = Upstream(target, node_id=self.node_id, dirty=self.dirty, run_pending=self.run_pending,
                            network=self.network)
            self.pools[target.key] = pool
        return pool

    def close(self) -> None:
        for pool in self.pools.values():
            pool.close()

    def describe(self) -> list[dict]:
        return [pool.describe() for pool in self.pools.values()]
