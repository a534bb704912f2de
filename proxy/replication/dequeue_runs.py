"""Dequeues waiting in a backup's stream, kept compact, and what a stream's entries cost.

How this works
--------------
A primary's ``BackupStream`` (``proxy.replication.primary``) keeps the events a backup has
not been sent yet in ``pending``, as ``(event, ticket stamp, appended at)`` entries. A
consumer draining a queue faster than its backup follows leaves a long stretch of
``DEQUEUE`` events there; each used to be an ``Event`` with its tuple, rid and time
(about 200 bytes, issue #44). Here consecutive dequeues become one entry, a ``DequeueRun``:
the rids in an ``array('q')`` (8 bytes each), the ticket stamp and time of its first.

* **Who joins a run** (``coalesce``): a dequeue whose stream's *last* pending entry is a run
  with room (fewer than ``RUN_MAX`` rids) or a single dequeue (then both become a run). Any
  other entry appended after a run (an enqueue, a release, in-sync) closes it: a dequeue
  never joins a run before an event it followed, so the stream's order of events is the
  order they happened in, exactly as before (docs/replication.md, "The primary's stream").
* **Sending** (``take``): the run is unpacked into ``DEQUEUE`` events when a batch takes it,
  as many as the batch has room for (``taken`` counts those gone); the wire is unchanged,
  a backup of the previous release reads it. The entry leaves ``pending`` once all its
  rids are taken. Its ticket stamp (the enqueues appended before it) is the run's
  first's: no enqueue can come between two rids of one run.
* **Costs** (``entry_cost``, ``RUN_COST``, ``PER_RID``): ``BackupStream.pending_bytes``
  counts what the entries cost in memory, measured with ``tracemalloc``
  (``tests/protocol/test_replication_drain_bound.py``), not their size in a batch; with
  the tables of what is not sent yet (their size read, ``BackupStream.memory``),
  ``MAX_STREAM_BYTES`` bounds the memory a backup's stream holds. An entry is counted
  until it leaves ``pending`` (an enqueue consumed before it was sent keeps its bytes
  alive until then, and is counted until then); a run's whole array until it goes.
"""

from __future__ import annotations

from array import array

from .events import DEQUEUE, ENQUEUE, Event

RUN = -1  # a DequeueRun's kind: never on the wire (its rids go as DEQUEUE events)
RUN_MAX = 8192  # rids in one run (64 KiB): a partly taken run's array is freed with its last
PER_RID = 9  # a rid in a run: 8 bytes, and the array's over-allocation (at most 1/16)
# one pending entry (tuple, time, Event, rid, the deque's slot: 200 bytes measured)
EVENT_COST = 216
TICKET_COST = 32  # an enqueue's ticket stamp, its own int (later entries share the last one)
BYTES_COST = 33  # a payload's bytes object, beyond its length
RUN_COST = 256  # a run's entry: tuple, time, the run, its array's header (232 measured)


class DequeueRun:
    """Consecutive dequeues waiting in one stream (module note)."""

    __slots__ = ("rids", "taken")
    kind = RUN

    def __init__(self, first: int, second: int) -> None:
        self.rids = array("q", (first, second))
        self.taken = 0  # rids already put in a batch

    @property
    def left(self) -> int:
        return len(self.rids) - self.taken

    def cost(self) -> int:
        return RUN_COST + PER_RID * len(self.rids)

    def __repr__(self) -> str:
        return f"DequeueRun({self.left} of {len(self.rids)} left)"


def entry_cost(event: Event) -> int:
    """What a pending entry holding ``event`` costs in memory (the payload counted whole,
    though the queue's message may share it: a bound, not a guess)."""
    payload = event.payload
    cost = EVENT_COST if payload is None else EVENT_COST + BYTES_COST + len(payload)
    return cost + TICKET_COST if event.kind == ENQUEUE else cost


def coalesce(stream, value: int) -> bool:
    """Dequeue ``value`` joins the stream's last pending entry, if that is a run with room
    or a single dequeue: True; else False (the caller appends a ``DEQUEUE`` event)."""
    pending = stream.pending
    if not pending:
        return False
    last, ticket, at = pending[-1]
    kind = last.kind
    if kind == RUN:
        if len(last.rids) >= RUN_MAX:
            return False
        last.rids.append(value)
        stream.pending_bytes += PER_RID
        return True
    if kind != DEQUEUE:
        return False
    run = DequeueRun(last.rid, value)
    pending[-1] = (run, ticket, at)
    stream.pending_bytes += run.cost() - entry_cost(last)
    return True


def take(stream, run: DequeueRun, events: list, room: int) -> int:
    """Up to ``room`` of ``run``'s rids as ``DEQUEUE`` events in ``events``; the run leaves
    ``pending`` (the stream's first entry) once all are taken. How many were taken."""
    start = run.taken
    end = min(len(run.rids), start + room)
    events.extend([Event(DEQUEUE, value) for value in run.rids[start:end]])
    if end == len(run.rids):
        stream.pending.popleft()
        stream.pending_bytes -= run.cost()
    else:
        run.taken = end
    return end - start
