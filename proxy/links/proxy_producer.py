"""Proxy producers: a client's sending link bridged to a sender on a primary.

How this works
--------------
``ProxyProducer`` (client sends; upstream is our Sender):
    The client gets credit only as the primary grants it, and at most a window of
    messages held for the primary (``sync_credit``). The window starts at
    ``credit_window`` and adapts (``_epoch_done``): it doubles, up to
    ``WINDOW_GROWTH`` x ``credit_window``, after a window's worth of outcomes during which
    the window held the client back while the primary kept up (its credit sufficed,
    nothing waited to be written to it, and the outcomes came back at least
    ``1 / EPOCH_SLOWER`` faster per message than before the last growth); it halves, not
    below ``credit_window``, after one during which the primary did not keep up. Above
    ``credit_window`` it is also bounded in bytes: at most ``window_bytes`` (the broker's
    ``producer_window_bytes``) of the largest message seen so far. Each client delivery
    is forwarded and settled with the primary's outcome (end-to-end
    at-least-once). Deliveries in flight when the upstream connection breaks are
    kept and sent again, so the client sees the real outcome rather than a
    spurious release; duplicates are possible, loss is not. They are sent again
    alone, as suspects (``proxy.upstream.suspects``): a message the primary cannot take
    is rejected to its client after ``max_send_failures`` instead of ending the
    shared connection for everyone at every replay. The link sends nothing
    else until its suspects are settled, so its order holds.

A transactional transfer (§4.4.1) goes to ``handler.transactions``, which forwards it
with the primary's txn-id (``proxy.transactions.forward``: ``txn_pending`` and
``txn_inflight``); it is never replayed as a suspect (the primary's transaction ends with
the connection).

The base it shares with ``ProxyConsumer`` (the client link, the pool member,
the upstream link's lifecycle) is ``proxy.links.proxy_links._ProxyEndpoint``.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque

from cproton import (
    PN_ACCEPTED,
    PN_REJECTED,
    pn_delivery_remote_state,
    pn_delivery_settle,
    pn_delivery_settled,
    pn_delivery_update,
    pn_link_credit,
    pn_link_flow,
)
from proton import Delivery, Link

from proxy.amqp.engine import (
    RELAY_IN_PYTHON,
    beyond_credit,
    link_session,
    session_outgoing_bytes,
    fast_relay,
    fast_relay_kept,
    read_transfer,
    relay_transfer,
    send_message,
    settle_accepted,
)
from proxy.amqp.outcomes import TRANSACTIONAL_STATE, copy_outcome, outcome_of
from proxy.links.proxy_links import _ProxyEndpoint

log = logging.getLogger("fedgate.proxy")

# The producer window (module doc): grown at most to this many times ``credit_window``
# (RabbitMQ 3.10 grants 65,536 per link; a primary's own credit bounds it too) ...
WINDOW_GROWTH = 16
# ... after an epoch (a window's worth of outcomes) at most this much longer than the one
# before the last growth (doubling the window must buy at least 2 / 1.5 the rate), with
# EPOCH_SLACK seconds of slack for epochs too short to time ...
EPOCH_SLOWER = 1.5
EPOCH_SLACK = 0.0005
# ... and after a growth that did not pay, this many epochs before the next try.
HOLD_EPOCHS = 8


class ProxyProducer(_ProxyEndpoint):
    """Client sends to an address on a primary."""

    sender_upstream = True
    # transactional transfers forwarded with the primary's txn-id (proxy.transactions.forward):
    # upstream delivery -> callback(delivery or None: lost), and sends waiting for credit
    # (callables: go(True) sends, go(False) refuses). Shared empty ones until first used.
    txn_inflight: dict = {}
    txn_pending: deque = deque()
    credited = False  # the client has had credit from us (the declare fence, below)

    def __init__(self, handler, client_link, upstream, remote_address,
                 capabilities: tuple[str, ...] = (), rule=None, properties: dict | None = None) -> None:
        self.properties = properties  # the upstream attach's link properties (configure_link)
        self.pending: deque = deque()  # (payload, client delivery | None) not yet sent upstream
        self.inflight: dict = {}  # upstream delivery -> (payload, client delivery | None)
        self.suspects = 0  # deliveries being sent again alone (proxy.upstream.suspects)
        self.received = 0
        broker = handler.broker
        self.base = self.window = broker.credit_window  # sync_credit; adapts (_epoch_done)
        self.most = self.base * getattr(broker, "producer_window_growth", 1)
        self.window_bytes = getattr(broker, "producer_window_bytes", 0)  # bound above ``base``
        self.refill_every, self.unsynced = max(1, self.window // 4), 0  # settled since the last sync
        self.largest = 0  # the largest message seen (the byte bound's unit)
        # the epoch under way: outcomes left in it, when it began, whether the window held the
        # client back, whether the primary fell behind; the last growth's (window, seconds)
        self.epoch_left, self.epoch_began = self.window, 0.0
        self.limited = self.lagging = False
        self.grown_from = None
        self.hold = 0
        super().__init__(handler, client_link, upstream, remote_address, capabilities, rule)

    def configure_upstream(self, link: Link) -> None:
        link.target.copy(self.link.remote_target)  # durability etc. as the client asked
        link.target.address = self.remote_address
        link.source.copy(self.link.remote_source)
        link.snd_settle_mode = Link.SND_UNSETTLED
        link.rcv_settle_mode = Link.RCV_FIRST

    def _drop_transactional(self) -> None:
        """The upstream link is gone: so is the primary's transaction; what was forwarded in it
        (or waits to be) is refused by its answer callback (proxy.transactions.forward)."""
        answers, self.txn_inflight = list(self.txn_inflight.values()), ProxyProducer.txn_inflight
        pending, self.txn_pending = list(self.txn_pending), ProxyProducer.txn_pending
        for answer in answers:
            answer(None)
        for go in pending:
            go(False)

    def link_lost(self) -> None:
        member = self.member
        if self.txn_inflight or self.txn_pending:
            self._drop_transactional()
        # sent again alone, in the original order, before anything else (proxy.upstream.suspects)
        self.suspects += self.upstream.suspects.take(self, self.remote_address, self.inflight, member,
                                                     self._suspect_settled)

    def _suspect_settled(self, client_delivery, state: int, up_delivery, condition) -> None:
        """A suspect's outcome: the primary's, or rejected with ``condition`` at the limit."""
        self.suspects -= 1
        if not self.closed:
            if up_delivery is not None and state:
                copy_outcome(up_delivery, client_delivery, state)
            elif up_delivery is not None:
                pn_delivery_update(client_delivery, PN_ACCEPTED)
            else:
                wrapped = Delivery.wrap(client_delivery)
                wrapped.local.condition = condition
                wrapped.update(PN_REJECTED)
            pn_delivery_settle(client_delivery)
            self.handler.mark_dirty()
            if not self.suspects:
                self._send_pending()
                self.sync_credit()

    def on_upstream_flow(self) -> None:
        self._send_pending()
        self.sync_credit()

    def sync_credit(self) -> None:
        """The primary's credit minus what is queued, within the window (topped up a quarter
        at a time). RabbitMQ 3.10 grants 65,536 per link: passed on whole, clients outran it
        and proton's session held the rest (13 MB in 2 s, 8 senders), walked on every output."""
        if self.closed:
            return
        settled, self.unsynced = self.unsynced, 0
        up_credit = pn_link_credit(self.up_ptr) if self.up_ptr is not None and self.up_attached else 0
        pending = len(self.pending) + len(self.txn_pending)
        window = self.window
        if window > self.base and self.largest:  # above credit_window: bounded in bytes too
            window = max(self.base, min(window, self.window_bytes // self.largest))
        by_window = window - pending - len(self.inflight) - len(self.txn_inflight)
        client_credit = pn_link_credit(self.link_ptr)
        if self.most > self.base:
            if pending or (up_credit and self._behind()):
                self.lagging = True  # messages wait for the primary's credit, or to be written
            elif by_window < up_credit and client_credit == 0 and self.up_attached:
                self.limited = True  # the client waits for credit the window holds back
            if not self.epoch_began:
                self.epoch_began = asyncio.get_running_loop().time()
            elif settled:
                self.epoch_left -= settled
                if self.epoch_left <= 0:
                    self._epoch_done()
        allowed = min(up_credit - pending, by_window)
        want = allowed - client_credit
        if want > 0:
            pn_link_flow(self.link_ptr, want)
            self.handler.mark_dirty()
            if not self.credited:
                self._first_credit()

    @property
    def awaits_first_credit(self) -> bool:
        """No credit given yet (the primary has not granted any): a transaction declared on this
        connection is answered after it (proxy.transactions.coordinator's declare fence)."""
        return not self.credited and not self.closed

    def _first_credit(self) -> None:
        self.credited = True
        transactions = self.handler.transactions
        if transactions is not None and transactions.held_declares:
            transactions.senders_ready()

    def _behind(self) -> bool:
        """More than ``max_output_buffer`` waits to be written to the primary (in proton, or in
        the connection's write buffer), or the connection stopped taking bytes: it lags."""
        member = self.member
        if member is None:
            return False
        if not getattr(member, "writable", True):
            return True
        waiting = session_outgoing_bytes(link_session(self.up_ptr))
        transport = getattr(getattr(member, "protocol", None), "transport", None)
        if transport is not None:
            waiting += transport.get_write_buffer_size()
        return waiting > self.handler.broker.max_output_buffer

    def _epoch_done(self) -> None:
        """A window's worth of outcomes came back: grow, keep or shrink the window."""
        now = asyncio.get_running_loop().time()
        took = now - self.epoch_began
        window = self.window
        if self.lagging:
            self.window = max(self.base, window // 2)
            self.grown_from = None
        elif self.hold:
            self.hold -= 1
        elif self.limited:
            grown = self.grown_from
            if grown is not None and grown[0] < window and took > grown[1] * EPOCH_SLOWER + EPOCH_SLACK:
                self.window = grown[0]  # the last growth bought no rate: back, and wait
                self.grown_from = None
                self.hold = HOLD_EPOCHS
            elif window < self.most and (not self.largest or window * self.largest < self.window_bytes):
                self.window = min(self.most, window * 2)
                self.grown_from = (window, took)
        self.limited = self.lagging = False
        self.epoch_left, self.epoch_began = self.window, now
        self.refill_every = max(1, self.window // 4)

    def can_send_now(self) -> bool:
        """Whether a message would go to the primary at once (nothing queued before it)."""
        up = self.up_ptr
        return (up is not None and self.up_attached and not self.pending and not self.suspects
                and not self.txn_pending and pn_link_credit(up) > 0)

    def on_delivery(self, delivery) -> None:
        if beyond_credit(self.link_ptr):
            self.handler.refuse_beyond_credit(self.link)
            return
        transactions = self.handler.transactions
        if transactions is not None and pn_delivery_remote_state(delivery) == TRANSACTIONAL_STATE:
            payload = read_transfer(self.link_ptr, delivery, self.handler.broker.max_message_size)
            if payload is False:
                self.handler.refuse_oversized(self.link)
            elif payload is not None:
                self.received += 1
                transactions.post_upstream(self, delivery, payload)  # §4.4.1, forwarded
            return
        up = self.up_ptr
        max_size = self.handler.broker.max_message_size
        if (not self.pending and up is not None and self.up_attached and not self.suspects
                and pn_link_credit(up) > 0):  # the common case: straight on, nothing queued
            tag = next(self.tags)
            if pn_delivery_settled(delivery):
                # pre-settled by the client (at-most-once): nothing to replay, so nothing kept;
                # the bytes go from link to link through the read buffer
                sent = fast_relay(self.link_ptr, delivery, up, tag, max_size)
                if sent is RELAY_IN_PYTHON:
                    sent = relay_transfer(self.link_ptr, delivery, up, tag, max_size)
                if sent is None:
                    return
                if sent is False:
                    self.handler.refuse_oversized(self.link)
                    return
                pn_delivery_settle(sent)
                pn_delivery_settle(delivery)
                self.received += 1
                member = self.member
                member.sent += 1
                member.mark_dirty()
                self.unsynced += 1
                if self.unsynced >= self.refill_every:
                    self.sync_credit()
                return
            kept = fast_relay_kept(self.link_ptr, delivery, up, tag, max_size)
            if kept is not RELAY_IN_PYTHON:  # sent upstream; the bytes kept for a replay
                payload, up_delivery = kept
                if len(payload) > self.largest:
                    self.largest = len(payload)
                self.received += 1
                self.inflight[up_delivery] = (payload, delivery)
                member = self.member
                member.sent += 1
                member.mark_dirty()
                return
        payload = read_transfer(self.link_ptr, delivery, max_size)
        if payload is None:
            return
        if payload is False:
            self.handler.refuse_oversized(self.link)
            return
        self.received += 1
        if len(payload) > self.largest:
            self.largest = len(payload)
        if pn_delivery_settled(delivery):  # pre-settled by the client: at-most-once
            pn_delivery_settle(delivery)
            delivery = None
        if (not self.pending and up is not None and self.up_attached and not self.suspects
                and pn_link_credit(up) > 0):  # the common case: straight on, nothing queued
            up_delivery = send_message(up, str(next(self.tags)).encode(), payload)
            if delivery is None:
                pn_delivery_settle(up_delivery)
                self.unsynced += 1
            else:
                self.inflight[up_delivery] = (payload, delivery)  # kept for a replay
            member = self.member
            member.sent += 1
            member.mark_dirty()
            if self.unsynced >= self.refill_every:
                self.sync_credit()
            return
        self.pending.append((payload, delivery))
        self._send_pending()

    def take_over(self, payload: bytes, delivery) -> None:
        """A transfer another endpoint of this link held (proxy.replication.address.park): sent
        to the primary after what waits (``delivery`` None: the client pre-settled it)."""
        self.received += 1
        self.pending.append((payload, delivery))
        self._send_pending()
        self.sync_credit()

    def _send_pending(self) -> None:
        up = self.up_ptr
        if up is None or not self.up_attached or self.suspects:
            return
        pending = self.pending
        sent = 0
        while pending and pn_link_credit(up) > 0:
            item = pending.popleft()
            payload, client_delivery = item
            up_delivery = send_message(up, str(next(self.tags)).encode(), payload)
            if client_delivery is None:
                pn_delivery_settle(up_delivery)
            else:
                self.inflight[up_delivery] = item
            sent += 1
        if sent:
            self.member.sent += sent
            self.member.mark_dirty()
        txn_pending = self.txn_pending
        while txn_pending and not pending and pn_link_credit(up) > 0:
            txn_pending.popleft()(True)

    def on_upstream_delivery(self, delivery) -> None:
        """The primary's outcome: pass it to the client, then settle both."""
        item = self.inflight.get(delivery)
        if item is None and delivery in self.txn_inflight:  # forwarded in a transaction
            if outcome_of(delivery) is not None:
                self.txn_inflight.pop(delivery)(delivery)
                self.unsynced += 1
                if self.unsynced >= self.refill_every:
                    self.sync_credit()
            return
        client_delivery = item[1] if item is not None and not self.closed else None
        if settle_accepted(delivery, client_delivery):  # nearly always: no helper calls
            if item is not None:
                del self.inflight[delivery]
            if client_delivery is not None:
                self.handler.mark_dirty()
            self.unsynced += 1
            if self.unsynced >= self.refill_every:
                self.sync_credit()
            return
        state = outcome_of(delivery)
        if state is None:
            return  # no outcome yet (§3.4.1: received is not terminal)
        item = self.inflight.pop(delivery, None)
        pn_delivery_settle(delivery)
        if item is None:
            return
        client_delivery = item[1]
        if client_delivery is not None and not self.closed:
            if state:
                copy_outcome(delivery, client_delivery, state)
            else:
                pn_delivery_update(client_delivery, PN_ACCEPTED)
            pn_delivery_settle(client_delivery)
            self.handler.mark_dirty()
        self.sync_credit()  # room in the window

    def parked(self) -> None:
        """The primary ended our link because the queue moved (a fenced primary ends every
        link): what it had not answered on that link never will be. It goes again first, in
        order, as a window, on the next link: ``rehome`` to a new primary, or ``reattach`` when
        the same node claims the queue again (docs/nemesis.md finding 23: left in ``inflight``,
        those filled the window and the client waited for outcomes that never came)."""
        if self.txn_inflight or self.txn_pending:  # the old primary's transaction ends here
            self._drop_transactional()
        if self.inflight:
            self.pending.extendleft(reversed(self.inflight.values()))
            self.inflight.clear()

    def rehome(self, upstream) -> None:
        """The address moved to another primary (proxy.replication): what the old one has not
        answered goes to the new one first, in order, then the link goes on there. Sent again
        as a window on the new link, not as suspects (one at a time, each waiting for its
        outcome: hundreds of round trips after a failover, docs/nemesis.md finding 16): the
        queue moved, no connection ended with them in flight. Suspects of this link still
        waiting go first, and what it had in flight after them, the same way, in order."""
        if self.closed:
            return
        if self.txn_inflight or self.txn_pending:  # the old primary's transaction ends here
            self._drop_transactional()
        moved = self.upstream.suspects.hand_over(self) if self.suspects else []
        old_member = self.member
        self.release_upstream()
        self.upstream = upstream
        upstream.suspects.adopt(moved)
        if self.inflight:
            if moved:
                self.suspects += upstream.suspects.take(self, self.remote_address, self.inflight,
                                                        old_member, self._suspect_settled)
            else:
                self.pending.extendleft(reversed(self.inflight.values()))
                self.inflight.clear()
        self.join_pool()

    def detached(self) -> None:
        """Client link gone: its unsettled sends have no one to report to."""
        self.closed = True
        self.pending.clear()
        if self.suspects:
            self.upstream.suspects.cancel(self)
            self.suspects = 0
        self.release_upstream()
