"""Scheduled delivery: messages held until their delivery time (docs/queue-semantics.md).

The message annotations ``x-opt-delivery-time`` (ms since the epoch) and
``x-opt-delivery-delay`` (ms), as ActiveMQ Artemis and Qpid JMS use them. A queue
holds such messages in one heap (``LocalQueue.scheduled``; beyond the node's memory budget
in runs on disk, ``proxy.queues.schedule_pages``, docs/paging-scheduled.md) and the broker
keeps one timer per queue for the earliest (``LocalQueue.next_due``). A delay is turned into a
time where the message arrives (``fix_delay``), before it is journaled or replicated,
so that a restart or a failover keeps its time (the wall clock, not the process's).

Only payloads whose first ``HEAD`` bytes hold ``MARK`` are decoded (their sections before
the body): the check costs every message a bounded search, not one over a large body (a
message whose annotations start more than 64 KiB in is not scheduled).
"""

from __future__ import annotations

import heapq
import time

from proxy.amqp import message_header
from proxy.queues import schedule_journal

MARK = b"x-opt-delivery-"
HEAD = 65536  # bytes searched for MARK: the sections before the body


def clock() -> float:
    """The wall clock the schedule reads (seconds since the epoch; tests move it)."""
    return time.time()


def marked(payload: bytes) -> bool:
    """Whether the message may carry a delivery time or delay (then it is decoded)."""
    return payload.find(MARK, 0, HEAD) >= 0
DELIVERY_TIME = "x-opt-delivery-time"
DELIVERY_DELAY = "x-opt-delivery-delay"


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def due_of(payload: bytes) -> float:
    """The delivery time a message asks for, in seconds since the epoch; 0: none."""
    if not marked(payload):
        return 0.0
    annotations = message_header.message_annotations(payload)
    at = _number(annotations.get(DELIVERY_TIME))
    if at is not None and at > 0:
        return at / 1000.0
    delay = _number(annotations.get(DELIVERY_DELAY))
    if delay is not None and delay > 0:
        return clock() + delay / 1000.0
    return 0.0


def fix_delay(payload: bytes) -> bytes:
    """A message with ``x-opt-delivery-delay`` (and no time): the time it is due, from now,
    added as ``x-opt-delivery-time``. Any other payload is returned as it is."""
    if payload.find(b"x-opt-delivery-delay", 0, HEAD) < 0:
        return payload
    annotations = message_header.message_annotations(payload)
    delay = _number(annotations.get(DELIVERY_DELAY))
    if delay is None or delay <= 0 or DELIVERY_TIME in annotations:
        return payload
    at = int(clock() * 1000 + delay)
    return message_header.modify(payload, increment_count=False, annotations={DELIVERY_TIME: at})


def hold(queue, message, payload: bytes | None = None) -> bool:
    """Into ``queue``'s scheduled heap when ``message`` is due later; False: it is due now.
    ``payload``: its body when ``message.payload`` is a page (on disk only: it stays there,
    proxy.queues.schedule_pages)."""
    due = due_of(message.payload if payload is None else payload)
    if not due or due <= clock():
        return False
    scheduled = queue.scheduled
    page = message.payload
    if payload is not None and payload is not page and page.segment.foreign:
        schedule_journal.keep(scheduled, queue, due, message)  # recovered: in a journal run
        return True
    heapq.heappush(scheduled, (due, message.seq, message))
    memory = queue.memory
    if memory.pager is not None and memory.used - memory.paged > memory.limit:
        memory.pager.wake()  # (a redelivery held again: no enqueue woke it)
    return True


def release_due(queue, now: float | None = None) -> int:
    """Messages whose time came: into the ready place, in the order of their times (runs on
    disk included: proxy.queues.schedule_pages)."""
    return queue.scheduled.release(queue, clock() if now is None else now)


def remove(queue, message) -> bool:
    """Take ``message`` out of the heap (a purge by id, a replicated queue's backup)."""
    for index, entry in enumerate(queue.scheduled):
        if entry[2] is message:
            queue.scheduled[index] = queue.scheduled[-1]
            queue.scheduled.pop()
            heapq.heapify(queue.scheduled)
            return True
    return False
