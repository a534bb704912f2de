"""A local queue that tells its replica set what happens to its messages.

``ReplicatedQueue`` is a ``LocalQueue`` (same storage, dispatch and outcomes)
whose changes are also reported to ``replica_set`` (``ReplicaSet``, the
primary's side of the protocol) while this node is the queue's primary: an
enqueue, a message handed to a consumer, released or modified back into the
queue, or gone for good (accepted, rejected, expired, dropped, purged). With
no replica set (this node is a backup, or fenced) it reports nothing: its
content is then what promotion put there. ``changed`` is told after each
report, for the batches to go out in the same cycle (``broker.dirty_queues``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from proxy.queues.local import LocalQueue, StoredMessage
from proxy.queues.runs import Chunk

from . import promote_runs


@dataclass(eq=False)
class ReplicatedQueue(LocalQueue):
    # replica_set (LocalQueue's field): proxy.replication.primary.ReplicaSet while primary
    changed: object = None  # called with the queue after a report
    # its rid index names the messages in memory; runs tell it what leaves and comes back
    # (run_written, run_read; docs/paging.md, "A replicated primary in runs")
    runs: ClassVar[bool] = True

    def serve_replicas(self, replica_set, changed) -> None:
        self.replica_set = replica_set
        replica_set.queue = self
        self.changed = changed
        self.on_acquired = self._acquired

    def stop_replicas(self) -> None:
        self.replica_set = None
        self.on_acquired = None

    def _acquired(self, message: StoredMessage) -> None:
        rs = self.replica_set
        if rs is not None:
            rs.acquired_by_consumer(message)

    def enqueue(self, message: StoredMessage, *, expiry: bool = True) -> None:
        super().enqueue(message, expiry=expiry)
        rs = self.replica_set
        if rs is not None:
            rs.enqueued(message)
            self.changed(self)

    def restore(self, message, header=None) -> None:
        """Put ``message`` (promoted from a copy, its rid kept) at the tail, reporting nothing;
        a ``Chunk``: a run of the copy, handed over as it is (``promote_runs``). ``header``:
        (ttl, priority) known already (a recovered message left in the journal)."""
        if type(message) is Chunk:
            promote_runs.restore(self, message)
            return
        rs, self.replica_set = self.replica_set, None
        try:
            super().enqueue(message, header=header)
        finally:
            self.replica_set = rs

    # its rid index and catch-up know one FIFO of runs (a RunQueue), not levels: a priority
    # turns runs back into messages paged one by one (docs/paging.md, "A priority queue in runs")
    priority_runs: ClassVar[bool] = False
    # its rid index and catch-up name its scheduled messages: they stay in memory
    # (docs/paging-scheduled.md, "Replicated queues")
    scheduled_runs: ClassVar[bool] = False

    def settled_accepted(self, message: StoredMessage) -> None:
        super().settled_accepted(message)
        self._gone(message)

    def settled_released(self, message: StoredMessage) -> None:
        super().settled_released(message)
        self._back(message, False)

    def settled_modified(self, message: StoredMessage, **outcome) -> None:
        before = message.payload
        super().settled_modified(message, **outcome)
        self._back(message, message.payload is not before)

    def settled_rejected(self, message: StoredMessage) -> StoredMessage | None:
        dead = super().settled_rejected(message)
        if dead is None:
            self._gone(message)
        # else dead-lettered: its removal is told once the copy is safe (Broker.let_go: forget)
        return dead

    def orphaned(self, messages) -> None:
        returned = list(messages)
        super().orphaned(returned)
        for message in returned:
            self._back(message, True)

    def forget(self, message: StoredMessage) -> None:
        self._gone(message)

    def run_written(self, chunk) -> None:
        rs = self.replica_set
        if rs is not None:
            rs.run_written(chunk)

    def run_read(self, messages) -> None:
        rs = self.replica_set
        if rs is not None:
            rs.run_read(messages)

    def purge(self) -> int:
        rs = self.replica_set
        if rs is not None:  # a run's rids from memory, nothing read (docs/paging_purge.md)
            for _, rid in list(self.waiting_names()):
                rs.dequeued_rid(rid, in_run=True)
            self.changed(self)
        return super().purge()

    def _gone(self, message: StoredMessage) -> None:
        rs = self.replica_set
        if rs is not None:
            rs.dequeued(message)
            self.changed(self)

    def _back(self, message: StoredMessage, changed: bool) -> None:
        rs = self.replica_set
        if rs is not None:
            rs.released(message, changed)
            self.changed(self)
