"""Committing and rolling back a transaction's work on this node's own queues.

How this works
--------------
A commit (``LocalCommit``) goes in three steps, and answers only after the last:

1. **Journal.** What a durable queue must keep (a posted message whose header
   says durable, to a durable queue: ``proxy.queues.durable``) and the
   dequeues of the journaled messages it accepted go into one TXN record
   (``Journal.commit``): after a crash, all of them are recovered or none.
   The commit waits until that record is on disk (``journal_progress``).
   Nothing is visible to consumers meanwhile.
2. **Apply**, in one step of the event loop: the held bytes leave the
   transaction's count, every posted message is enqueued (an exchange's
   posting into each of its queues), and each retirement's outcome is applied
   as a plain disposition would be (``proxy.queues.endpoints.apply_outcome``:
   accepted, released, modified, rejected and dead-lettered).
3. **Barriers.** A queue with a ``commit_barrier`` (a replicated queue, whose
   copies must hold the commit) is asked, and the answer waits for every
   ``done``; a barrier not done within ``transaction_timeout`` ends the
   coordinator link with ``amqp:transaction:timeout``: applied here, the
   outcome is unknown to the client.

A journal that fails rolls the transaction back and the commit is refused
(``amqp:transaction:rollback``). A rollback (``rollback_local``) drops the
posted messages and puts every retired message back at the head of its queue
with its delivery-count raised (§3.2.1: the client may have processed it), as
for a consumer that went away.
"""

from __future__ import annotations

import logging
from collections import defaultdict

from cproton import PN_ACCEPTED

from proxy.journal.journal import JournalError
from proxy.queues import durable as journal_queues
from proxy.queues.endpoints import apply_outcome
from proxy.queues.local import StoredMessage

log = logging.getLogger("fedgate.transactions")


def _accepted(retirement) -> bool:
    outcome = retirement.state.outcome
    return outcome == PN_ACCEPTED or not outcome


class LocalCommit:
    """One commit of local work in flight; ``done(error)`` once answered (None: committed)."""

    def __init__(self, broker, txn, done, *, call_later=None, barrier_timeout: float = 60.0) -> None:
        self.broker = broker
        self.txn = txn
        self.done = done
        self.call_later = call_later  # (delay, callback) -> handle with cancel(), or None
        self.barrier_timeout = barrier_timeout
        self.batch = 0
        self.targets: list = []  # (queue, payload, journal id) per posted copy
        self.waiting_barriers = 0
        self.timer = None

    def start(self) -> None:
        registry = self.broker.queues
        journal = self.broker.journal
        targets = [(queue, payload) for queues, payload in self.txn.postings
                   for queue in queues if registry.get(queue.name) is queue]
        durable = [journal is not None and journal_queues.wants_journal(queue, payload)
                   for queue, payload in targets]
        dequeues = [r.message.journal_id for r in self.txn.retirements
                    if r.message.journal_id and _accepted(r)]
        ids = iter(())
        if journal is not None and (any(durable) or dequeues):
            try:
                new_ids, self.batch = journal.commit(
                    [(queue.name, payload) for (queue, payload), keep in zip(targets, durable) if keep],
                    dequeues)
            except JournalError as exc:
                self._fail(f"journal unavailable: {exc}")
                return
            ids = iter(new_ids)
        self.targets = [(queue, payload, next(ids) if keep else 0)
                        for (queue, payload), keep in zip(targets, durable)]
        if self.batch and self.batch > journal.durable_batch:
            journal.wait(self)
            return
        self._apply()

    def journal_progress(self, durable_batch: int, error) -> bool:
        """The journal made batches durable (``proxy.journal``): apply once ours is."""
        if durable_batch >= self.batch:
            self._apply()
        elif error is not None:
            self._fail(f"journal write failed: {error}")
        else:
            return True
        return False

    def _fail(self, reason: str) -> None:
        log.error("transaction %r: commit failed, rolled back: %s", self.txn.txn_id, reason)
        rollback_local(self.broker, self.txn)
        self.done(reason)

    def _apply(self) -> None:
        broker = self.broker
        txn = self.txn
        release_held(broker, txn)
        touched = set()
        for queue, payload, journal_id in self.targets:
            broker.enqueue(queue, StoredMessage(payload, journal_id=journal_id))
            touched.add(queue)
        for retirement in txn.retirements:
            state = retirement.state
            apply_outcome(broker, retirement.queue, retirement.message, state.outcome or PN_ACCEPTED,
                          retirement.consumer_id, failed=state.failed,
                          undeliverable=state.undeliverable, annotations=state.annotations,
                          journaled=True)
            broker.dirty_queues.add(retirement.queue)
            touched.add(retirement.queue)
        txn.postings, txn.retirements = [], []
        barriers = [queue.commit_barrier for queue in touched if queue.commit_barrier is not None]
        if not barriers:
            self.done(None)
            return
        self.waiting_barriers = len(barriers)
        if self.call_later is not None:
            self.timer = self.call_later(self.barrier_timeout, self._barrier_timeout)
        for barrier in barriers:
            barrier(self._barrier_done)

    def _barrier_done(self) -> None:
        self.waiting_barriers -= 1
        if self.waiting_barriers == 0:
            if self.timer is not None:
                self.timer.cancel()
                self.timer = None
            self.done(None)

    def _barrier_timeout(self) -> None:
        self.timer = None
        if self.waiting_barriers > 0:
            self.waiting_barriers = -1  # late dones change nothing
            self.done(UnknownOutcome(f"applied on this node, not confirmed by its queues' copies "
                                     f"within {self.barrier_timeout:g} s"))


class UnknownOutcome(str):
    """A commit applied here whose barriers did not answer: neither committed nor rolled back
    as far as the client can know (the coordinator link ends, §4.3)."""


def release_held(broker, txn) -> None:
    """The transaction's postings no longer count against ``max_memory`` and ``max_depth``."""
    for queues, _ in txn.postings:
        for queue in queues:
            queue.incoming -= 1
    if txn.held_bytes:
        memory = broker.queues.memory
        memory.used -= txn.held_bytes
        txn.held_bytes = 0
        if memory.blocked or memory.waiting:
            memory.freed()


def rollback_local(broker, txn) -> None:
    """Drop the posted messages; retired ones go back to their queues' heads, count raised."""
    release_held(broker, txn)
    txn.postings = []
    returned = defaultdict(list)
    for retirement in txn.retirements:
        returned[retirement.queue].append(retirement.message)
    txn.retirements = []
    for queue, messages in returned.items():
        queue.orphaned(messages)  # §3.2.1: delivery-count + 1, back at the head in order
        broker.dirty_queues.add(queue)
