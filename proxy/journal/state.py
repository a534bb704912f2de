"""The journal's bookkeeping records: a segment's live counts, what recovery found, counters.

``Recovered.queues`` holds, per queue, ``(message id, bytes)`` in id order (a
``proxy.journal.recovery.Listing``: the ids in an array, the pairs made as they are read);
for a message
whose body recovery left in the journal file (``Journal.open``'s ``body_budget``: read back
through ``Journal.location``, docs/paging.md) the bytes are None, or what ``open``'s
``peek`` kept of the body (its header's fields: ``proxy.queues.journal_restore``).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field


@dataclass(slots=True)
class Segment:
    number: int
    size: int  # bytes, file header included
    live: int = 0  # live messages whose current record is in this segment
    live_bytes: int = 0
    # older segment -> ids this segment's DEQUEUE records remove from it
    refs: dict[int, array] = field(default_factory=dict)

    def add_ref(self, source: int, message_id: int) -> None:
        ids = self.refs.get(source)
        if ids is None:
            ids = self.refs[source] = array("Q")
        ids.append(message_id)


@dataclass
class Recovered:
    """What ``Journal.open`` found."""

    queues: dict[str, list[tuple[int, object]]]  # queue -> [(message id, bytes)], id order
    messages: int = 0
    records: int = 0
    segments: int = 0
    torn_tail: str | None = None
    corrupt: str | None = None
    quarantined: list[str] = field(default_factory=list)
    seconds: float = 0.0


@dataclass
class JournalStats:
    enqueued: int = 0
    dequeued: int = 0
    batches: int = 0
    segments_created: int = 0
    segments_deleted: int = 0
    relocated: int = 0  # live ENQUEUE records copied out of sparse segments
    carried: int = 0  # DEQUEUE entries carried forward out of dead segments
