"""Transactions forwarded to a primary: one upstream transaction per client transaction.

How this works
--------------
A client transaction whose first work is on a proxied link (a ``ProxyProducer``
or ``ProxyConsumer``) gets that link's upstream connection as its home
(``UpstreamHome``), when the primary has transactions: a known primary
without them (``proxy.upstream.primaries``: RabbitMQ) fails the work at once
with the reason. On that connection an ``UpstreamCoordinator`` (one per client
coordinator link and upstream connection, a link owner like every other,
``proxy.upstream.owner``) attaches a coordinator link and declares a
transaction there; the client's work on that primary then goes on with the
primary's txn-id:

* a transactional transfer (§4.4.1) is sent on the producer's upstream link
  with ``transactional-state`` (the primary's txn-id); the primary's answer
  goes back to the client with the client's txn-id and the primary's outcome;
* a transactional disposition (§4.4.2) is passed to the upstream delivery with
  the primary's txn-id and the client's outcome, and settled;
* the discharge is the primary's: its ``accepted`` or ``rejected`` is the
  client's answer (outcomes end to end).

Work that arrives before the primary answered the declare waits in the
transaction (``Transaction.waiting``) and goes in order once it has. The
primary refusing the coordinator (``link_refused``) fails what waits with
"primary X has no transactions"; the connection lost (``link_lost``) fails
every transaction forwarded on it (the primary rolled them back), and a
commit in flight then ends the client's coordinator link: its outcome at the
primary is unknown. Work for another connection fails the transaction, with
the reason: two primaries, this node and a primary, or one primary reached
over two connections (a rule's ``split_directions`` puts senders and
receivers on separate connections, and a transaction lives on one).
"""

from __future__ import annotations

import itertools
import logging
from collections import deque

from cproton import (
    PN_ACCEPTED,
    PN_MODIFIED,
    PN_RECEIVED,
    PN_REJECTED,
    pn_delivery_link,
    pn_delivery_remote_state,
    pn_delivery_settle,
    pn_delivery_settled,
    pn_link_credit,
)
from proton import Delivery, Link, Terminus

from proxy.amqp import engine
from proxy.amqp.termini import set_capabilities
from proxy.links.proxy_producer import ProxyProducer
from proxy.transactions.local import UnknownOutcome
from proxy.transactions.transaction import LOCAL, TxnState
from proxy.transactions.wire import (
    DECLARED,
    LOCAL_TRANSACTIONS,
    ROLLBACK,
    TRANSACTIONAL_STATE,
    encode_declare,
    encode_discharge,
    mark_transactional,
    read_declared,
    read_state,
    reject,
    set_outcome,
)
from proxy.upstream.owner import UplinkState, UpstreamLinkOwner

log = logging.getLogger("fedgate.transactions")

NOT_IMPLEMENTED = "amqp:not-implemented"
_names = itertools.count(1)
_WORKING = (TxnState.ACTIVE, TxnState.COMMITTING)


class UpstreamHome:
    """A forwarded transaction's home: one connection (pool member) to one primary."""

    __slots__ = ("pool", "member", "coordinator")

    def __init__(self, pool, member, coordinator) -> None:
        self.pool = pool
        self.member = member
        self.coordinator = coordinator

    def __eq__(self, other) -> bool:
        return isinstance(other, UpstreamHome) and other.member is self.member

    __hash__ = object.__hash__

    def describe(self) -> dict:
        display = self.pool.target.display
        return {"primary": display, "connection": self.member.index, "text": f"primary {display}"}


class UpstreamCoordinator(UpstreamLinkOwner):
    """Our coordinator link on one upstream connection: declares and discharges sent in order,
    each answered through its callback ``(delivery, failure)`` (delivery None: ``failure``)."""

    sender_upstream = True

    def __init__(self, table, pool, member) -> None:
        self.table = table
        self.upstream = pool
        self.display = pool.target.display
        self.outbox: deque = deque()  # (payload, answer) not sent yet
        self.sent: dict = {}  # upstream delivery -> answer
        self.tags = itertools.count(1)
        self.refused: str | None = None  # the primary refused our coordinator link
        self.leaving = False  # released once what it sent is answered
        self._move(UplinkState.WAITING)
        self.member = pool.add_to(self, member)

    # -- upstream lifecycle hooks (proxy.upstream.owner) ------------------------------------
    def link_name(self) -> str:
        return f"fedgate-txn-{next(_names)}"

    def configure_link(self, link: Link) -> None:
        link.target.type = Terminus.COORDINATOR  # §4.5.2
        set_capabilities(link.target, (LOCAL_TRANSACTIONS,))
        link.snd_settle_mode = Link.SND_UNSETTLED
        link.rcv_settle_mode = Link.RCV_FIRST

    def link_attached(self) -> None:
        if self.up_link.remote_target.type != Terminus.COORDINATOR:
            return  # a null target: the primary's detach (a refusal) follows
        self._flush()

    def on_upstream_flow(self) -> None:
        self._flush()

    def link_refused(self, condition) -> None:
        what = f"{condition.name}: {condition.description}" if condition is not None else "no error"
        self.refused = f"primary {self.display} has no transactions (it refused the coordinator: {what})"
        log.info("upstream %s: %s", self.display, self.refused)
        self._fail_all(self.refused)

    def link_lost(self) -> None:
        self._fail_all(f"the connection to primary {self.display} was lost: its transactions "
                       "there ended")
        self.table_lost()

    # -- requests ----------------------------------------------------------------------------
    def request(self, payload: bytes, answer) -> None:
        if self.refused is not None:
            answer(None, self.refused)
            return
        self.outbox.append((payload, answer))
        self._flush()

    def _flush(self) -> None:
        up = self.up_ptr
        sent = 0
        while self.outbox and self.up_attached and pn_link_credit(up) > 0:
            payload, answer = self.outbox.popleft()
            delivery = engine.send_message(up, str(next(self.tags)).encode(), payload)
            self.sent[delivery] = answer
            sent += 1
        if sent:
            self.member.mark_dirty()

    def on_upstream_delivery(self, delivery) -> None:
        state = pn_delivery_remote_state(delivery)
        if state == PN_RECEIVED or (not state and not pn_delivery_settled(delivery)):
            return  # no outcome yet
        answer = self.sent.pop(delivery, None)
        if answer is not None:
            answer(delivery, None)
        pn_delivery_settle(delivery)
        self.member.mark_dirty()
        if self.leaving and not self.sent and not self.outbox:
            self.release_upstream()
        self.table.handler.broker.run_pending()

    def _fail_all(self, reason: str) -> None:
        waiting = list(self.sent.values()) + [answer for _, answer in self.outbox]
        self.sent.clear()
        self.outbox.clear()
        for answer in waiting:
            answer(None, reason)
        if self.leaving:
            self.release_upstream()

    def table_lost(self) -> None:
        """Every open transaction forwarded through this connection is gone at the primary."""
        for txn in list(self.table.txns.values()):
            if isinstance(txn.home, UpstreamHome) and txn.home.coordinator is self:
                txn.upstream_id = None
                txn.fail(f"the connection to primary {self.display} was lost during the transaction")

    def leave(self) -> None:
        """No client coordinator uses this any more: released once its requests are answered."""
        self.leaving = True
        if not self.sent and not self.outbox:
            self.release_upstream()


# -- binding a transaction to a primary ------------------------------------------------------
def _bind(table, txn, endpoint) -> str | None:
    """Make ``endpoint``'s upstream connection ``txn``'s home; why it cannot be, or None."""
    pool, member = endpoint.upstream, endpoint.member
    display = pool.target.display
    if txn.home is None:
        if member is None or not member.is_up:
            reason = f"primary {display} is not connected"
        elif member.transactions_unsupported:
            reason = f"primary {display} has no transactions ({member.transactions_unsupported})"
        else:
            key = (txn.coordinator, member)
            coordinator = table.upstream_coordinators.get(key)
            if coordinator is None or coordinator.up_state is UplinkState.LEFT:
                coordinator = table.upstream_coordinators[key] = UpstreamCoordinator(table, pool, member)
            txn.home = UpstreamHome(pool, member, coordinator)
            _declare(table, txn)
            return None
        txn.fail(reason)
        return reason
    home = txn.home
    if home != LOCAL and home.member is not member and home.pool is pool:
        reason = (f"the transaction's links reach primary {display} over two connections "
                  "(split_directions puts senders and receivers on separate ones; a transaction "
                  "lives on one): set split_directions = false on the rule")
        txn.fail(reason)
        return reason
    if home == LOCAL or home.member is not member:
        return table.bind(txn, UpstreamHome(pool, member, None), f"primary {display}")
    return None


def _declare(table, txn) -> None:
    home = txn.home

    def answer(delivery, failure) -> None:
        if failure is None and pn_delivery_remote_state(delivery) == DECLARED:
            txn.upstream_id = read_declared(delivery)
            if txn.state not in _WORKING:  # rolled back meanwhile: end it there too
                home.coordinator.request(encode_discharge(txn.upstream_id, True), _ignore)
        elif failure is None:
            condition = Delivery.wrap(delivery).remote.condition
            txn.fail(f"primary {home.coordinator.display} refused the declare"
                     + (f" ({condition.name}: {condition.description})" if condition else ""))
        else:
            txn.fail(failure)
        waiting, txn.waiting = txn.waiting, []
        for step in waiting:
            step()

    home.coordinator.request(encode_declare(), answer)


def _ignore(delivery, failure) -> None:
    pass


def _later(txn, step) -> None:
    """Run ``step`` once the primary answered the declare (now if it has)."""
    if txn.upstream_id is None and txn.state in _WORKING and txn.failure is None:
        txn.waiting.append(step)
    else:
        step()


# -- work --------------------------------------------------------------------------------------
def post(table, producer, delivery, payload: bytes) -> None:
    """A transactional transfer on a proxied link (§4.4.1), sent on with the primary's txn-id.

    Counted in ``txn.unanswered`` until the primary answers it (or it is refused): a commit
    is discharged on the primary only after every transfer of it has been answered."""
    _, txn, refusal = table.find(delivery)
    if refusal is None:
        reason = _bind(table, txn, producer)
        if reason is not None:
            refusal = (NOT_IMPLEMENTED, reason)
    if refusal is not None:
        _refuse(table, delivery, refusal)
        return
    held = engine.hold(delivery)
    txn.unanswered += 1
    table.posted.add(held)  # a disposition re-stating its state is not "too late" (late_state)
    ended = []

    def finish() -> None:  # once per posting, whatever became of it
        if not ended:
            ended.append(True)
            table.posted.discard(held)
            _answered(txn)

    def send() -> None:
        if producer.closed:
            finish()
        elif txn.upstream_id is None or txn.state not in _WORKING:
            _refuse(table, held, (ROLLBACK, txn.failure or "the transaction has ended"))
            finish()
        else:
            _transmit(table, txn, producer, held, payload, finish)

    _later(txn, send)


def _answered(txn) -> None:
    txn.unanswered -= 1
    if not txn.unanswered:
        steps, txn.when_answered = txn.when_answered, []
        for step in steps:
            step()


def _after_work(txn, step) -> None:
    """Run ``step`` once every forwarded transfer of ``txn`` has been answered."""
    if txn.unanswered:
        txn.when_answered.append(step)
    else:
        step()


def _refuse(table, delivery, refusal) -> None:
    if pn_delivery_settled(delivery):
        pn_delivery_settle(delivery)
    else:
        reject(delivery, *refusal)
    table.handler.mark_dirty()


def _transmit(table, txn, producer, delivery, payload: bytes, finish) -> None:
    up_txn_id = txn.upstream_id
    display = producer.upstream.target.display

    def answered(up_delivery) -> None:
        finish()
        if producer.closed:
            if up_delivery is not None:
                pn_delivery_settle(up_delivery)
            return
        if up_delivery is None:
            txn.fail(f"the link to primary {display} was lost")
            _refuse(table, delivery, (ROLLBACK, txn.failure))
            return
        state = pn_delivery_remote_state(up_delivery)
        fields: tuple = ()
        if state == TRANSACTIONAL_STATE:
            outcome = read_state(up_delivery)
            state, fields = (outcome.outcome or PN_ACCEPTED, outcome.fields) if outcome else (PN_ACCEPTED, ())
        if state == PN_REJECTED:
            condition = Delivery.wrap(up_delivery).remote.condition
            txn.fail(f"primary {display} rejected a message"
                     + (f" ({condition.name}: {condition.description})" if condition else ""))
            _refuse(table, delivery, (condition.name if condition else ROLLBACK, txn.failure))
        else:
            if not pn_delivery_settled(delivery):
                set_outcome(delivery, txn.txn_id, state or PN_ACCEPTED, fields)
            pn_delivery_settle(delivery)
        pn_delivery_settle(up_delivery)
        txn.forwarded += 1
        table.handler.mark_dirty()

    def go(ok: bool = True) -> None:
        """Send now (``ok``), or refuse: the link to the primary was lost before it went."""
        if producer.closed:
            finish()
            return
        if not ok or txn.state not in _WORKING or txn.upstream_id != up_txn_id:
            txn.fail(txn.failure or f"the link to primary {display} was lost")
            _refuse(table, delivery, (ROLLBACK, txn.failure))
            finish()
            return
        up = producer.up_ptr
        up_delivery = engine.send_message(up, str(next(producer.tags)).encode(), payload)
        mark_transactional(up_delivery, up_txn_id)  # §4.4.1: written with the transfer
        if producer.txn_inflight is ProxyProducer.txn_inflight:
            producer.txn_inflight = {}
        producer.txn_inflight[up_delivery] = answered
        producer.member.sent += 1
        producer.member.mark_dirty()

    if producer.can_send_now():
        go()
    else:
        if producer.txn_pending is ProxyProducer.txn_pending:
            producer.txn_pending = deque()
        producer.txn_pending.append(go)


def retire(table, consumer, delivery, up_delivery) -> None:
    """A transactional disposition on a proxied link (§4.4.2), passed on with the primary's id."""
    state, txn, refusal = table.find(delivery)
    pn_delivery_settle(delivery)
    reason = refusal[1] if refusal is not None else _bind(table, txn, consumer)
    if up_delivery is None:  # its upstream link is gone: the primary sends it again
        if txn is not None:
            txn.fail(f"the link to primary {consumer.upstream.target.display} was lost before a "
                     "settle in the transaction reached it")
        return
    held = engine.hold(up_delivery)
    link = pn_delivery_link(up_delivery)

    def give_back() -> None:
        # back to the primary's queue, counted as a failed delivery (§3.4.5)
        wrapped = Delivery.wrap(held)
        wrapped.local.failed = True
        wrapped.update(PN_MODIFIED)
        pn_delivery_settle(held)
        consumer.member.mark_dirty()

    if reason is not None:
        give_back()
        return

    def forward() -> None:
        if consumer.up_ptr != link:
            return  # the upstream link ended meanwhile: the delivery went with it
        if txn.upstream_id is None or txn.state not in _WORKING:
            give_back()
            return
        set_outcome(held, txn.upstream_id, state.outcome or PN_ACCEPTED, state.fields)
        pn_delivery_settle(held)
        txn.forwarded += 1
        consumer.member.mark_dirty()

    _later(txn, forward)


# -- discharge ---------------------------------------------------------------------------------
def commit(table, txn, done) -> None:
    """The client's commit, made by the primary; ``done`` gets its answer."""
    home = txn.home
    display = home.coordinator.display

    def answer(delivery, failure) -> None:
        if failure is not None:
            done(UnknownOutcome(f"{failure} during the commit: its outcome there is unknown"))
        elif pn_delivery_remote_state(delivery) == PN_ACCEPTED:
            done(None)
        else:
            condition = Delivery.wrap(delivery).remote.condition
            done(f"primary {display} refused the commit"
                 + (f" ({condition.name}: {condition.description})" if condition else ""))

    def discharge() -> None:
        if txn.upstream_id is None or txn.failure is not None:
            if txn.upstream_id is not None:
                home.coordinator.request(encode_discharge(txn.upstream_id, True), _ignore)
            done(f"rolled back: {txn.failure or 'not declared on primary ' + display}")
            return
        home.coordinator.request(encode_discharge(txn.upstream_id, False), answer)

    _later(txn, lambda: _after_work(txn, discharge))


def rollback(table, txn) -> None:
    """Roll the primary's transaction back (fire and forget: the client's answer is ours)."""
    home = txn.home
    if home.coordinator is not None and txn.upstream_id is not None:
        home.coordinator.request(encode_discharge(txn.upstream_id, True), _ignore)
    waiting, txn.waiting = txn.waiting, []
    txn.failure = txn.failure or "rolled back"
    for step in waiting:
        step()


def coordinator_gone(table, coordinator) -> None:
    for key in [k for k in table.upstream_coordinators if k[0] is coordinator]:
        table.upstream_coordinators.pop(key).leave()


def close_all(table) -> None:
    for upstream in table.upstream_coordinators.values():
        upstream.leave()
    table.upstream_coordinators.clear()
