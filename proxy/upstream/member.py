"""One connection of an upstream pool (``PoolMember``): connect, reconnect, pace attaches, route link events.

How this works
--------------
The pool (``proxy.upstream.pool``) gives each member the links of one side
(receive, send, both, or ``alone`` for suspects); a member is one AMQP
connection with one session carrying them all. Its ``state`` is a
``MemberState`` and changes only by the moves in ``MEMBER_TRANSITIONS``:
``down`` -> ``connecting`` (socket, SASL, open) -> ``up`` (the primary's open
came: every owner is told ``upstream_up``) -> ``backoff`` when the socket is
lost or the connect fails (owners are told ``upstream_down``; retried with
capped exponential backoff and jitter while owners remain) or ``down`` when
no owner is left.

Attaches are paced: at most ``MAX_ATTACHING`` per member are in flight, the
others are opened as answers come back, so a burst of clients (or a
reconnect with thousands of links) reaches the primary as a steady stream.
Heartbeats: the transport's idle timeout is twice the heartbeat, so proton
asks the primary for a frame every heartbeat and declares it dead after two
(§2.4.5). The primary ending the shared session re-attaches every owner's
link on a new one; the links still waiting for an attach answer get the
primary's condition. Link events are routed to owners by link pointer
(``proxy.upstream.owner``); the per-link logic is theirs.
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import logging
import random
import ssl
from collections import deque
from typing import TYPE_CHECKING

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
from proton import Link, Session

from proxy.amqp import engine
from proxy.upstream.connection import UpstreamConnection, UpstreamProtocol
from proxy.upstream.primaries import (
    drain_unanswered,
    echoes_source_unapplied,
    filters_applied,
    modified_unsupported,
    transactions_unsupported,
)
from proxy.upstream.management import ManagementRequest
from proxy.upstream.probe import RemoteProbe

if TYPE_CHECKING:
    from proxy.upstream.pool import Upstream

log = logging.getLogger("fedgate.upstream")


class MemberState(enum.StrEnum):
    """Where one upstream connection is; ``describe`` shows the value."""

    DOWN = "down"  # no connection and none wanted (no links), or about to connect
    CONNECTING = "connecting"  # socket, SASL and open under way
    UP = "up"  # the primary's open came: links are attached on our session
    BACKOFF = "backoff"  # lost or refused: waiting to try again (capped, jittered)


# the moves a member may make (as h11's _state.py writes its transitions): anything
# else is a bug, and ``PoolMember._move`` says so rather than carry on confused
MEMBER_TRANSITIONS: dict[MemberState, frozenset[MemberState]] = {
    MemberState.DOWN: frozenset({MemberState.CONNECTING}),
    MemberState.CONNECTING: frozenset({MemberState.UP, MemberState.BACKOFF, MemberState.DOWN}),
    MemberState.UP: frozenset({MemberState.BACKOFF, MemberState.DOWN}),
    MemberState.BACKOFF: frozenset({MemberState.DOWN, MemberState.CONNECTING}),
}


class MemberStateError(RuntimeError):
    """A member was asked to make a move ``MEMBER_TRANSITIONS`` does not allow."""

BACKOFF_START = 0.1
BACKOFF_CAP = 5.0
# attaches sent to a primary and not answered yet, per pool member; more wait their
# turn. 10,000 clients arriving (or re-attaching after a reconnect) would otherwise
# be 10,000 attaches at once: RabbitMQ 3.10 resets the connection when its session
# process is flow-controlled in the middle of such a burst.
MAX_ATTACHING = 64



class PoolMember:
    """One upstream AMQP connection of a pool, and the proxy links it carries."""

    def __init__(self, upstream: "Upstream", index: int, role: str = "both") -> None:
        self.upstream = upstream
        self.index = index
        self.role = role  # the links it carries: receive | send | both | alone (proxy.upstream.suspects)
        self.state = MemberState.DOWN
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
        # are not to be trusted (proxy.upstream.primaries), or None
        self.source_echo_untrusted: str | None = None
        self.filters_applied: frozenset[str] = frozenset()  # applied even so (primaries)
        self.drain_unanswered: str | None = None  # the same for a drain
        self.modified_unsupported: str | None = None  # the same for the modified outcome
        self.transactions_unsupported: str | None = None  # why no transaction goes there
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
    def _move(self, state: MemberState) -> None:
        if state not in MEMBER_TRANSITIONS[self.state]:
            raise MemberStateError(f"upstream member {self.index}: {self.state.value} -> {state.value}")
        self.state = state

    def connect(self) -> None:
        if self.state in (MemberState.CONNECTING, MemberState.UP):
            return
        self._cancel_timer()
        self._move(MemberState.CONNECTING)
        asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        upstream = self.upstream
        target = upstream.target
        self.conn = UpstreamConnection(target, self, f"{upstream.node_id}-up-{next(_container_ids)}")
        try:
            if target.unix_path is not None:  # another worker of this node
                connecting = upstream.network.connect_unix(lambda: UpstreamProtocol(self),
                                                           target.unix_path)
            else:
                connecting = upstream.network.connect(
                    lambda: UpstreamProtocol(self), target.host, target.port,
                    ssl_context=target.ssl_context(),
                    server_hostname=target.host if target.scheme == "amqps" else None)
            _, protocol = await asyncio.wait_for(connecting, timeout=max(2.0, target.heartbeat))
        except (OSError, asyncio.TimeoutError, ssl.SSLError) as exc:
            self.conn = None
            self._schedule_retry(f"connect failed: {exc!r}")
            return
        self.protocol = protocol
        self.connects += 1

    def _on_remote_open(self, event) -> None:
        self._move(MemberState.UP)
        properties = self.conn.connection.remote_properties
        self.source_echo_untrusted = echoes_source_unapplied(properties)
        self.filters_applied = filters_applied(properties)
        self.drain_unanswered = drain_unanswered(properties)
        self.modified_unsupported = modified_unsupported(properties)
        self.transactions_unsupported = transactions_unsupported(properties)
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
        was_up = self.state is MemberState.UP
        if was_up and self.role != "alone":
            self.upstream.disruptions += 1
        self.last_error = self.last_error or reason  # what endpoints read in upstream_down
        self.protocol = None
        self.conn = None
        self.session = None
        self.links.clear()
        self.attaching.clear()
        self.unopened.clear()
        for holder in list(self.side_sessions.values()):
            if isinstance(holder, ManagementRequest):
                holder.abandon()
        self.side_sessions.clear()
        for endpoint in list(self.endpoints):
            endpoint.upstream_down()
        reason = self.last_error or reason
        if self.endpoints:
            if was_up:
                self.reconnects += 1
            self._schedule_retry(reason)
        else:
            self._move(MemberState.DOWN)
            log.info("upstream %s member %d closed: %s", self.upstream.target.display, self.index, reason)
        self.upstream.run_pending()

    def _schedule_retry(self, reason: str) -> None:
        self._move(MemberState.BACKOFF)
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
            self._move(MemberState.DOWN)
            self.connect()
        else:
            self._move(MemberState.DOWN)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def release_if_idle(self) -> None:
        """No links left: close after the idle timeout unless one comes back."""
        if self.endpoints or self.state is not MemberState.UP:
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

    @property
    def is_up(self) -> bool:
        return self.state is MemberState.UP

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
            "state": self.state.value,
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
            # internal senders of exchanges (proxy.links.remote_destinations)
            "senders": [e.describe() for e in self.endpoints if getattr(e, "internal", False)],
        }



_container_ids = itertools.count(1)
