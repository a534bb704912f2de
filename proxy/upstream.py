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
``UpstreamConnection`` and moved by ``UpstreamProtocol`` (``proxy.io``).
Attaches are paced: at most ``MAX_ATTACHING`` per member are in flight, the
others are opened as answers come back, so a burst of clients (or a reconnect
with thousands of links) reaches the primary as a steady stream.
Heartbeats: the transport's idle timeout is twice the heartbeat, so proton
asks the primary for a frame every heartbeat and declares it dead after two
(§2.4.5). A lost member is reconnected with capped exponential backoff and
jitter; its proxy links are told ``upstream_down`` and later ``upstream_up``
(they keep their client links attached meanwhile).

Proxy link endpoints (``proxy.proxy_links``) implement the per-link logic;
this module only routes upstream link events to them by link pointer.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import ssl
from collections import deque
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

from cproton import (
    PN_RELEASED,
    pn_delivery_link,
    pn_delivery_settle,
    pn_delivery_update,
    pn_link_free,
    pn_link_is_receiver,
    pn_link_open,
    pn_receiver,
    pn_sender,
    pn_session_free,
)
from proton import Connection, Link, Session, Terminus, Transport

from . import engine
from .io import EngineProtocol
from .primaries import drain_unanswered, echoes_source_unapplied, modified_unsupported
from .suspects import SuspectSender

log = logging.getLogger("fedgate.upstream")

BACKOFF_START = 0.1
BACKOFF_CAP = 5.0
# attaches sent to a primary and not answered yet, per pool member; more wait their
# turn. 10,000 clients arriving (or re-attaching after a reconnect) would otherwise
# be 10,000 attaches at once: RabbitMQ 3.10 resets the connection when its session
# process is flow-controlled in the middle of such a burst.
MAX_ATTACHING = 64


@dataclass(frozen=True)
class UpstreamTarget:
    """Where and how to connect: a primary URL plus per-rule options."""

    scheme: str
    host: str
    port: int
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    heartbeat: float = 10.0
    idle_timeout: float = 60.0
    pool_size: int = 1
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    split_directions: bool = True
    max_send_failures: int = 2  # proxy.suspects

    @property
    def key(self) -> tuple:
        return (self.scheme, self.host, self.port, self.user, self.tls_ca, self.tls_cert)

    @property
    def display(self) -> str:
        user = f"{self.user}@" if self.user else ""
        return f"{self.scheme}://{user}{self.host}:{self.port}"

    @classmethod
    def from_url(cls, url: str, **options) -> "UpstreamTarget":
        parts = urlsplit(url)
        if parts.scheme not in ("amqp", "amqps") or not parts.hostname:
            raise ValueError(f"not an amqp:// or amqps:// URL: {url!r}")
        port = parts.port or (5671 if parts.scheme == "amqps" else 5672)
        user = unquote(parts.username) if parts.username else None
        password = unquote(parts.password) if parts.password else None
        options.setdefault("user", user)
        options.setdefault("password", password)
        return cls(scheme=parts.scheme, host=parts.hostname, port=port, **options)

    def ssl_context(self) -> ssl.SSLContext | None:
        if self.scheme != "amqps":
            return None
        context = ssl.create_default_context(cafile=self.tls_ca)
        if self.tls_cert:
            context.load_cert_chain(self.tls_cert, self.tls_key)
        return context


class UpstreamConnection:
    """Client-mode proton connection to a primary, sans-I/O (same shape as ServerConnection)."""

    def __init__(self, target: UpstreamTarget, handler, container_id: str) -> None:
        transport = Transport()
        transport.max_frame_size = 65536
        if target.heartbeat:
            transport.idle_timeout = target.heartbeat * 2
        sasl = transport.sasl()
        if target.user:
            sasl.allowed_mechs("PLAIN")
            sasl.allow_insecure_mechs = True  # the URL's choice; amqps:// for TLS
        else:
            sasl.allowed_mechs("ANONYMOUS")
        connection = Connection()
        connection.container = container_id
        connection.hostname = target.host
        if target.user:
            connection.user = target.user
            connection.password = target.password or ""
        self.pipe = engine.ProtonPipe(transport._impl, connection._impl, handler)
        self.transport = transport  # the wrappers keep proton's objects alive
        self.connection = connection
        self.failure: str | None = None
        connection.open()

    def receive(self, data: bytes) -> None:
        self.pipe.push(data)

    def process(self) -> None:
        self.pipe.pump.run()

    def take_output(self) -> bytes:
        return self.pipe.output()

    @property
    def finished(self) -> bool:
        return self.pipe.finished

    def tick(self, now: float) -> float | None:
        return self.pipe.tick(now)

    def input_closed(self) -> None:
        self.pipe.close_input()


class UpstreamProtocol(EngineProtocol):
    def __init__(self, member: "PoolMember") -> None:
        super().__init__(member.upstream.run_pending)
        self.member = member
        self.conn = member.conn

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self.flush()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.member.lost(str(exc) if exc else "connection closed")

    def pause_writing(self) -> None:
        self.member.writable = False

    def resume_writing(self) -> None:
        self.member.writable = True
        self.member.resume()


class PoolMember:
    """One upstream AMQP connection of a pool, and the proxy links it carries."""

    def __init__(self, upstream: "Upstream", index: int, role: str = "both") -> None:
        self.upstream = upstream
        self.index = index
        self.role = role  # the links it carries: receive | send | both | alone (proxy.suspects)
        self.state = "down"  # down | connecting | up | backoff
        self.conn: UpstreamConnection | None = None
        self.protocol: UpstreamProtocol | None = None
        self.session = None
        self.endpoints: set = set()  # proxy endpoints assigned to this member
        self.links: dict = {}  # upstream link pointer -> endpoint
        self.attaching: set = set()  # link pointers whose attach the primary has not answered
        self.unopened: deque = deque()  # link pointers waiting for their turn (MAX_ATTACHING)
        self.attaching_peak = 0  # most attaches in flight at once on this connection
        self.side_sessions: dict = {}  # session pointer -> RemoteProbe using it alone
        self.writable = True
        self.attempts = 0
        self.connects = 0
        self.reconnects = 0
        self.sessions_ended = 0  # times the primary ended our shared session
        self.last_error: str | None = None
        self.last_condition = None  # the primary's condition when it ended our session or connection
        self.sent = 0  # messages sent to the primary over this connection
        self.received = 0  # messages received from the primary
        # set at open: why this primary's answers to browse / filter requests
        # are not to be trusted (proxy.primaries), or None
        self.source_echo_untrusted: str | None = None
        self.drain_unanswered: str | None = None  # the same for a drain
        self.modified_unsupported: str | None = None  # the same for the modified outcome
        self._timer: asyncio.TimerHandle | None = None
        self._dispatch = {
            engine.PN_CONNECTION_REMOTE_OPEN: self._on_remote_open,
            engine.PN_CONNECTION_REMOTE_CLOSE: self._on_remote_close,
            engine.PN_SESSION_REMOTE_CLOSE: self._on_session_close,
            engine.PN_LINK_REMOTE_OPEN: self._on_link_open,
            engine.PN_LINK_REMOTE_CLOSE: self._on_link_close,
            engine.PN_LINK_REMOTE_DETACH: self._on_link_close,
            engine.PN_LINK_FLOW: self._on_link_flow,
            engine.PN_DELIVERY: self._on_delivery,
            engine.PN_TRANSPORT_ERROR: self._on_transport_error,
        }

    # -- connection lifecycle ------------------------------------------------
    def connect(self) -> None:
        if self.state in ("connecting", "up"):
            return
        self._cancel_timer()
        self.state = "connecting"
        asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        upstream = self.upstream
        target = upstream.target
        self.conn = UpstreamConnection(target, self, f"{upstream.node_id}-up-{next(_container_ids)}")
        loop = asyncio.get_running_loop()
        try:
            _, protocol = await asyncio.wait_for(
                loop.create_connection(lambda: UpstreamProtocol(self), target.host, target.port,
                                       ssl=target.ssl_context(),
                                       server_hostname=target.host if target.scheme == "amqps" else None),
                timeout=max(2.0, target.heartbeat),
            )
        except (OSError, asyncio.TimeoutError, ssl.SSLError) as exc:
            self.conn = None
            self._schedule_retry(f"connect failed: {exc!r}")
            return
        self.protocol = protocol
        self.connects += 1

    def _on_remote_open(self, event) -> None:
        self.state = "up"
        properties = self.conn.connection.remote_properties
        self.source_echo_untrusted = echoes_source_unapplied(properties)
        self.drain_unanswered = drain_unanswered(properties)
        self.modified_unsupported = modified_unsupported(properties)
        self.attempts = 0
        self.last_error = None
        self.last_condition = None
        self._new_session()
        log.info("upstream %s member %d up", self.upstream.target.display, self.index)
        for endpoint in list(self.endpoints):
            endpoint.upstream_up(self)
        self.mark_dirty()

    def _new_session(self) -> None:
        self.session = self.conn.connection.session()
        self.session.open()

    def _on_session_close(self, event) -> None:
        """The primary ended our session (RabbitMQ does so for a failed attach).

        Links still waiting for their attach answer caused it: they get the
        primary's condition. The others are re-attached on a fresh session.
        """
        ptr = engine.pn_event_session(event)
        try:
            self._session_ended(engine.transient(Session, ptr))
        finally:  # ended on both sides: its links go with it (engine: freeing)
            pn_session_free(ptr)

    def _session_ended(self, session) -> None:
        condition = session.remote_condition
        session.close()
        probe = self.side_sessions.pop(session._impl, None)
        if probe is not None:  # a probe's own session: only the probe learns of it
            probe.on_upstream_detached(condition)
            self.mark_dirty()
            return
        if self.session is None or session != self.session:
            return
        log.info("upstream %s member %d: session ended by primary: %s", self.upstream.target.display,
                 self.index, condition)
        self.sessions_ended += 1
        if condition is not None and condition.name:
            self.last_condition = condition
        self.last_error = f"session ended by primary: {condition.name if condition else 'no error'}"
        if self.role != "alone":
            self.upstream.disruptions += 1
        # links still waiting for their attach answer (endpoints and probes) get the condition
        waiting = {endpoint for ptr, endpoint in self.links.items()
                   if ptr in self.attaching or (isinstance(endpoint, RemoteProbe) and not endpoint.up_attached)}
        self.links.clear()
        self.attaching.clear()
        self.unopened.clear()  # their endpoints attach again on the new session, below
        self._new_session()
        for endpoint in waiting:
            if len(waiting) > 1 and isinstance(endpoint, RemoteProbe):
                endpoint.inconclusive()  # which of the attaches failed is unknown
            else:
                endpoint.on_upstream_detached(condition)
        for endpoint in list(self.endpoints):
            if endpoint in waiting or endpoint.closed:
                continue
            endpoint.upstream_down()
            endpoint.upstream_up(self)
        self.mark_dirty()

    def _on_remote_close(self, event) -> None:
        cond = self.conn.connection.remote_condition
        self.last_error = f"closed by primary: {cond.name}: {cond.description}" if cond else "closed by primary"
        if cond is not None and cond.name:
            self.last_condition = cond
        self.conn.connection.close()
        self.mark_dirty()

    def _on_transport_error(self, event) -> None:
        cond = self.conn.transport.condition
        if cond is not None:
            self.last_error = f"{cond.name}: {cond.description}"

    def lost(self, reason: str) -> None:
        """The socket is gone (error, close, heartbeat timeout)."""
        was_up = self.state == "up"
        if was_up and self.role != "alone":
            self.upstream.disruptions += 1
        self.last_error = self.last_error or reason  # what endpoints read in upstream_down
        self.protocol = None
        self.conn = None
        self.session = None
        self.links.clear()
        self.attaching.clear()
        self.unopened.clear()
        self.side_sessions.clear()
        for endpoint in list(self.endpoints):
            endpoint.upstream_down()
        reason = self.last_error or reason
        if self.endpoints:
            if was_up:
                self.reconnects += 1
            self._schedule_retry(reason)
        else:
            self.state = "down"
            log.info("upstream %s member %d closed: %s", self.upstream.target.display, self.index, reason)
        self.upstream.run_pending()

    def _schedule_retry(self, reason: str) -> None:
        self.state = "backoff"
        self.last_error = reason
        delay = min(BACKOFF_CAP, BACKOFF_START * (2 ** self.attempts))
        delay *= random.uniform(0.5, 1.0)  # jitter: many nodes do not retry in step
        self.attempts += 1
        log.warning("upstream %s member %d: %s; retry in %.2fs", self.upstream.target.display,
                    self.index, reason, delay)
        self._cancel_timer()
        self._timer = asyncio.get_running_loop().call_later(delay, self._retry)

    def _retry(self) -> None:
        self._timer = None
        if self.endpoints:
            self.state = "down"
            self.connect()
        else:
            self.state = "down"

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def release_if_idle(self) -> None:
        """No links left: close after the idle timeout unless one comes back."""
        if self.endpoints or self.state != "up":
            return
        self._cancel_timer()
        self._timer = asyncio.get_running_loop().call_later(
            self.upstream.target.idle_timeout, self._close_idle)

    def _close_idle(self) -> None:
        self._timer = None
        if self.endpoints or self.conn is None:
            return
        log.info("upstream %s member %d idle: closing", self.upstream.target.display, self.index)
        self.conn.connection.close()
        self.mark_dirty()

    def close(self) -> None:
        self._cancel_timer()
        if self.conn is not None:
            self.conn.connection.close()
            self.flush()

    # -- plumbing ----------------------------------------------------------------
    def on_amqp_start(self, conn) -> None:  # pragma: no cover - server-side hook only
        pass

    def on_event(self, event_type: int, event) -> None:
        method = self._dispatch.get(event_type)
        if method is not None:
            method(event)

    def mark_dirty(self) -> None:
        self.upstream.dirty.add(self)

    def flush(self) -> None:
        if self.protocol is not None:
            self.protocol.flush()

    def resume(self) -> None:
        for endpoint in list(self.endpoints):
            endpoint.on_upstream_flow()
        self.upstream.run_pending()

    def new_link(self, name: str, *, sender: bool) -> Link:
        """A new link on our session, as a transient wrapper (``engine.transient``)."""
        ptr = (pn_sender if sender else pn_receiver)(self.session._impl, name)
        return engine.transient(Link, ptr)

    def open_link(self, link_ptr) -> None:
        """Attach now if fewer than MAX_ATTACHING attaches are unanswered, else later."""
        if len(self.attaching) < MAX_ATTACHING and not self.unopened:
            self._open(link_ptr)
        else:
            self.unopened.append(link_ptr)

    def _open(self, link_ptr) -> None:
        self.attaching.add(link_ptr)
        self.attaching_peak = max(self.attaching_peak, len(self.attaching))
        pn_link_open(link_ptr)
        self.mark_dirty()

    def _attach_answered(self, link_ptr) -> None:
        self.attaching.discard(link_ptr)
        unopened = self.unopened
        while unopened and len(self.attaching) < MAX_ATTACHING:
            self._open(unopened.popleft())

    def drop_unopened(self, link_ptr) -> bool:
        """A link still waiting for its turn: forget it (never attached, so nothing to say)."""
        try:
            self.unopened.remove(link_ptr)
        except ValueError:
            return False
        pn_link_free(link_ptr)
        return True

    def register(self, link: Link, endpoint) -> None:
        self.links[link._impl] = endpoint

    def unregister(self, link_ptr) -> None:
        self.links.pop(link_ptr, None)

    # -- link events --------------------------------------------------------------
    def _on_link_open(self, event) -> None:
        ptr = engine.pn_event_link(event)
        self._attach_answered(ptr)
        endpoint = self.links.get(ptr)
        if endpoint is not None:
            endpoint.on_upstream_attached()

    def _on_link_close(self, event) -> None:
        ptr = engine.pn_event_link(event)
        self._attach_answered(ptr)  # a refusal answers the attach too
        endpoint = self.links.pop(ptr, None)
        link = engine.transient(Link, ptr)
        condition = link.remote_condition
        if link.state & Link.LOCAL_ACTIVE:
            link.close()
        try:
            if endpoint is not None:
                endpoint.on_upstream_detached(condition)
        finally:  # closed on both sides: proton drops it once our detach is written
            pn_link_free(ptr)
        self.mark_dirty()

    def _on_link_flow(self, event) -> None:
        endpoint = self.links.get(engine.pn_event_link(event))
        if endpoint is not None:
            endpoint.on_upstream_flow()

    def _on_delivery(self, event) -> None:
        delivery = engine.pn_event_delivery(event)
        endpoint = self.links.get(pn_delivery_link(delivery))
        if endpoint is not None:
            endpoint.on_upstream_delivery(delivery)
            return
        if pn_link_is_receiver(pn_delivery_link(delivery)):
            # a message on a link we already let go of: back to the primary, never lost
            pn_delivery_update(delivery, PN_RELEASED)
        pn_delivery_settle(delivery)
        self.mark_dirty()

    def describe(self) -> dict:
        return {
            "member": self.index,
            "role": self.role,
            "state": self.state,
            "links": len(self.links),
            "attaching": len(self.attaching) + len(self.unopened),  # not attached yet
            "attaching_peak": self.attaching_peak,
            # links proton keeps on the connection, ours and those still closing
            "proton_links": engine.links_held(self.conn.connection._impl) if self.conn else 0,
            "endpoints": len(self.endpoints),
            "connects": self.connects,
            "reconnects": self.reconnects,
            # the primary ended the shared session (every link on it attached again)
            "sessions_ended": self.sessions_ended,
            "last_error": self.last_error,
            "sent": self.sent,
            "received": self.received,
            # internal senders of exchanges (proxy.remote_destinations)
            "senders": [e.describe() for e in self.endpoints if getattr(e, "internal", False)],
        }


_container_ids = itertools.count(1)


class Upstream:
    """The pool of connections to one primary."""

    def __init__(self, target: UpstreamTarget, *, node_id: str, dirty: set, run_pending) -> None:
        self.target = target
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
        # suspect deliveries are sent alone on a connection of their own (proxy.suspects);
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
        # every client consumer of it (proxy.shared_consumers)
        self.shared: dict[tuple, object] = {}

    def add(self, endpoint) -> PoolMember:
        """Assign a link owner to the least-loaded member of its side; connect if needed."""
        side = self.sending if endpoint.sender_upstream else self.receiving
        member = min(side, key=lambda m: (m.state != "up", len(m.endpoints)))
        if member.state != "up" and any(m.state == "up" and not m.endpoints for m in side):
            member = next(m for m in side if m.state == "up")
        member.endpoints.add(endpoint)
        member._cancel_timer() if member.state == "up" else None
        if member.state == "up":
            endpoint.upstream_up(member)
        else:
            member.connect()
        return member

    def add_alone(self, endpoint) -> PoolMember:
        """Put a link owner on the ``alone`` member (the suspect sender); connect if needed."""
        member = self.alone
        member.endpoints.add(endpoint)
        if member.state == "up":
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
            if member.state != "up" or member.session is None:
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
        return sum(1 for m in self.members if m.state == "up")

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


PROBE_TIMEOUT = 30.0  # a probe not answered by then is forgotten (another may start)
INCONCLUSIVE = object()  # a probe's answer was lost with a session that failed for another link
_probe_names = itertools.count(1)


class RemoteProbe:
    """Does a remote source still exist? Attach a link without credit, then detach.

    An attach answered with a terminus (§2.6.3) means yes; a refusal (null
    terminus then detach with an error, or, with RabbitMQ, the session ended
    with an error) means no, with the primary's condition. No credit is ever
    granted, so no message moves; an unexpected one is released.

    The probe is a receiver with the consumer's source, except for RabbitMQ's
    ``/exchange/X/KEY`` sources: a receiver there makes RabbitMQ 3.10 create
    (and keep) another subscription queue, so a sender to the same address is
    attached instead; it is refused the same way when the exchange is gone.
    """

    closed = False

    def __init__(self, member: PoolMember, address: str, source, started: float, done) -> None:
        self.member = member
        self.started = started
        self.done = done
        self.sender = address.startswith("/exchange/")
        # its own session: RabbitMQ ends the session of a refused attach, and the
        # links sharing the member's session must not pay for that
        self.session = member.conn.connection.session()
        self.session.open()
        member.side_sessions[self.session._impl] = self
        name = f"fedgate-probe-{next(_probe_names)}"
        link = self.session.sender(name) if self.sender else self.session.receiver(name)
        if self.sender:
            link.target.address = address
        else:
            if source is not None:
                link.source.copy(source)
            link.source.address = address
        link.rcv_settle_mode = Link.RCV_FIRST
        link.open()
        self.up_link, self.up_ptr, self.up_attached = link, link._impl, False
        member.register(link, self)
        member.mark_dirty()

    def _finish(self, condition) -> None:
        if self.done is not None:
            done, self.done = self.done, None
            done(condition)
        # answered: our link and its session go (the session may already be ended)
        member = self.member
        member.unregister(self.up_ptr)
        if self.up_link.state & Link.LOCAL_ACTIVE:
            self.up_link.close()
        if member.side_sessions.get(self.session._impl) is self:
            del member.side_sessions[self.session._impl]
            if self.session.state & Link.LOCAL_ACTIVE:
                self.session.close()
        member.mark_dirty()

    def on_upstream_attached(self) -> None:
        self.up_attached = True
        link = self.up_link
        terminus = link.remote_target if self.sender else link.remote_source
        if terminus.type != Terminus.UNSPECIFIED:
            self._finish(None)  # it exists
        elif link.state & Link.LOCAL_ACTIVE:
            link.close()  # refused: the detach with the primary's error follows
            self.member.mark_dirty()

    def on_upstream_detached(self, condition) -> None:
        self.up_attached = False
        self._finish(condition if condition is not None and condition.name else None)

    def inconclusive(self) -> None:
        self._finish(INCONCLUSIVE)

    def on_upstream_flow(self) -> None:
        pass

    def on_upstream_delivery(self, delivery) -> None:
        pn_delivery_update(delivery, PN_RELEASED)
        pn_delivery_settle(delivery)
        self.member.mark_dirty()


class UpstreamRegistry:
    """All pools of a node, by primary; created on first use."""

    def __init__(self, *, node_id: str, dirty: set, run_pending, secrets: dict | None = None) -> None:
        self.node_id = node_id
        self.dirty = dirty
        self.run_pending = run_pending
        self.secrets = secrets or {}
        self.pools: dict[tuple, Upstream] = {}

    def for_decision(self, decision) -> Upstream:
        rule = decision.rule
        options = rule.upstream
        credentials = self.secrets.get(options.credentials) if options.credentials else None
        extra = {}
        if credentials:
            extra = {"user": credentials.get("user"), "password": credentials.get("password")}
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
            pool = Upstream(target, node_id=self.node_id, dirty=self.dirty, run_pending=self.run_pending)
            self.pools[target.key] = pool
        return pool

    def close(self) -> None:
        for pool in self.pools.values():
            pool.close()

    def describe(self) -> list[dict]:
        return [pool.describe() for pool in self.pools.values()]
