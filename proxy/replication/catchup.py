"""A primary's catch-up of a backup: what it reads and sends (docs/replication.md, catch-up).

How this works
--------------
A backup that attaches gets a stream whose ``catchup`` is the sync point: the rids of every
message the queue held at that moment, oldest first. ``take`` (called by
``ReplicaSet.take_batch`` after the stream's live events) sends them from the end, newest
first, as ``FRONT`` events carrying the message's current body and acquired flag, skipping
what was dequeued meanwhile, up to a batch's limits; the last batch carries
``CATCHUP_DONE``. ``index_content`` fills a new primary's rid index from its queue's
content (promoted or recovered: rids kept, or given).
"""

from __future__ import annotations

from proxy.paging.store import body

from .events import CATCHUP_DONE, FRONT, Event


def index_content(replica_set, queue) -> None:
    """``replica_set.index`` filled from ``queue``'s messages (promoted or recovered content:
    rids kept, or given)."""
    for message in queue.waiting():
        if message.rid:
            replica_set.index[message.rid] = message
        else:
            replica_set.enqueued(message)


def take(replica_set, stream, events: list, size: int, max_events: int, max_bytes: int) -> bool:
    """Catch-up events for ``stream`` appended to ``events`` (``size`` bytes so far), within
    ``max_events`` / ``max_bytes``; True when this batch ends the catch-up."""
    catchup = stream.catchup
    index = replica_set.index
    acquired = replica_set.acquired
    while catchup and len(events) < max_events and size < max_bytes:
        value = catchup.pop()
        message = index.get(value)
        if message is None:
            continue  # dequeued since the sync point: consumers shrank the work
        event = Event(FRONT, value, body(message), value in acquired)
        events.append(event)
        size += event.size
    if not catchup and len(events) < max_events:  # the end of the catch-up
        events.append(Event(CATCHUP_DONE, 0))
        stream.catchup = None
        return True
    return False
