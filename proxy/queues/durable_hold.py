"""Enqueue into a local queue on behalf of exchanges and remote sources, journal included.

How this works
--------------
``DurableHold.put(queue, payload, done)`` stores a message in a local queue
and calls ``done(error)`` once it is stored: at once for an in-memory message;
for a durable message to a durable queue (``proxy.journal_queues``) only when
its journal record is on disk, as ``QueueProducer`` does for clients. Until
then the message counts in the queue's ``incoming`` (depth limit) and is not
visible to consumers. Later messages to a queue that still has one waiting
wait behind it, so each queue keeps arrival order. ``done`` gets an error
text when the journal cannot take the message (it is then not stored).
"""

from __future__ import annotations

from collections import deque

from proxy.journal.journal import JournalError
from proxy.queues import durable as journal_queues
from proxy.queues.local import StoredMessage


class DurableHold:
    def __init__(self, broker) -> None:
        self.broker = broker
        self.items: deque = deque()  # (batch, queue, message, done), in journal batch order
        self.waiting_per_queue: dict = {}  # queue -> messages of it waiting
        self.last_batch = 0
        self.registered = False

    def put(self, queue, payload: bytes, done) -> None:
        broker = self.broker
        journal = broker.journal
        durable = journal is not None and journal_queues.wants_journal(queue, payload)
        if not durable and not self.waiting_per_queue.get(queue):
            broker.enqueue(queue, StoredMessage(payload))
            done(None)
            return
        message = StoredMessage(payload)
        if durable:
            try:
                message.journal_id, batch = journal.enqueue(queue.name, payload)
            except JournalError as exc:
                done(str(exc))
                return
            self.last_batch = max(self.last_batch, batch)
        else:
            batch = self.last_batch
        self.items.append((batch, queue, message, done))
        self.waiting_per_queue[queue] = self.waiting_per_queue.get(queue, 0) + 1
        queue.incoming += 1
        if not self.registered:
            self.registered = True
            journal.wait(self)

    def journal_progress(self, durable_batch: int, error) -> bool:
        items = self.items
        broker = self.broker
        while items and (items[0][0] <= durable_batch or error is not None):
            batch, queue, message, done = items.popleft()
            queue.incoming -= 1
            left = self.waiting_per_queue[queue] - 1
            if left:
                self.waiting_per_queue[queue] = left
            else:
                del self.waiting_per_queue[queue]
            if batch > durable_batch and message.journal_id:
                done(f"journal write failed: {error}")
                continue
            broker.enqueue(queue, message)
            done(None)
        self.registered = bool(items)
        return self.registered
