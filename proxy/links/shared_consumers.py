"""``mirror_auto_delete``: client consumers of one remote source share one upstream receiver.

How this works
--------------
A proxy rule with ``mirror_auto_delete = true`` holds its upstream consumer
only while clients consume: the first client receiver for an address attaches
the upstream receiver (``SharedSubscription``), later ones join it, and the
last one to detach (or to drop its connection) detaches it at once. An
auto-delete queue on the primary therefore lives exactly as long as it would
with the clients attached directly (RabbitMQ deletes an ``auto_delete`` queue
when its last consumer goes), and the primary sees one consumer, not one per
client.

Messages from the shared upstream link are competing-consumer work among the
clients: each goes to the next client with credit (round-robin). Upstream
credit is the sum of the clients' credit minus messages held (§2.6.7), so
nothing is fetched that no client can take. A client's drain is answered by
the node (its credit is consumed when nothing is held for it); the upstream
link is never drained for one client. Outcomes go upstream as the client
gives them, then both deliveries are settled (§3.4); a client that leaves has
its unsettled messages released upstream (§3.4.4). The upstream link's source
terminus is the first client's (only the address is mapped).
"""

from __future__ import annotations

import itertools
import logging
from collections import deque

from cproton import (
    PN_ACCEPTED,
    PN_REJECTED,
    PN_RELEASED,
    pn_delivery_settle,
    pn_delivery_settled,
    pn_delivery_update,
    pn_link_credit,
    pn_link_flow,
)
from proton import Link

from proxy.amqp import engine
from proxy.amqp.drain import answer_drain
from proxy.amqp.engine import read_transfer, send_message
from proxy.amqp.outcomes import TRANSACTIONAL_STATE, outcome_of, relay_outcome
from proxy.upstream.owner import UpstreamLinkOwner

log = logging.getLogger("fedgate.proxy")

_names = itertools.count(1)


def attach_shared_consumer(handler, link: Link, upstream, remote_address: str, *,
                           presettled: bool, recheck_interval: float = 0.0) -> "SharedConsumer":
    key = (remote_address, presettled)
    subscription = upstream.shared.get(key)
    if subscription is None or subscription.closed:
        subscription = SharedSubscription(upstream, key, remote_address, link.remote_source,
                                          presettled=presettled, recheck_interval=recheck_interval)
    consumer = SharedConsumer(handler, link, subscription, presettled=presettled)
    subscription.join(consumer)
    return consumer


class SharedSubscription(UpstreamLinkOwner):
    """The one upstream receiver of (pool, address): a pool endpoint like a proxy link."""

    recheck_interval = 0.0

    def __init__(self, upstream, key: tuple, remote_address: str, source, *, presettled: bool,
                 recheck_interval: float) -> None:
        self.upstream = upstream
        self.key = key
        self.remote_address = remote_address
        self._initial_source = source  # the creating client's terminus: valid during __init__ only
        self.presettled = presettled
        self.consumers: list[SharedConsumer] = []
        self.held: deque = deque()  # (payload, upstream delivery) waiting for a client with credit
        self.received = 0
        self.credit_total = 0  # sum of the clients' link credit, kept up to date in O(1)
        self._next = 0
        self.closed = False
        upstream.shared[key] = self
        self.join_pool()
        self._initial_source = None
        if recheck_interval > 0 and not self.closed:
            self.recheck_interval = recheck_interval
            upstream.watch(self)

    # -- clients ------------------------------------------------------------------
    def join(self, consumer: "SharedConsumer") -> None:
        self.consumers.append(consumer)
        self.recount(consumer)
        self.sync_credit()

    def recount(self, consumer: "SharedConsumer") -> None:
        """A client's credit may have changed (flow, transfer, drain): adjust the total."""
        credit = pn_link_credit(consumer.link_ptr)
        self.credit_total += credit - consumer.known_credit
        consumer.known_credit = credit

    def leave(self, consumer: "SharedConsumer") -> None:
        try:
            index = self.consumers.index(consumer)
        except ValueError:
            return
        del self.consumers[index]
        self.credit_total -= consumer.known_credit
        consumer.known_credit = 0
        if index < self._next:
            self._next -= 1
        if not self.consumers:
            self.close()  # the last client left: so does our upstream consumer
        else:
            self._deliver_held()
            self.sync_credit()

    def client_flow(self, consumer: "SharedConsumer") -> None:
        self._deliver_held()
        if consumer.drain_requested:
            consumer.drain_requested = False
            answer_drain(consumer.link_ptr)  # nothing held for it: drained here (§2.6.7)
            consumer.handler.mark_dirty()
        self.recount(consumer)
        self.sync_credit()

    def _pick(self):
        consumers = self.consumers
        count = len(consumers)
        for offset in range(count):
            index = (self._next + offset) % count
            consumer = consumers[index]
            if consumer.credit > 0:
                self._next = (index + 1) % count
                return consumer
        return None

    def _deliver_held(self) -> None:
        held = self.held
        while held:
            consumer = self._pick()
            if consumer is None:
                return
            consumer.forward(*held.popleft())

    def sync_credit(self) -> None:
        up = self.up_ptr
        if up is None or not self.up_attached or self.closed:
            return
        want = self.credit_total - pn_link_credit(up) - len(self.held)
        if want > 0:
            pn_link_flow(up, want)
            self.member.mark_dirty()

    # -- upstream lifecycle (proxy.upstream.owner) ----------------------------------------
    def link_name(self) -> str:
        return f"fedgate-shared-{next(_names)}"

    def configure_link(self, link: Link) -> None:
        link.source.copy(self._source())
        link.source.address = self.remote_address
        if self.presettled:
            link.snd_settle_mode = Link.SND_SETTLED
        link.rcv_settle_mode = Link.RCV_FIRST

    def link_attached(self) -> None:
        self.sync_credit()

    def link_lost(self) -> None:
        self.held.clear()  # died with the connection: the primary redelivers them
        for consumer in self.consumers:
            consumer.upstream_gone()

    def link_refused(self, condition) -> None:
        self.link_lost()
        if self.closed:
            return
        name = condition.name if condition else "amqp:link:detach-forced"
        description = (condition.description if condition else None) or "detached by the primary"
        log.info("shared proxy consumer -> %s detached by primary: %s %s", self.remote_address,
                 name, description)
        for consumer in list(self.consumers):
            consumer.handler.close_link(consumer.link, name, description)

    def on_upstream_flow(self) -> None:
        self.sync_credit()

    def on_upstream_delivery(self, delivery) -> None:
        payload = read_transfer(self.up_ptr, delivery, 0)
        if payload is None:
            return
        if payload is False:  # pragma: no cover - no size limit here
            pn_delivery_update(delivery, PN_REJECTED)
            pn_delivery_settle(delivery)
            return
        self.received += 1
        self.member.received += 1
        consumer = self._pick() if not self.held else None
        if consumer is None:
            self.held.append((payload, delivery))
        else:
            consumer.forward(payload, delivery)

    # -- idle re-check (proxy.upstream.Upstream.watch) ----------------------------------
    @property
    def activity(self) -> int:
        return self.received

    def recheck_ready(self) -> bool:
        return self.up_attached and not self.held and not any(c.unsettled for c in self.consumers)

    def probe_source(self):
        return self._source()

    def _source(self):
        """A client's source terminus to copy (proton termini live with their links)."""
        return self.consumers[0].link.remote_source if self.consumers else self._initial_source

    def remote_gone(self, condition) -> None:
        for consumer in list(self.consumers):
            consumer.handler.close_link(consumer.link, condition.name, condition.description or "")

    # -- end ----------------------------------------------------------------------------
    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.upstream.shared.get(self.key) is self:
            del self.upstream.shared[self.key]
        for _, up in self.held:
            pn_delivery_update(up, PN_RELEASED)
            pn_delivery_settle(up)
        self.held.clear()
        self.release_upstream()


class SharedConsumer(engine.ClientLinkEndpoint):
    """One client receiver of a shared subscription (our side: a proton Sender)."""

    def __init__(self, handler, link: Link, subscription: SharedSubscription, *,
                 presettled: bool) -> None:
        self.handler = handler
        self.link_ptr = engine.hold(link._impl)
        self.session_ptr = engine.link_session(self.link_ptr)
        self.subscription = subscription
        self.presettled = presettled
        self.remote_address = subscription.remote_address
        self.address = subscription.remote_address
        self.unsettled: dict = {}  # client delivery -> upstream delivery (None once upstream is gone)
        self.tags = itertools.count(1)
        self.sent = 0
        self.known_credit = 0  # this link's credit as counted in subscription.credit_total

    @property
    def credit(self) -> int:
        return pn_link_credit(self.link_ptr) if self.handler.can_send(self) else 0

    def forward(self, payload: bytes, up_delivery) -> None:
        ptr = self.link_ptr
        delivery = send_message(ptr, str(next(self.tags)).encode(), payload)
        self.sent += 1
        self.subscription.recount(self)
        if self.presettled or pn_delivery_settled(up_delivery):
            pn_delivery_settle(delivery)
            if not pn_delivery_settled(up_delivery):
                pn_delivery_update(up_delivery, PN_ACCEPTED)
            pn_delivery_settle(up_delivery)
            self.subscription.member.mark_dirty()
        else:
            self.unsettled[delivery] = up_delivery
        self.handler.mark_dirty()

    def upstream_gone(self) -> None:
        for delivery in self.unsettled:
            self.unsettled[delivery] = None

    def on_flow(self) -> None:
        self.subscription.client_flow(self)

    def on_delivery(self, delivery) -> None:
        """The client's disposition: apply it upstream, then settle both (§3.4)."""
        state = outcome_of(delivery)
        if state is None:
            return  # no outcome yet (§3.4.1: received is not terminal)
        if state == TRANSACTIONAL_STATE and self.handler.transactions is not None:
            self.handler.transactions.refuse_retirement(delivery, (
                "a consumer sharing one upstream link (the rule's mirror_auto_delete) cannot "
                "settle in a transaction"))
            state = PN_RELEASED  # the message goes back to the primary's queue
        up = self.unsettled.pop(delivery, None)
        if up is not None:
            relay_outcome(state, delivery, up, self.subscription.member.modified_unsupported)
            self.subscription.member.mark_dirty()
        pn_delivery_settle(delivery)

    def detached(self) -> None:
        subscription = self.subscription
        for up in self.unsettled.values():
            if up is not None:
                pn_delivery_update(up, PN_RELEASED)
                pn_delivery_settle(up)
                subscription.member.mark_dirty()
        self.unsettled.clear()
        subscription.leave(self)
