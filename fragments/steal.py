"""Stealing from one peer fragment: a marked receiver link to that fragment.

How this works
--------------
A ``Stealer`` belongs to a ``FragmentGroup`` and points at one other member
(a fedgate peer, or a queue on a third-party broker). It rides the node's
shared upstream pools (``proxy.upstream``) like a proxy link does, but it has
no client link: stolen messages go straight to a local consumer that has
credit, and their outcome is settled at the home fragment
(``settle_at_home``), never in a local queue.

Requests to fedgate peers are drains (AMQP 1.0 §2.6.7): ``request(n)``
grants ``n`` credit with drain set, the peer sends what it has (up to ``n``)
and answers the rest with a drained flow whose ``available`` field reports its
remaining backlog. So no credit stays parked at a peer, and the group learns
every peer's backlog without moving messages.

Third-party brokers get plain credit instead (``top_up``): RabbitMQ 3.10
ends the session with an internal error when a classic queue is drained
(``send_drained`` function_clause). That credit stays parked, capped at what
the local consumers lack; what arrives when nobody local can take it goes
straight back.

A stolen message that arrives when no local consumer has credit left (local
messages took it meanwhile) is held by the group and delivered first when
credit comes back: released home, it would land at the head of the home
queue, behind later messages of its producer that were already delivered. If the link to
the home node is lost, the home node itself puts the stolen-but-unsettled
messages back (they were unsettled on its side): we just forget them.
"""

from __future__ import annotations

import itertools
import logging

from cproton import (
    PN_ACCEPTED,
    PN_MODIFIED,
    PN_RELEASED,
    pn_delivery_settle,
    pn_delivery_update,
    pn_link_available,
    pn_link_credit,
    pn_link_flow,
    pn_link_set_drain,
)
from proton import Delivery, Described, Link, symbol

from proxy.amqp.engine import read_transfer
from proxy.amqp.termini import SELECTOR_FILTER
from proxy.amqp.outcomes import copy_outcome
from proxy.queues.local import StoredMessage
from proxy.upstream.owner import UplinkState, UpstreamLinkOwner

from .capability import mark

log = logging.getLogger("fedgate.fragments")

_names = itertools.count(1)
SELECTOR_KEY = "jms-selector"  # the filter's name, as Qpid JMS names it


class Stealer(UpstreamLinkOwner):
    def __init__(self, group, member_key: str, upstream, remote_address: str, *,
                 mark: bool = True, selector=None) -> None:
        self.group = group
        # a JMS selector (proxy.selectors) the peer applies: this stealer takes only what it
        # selects, for local consumers with that selector (fragments.selective)
        self.selector = selector
        # fedgate peers: marked links and drain requests; third-party brokers: neither
        self.mark = mark
        self.drains = mark
        self.received = 0  # messages that arrived for the current request
        self.member_key = member_key
        self.upstream = upstream
        self.remote_address = remote_address
        self.requested = 0  # credit asked for in the current drain
        self.available: int | None = None  # the peer's last reported backlog
        self.inflight: set = set()  # home deliveries handed to local consumers
        self.closed = False
        self.join_pool()

    # -- upstream lifecycle (proxy.upstream.owner) ----------------------------------------
    def link_name(self) -> str:
        return f"fedgate-steal-{next(_names)}-{self.group.address}"

    def configure_link(self, link: Link) -> None:
        link.source.address = self.remote_address
        if self.mark:
            mark(link.source)
        if self.selector is not None:
            link.source.filter.put_dict({symbol(SELECTOR_KEY): Described(
                symbol(SELECTOR_FILTER), self.selector.text)})
        link.target.address = None
        link.snd_settle_mode = Link.SND_UNSETTLED
        link.rcv_settle_mode = Link.RCV_FIRST

    def link_attached(self) -> None:
        self.group.evaluate()

    def link_lost(self) -> None:
        # the home node requeues what we held unsettled: forget it here
        self.requested = 0
        self.inflight.clear()
        self.group.drop_held(self)

    def link_refused(self, condition) -> None:
        self.link_lost()
        if condition is not None:
            log.warning("fragment %s: steal link to %s refused: %s %s", self.group.address,
                        self.member_key, condition.name, condition.description)
        self.available = 0

    # -- requests -----------------------------------------------------------------
    @property
    def outstanding(self) -> int:
        """Credit of the current drain request not yet used (drain peers only)."""
        return pn_link_credit(self.up_ptr) if self.requested and self.up_ptr is not None else 0

    def top_up(self, credit: int) -> None:
        """Third-party fragments: keep ``credit`` parked (no drain, see above)."""
        if not self.ready:
            return
        missing = credit - pn_link_credit(self.up_ptr)
        if missing > 0:
            pn_link_flow(self.up_ptr, missing)
            self.group.stats.steal_attempts += 1
            self.member.mark_dirty()

    @property
    def ready(self) -> bool:
        return self.up_attached and not self.closed

    @property
    def refused(self) -> bool:
        """The peer refused or ended our link: this stealer takes nothing more (the group
        makes it again on its retry timer)."""
        return self.up_state is UplinkState.REFUSED

    def request(self, count: int) -> None:
        """Ask the peer for up to ``count`` messages, draining the rest (§2.6.7)."""
        up = self.up_ptr
        if not self.requested:
            self.received = 0
        self.requested = pn_link_credit(up) + count
        self.group.stats.steal_attempts += 1
        pn_link_set_drain(up, True)
        pn_link_flow(up, count)
        self.member.mark_dirty()

    def on_upstream_flow(self) -> None:
        up = self.up_ptr
        if up is None or not self.requested:
            return
        if pn_link_credit(up) == 0:  # drained: the request is over
            self.available = pn_link_available(up)
            self._finished()

    def _finished(self) -> None:
        self.requested = 0
        pn_link_set_drain(self.up_ptr, False)
        self.group.steal_finished(self, self.received)

    def on_upstream_delivery(self, delivery) -> None:
        payload = read_transfer(self.up_ptr, delivery, 0)
        if payload is None or payload is False:
            return
        group = self.group
        group.stats.stolen_in += 1
        self.received += 1
        self.inflight.add(delivery)
        message = StoredMessage(payload, origin=(self, delivery))
        consumer = group.consumer_with_credit(message)
        if consumer is None:
            # Local messages took the credit meanwhile. Sending it home would put
            # it back at the head there, behind later messages of the same
            # producer already delivered: hold it here, first in line instead.
            group.held.append(message)
            group.stats.held += 1
        else:
            consumer.deliver(message)
        if self.requested and pn_link_credit(self.up_ptr) == 0:
            self._finished()  # all asked for arrived: no drained answer will come

    # -- outcomes at home ------------------------------------------------------
    def settle_at_home(self, home_delivery, state, client_delivery) -> None:
        """The local consumer's outcome for a stolen message, applied at its home."""
        if home_delivery not in self.inflight:
            return  # the link to home was lost: home already took it back
        self.inflight.discard(home_delivery)
        if state is None:  # the consumer went away: back home, counted as a failed attempt
            Delivery.wrap(home_delivery).local.failed = True
            pn_delivery_update(home_delivery, PN_MODIFIED)
        elif client_delivery is not None and state and state != PN_ACCEPTED:
            copy_outcome(client_delivery, home_delivery)  # released, modified, rejected
        else:
            pn_delivery_update(home_delivery, PN_ACCEPTED)
        pn_delivery_settle(home_delivery)
        self.member.mark_dirty()

    def give_back(self, home_delivery) -> None:
        """A stolen message no local consumer took (nobody here selects it now): released
        at home, its delivery-count unchanged (§3.4.4: it was not processed)."""
        if home_delivery not in self.inflight:
            return
        self.inflight.discard(home_delivery)
        pn_delivery_update(home_delivery, PN_RELEASED)
        pn_delivery_settle(home_delivery)
        self.member.mark_dirty()

    def close(self) -> None:
        self.closed = True
        for delivery in list(self.inflight):
            self.settle_at_home(delivery, None, None)
        self.release_upstream()

    def describe(self) -> dict:
        return {"member": self.member_key, "attached": self.up_attached,
                "available": self.available, "inflight": len(self.inflight)}
