"""Internal upstream senders: where exchanges put messages bound for a primary.

How this works
--------------
A ``RemoteDestination`` is one upstream sender link to (pool, remote address),
shared by every exchange and client that routes there; it is a pool endpoint
like a proxy link (``proxy.upstream``) and is created on first use. Each
message comes with a ``done(state, condition)`` callback (an exchange's
fan-in, ``proxy.exchanges``) that is called once with the primary's outcome
(§3.4): the message is sent unsettled and settled when the primary answers.

* Messages wait (in order) while the link has no credit or is not attached.
* The connection drops: in-flight messages are sent again, alone, as
  suspects (``proxy.upstream.suspects``; at-least-once: duplicates possible, loss
  not), as ``ProxyProducer`` does; nothing else is sent until they are
  settled.
* The primary detaches the link with an error (``amqp:not-found`` ...): every
  waiting and in-flight message gets ``rejected`` with that condition, and for
  ``HOLD_OFF`` seconds new messages are rejected at once (a missing queue must
  not cost an attach per message); then the link is attached again.
* ``RemoteDestinations`` closes destinations idle (nothing waiting or in
  flight) for the pool's ``idle_timeout``, so per-subject addresses
  (``/exchange/X/{subject}``) do not accumulate.

``sent`` counts transfers to the primary; ``PoolMember.describe`` lists each
destination (``internal`` endpoints) with it, which is how "fan out once per
primary" is observed.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import deque
from time import monotonic

from cproton import (
    PN_REJECTED,
    PN_RELEASED,
    pn_delivery_settle,
    pn_link_credit,
)
from proton import Condition, Delivery, Link

from proxy.amqp.engine import send_message
from proxy.amqp.termini import set_capabilities
from proxy.amqp.outcomes import outcome_of
from proxy.upstream.owner import UpstreamLinkOwner

log = logging.getLogger("fedgate.exchanges")

HOLD_OFF = 5.0  # seconds a destination refused by its primary rejects without trying
_names = itertools.count(1)


class RemoteDestination(UpstreamLinkOwner):
    internal = True  # PoolMember.describe lists it
    sender_upstream = True

    def __init__(self, registry: "RemoteDestinations", upstream, address: str,
                 capabilities: tuple[str, ...] = ()) -> None:
        self.registry = registry
        self.upstream = upstream
        self.capabilities = capabilities  # the target's (e.g. a dead-letter copy's mark)
        self.address = address
        self.remote_address = address
        self.pending: deque = deque()  # (payload, done) not yet sent
        self.inflight: dict = {}  # upstream delivery -> (payload, done)
        self.suspects = 0  # in-flight messages being sent again alone (proxy.upstream.suspects)
        self.sent = 0
        self.accepted = 0
        self.failed = 0
        self.used_at = monotonic()
        self.failure: Condition | None = None
        self.failed_until = 0.0
        self.closed = False
        self.tags = itertools.count(1)
        self.join_pool()

    # -- exchange side ------------------------------------------------------------
    def send(self, payload: bytes, done) -> None:
        now = monotonic()
        self.used_at = now
        if self.failure is not None:
            if now < self.failed_until:
                self.failed += 1
                done(PN_REJECTED, self.failure)
                return
            self.failure = None  # hold-off over: try the primary again
            self.reattach()
        self.pending.append((payload, done))
        self._send_pending()

    @property
    def idle(self) -> bool:
        return not self.pending and not self.inflight and not self.suspects

    # -- upstream lifecycle (proxy.upstream.owner) ----------------------------------------
    def link_name(self) -> str:
        return f"fedgate-x-{next(_names)}"

    def wants_link(self) -> bool:
        return self.failure is None  # refused: held off until HOLD_OFF is over

    def configure_link(self, link: Link) -> None:
        """Our upstream link's target and settle modes (also the suspect sender's)."""
        link.target.address = self.address
        if self.capabilities:
            set_capabilities(link.target, self.capabilities)
        link.snd_settle_mode = Link.SND_UNSETTLED
        link.rcv_settle_mode = Link.RCV_FIRST

    def link_attached(self) -> None:
        self._send_pending()

    def on_upstream_flow(self) -> None:
        self._send_pending()

    def link_lost(self) -> None:
        # sent again alone, in the original order (proxy.upstream.suspects)
        self.suspects += self.upstream.suspects.take(self, self.address, self.inflight, self.member,
                                                     self._suspect_settled)

    def _suspect_settled(self, done, state: int, delivery, condition) -> None:
        self.suspects -= 1
        if delivery is not None and state == PN_REJECTED:
            condition = Delivery.wrap(delivery).remote.condition
        if state == PN_REJECTED:
            self.failed += 1
        else:
            self.accepted += 1
        done(state, condition)
        if not self.suspects:
            self._send_pending()

    def link_refused(self, condition) -> None:
        if self.closed:
            return
        items = list(self.inflight.values()) + list(self.pending)
        self.inflight.clear()
        self.pending.clear()
        if condition is not None and condition.name:
            log.warning("exchange destination %s on %s refused: %s %s", self.address,
                        self.upstream.target.display, condition.name, condition.description)
            self.failure = condition
            self.failed_until = monotonic() + HOLD_OFF
            for _, done in items:
                self.failed += 1
                done(PN_REJECTED, condition)
        else:  # closed by the primary without an error: the sender may try again
            for _, done in items:
                done(PN_RELEASED, None)
            self.reattach()

    def _send_pending(self) -> None:
        up = self.up_ptr
        if up is None or not self.up_attached or self.suspects:
            return
        pending = self.pending
        count = 0
        while pending and pn_link_credit(up) > 0:
            item = pending.popleft()
            delivery = send_message(up, str(next(self.tags)).encode(), item[0])
            self.inflight[delivery] = item
            count += 1
        if count:
            self.sent += count
            self.member.sent += count
            self.member.mark_dirty()

    def on_upstream_delivery(self, delivery) -> None:
        """The primary's outcome (§3.4): report it, settle."""
        state = outcome_of(delivery)
        if state is None:
            return  # no outcome yet (§3.4.1: received is not terminal)
        item = self.inflight.pop(delivery, None)
        condition = Delivery.wrap(delivery).remote.condition if state == PN_REJECTED else None
        pn_delivery_settle(delivery)
        self.member.mark_dirty()
        if item is not None:
            if state == PN_REJECTED:
                self.failed += 1
            else:
                self.accepted += 1
            item[1](state, condition)

    # -- end -------------------------------------------------------------------------
    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        items = list(self.inflight.values()) + list(self.pending)
        self.inflight.clear()
        self.pending.clear()
        for _, done in items:
            done(PN_RELEASED, None)
        if self.suspects:
            for suspect in self.upstream.suspects.cancel(self):
                suspect.done(PN_RELEASED, None, None)  # released to their exchanges
            self.suspects = 0  # the one in flight, if any, reports to no one
        self.release_upstream()

    def describe(self) -> dict:
        return {"address": self.address, "attached": self.up_attached, "sent": self.sent,
                "accepted": self.accepted, "failed": self.failed, "waiting": len(self.pending),
                "unsettled": len(self.inflight),
                "refused": self.failure.name if self.failure is not None else None}


class RemoteDestinations:
    """Every internal sender of the node, by (pool, address); idle ones are closed."""

    def __init__(self) -> None:
        self.by_key: dict[tuple, RemoteDestination] = {}
        self._timer: asyncio.TimerHandle | None = None

    def has(self, upstream, address: str) -> bool:
        destination = self.by_key.get((upstream.target.key, address, ()))
        return destination is not None and not destination.closed

    def get(self, upstream, address: str, capabilities: tuple[str, ...] = ()) -> RemoteDestination:
        key = (upstream.target.key, address, capabilities)
        destination = self.by_key.get(key)
        if destination is None or destination.closed:
            destination = RemoteDestination(self, upstream, address, capabilities)
            self.by_key[key] = destination
            if self._timer is None:
                self._schedule(upstream.target.idle_timeout)
        return destination

    def _schedule(self, idle_timeout: float) -> None:
        self._timer = asyncio.get_running_loop().call_later(max(1.0, idle_timeout / 2), self._sweep)

    def _sweep(self) -> None:
        self._timer = None
        now = monotonic()
        shortest = None
        for key, destination in list(self.by_key.items()):
            timeout = destination.upstream.target.idle_timeout
            if destination.idle and now - destination.used_at >= timeout:
                del self.by_key[key]
                destination.close()
                destination.upstream.run_pending()
            else:
                shortest = timeout if shortest is None else min(shortest, timeout)
        if shortest is not None:
            self._schedule(shortest)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for destination in list(self.by_key.values()):
            destination.close()
        self.by_key.clear()
