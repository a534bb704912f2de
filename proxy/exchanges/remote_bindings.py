"""A local queue bound to a remote source: ``[[bindings]] queue = ..., source = {...}``.

How this works
--------------
``RemoteSubscription`` attaches one upstream receiver to the source address
on the primary (``/exchange/amq.topic/orders.#`` makes RabbitMQ create a
subscription queue bound to that exchange) and feeds the local queue. It is a
pool endpoint (``proxy.upstream``): it follows the pool's reconnects, and it
is registered among the local queue's producers, so its credit follows the
same rule as a client sender's (§2.6.7): at most ``window`` outstanding, and
never more than the queue's depth limit leaves room for; when consumers make
room, ``top_up`` is called again (``Broker.run_pending``). A message is
accepted upstream once it is stored in the local queue (for a durable message
to a durable queue: once journaled, ``proxy.durable_hold``), so a node crash
before that leaves it with the primary (at-least-once).

A refusal by the primary (``amqp:not-found``: no such exchange ...) is logged
and the attach retried with capped exponential backoff.
"""

from __future__ import annotations

import asyncio
import itertools
import logging

from cproton import (
    PN_ACCEPTED,
    PN_REJECTED,
    PN_RELEASED,
    pn_delivery_settle,
    pn_delivery_settled,
    pn_delivery_update,
    pn_link_credit,
    pn_link_flow,
    pn_link_queued,
)
from proton import Condition, Delivery, Link

from proxy.amqp.engine import read_transfer
from proxy.upstream.owner import UpstreamLinkOwner

log = logging.getLogger("fedgate.exchanges")

RETRY_START = 0.5
RETRY_CAP = 30.0
_names = itertools.count(1)


class RemoteSubscription(UpstreamLinkOwner):
    def __init__(self, broker, queue, source, upstream, hold) -> None:
        self.broker = broker
        self.queue = queue
        self.source = source  # exchange_config.RemoteSource
        self.remote_address = source.address
        self.address = queue.name
        self.window = source.window
        self.upstream = upstream
        self.hold = hold  # DurableHold
        self.closed = False
        self.generation = 0  # bumped when upstream deliveries die with a connection
        self.waiting = 0  # stored but not yet durable (counts against the window)
        self.received = 0
        self.refusals = 0
        self.last_error: str | None = None
        self._retry: asyncio.TimerHandle | None = None
        queue.producers.append(self)
        self.join_pool()

    # -- credit (same contract as QueueProducer) -------------------------------------
    @property
    def outstanding_credit(self) -> int:
        """The room this source holds in its queue: its credit, and the deliveries proton
        has received for it and it has not read yet (their credit is spent, they are not
        in the queue yet: a run of them arrives at once and is read one event at a time,
        and a top-up between two of them must not grant their room again)."""
        up = self.up_ptr
        if up is None or not self.up_attached:
            return 0
        # never below 0: a primary that sent past our credit must not make room look larger
        return max(0, pn_link_credit(up)) + pn_link_queued(up)

    def top_up(self) -> None:
        up = self.up_ptr
        if up is None or not self.up_attached or self.closed:
            return
        want = self.window - self.outstanding_credit - self.waiting
        if want <= 0:
            return
        want = self.queue.credit_within_room(want)
        if want:
            pn_link_flow(up, want)
            self.member.mark_dirty()

    # -- upstream lifecycle (proxy.upstream.owner) ----------------------------------------
    def link_name(self) -> str:
        return f"fedgate-binding-{next(_names)}-{self.queue.name}"

    def configure_link(self, link: Link) -> None:
        link.source.address = self.remote_address
        link.snd_settle_mode = Link.SND_UNSETTLED
        link.rcv_settle_mode = Link.RCV_FIRST

    def link_attached(self) -> None:
        self.last_error = None
        self.refusals = 0
        self.top_up()

    def link_lost(self) -> None:
        self.generation += 1  # unsettled upstream deliveries died: the primary redelivers them

    def link_refused(self, condition) -> None:
        self.link_lost()
        if self.closed:
            return
        name = condition.name if condition is not None else "detached"
        self.last_error = f"{name}: {condition.description if condition is not None else ''}"
        delay = min(RETRY_CAP, RETRY_START * (2 ** self.refusals))
        self.refusals += 1
        log.warning("binding %s <- %s on %s refused: %s; retry in %.1fs", self.queue.name,
                    self.remote_address, self.upstream.target.display, self.last_error, delay)
        self._cancel_retry()
        self._retry = asyncio.get_running_loop().call_later(delay, self._reattach)

    def _reattach(self) -> None:
        self._retry = None
        if not self.closed:
            self.reattach()
            self.upstream.run_pending()

    def _cancel_retry(self) -> None:
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None

    def on_upstream_flow(self) -> None:
        pass

    def on_upstream_delivery(self, delivery) -> None:
        payload = read_transfer(self.up_ptr, delivery, self.broker.max_message_size)
        if payload is None:
            return
        member = self.member
        if payload is False:
            wrapped = Delivery.wrap(delivery)
            wrapped.local.condition = Condition("amqp:link:message-size-exceeded",
                                                f"larger than {self.broker.max_message_size} bytes")
            wrapped.update(PN_REJECTED)
            pn_delivery_settle(delivery)
            member.mark_dirty()
            return
        self.received += 1
        member.received += 1
        generation = self.generation
        self.waiting += 1
        presettled = pn_delivery_settled(delivery)
        if presettled:  # settled by the primary already: nothing to answer
            pn_delivery_settle(delivery)

        def stored(error, delivery=delivery) -> None:
            self.waiting -= 1
            if not presettled and generation == self.generation:
                # not if the delivery died with its connection: the primary redelivers it
                pn_delivery_update(delivery, PN_ACCEPTED if error is None else PN_RELEASED)
                pn_delivery_settle(delivery)
                member.mark_dirty()
            up = self.up_ptr
            if up is not None and self.up_attached and pn_link_credit(up) <= self.window // 2:
                self.top_up()

        self.hold.put(self.queue, payload, stored)

    # -- end -----------------------------------------------------------------------------
    def close(self) -> None:
        self.closed = True
        self._cancel_retry()
        if self in self.queue.producers:
            self.queue.producers.remove(self)
        self.release_upstream()

    def describe(self) -> dict:
        return {"queue": self.queue.name, "source": self.remote_address,
                "primary": self.upstream.target.display, "attached": self.up_attached,
                "received": self.received,
                "credit": pn_link_credit(self.up_ptr) if self.up_ptr is not None and self.up_attached else 0,
                "last_error": self.last_error}
