"""A client connection's transactions: its coordinator links and the work they declare.

How this works
--------------
A client that attaches a sender whose target is a ``coordinator`` (§4.2; Qpid
JMS does for each transacted session) gets a ``Coordinator`` endpoint: our
receiver, answering with the capabilities we offer (local transactions,
several per session, across sessions). Each message on it is a declare or a
discharge (``proxy.transactions.wire``).

``ConnectionTransactions`` is one per client connection (``ClientHandler``
keeps it as ``transactions``, None until the first coordinator link): the
open transactions by txn-id. A txn-id is good on every link of the
connection (§4.1); the work arrives from the link endpoints:

* ``post`` — a transactional transfer to a local queue, an exchange or the
  anonymous relay (§4.4.1): held in the transaction, answered at once with
  ``transactional-state`` carrying ``accepted`` and settled;
* ``retire`` — a client's transactional disposition for a message of a local
  queue (§4.4.2): settled, the outcome held until the discharge;
* ``post_upstream`` / ``retire_upstream`` — the same on a proxied link: the
  transaction is forwarded (``proxy.transactions.forward``).

A discharge with ``fail`` rolls back and is accepted. A commit is applied
(``proxy.transactions.local``, or by the primary) and accepted, or rejected
with ``amqp:transaction:rollback`` and the reason (a transaction made
``FAILED`` by work it could not take, a journal that failed, a primary that
refused). A declare beyond ``[limits] max_transactions_per_connection`` is
rejected with ``amqp:resource-limit-exceeded``. An unknown txn-id is
rejected with ``amqp:transaction:unknown-id``. The transactions of a
coordinator link that ends, or of a connection that ends, are rolled back.

The declare fence (issue #41). A controller may send a transaction's transfers on a
link that has no credit yet: its library queues them, and the discharge, on the
coordinator link that has credit, overtakes them on the wire (proton's
``Transaction.send`` then ``commit()`` does exactly this). A local queue's producer
link gets credit with its attach, before a declare can be answered; a proxied one
only once its primary attached and granted credit. So a declare is answered once no
sender link of the connection still waits for its first credit (``awaits_first_credit``:
a proxied producer before its primary's credit, a link held for a replicated queue's
owner), or after ``DECLARE_FENCE`` seconds: then the client has the credit before it
learns the txn-id, as with a local queue. Transfers that arrive after their
transaction was discharged are still refused with ``amqp:transaction:unknown-id``,
saying the discharge came first (``discharged``: the last ``DISCHARGED_KEPT`` ids).
"""

from __future__ import annotations

import logging

from cproton import (
    PN_ACCEPTED,
    pn_delivery_settle,
    pn_delivery_settled,
    pn_delivery_update,
    pn_link_credit,
    pn_link_flow,
)
from proton import Link

from proxy.amqp import engine
from proxy.amqp.termini import set_capabilities
from proxy.transactions import forward
from proxy.transactions.late_state import LateStateWatch
from proxy.transactions.local import LocalCommit, UnknownOutcome, release_held, rollback_local
from proxy.transactions.transaction import LOCAL, Retirement, Transaction, TxnState
from proxy.transactions.wire import (
    CAPABILITIES,
    ROLLBACK,
    TIMEOUT,
    UNKNOWN_ID,
    ControlError,
    Declare,
    accepted_template,
    answer_accepted,
    parse_control,
    posting_key,
    read_state,
    answer_declared,
    reject,
    state_key,
)

log = logging.getLogger("fedgate.transactions")
ACTIVE = TxnState.ACTIVE

NOT_IMPLEMENTED = "amqp:not-implemented"
RESOURCE_LIMIT = "amqp:resource-limit-exceeded"
DECODE_ERROR = "amqp:decode-error"
CONTROL_CREDIT = 16  # declares and discharges a controller may have in flight
MAX_CONTROL_SIZE = 64 * 1024
DECLARE_FENCE = 5.0  # seconds a declare waits for the connection's senders' first credit
FENCE_CHECK = 0.01  # how often a held declare looks again (a proxied producer also says so)
DISCHARGED_KEPT = 64  # ids of discharged transactions remembered per connection (for the reason)


class Coordinator(engine.ClientLinkEndpoint):
    """The client's coordinator link (§4.2). Our side is a proton Receiver."""

    __slots__ = ("handler", "link_ptr", "table", "received", "attached")
    address = None

    def __init__(self, handler, link: Link, table: "ConnectionTransactions") -> None:
        self.handler = handler
        self.table = table
        self.received = 0
        self.attached = True
        self.link_ptr = engine.hold(link._impl)
        link.source.copy(link.remote_source)
        link.target.copy(link.remote_target)  # a coordinator target (§4.5.2) ...
        set_capabilities(link.target, CAPABILITIES)  # ... with what we offer (§4.5.7)
        link.snd_settle_mode = link.remote_snd_settle_mode
        link.rcv_settle_mode = Link.RCV_FIRST
        link.open()
        handler.links[self.link_ptr] = self
        pn_link_flow(self.link_ptr, CONTROL_CREDIT)
        handler.mark_dirty()

    def on_delivery(self, delivery) -> None:
        handler = self.handler
        payload = self.read_whole(delivery, MAX_CONTROL_SIZE)
        if payload is None:
            return
        self.received += 1
        try:
            control = parse_control(payload)
        except ControlError as exc:
            reject(delivery, DECODE_ERROR, f"coordinator message: {exc}")
        else:
            if isinstance(control, Declare):
                self.table.declare(self, delivery, control)
            else:
                self.table.discharge(self, delivery, control)
        if pn_link_credit(self.link_ptr) <= CONTROL_CREDIT // 2:
            pn_link_flow(self.link_ptr, CONTROL_CREDIT - pn_link_credit(self.link_ptr))
        handler.mark_dirty()

    def on_flow(self) -> None:
        pass

    def detached(self) -> None:
        self.attached = False
        self.table.coordinator_gone(self)


class ConnectionTransactions:
    """The open transactions of one client connection, by txn-id."""

    def __init__(self, manager, handler) -> None:
        self.manager = manager
        self.handler = handler
        self.txns: dict[bytes, Transaction] = {}
        self.keys: dict[bytes, Transaction] = {}  # the encoded state of its transfers -> an open one
        self.memory = handler.broker.queues.memory  # held postings count against max_memory
        self.upstream_coordinators: dict = {}  # (coordinator, member) -> forward.UpstreamCoordinator
        self.posted: set = set()  # client deliveries forwarded in a transaction, unanswered
        self.held_declares: list = []  # (delivery, txn, since) waiting for senders' credit
        self.fence_timer = None
        self.discharged: dict[bytes, str] = {}  # txn-id -> "committed" / "rolled back", newest last
        connection = handler.server_connection
        self.late_watch = (LateStateWatch(self, connection.transport_ptr, connection.connection_ptr)
                           if connection is not None and connection.transport_ptr is not None else None)

    # -- declare and discharge (§4.3) ---------------------------------------------------------
    def declare(self, coordinator: Coordinator, delivery, declare: Declare) -> None:
        manager = self.manager
        if declare.global_id is not None:
            manager.stats.refused += 1
            reject(delivery, NOT_IMPLEMENTED, "distributed transactions (global-id) are not offered")
            return
        limit = manager.max_per_connection
        if limit and len(self.txns) >= limit and not self.handler.trusted:  # (another worker's)
            manager.stats.refused += 1
            reject(delivery, RESOURCE_LIMIT, f"{len(self.txns)} transactions open on this "
                                             f"connection (max_transactions_per_connection {limit})")
            return
        txn = Transaction(manager.new_id(), coordinator, manager.now())
        self.txns[txn.txn_id] = txn
        txn.key, txn.answer = posting_key(txn.txn_id), accepted_template(txn.txn_id)
        self.keys[txn.key] = txn  # its transfers find it by their state's encoding
        manager.opened()
        if self.held_declares or self._senders_waiting():  # the declare fence (module note)
            self.held_declares.append((engine.hold(delivery), txn, manager.now()))
            self._arm_fence()
            return
        answer_declared(delivery, txn.txn_id, txn.key)  # §4.5.4

    def _senders_waiting(self) -> bool:
        return any(getattr(endpoint, "awaits_first_credit", False)
                   for endpoint in self.handler.links.values())

    def _arm_fence(self) -> None:
        if self.fence_timer is None:
            self.fence_timer = self.manager.call_later(FENCE_CHECK, self.senders_ready)

    def senders_ready(self) -> None:
        """Answer the held declares once no sender waits for its first credit (or the fence's
        time is up for them); called by the fence's timer and by a proxied producer's first
        credit."""
        if self.fence_timer is not None:
            self.fence_timer.cancel()
            self.fence_timer = None
        if not self.held_declares:
            return
        waiting = self._senders_waiting()
        now = self.manager.now()
        while self.held_declares:
            delivery, txn, since = self.held_declares[0]
            if waiting and now - since < DECLARE_FENCE and txn.coordinator.attached:
                break
            self.held_declares.pop(0)
            if txn.coordinator.attached and txn.open:
                answer_declared(delivery, txn.txn_id, txn.key)
        if self.held_declares:
            self._arm_fence()
        self.handler.mark_dirty()
        self.manager.call_later(0, self.handler.broker.run_pending)

    def discharge(self, coordinator: Coordinator, delivery, discharge) -> None:
        txn = self.txns.get(discharge.txn_id)
        if txn is None or not txn.open:
            what = "is being discharged" if txn is not None else "is not open on this connection"
            reject(delivery, UNKNOWN_ID, f"transaction {discharge.txn_id!r} {what}")
            return
        if discharge.fail or txn.state is TxnState.FAILED:
            self.rollback(txn)
            if discharge.fail:
                self._answer(delivery, None)
            else:  # a commit of a transaction that could not take all its work
                self._answer(delivery, f"rolled back: {txn.failure}")
            return
        txn.move(TxnState.COMMITTING)
        txn.started = self.manager.now()  # from now on: how long the commit has waited
        held = engine.hold(delivery)  # answered later: kept valid meanwhile

        def done(error) -> None:
            if txn.state is TxnState.COMMITTING:  # once: a late answer changes nothing
                self._committed(txn, held, error)

        txn.committed = done

        if txn.home is None:
            done(None)
        elif txn.home == LOCAL:
            manager = self.manager
            LocalCommit(self.handler.broker, txn, done, call_later=manager.call_later,
                        barrier_timeout=manager.timeout).start()
        else:
            forward.commit(self, txn, done)

    def _forget(self, txn: Transaction) -> None:
        if self.txns.pop(txn.txn_id, None) is not None:
            discharged = self.discharged
            discharged[txn.txn_id] = "being committed" if txn.state is TxnState.COMMITTING else "rolled back"
            if len(discharged) > DISCHARGED_KEPT:
                del discharged[next(iter(discharged))]
        if txn.key is not None:
            self.keys.pop(txn.key, None)

    def _committed(self, txn: Transaction, delivery, error) -> None:
        self._forget(txn)
        self.discharged[txn.txn_id] = "committed" if error is None else "rolled back"
        txn.move(TxnState.COMMITTED if error is None else TxnState.ROLLED_BACK)
        self.manager.closed(txn, "committed" if error is None else
                            "unknown" if isinstance(error, UnknownOutcome) else "rolled_back")
        coordinator = txn.coordinator
        if coordinator.attached:  # else nobody to answer; what was decided stands
            if isinstance(error, UnknownOutcome):  # §4.3: the controller learns it is unknown
                self.handler.close_link(coordinator.link, TIMEOUT, (
                    f"the outcome of the commit of {txn.txn_id.decode('latin-1')} is unknown: {error}"))
            else:
                self._answer(delivery, error)
        # the answer may come from the journal, a primary or a queue's barrier: written out
        # in the next turn of the loop (never from inside the pump that is running now)
        self.manager.call_later(0, self.handler.broker.run_pending)

    def _answer(self, delivery, error: str | None) -> None:
        if error is None:
            pn_delivery_update(delivery, PN_ACCEPTED)
            pn_delivery_settle(delivery)
        else:
            reject(delivery, ROLLBACK, error)
        self.handler.mark_dirty()

    def rollback(self, txn: Transaction) -> None:
        """Roll ``txn`` back: its local work undone, a forwarded one discharged on its primary."""
        self._forget(txn)
        txn.move(TxnState.ROLLED_BACK)  # first: work waiting for the primary sees it ended
        home = txn.home
        if home == LOCAL:
            rollback_local(self.handler.broker, txn)
        elif home is not None:
            forward.rollback(self, txn)
        release_held(self.handler.broker, txn)
        self.manager.closed(txn, "rolled_back")

    def coordinator_gone(self, coordinator: Coordinator) -> None:
        """A coordinator link ended: its open transactions are rolled back."""
        for txn in [t for t in self.txns.values() if t.coordinator is coordinator and t.open]:
            self.rollback(txn)
        forward.coordinator_gone(self, coordinator)

    def connection_closed(self) -> None:
        if self.fence_timer is not None:
            self.fence_timer.cancel()
            self.fence_timer = None
        self.held_declares.clear()
        if self.late_watch is not None:
            self.late_watch.close()
        for txn in [t for t in self.txns.values() if t.open]:
            self.rollback(txn)
        forward.close_all(self)
        self.manager.tables.discard(self)

    def commit_stalled(self, txn: Transaction) -> None:
        """A commit that waited longer than ``transaction_timeout`` for the journal, a primary or
        a queue's barrier: its outcome is unknown to the client (its coordinator link ends)."""
        log.warning("connection %s: commit of %r not done after %g s", self.handler.connection_id,
                    txn.txn_id, self.manager.timeout)
        txn.committed(UnknownOutcome(f"not done within {self.manager.timeout:g} s "
                                     "(transaction_timeout)"))

    def timed_out(self, txn: Transaction) -> None:
        """Older than ``transaction_timeout``: rolled back, its coordinator link ended."""
        log.warning("connection %s: transaction %r open for more than %g s: rolled back",
                    self.handler.connection_id, txn.txn_id, self.manager.timeout)
        self.manager.stats.timed_out += 1
        coordinator = txn.coordinator
        self.rollback(txn)
        if coordinator.attached:
            self.handler.close_link(coordinator.link, TIMEOUT, (
                f"transaction {txn.txn_id.decode('latin-1')} was open for more than "
                f"{self.manager.timeout:g} s (transaction_timeout): rolled back"))

    # -- work (§4.4) --------------------------------------------------------------------------
    def find(self, delivery) -> tuple:
        """(txn state, open transaction or None, why it cannot take work or None)."""
        state = read_state(delivery)
        txn = self.txns.get(state.txn_id) if state is not None else None
        if txn is None:
            ended = self.discharged.get(state.txn_id) if state is not None else None
            if ended is not None:  # the discharge overtook this transfer (module note)
                return state, None, (UNKNOWN_ID, (
                    f"transaction {state.txn_id!r} was discharged ({ended}) before this arrived: "
                    "its discharge was sent ahead of it; wait for a transaction's transfers to be "
                    "answered before discharging it"))
            what = "no txn-id" if state is None else f"transaction {state.txn_id!r} is not open"
            return state, None, (UNKNOWN_ID, f"{what} on this connection")
        if txn.state is TxnState.COMMITTING:
            return state, None, (ROLLBACK, f"transaction {state.txn_id!r} is being discharged")
        return state, txn, None

    def post(self, delivery, queues: tuple, payload: bytes) -> None:
        """A transactional transfer for ``queues`` of this node (§4.4.1); answers it.

        The hot path: a transaction's transfers all carry the same state, so its encoding
        finds the transaction (``keys``) and the answer is a copy of one built for it."""
        txn = self.keys.get(state_key(delivery))
        if txn is None or txn.state is not ACTIVE or (txn.home is not LOCAL and txn.home is not None):
            self._post(delivery, queues, payload)  # not for this node, or refused: say why
            return
        txn.home = LOCAL
        if queues:
            txn.postings.append((queues, payload))
            txn.held_bytes += len(payload)
            self.memory.used += len(payload)
            for queue in queues:  # counted against max_depth until the discharge
                queue.incoming += 1
        if not pn_delivery_settled(delivery):
            answer_accepted(delivery, txn.answer)
        pn_delivery_settle(delivery)
        self.handler.mark_dirty()

    def _post(self, delivery, queues: tuple, payload: bytes) -> None:
        state, txn, refusal = self.find(delivery)
        if refusal is None:
            names = ", ".join(repr(q.name) for q in queues) or "no queue"
            reason = self.bind(txn, LOCAL, f"this node's queues ({names})")
            if reason is not None:
                refusal = (NOT_IMPLEMENTED, reason)
            elif txn.state is TxnState.FAILED:
                refusal = (ROLLBACK, f"the transaction can only roll back: {txn.failure}")
        if refusal is not None:
            if pn_delivery_settled(delivery):
                pn_delivery_settle(delivery)
            else:
                reject(delivery, *refusal)
            self.handler.mark_dirty()
            return
        self._hold(txn, delivery, queues, payload)  # a txn-id encoded another way

    def _hold(self, txn: Transaction, delivery, queues: tuple, payload: bytes) -> None:
        if queues:
            txn.postings.append((queues, payload))
            txn.held_bytes += len(payload)
            self.memory.used += len(payload)
            for queue in queues:
                queue.incoming += 1
        if not pn_delivery_settled(delivery):
            answer_accepted(delivery, txn.answer)
        pn_delivery_settle(delivery)
        self.handler.mark_dirty()

    def refuse_posting(self, delivery, condition: str, reason: str) -> None:
        """A transactional transfer that cannot be part of its transaction: rejected with
        ``condition`` and ``reason``, and the transaction can only roll back now."""
        state, txn, refusal = self.find(delivery)
        if txn is not None:
            txn.fail(reason)
        if pn_delivery_settled(delivery):
            pn_delivery_settle(delivery)
        else:
            reject(delivery, *(refusal or (condition, reason)))
        self.handler.mark_dirty()

    def late_state(self, txn_id: bytes, reason: str) -> None:
        """A transfer's transactional-state came on a later frame (``late_state``): ``txn_id``
        can only roll back now."""
        txn = self.txns.get(txn_id)
        if txn is not None and txn.state is ACTIVE:
            txn.fail(reason)

    def state_after_transfer(self, delivery) -> None:
        """A disposition gave ``transactional-state`` to a transfer taken already outside any
        transaction (its first frame had no state): the transaction can only roll back now,
        and its commit is refused saying why (it did not hold that message)."""
        _, txn, _ = self.find(delivery)
        if txn is not None:
            txn.fail("a transfer's transactional-state came in a disposition after the transfer, "
                     "which had gone on outside the transaction: this node takes a transfer into a "
                     "transaction by the state on its first frame (§4.4.1)")

    def retire(self, consumer, delivery, message) -> None:
        """A transactional disposition for ``message`` of a local queue (§4.4.2)."""
        state, txn, refusal = self.find(delivery)
        pn_delivery_settle(delivery)  # the transaction holds the message now, not the delivery
        queue = consumer.queue
        broker = self.handler.broker
        if refusal is None:
            if message.origin is not None:  # stolen from another member's fragment
                refusal = (NOT_IMPLEMENTED, "a message taken from another node's fragment cannot "
                                            "be settled in a transaction here")
                txn.fail(refusal[1])
                stealer, home = message.origin
                stealer.settle_at_home(home, None, None)  # it goes back there
                return
            reason = self.bind(txn, LOCAL, f"this node's queue {queue.name!r}")
            if reason is None and txn.state is TxnState.ACTIVE:
                txn.retirements.append(Retirement(queue, message, state, consumer.consumer_id))
                return
        if message.origin is not None:
            stealer, home = message.origin
            stealer.settle_at_home(home, None, None)
        else:  # it can only go back: now, as a rollback would
            queue.orphaned([message])
            broker.dirty_queues.add(queue)
        if refusal is not None and refusal[0] == UNKNOWN_ID:
            self.handler.close_link(consumer.link, *refusal)

    # -- where the work goes --------------------------------------------------------------------
    def bind(self, txn: Transaction, home, description: str) -> str | None:
        """Fix ``txn``'s home with its first work; why ``home`` cannot take more work, or None."""
        if txn.home is None:
            txn.home = home
            return None
        if txn.home == home:
            return None
        reason = (f"the transaction spans {self.describe_home(txn.home)} and {description}: "
                  "a transaction is either on this node or forwarded to one primary")
        txn.fail(reason)
        return reason

    def describe_home(self, home) -> str:
        return "this node's queues" if home == LOCAL else home.describe()["text"]

    # -- forwarded work (proxy.transactions.forward) -------------------------------------------
    def post_upstream(self, producer, delivery, payload: bytes) -> None:
        forward.post(self, producer, delivery, payload)

    def retire_upstream(self, consumer, delivery, up_delivery) -> None:
        forward.retire(self, consumer, delivery, up_delivery)

    def refuse_retirement(self, delivery, reason: str) -> None:
        """A transactional disposition that cannot be part of its transaction (the caller puts
        the message back and settles): the transaction can only roll back now."""
        _, txn, _ = self.find(delivery)
        if txn is not None:
            txn.fail(reason)

    def describe(self) -> list[dict]:
        now = self.manager.now()
        return [txn.describe(now) for txn in self.txns.values()]

