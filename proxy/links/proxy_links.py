"""Proxy links: a client link on the node bridged to a link on a primary.

How this works
--------------
Each proxied client link gets one upstream link of the opposite role on a
shared pool connection (``proxy.upstream``). Messages cross as encoded bytes,
never decoded. The client's link is attached at once and stays attached while
the primary is unreachable; the upstream link follows the pool member's state
(``upstream_up`` / ``upstream_down``).

``ProxyConsumer`` (client receives; upstream is our Receiver)
    Credit passes through: the upstream link is granted only the credit the
    client has (minus messages held), so nothing is fetched that no client can
    take (§2.6.7; the seed's "stuck messages"). Drain is passed upstream and the
    client is drained when the primary answers; a primary known not to answer a
    drain (``proxy.upstream.primaries``) is never sent one: the node answers the client
    after giving the primary ``DRAIN_GRACE`` to send what it has. A browser or
    a filter the client asks for must be in the primary's answer, or the client
    link is closed (``unhonoured_source``). The client's outcome is applied
    upstream, and only then is the upstream delivery settled (§3.4). A client
    that detaches or drops has its unsettled deliveries released upstream.

``ProxyProducer`` (client sends; upstream is our Sender) is in
``proxy.links.proxy_producer``.

An upstream detach with an error (``amqp:not-found`` ...) closes the client
link with the same condition.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import deque

from cproton import (
    PN_ACCEPTED,
    PN_REJECTED,
    PN_RELEASED,
    pn_delivery_pending,
    pn_delivery_settle,
    pn_delivery_settled,
    pn_delivery_update,
    pn_link_credit,
    pn_link_flow,
    pn_link_get_drain,
    pn_link_set_drain,
)
from proton import Data, Link, Terminus

from proxy.amqp.drain import answer_drain
from proxy.amqp.engine import (
    RELAY_IN_PYTHON,
    ClientLinkEndpoint,
    _lib,
    fast_relay,
    hold,
    link_session,
    read_transfer,
    relay_transfer,
    send_message,
    settle_accepted,
)
from proxy.amqp.outcomes import TRANSACTIONAL_STATE, outcome_of, relay_outcome
from proxy.amqp.termini import filter_names, set_capabilities
from proxy.upstream.owner import UpstreamLinkOwner

log = logging.getLogger("fedgate.proxy")

# seconds a primary that cannot drain has to send what it has before the node
# answers a client's drain itself (proxy.upstream.primaries)
DRAIN_GRACE = 0.1
NOT_IMPLEMENTED = "amqp:not-implemented"
_NONE_HELD = ()  # ProxyConsumer.held while nothing is held
# Credit the primary gets for a client (issue #21): what a client does not read must
# stay on the primary's queue, so at most about OUTPUT_WINDOWS x [limits]
# max_output_buffer bytes are on the way for one consumer (and at most the broker's
# credit window of messages); FIRST_WINDOW until a message showed their size.
FIRST_WINDOW = 16
OUTPUT_WINDOWS = 2
_NONE_UNSETTLED: dict = {}  # ProxyConsumer.unsettled until its first delivery (never written to)
_link_names = itertools.count(1)


def unhonoured_source(asked, answered, echo_untrusted: str | None = None,
                      applied: frozenset[str] = frozenset()) -> str | None:
    """Why the primary's source does not do what the client asked, or None (§3.5.3).

    A browser (distribution-mode ``copy``) or a filter (a JMS selector) the
    primary leaves out of its answer is not applied: the client would take
    messages it meant to look at, or messages it did not select.
    ``echo_untrusted`` says why this primary's answer proves nothing
    (``proxy.upstream.primaries``), except for the filters in ``applied``, which it
    is known to apply. A null source (the attach refused, a detach follows) is left
    to the detach's condition.
    """
    copy = asked.distribution_mode == Terminus.DIST_MODE_COPY
    wanted = filter_names(asked)
    if not copy and not wanted:
        return None  # nearly every link: nothing to check
    if answered.type != Terminus.SOURCE:
        return None
    if echo_untrusted is not None:
        if copy or not wanted <= applied:
            return echo_untrusted
        return None  # every filter asked for is one it is known to apply
    if copy and answered.distribution_mode != Terminus.DIST_MODE_COPY:
        return "the primary does not browse this address (distribution-mode copy)"
    missing = wanted - filter_names(answered)
    if missing:
        return f"the primary does not apply the filter ({', '.join(sorted(missing))})"
    return None


class _ProxyEndpoint(ClientLinkEndpoint, UpstreamLinkOwner):
    """What both directions share: client link, pool member, upstream link."""

    sender_upstream = False  # role of our upstream link

    rule_name = None  # the proxy rule that routed the client here (messages name it)
    properties = None  # link properties for the upstream attach (a replication link forwarded
    # to the worker that owns its queue carries the primary's: proxy.replication.service)

    def __init__(self, handler, client_link: Link, upstream, remote_address: str,
                 capabilities: tuple[str, ...] = (), rule=None) -> None:
        if rule is not None:
            self.rule_name = rule.name
            self.declare = rule.upstream.declare  # proxy.upstream.owner: before the first attach
        self.handler = handler
        self.capabilities = capabilities  # added to the upstream terminus (e.g. fragment links)
        self.link_ptr = hold(client_link._impl)
        self.session_ptr = link_session(self.link_ptr)
        self.upstream = upstream
        self.remote_address = remote_address
        self.address = remote_address
        self.tags = itertools.count(1)
        self.closed = False
        self.join_pool()

    # -- upstream lifecycle (proxy.upstream.owner) ----------------------------------------
    def link_name(self) -> str:
        return f"fedgate-{next(_link_names)}-{self.link.name}"

    def configure_link(self, link: Link) -> None:
        """Termini and settle modes of our upstream link (also the suspect sender's)."""
        self.configure_upstream(link)
        if self.properties:
            data = Data(_lib.pn_link_properties(link._impl))
            data.clear()
            data.put_object(self.properties)
        if self.capabilities:
            set_capabilities(link.target if self.sender_upstream else link.source, self.capabilities)

    def link_attached(self) -> None:
        self.on_upstream_flow()

    # Called with the primary's condition when it ends our link; True: the address moved to
    # another primary (proxy.replication: a fenced primary ends every link) and the client's
    # link stays, parked, until its owner rehomes it. None: the client learns the condition.
    moved = None

    def parked(self) -> None:
        """Our link on the old primary is gone for good; a new one comes with ``rehome``."""

    def link_refused(self, condition) -> None:
        """The primary detached our link: the client learns the same condition."""
        if self.closed:
            return
        if self.moved is not None and self.moved(condition):
            self.parked()
            return
        name = condition.name if condition else "amqp:link:detach-forced"
        description = condition.description if condition else "detached by the primary"
        if name == "amqp:not-found" and self.rule_name and self.declare is None:
            description = (f"{description or 'not found'} (rule {self.rule_name!r}: the primary has "
                           f"no {self.remote_address!r}; upstream.declare makes it on RabbitMQ 4)")
        log.info("proxy link %s -> %s detached by primary: %s %s", self.link.name,
                 self.remote_address, name, description)
        self.handler.close_link(self.link, name, description or "")

    def on_flow(self) -> None:  # client flow
        pass


class ProxyConsumer(_ProxyEndpoint):
    """Client receives from an address on a primary."""

    sender_upstream = False

    recheck_interval = 0.0  # seconds idle before the remote source is re-checked; 0: never
    drain_timer = None  # a drain the node answers itself (a primary that cannot drain)
    size_hint = 0  # bytes of the largest message seen (sets _window)
    check_source = False  # whether the primary's answer must keep a browse or a filter

    def __init__(self, handler, client_link, upstream, remote_address, *, presettled: bool,
                 capabilities: tuple[str, ...] = (), recheck_interval: float = 0.0,
                 check_source: bool = False, rule=None) -> None:
        self.presettled = presettled
        if check_source:  # the client asked for a browser or a filter: see link_attached
            self.check_source = True
        # client delivery -> upstream delivery (None once upstream is gone); a dict of its
        # own from the first message on (most proxy consumers of a concentrator are idle)
        self.unsettled: dict = _NONE_UNSETTLED
        # (payload, upstream delivery) waiting for client credit; a deque only once needed
        # (an empty deque is ~600 bytes, and most proxy consumers are idle)
        self.held = _NONE_HELD
        self.draining = False
        self.sent = 0
        super().__init__(handler, client_link, upstream, remote_address, capabilities, rule)
        if recheck_interval > 0 and not self.closed:
            self.recheck_interval = recheck_interval
            upstream.watch(self)

    # -- idle re-check (proxy.upstream.Upstream.watch) ------------------------------
    @property
    def activity(self) -> int:
        return self.sent

    def recheck_ready(self) -> bool:
        return self.up_attached and not self.unsettled and not self.held

    def probe_source(self):
        return self.link.remote_source

    def remote_gone(self, condition) -> None:
        """A re-check found the remote source gone: the client learns the primary's condition."""
        if not self.closed:
            self.handler.close_link(self.link, condition.name, condition.description or "")

    def link_attached(self) -> None:
        member = self.member
        unhonoured = unhonoured_source(self.link.remote_source, self.up_link.remote_source,
                                       member.source_echo_untrusted, member.filters_applied) \
            if self.check_source else None
        if unhonoured is not None:
            log.info("proxy link %s -> %s refused: %s", self.link.name, self.remote_address,
                     unhonoured)
            self.handler.close_link(self.link, NOT_IMPLEMENTED, unhonoured)
            return
        super().link_attached()

    def configure_upstream(self, link: Link) -> None:
        # transparent: the client's termini (durability, expiry, filters,
        # distribution mode, capabilities) go upstream as they are, only the
        # address is mapped; link_attached checks what the primary kept
        link.source.copy(self.link.remote_source)
        link.source.address = self.remote_address
        link.target.copy(self.link.remote_target)
        if self.presettled:
            link.snd_settle_mode = Link.SND_SETTLED
        link.rcv_settle_mode = Link.RCV_FIRST

    def link_lost(self) -> None:
        self.draining = False
        if self.drain_timer is not None:
            self.drain_timer.cancel()
            self.drain_timer = None
        # upstream deliveries died with the connection: the primary redelivers them
        self.held = _NONE_HELD
        for delivery in self.unsettled:
            self.unsettled[delivery] = None

    # -- credit --------------------------------------------------------------------
    def on_flow(self) -> None:
        self._deliver_held()
        self.sync_credit()

    def sync_credit(self) -> None:
        up = self.up_ptr
        if up is None or not self.up_attached:
            if self.drain_requested and pn_link_credit(self.link_ptr) == 0:
                self._answer_drain()  # nothing to wait for (§2.6.7: no credit to use up)
            return  # otherwise the drain goes to the primary once our link there is attached
        client_credit = pn_link_credit(self.link_ptr) if self.handler.can_send(self) else 0
        if client_credit > FIRST_WINDOW and not pn_link_get_drain(self.link_ptr):
            # at most a window on the way from the primary, whatever credit the client
            # gave (a drain gets it all: §2.6.7 asks the primary for what it has)
            client_credit = min(client_credit, self._window())
        up_credit = pn_link_credit(up)
        want = client_credit - up_credit - len(self.held)
        changed = False
        # Top up in batches: once the upstream credit fell to half of what the client
        # has (or ran out), not on every client flow. It never exceeds the client's
        # credit, and the primary gets one flow frame per half window instead of one
        # per message (clients that refill credit per message).
        if want > 0 and (want >= up_credit or want * 2 >= client_credit):
            pn_link_flow(up, want)
            changed = True
        if self.drain_requested and not self.draining and pn_link_credit(self.link_ptr) == 0:
            # nothing to wait for (§2.6.7: no credit to use up): answered now, also
            # where the primary would not answer a drain at credit 0 (Artemis)
            self._answer_drain()
        elif self.drain_requested and not self.draining:
            self.draining = True
            if self.member.drain_unanswered is None:
                pn_link_set_drain(up, True)
                pn_link_flow(up, 0)  # send a flow with drain set
                changed = True
            else:
                # a primary that cannot drain (proxy.upstream.primaries): it gets DRAIN_GRACE to
                # send what it has for the credit it holds, then the drain is answered
                # here; what comes later waits in ``held`` for the client's next credit
                self.drain_timer = asyncio.get_running_loop().call_later(DRAIN_GRACE,
                                                                         self._drain_here)
        if changed:
            self.member.mark_dirty()

    def _window(self) -> int:
        broker = self.handler.broker
        if not self.size_hint:
            return FIRST_WINDOW
        return max(1, min(broker.credit_window, OUTPUT_WINDOWS * broker.max_output_buffer // self.size_hint))

    def _drain_here(self) -> None:
        self.drain_timer = None
        if self.closed or not self.draining:
            return
        self.draining = False
        if not self.held or pn_link_credit(self.link_ptr) == 0:
            self._answer_drain()
            self.upstream.run_pending()

    def _answer_drain(self) -> None:
        """The client's drain is done: its credit used up, its flow state sent (§2.6.7)."""
        self.drain_requested = False
        if self.draining:  # the primary's part of it is moot now
            self.draining = False
            if self.drain_timer is not None:
                self.drain_timer.cancel()
                self.drain_timer = None
            if self.up_ptr is not None and pn_link_get_drain(self.up_ptr):
                pn_link_set_drain(self.up_ptr, False)
        answer_drain(self.link_ptr)
        self.handler.mark_dirty()

    def on_upstream_flow(self) -> None:
        up = self.up_ptr
        if up is None:
            return
        if self.draining and pn_link_credit(up) == 0:
            self.draining = False
            pn_link_set_drain(up, False)
            if self.drain_requested and (not self.held or pn_link_credit(self.link_ptr) == 0):
                self._answer_drain()
        self.sync_credit()

    # -- messages --------------------------------------------------------------------
    def on_upstream_delivery(self, delivery) -> None:
        if not self.size_hint:
            self.size_hint = max(1, pn_delivery_pending(delivery))
        direct = pn_link_credit(self.link_ptr) > 0 and not self.held and self.handler.can_send(self)
        if direct:
            # the common case: primary to client through the read buffer, no copy kept
            # (a delivery lost on the way is the primary's to send again)
            tag = next(self.tags)
            max_size = self.handler.broker.max_message_size
            result = fast_relay(self.up_ptr, delivery, self.link_ptr, tag, max_size)
            if result is RELAY_IN_PYTHON:
                result = relay_transfer(self.up_ptr, delivery, self.link_ptr, tag, max_size)
        else:  # the client has no credit: the bytes wait here
            result = read_transfer(self.up_ptr, delivery, self.handler.broker.max_message_size)
        if result is None:
            return
        if result is False:
            pn_delivery_update(delivery, PN_REJECTED)
            pn_delivery_settle(delivery)
            return
        self.member.received += 1
        if direct:
            self._forwarded(result, delivery)
        else:
            if not self.held:
                self.held = deque()
            self.held.append((result, delivery))
            if len(result) > self.size_hint:
                self.size_hint = len(result)

    def _deliver_held(self) -> None:
        held = self.held
        while held and pn_link_credit(self.link_ptr) > 0 and self.handler.can_send(self):
            self._forward(*held.popleft())

    def _forward(self, payload: bytes, up_delivery) -> None:
        self._forwarded(send_message(self.link_ptr, str(next(self.tags)).encode(), payload), up_delivery)

    def _forwarded(self, delivery, up_delivery) -> None:
        """``delivery`` went to the client for ``up_delivery``: settle or remember the pair."""
        self.sent += 1
        if self.presettled or pn_delivery_settled(up_delivery):
            pn_delivery_settle(delivery)
            if not pn_delivery_settled(up_delivery):
                pn_delivery_update(up_delivery, PN_ACCEPTED)
            pn_delivery_settle(up_delivery)
            self.member.mark_dirty()
        else:
            if self.unsettled is _NONE_UNSETTLED:
                self.unsettled = {}
            self.unsettled[delivery] = up_delivery
        self.handler.mark_dirty()
        if self.drain_requested and pn_link_credit(self.link_ptr) == 0:
            self._answer_drain()  # every credit used: that ends the drain (§2.6.7)

    def on_delivery(self, delivery) -> None:
        """The client's disposition: apply it upstream, then settle both (§3.4)."""
        up = self.unsettled.get(delivery)
        if settle_accepted(delivery, up):  # nearly always: no helper calls
            if up is not None:
                del self.unsettled[delivery]
                self.member.mark_dirty()
            return
        state = outcome_of(delivery)
        if state is None:
            return  # no outcome yet (§3.4.1: received is not terminal)
        if state == TRANSACTIONAL_STATE and self.handler.transactions is not None \
                and delivery in self.unsettled:  # §4.4.2, forwarded (proxy.transactions)
            self.handler.transactions.retire_upstream(self, delivery, self.unsettled.pop(delivery))
            return
        up = self.unsettled.pop(delivery, None)
        if up is not None:
            relay_outcome(state, delivery, up, self.member.modified_unsupported)
            self.member.mark_dirty()
        pn_delivery_settle(delivery)

    def parked(self) -> None:
        self.link_lost()  # what the old primary sent and is unsettled comes again from the new

    def rehome(self, upstream) -> None:
        """The address moved to another primary (proxy.replication): what came from the old
        one and is not settled comes again from the new one; the link goes on there."""
        if self.closed:
            return
        self.release_upstream()
        self.link_lost()  # unsettled deliveries die with the old link, held ones are dropped
        self.upstream = upstream
        self.join_pool()

    def detached(self) -> None:
        """Client link gone: release what it held upstream (§3.4.4), close our link."""
        self.closed = True
        if self.drain_timer is not None:
            self.drain_timer.cancel()
            self.drain_timer = None
        for up in self.unsettled.values():
            if up is not None:
                pn_delivery_update(up, PN_RELEASED)
                pn_delivery_settle(up)
        self.unsettled.clear()
        for _, up in self.held:
            pn_delivery_update(up, PN_RELEASED)
            pn_delivery_settle(up)
        self.held = _NONE_HELD
        self.release_upstream()
