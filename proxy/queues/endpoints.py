"""Client links on local queues: ``QueueProducer`` (client sends) and ``QueueConsumer`` (client receives).

How this works
--------------
* ``QueueProducer`` — the client sends to a queue (our proton Receiver).
  Incoming transfers are copied out of proton as bytes and enqueued, never
  decoded; unsettled ones are accepted and settled at once (§3.4.2). Credit is
  topped up to the credit window as it is used, and never beyond what the
  queue's depth limit leaves room for (§2.6.7: credit withheld, nothing lost).
  Durable messages to a durable queue are journaled first and wait, unsettled
  and counted against the window, until the journal reports them on disk
  (``journal_progress``); later messages of the link wait behind them.
* ``QueueConsumer`` — the client receives from a queue (our proton Sender).
  ``LocalQueue.dispatch`` calls ``deliver`` only when the link has credit.
  Outcomes (§3.4) come back as disposition updates and go to the queue.
* Transactions (§4.4): on a connection with a coordinator link
  (``handler.transactions``, ``proxy.transactions``), a transfer carrying
  ``transactional-state`` is handed to its transaction (enqueued at commit),
  and so is a disposition carrying it (its outcome applied at commit).

Each endpoint reaches the node through its ``handler`` (``proxy.broker``):
``handler.broker`` for the journal, dead-lettering and latency figures.
"""

from __future__ import annotations

import itertools
import logging
from collections import deque
from time import monotonic

from cproton import (
    PN_ACCEPTED,
    PN_MODIFIED,
    PN_REJECTED,
    PN_RELEASED,
    pn_delivery_remote_state,
    pn_delivery_settle,
    pn_delivery_settled,
    pn_delivery_update,
    pn_link_credit,
    pn_link_flow,
)
from proton import Condition, Delivery, Link

from proxy.amqp import engine
from proxy.amqp.outcomes import TRANSACTIONAL_STATE, outcome_of
from proxy.journal.journal import JournalError
from proxy.queues import durable as journal_queues
from proxy.queues import schedule
from proxy.queues.local import LocalQueue, StoredMessage

log = logging.getLogger("fedgate.broker")

INTERNAL_ERROR = "amqp:internal-error"
RESOURCE_LIMIT = "amqp:resource-limit-exceeded"

def _settle_at_home(message: StoredMessage, state, client_delivery) -> None:
    """A stolen message's outcome goes to the fragment it came from (fragments.steal).

    ``state`` None means the consumer is gone: the home fragment gets it back.
    """
    stealer, home_delivery = message.origin
    stealer.settle_at_home(home_delivery, state, client_delivery)


def apply_outcome(broker, queue: LocalQueue, message: StoredMessage, state: int, consumer_id: int, *,
                  failed: bool = False, undeliverable: bool = False, annotations=None,
                  journaled: bool = False) -> None:
    """A consumer's outcome (§3.4) for ``message`` of ``queue``, the way the node applies it
    (also at a transaction's commit); ``journaled``: its dequeue is in the journal already."""
    if state == PN_ACCEPTED or not state:
        queue.settled_accepted(message)
        if not journaled:
            journal_queues.dequeued(broker.journal, message)
        broker.delivery_latency.observe(monotonic() - message.enqueued_at)
        if queue.producers_blocked:
            broker.dirty_queues.add(queue)
        return
    if state == PN_MODIFIED:
        queue.settled_modified(message, delivery_failed=failed, undeliverable_here=undeliverable,
                               consumer_id=consumer_id, annotations=annotations)
    elif state == PN_REJECTED:
        dead = queue.settled_rejected(message)
        if dead is None:
            journal_queues.dequeued(broker.journal, message)
        else:  # let go (its removal replicated and journaled) once the dead-letter copy is safe
            broker.dead_letter(queue, dead, "rejected", lambda: broker.let_go(queue, message))
    else:
        queue.settled_released(message)
    broker.dirty_queues.add(queue)


# the target capability of another worker's link carrying dead-lettered copies (proxy.workers)
DEAD_LETTER_COPY = "fedgate:dead-letter-copy"


class QueueProducer(engine.ClientLinkEndpoint):
    """Client -> local queue. Our side is a proton Receiver."""

    __slots__ = ("handler", "link_ptr", "queue", "window", "address", "received",
                 "awaiting", "attached", "expiry", "unconfirmed")

    def __init__(self, handler, link: Link, queue: LocalQueue, window: int, *,
                 expiry: bool = True) -> None:
        self.handler = handler
        # False: dead-lettered copies from another worker of this node (DEAD_LETTER_COPY),
        # which do not expire again, as a copy made on this worker would not
        self.expiry = expiry
        self.link_ptr = engine.hold(link._impl)
        self.queue = queue
        self.window = window
        self.address = queue.name
        self.received = 0
        # (journal batch, delivery or None, message): held until the journal says
        # durable; settled and enqueued in arrival order (proxy.journal)
        self.awaiting: deque = deque()
        self.attached = True
        # deliveries stored but not yet accepted: a replicated queue accepts once its
        # in-sync copies hold them (proxy.replication calls confirmed())
        self.unconfirmed = 0

    @property
    def outstanding_credit(self) -> int:
        return pn_link_credit(self.link_ptr)

    def top_up(self) -> None:
        """Grant credit up to the window, within the queue's room (§2.6.7)."""
        ptr = self.link_ptr
        credit = pn_link_credit(ptr)
        # unsettled until durable, or until the copies hold them, count too
        want = self.window - credit - len(self.awaiting) - self.unconfirmed
        if want <= 0:
            return
        want = self.queue.credit_within_room(want)
        if want:
            pn_link_flow(ptr, want)
            self.handler.mark_dirty()

    def on_delivery(self, delivery) -> None:
        if engine.beyond_credit(self.link_ptr):
            self.handler.refuse_beyond_credit(self.link)
            return
        payload = engine.read_transfer(self.link_ptr, delivery, self.handler.broker.max_message_size)
        if payload is None:
            return  # the rest of a multi-frame transfer is still to come, or it was aborted
        if payload is False:
            self._too_large(delivery)
            return
        ptr = self.link_ptr
        self.received += 1
        queue = self.queue
        if schedule.marked(payload):  # a delay becomes a time now (docs/queue-semantics.md)
            payload = schedule.fix_delay(payload)
        if queue.max_bytes and queue.refuses(len(payload)):
            # overflow reject-publish: sent on credit given before the queue filled
            self._reject(delivery, f"queue {queue.name!r} is full (max_bytes {queue.max_bytes})",
                         RESOURCE_LIMIT)
            return
        transactions = self.handler.transactions
        if transactions is not None and pn_delivery_remote_state(delivery) == TRANSACTIONAL_STATE:
            transactions.post(delivery, (queue,), payload)  # §4.4.1: enqueued at commit
        else:
            self._arrived(delivery, payload)
        if pn_link_credit(ptr) <= self.window // 2:
            self.top_up()

    def _arrived(self, delivery, payload: bytes) -> None:
        message = StoredMessage(payload)
        journal = self.handler.broker.journal
        if journal is None or not (self.awaiting or self.queue.durable) \
                or not self._hold(journal, delivery, message):
            self._store(delivery, message)

    def _hold(self, journal, delivery, message: StoredMessage) -> bool:
        """Journal a durable message; it (and later ones, to keep order) waits for the disk."""
        queue = self.queue
        if journal_queues.wants_journal(queue, message.payload):
            try:  # the journal failed earlier, or cannot take this queue name
                message.journal_id, batch = journal.enqueue(queue.name, message.payload)
            except JournalError as exc:
                self._reject(delivery, str(exc))
                return True
            if not self.awaiting:
                journal.wait(self)
        elif self.awaiting:
            batch = self.awaiting[-1][0]
        else:
            return False
        if pn_delivery_settled(delivery):  # pre-settled: nothing to answer
            pn_delivery_settle(delivery)
            delivery = None
        self.awaiting.append((batch, delivery, message))
        queue.incoming += 1
        return True

    def journal_progress(self, durable_batch: int, error) -> bool:
        """The journal made batches durable: accept + enqueue what waited (§3.4.2)."""
        awaiting = self.awaiting
        queue = self.queue
        broker = self.handler.broker
        while awaiting and (awaiting[0][0] <= durable_batch or error is not None):
            batch, delivery, message = awaiting.popleft()
            queue.incoming -= 1
            if batch > durable_batch and message.journal_id:
                if delivery is not None:  # the journal failed before this one was on disk
                    self._reject(delivery, f"journal write failed: {error}")
                continue
            self._store(delivery, message)
        if self.attached:
            self.handler.mark_dirty()
            self.top_up()
        return bool(awaiting)

    def _store(self, delivery, message: StoredMessage) -> None:
        """Enqueue, and accept (§3.4.2) now or, on a replicated queue, once the copies hold it."""
        queue = self.queue
        self.handler.broker.enqueue(queue, message, expiry=self.expiry)
        replica_set = queue.replica_set
        if delivery is None:
            return
        if replica_set is None or pn_delivery_settled(delivery):
            if not pn_delivery_settled(delivery):
                pn_delivery_update(delivery, PN_ACCEPTED)
            pn_delivery_settle(delivery)
            return
        # the bytes too: a primary fenced before the copies hold it hands them on (take_over)
        replica_set.wait(replica_set.ticket, (self, delivery, message.payload))
        self.unconfirmed += 1

    def take_over(self, payload: bytes, delivery) -> None:
        """A transfer another endpoint of this link held (proxy.replication.address.park): as
        if it arrived now (``delivery`` None: the client pre-settled it)."""
        self.received += 1
        if delivery is None:
            self.handler.broker.enqueue(self.queue, StoredMessage(payload), expiry=self.expiry)
        else:
            self._arrived(delivery, payload)

    def confirmed(self, delivery) -> None:
        """The in-sync copies hold ``delivery``'s message: accepted now. The caller calls
        ``after_confirmed`` once after a run of these (credit is topped up there)."""
        self.unconfirmed -= 1
        if self.attached:
            pn_delivery_update(delivery, PN_ACCEPTED)
            pn_delivery_settle(delivery)

    def after_confirmed(self) -> None:
        if self.attached:
            self.handler.mark_dirty()
            if pn_link_credit(self.link_ptr) <= self.window // 2:
                self.top_up()

    def _reject(self, delivery, description: str, condition: str = INTERNAL_ERROR) -> None:
        if pn_delivery_settled(delivery):
            pn_delivery_settle(delivery)
            return
        wrapped = Delivery.wrap(delivery)
        wrapped.local.condition = Condition(condition, description)
        wrapped.update(Delivery.REJECTED)
        wrapped.settle()
        self.handler.mark_dirty()

    def on_flow(self) -> None:
        pass  # the client's flow frames change nothing for a sender into a queue

    def _too_large(self, delivery) -> None:
        self.handler.refuse_oversized(self.link)

    def detached(self) -> None:
        queue = self.queue
        self.attached = False
        if self.awaiting:  # still enqueued once durable; the deliveries are gone with the link
            self.awaiting = deque((batch, None, message) for batch, _, message in self.awaiting)
        if self.unconfirmed and queue.replica_set is not None:  # their deliveries are gone
            queue.replica_set.forget(lambda token: isinstance(token, tuple) and token[0] is self)
            self.unconfirmed = 0
        if self in queue.producers:
            queue.producers.remove(self)
        if queue.temporary:
            self.handler.broker.delete_temporary(queue)


class QueueConsumer(engine.ClientLinkEndpoint):
    """Local queue -> client. Our side is a proton Sender."""

    __slots__ = (
        "handler", "link_ptr", "session_ptr", "queue", "consumer_id", "presettled",
        "unsettled", "tags", "owns_queue", "address", "sent", "drain_requested",
        "selector", "matched", "subscription", "remote_closed",
    )

    def __init__(self, handler, link: Link, queue: LocalQueue, *,
                 presettled: bool, owns_queue: bool) -> None:
        self.handler = handler
        self.link_ptr = engine.hold(link._impl)
        self.session_ptr = engine.link_session(self.link_ptr)
        self.queue = queue
        self.consumer_id = next(handler.broker.consumer_ids)
        self.presettled = presettled
        self.unsettled: dict = {}
        self.tags = itertools.count(1)
        self.owns_queue = owns_queue
        self.address = queue.name
        self.sent = 0
        # a drain the client asked for, not answered yet (set by the handler on the client's
        # flow, §2.6.7; answered once nothing more comes: proxy.broker.broker._finish_drains)
        self.drain_requested = False
        # a JMS selector (proxy.selectors) and the ready messages it selects (a
        # PriorityStore kept by proxy.queues.selective); None: every message
        self.selector = None
        self.matched = None
        # a topic subscriber's (Subscriptions, Subscription), told when it goes; remote_closed:
        # its detach said closed = true (proxy.exchanges.subscriptions: JMS unsubscribe)
        self.subscription = None
        self.remote_closed = False

    @property
    def credit(self) -> int:
        if not self.handler.can_send(self):
            return 0
        return pn_link_credit(self.link_ptr)

    def deliver(self, message: StoredMessage) -> None:
        ptr = self.link_ptr
        delivery = engine.send_message(ptr, str(next(self.tags)).encode(), message.payload)
        self.sent += 1
        if message.origin is not None:  # stolen: its home fragment settles it
            if self.presettled:
                pn_delivery_settle(delivery)
                _settle_at_home(message, PN_ACCEPTED, None)
            else:
                self.unsettled[delivery] = message
        elif self.presettled:
            pn_delivery_settle(delivery)
            self.queue.settled_accepted(message)
            journal_queues.dequeued(self.handler.broker.journal, message)
            self.handler.broker.delivery_latency.observe(monotonic() - message.enqueued_at)
        else:
            self.unsettled[delivery] = message
        self.handler.mark_dirty()

    def on_delivery(self, delivery) -> None:
        state = outcome_of(delivery)
        if state is None:
            return  # no outcome yet (§3.4.1: received is not terminal)
        message = self.unsettled.pop(delivery, None)
        if state == TRANSACTIONAL_STATE and message is not None \
                and self.handler.transactions is not None:
            # §4.4.2: settled in a transaction, which applies the outcome at commit
            self.handler.transactions.retire(self, delivery, message)
            return
        if message is not None and message.origin is not None:
            _settle_at_home(message, state, delivery)
            pn_delivery_settle(delivery)
            return
        pn_delivery_settle(delivery)
        if message is None:
            return
        queue = self.queue
        broker = self.handler.broker
        if state == PN_ACCEPTED or not state:
            # settled without an outcome: the source's default, accepted here
            queue.settled_accepted(message)
            journal_queues.dequeued(broker.journal, message)
            broker.delivery_latency.observe(monotonic() - message.enqueued_at)
            if queue.producers_blocked:
                broker.dirty_queues.add(queue)
            return
        if state == PN_MODIFIED:
            remote = Delivery.wrap(delivery).remote
            apply_outcome(broker, queue, message, state, self.consumer_id, failed=bool(remote.failed),
                          undeliverable=bool(remote.undeliverable),
                          annotations=remote.annotations or None)
        else:
            apply_outcome(broker, queue, message, state, self.consumer_id)

    def on_flow(self) -> None:
        self.handler.broker.dirty_queues.add(self.queue)

    def detached(self) -> None:
        queue = self.queue
        queue.remove_consumer(self)
        if self.unsettled:
            # §3.4: unsettled deliveries of a departed receiver go back to the
            # queue; stolen ones go back to their home fragment
            local = []
            for message in self.unsettled.values():
                if message.origin is not None:
                    _settle_at_home(message, None, None)
                else:
                    local.append(message)
            queue.orphaned(local)
            self.unsettled.clear()
            self.handler.broker.dirty_queues.add(queue)
        if queue.temporary and self.owns_queue:
            self.handler.broker.delete_temporary(queue)
        if self.subscription is not None:  # a topic subscriber: its subscription may go now
            subscriptions, sub = self.subscription
            self.subscription = None
            subscriptions.consumer_detached(sub, self, closed=self.remote_closed)
