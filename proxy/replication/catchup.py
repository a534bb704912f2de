"""A primary's catch-up of a backup: what it reads and sends (docs/paging.md, "A replicated
primary in runs"; docs/replication.md, catch-up).

How this works
--------------
A backup that attaches gets a stream whose ``catchup`` (a ``Catchup``) is the sync point:
the rids of the messages the queue holds in memory at that moment (its rid index, sorted),
and a snapshot of its runs on disk (``proxy.queues.runs``: the chunks on disk, each with
its front's offset, bytes, count and first rid). ``take`` (called by
``ReplicaSet.take_batch`` after the stream's live events) sends them newest first, merged in
rid order, as ``FRONT`` events carrying the message's current body and acquired flag, up to
a batch's limits; the last batch carries ``CATCHUP_DONE``.

A run is read backwards one chunk at a time: a forward scan of its records' headers makes
arrays of their offsets and rids (that chunk's only), then its records are read from the
end, a slice of at most ``SLICE`` bytes at a time. A record is sent when it is still live:
its chunk on disk and the record at or after the chunk's current front (its body is the
message's); else the message was read back (its rid in the index: its current body and
flag), or paged again into a newer run (``moved``: noted by ``run_written`` while a
catch-up is under way, read from there), or it is gone and skipped. A record in a run is
never acquired. The primary's page store never moves a record and deletes a segment only
when all its records are dead: a chunk's segment found deleted at its scan means none of
its messages is on disk there any more; those still held are found by rid instead.

Who may do what, when: the event loop alone; the reads are synchronous, at most a batch's
worth at a time (as ``body()`` of a message paged one by one is).
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from zlib import crc32

from proxy.paging.store import HEADER, body
from proxy.queues.runs import ON_DISK, RunQueue

from .events import CATCHUP_DONE, FRONT, Event, rid

SLICE = 1 << 20  # bytes of a run read at a time, backwards
SCAN = 1 << 20  # bytes read at a time when a chunk's headers are scanned
RECORD = 4096  # bytes read first for one record


def index_content(replica_set, queue) -> None:
    """``replica_set.index`` filled from ``queue``'s messages in memory (promoted or
    recovered content: rids kept, or given); those in runs on disk have their rids."""
    messages = queue.messages
    if type(messages) is RunQueue:
        held = list(messages.head)
        for chunk in messages.runs:
            held.extend(chunk.messages or ())
        held.extend(messages.tail)
        held.extend(entry[2] for entry in queue.scheduled)
    else:
        held = queue.waiting()
    for message in held:
        if message.rid:
            replica_set.index[message.rid] = message
        else:
            replica_set.enqueued(message)


def held(replica_set, queue) -> list:
    """Every message the primary holds (in memory, out with a consumer, or in runs: those as
    transient messages read from disk), in rid order."""
    found = dict(replica_set.index)
    if type(queue.messages) is RunQueue:
        for message in queue.messages.iterate():
            found.setdefault(message.rid, message)
    return [found[value] for value in sorted(found)]


def run_written(replica_set, chunk) -> None:
    """A run of the queue is on disk: its messages leave the index; a catch-up under way
    notes where the ones it may still need are now."""
    index = replica_set.index
    moving = [s.catchup for s in replica_set.streams.values() if s.catchup is not None]
    for message in chunk.messages:
        value = message.rid
        index.pop(value, None)
        for catchup in moving:
            if value <= catchup.high:
                catchup.moved[value] = (chunk, message.page.offset)


def start(replica_set) -> "Catchup":
    """The sync point of a backup attaching now."""
    queue = replica_set.queue
    messages = queue.messages if queue is not None else None
    pager = getattr(queue.memory, "pager", None) if queue is not None else None
    store = pager.store if pager is not None else None  # runs may come during the catch-up
    chunks = []
    if type(messages) is RunQueue:
        for chunk in messages.runs:
            if chunk.state == ON_DISK and chunk.count:
                data = store.read_now(chunk.segment, chunk.offset, HEADER.size)
                chunks.append((chunk, chunk.offset, chunk.nbytes, chunk.count,
                               HEADER.unpack_from(data)[7]))
    return Catchup(sorted(replica_set.index), chunks, rid(replica_set.epoch, replica_set.n), store)


class Catchup:
    """What a backup's catch-up has still to send (the module note)."""

    __slots__ = ("rids", "chunks", "high", "upper", "moved", "store", "left", "chunk", "offsets",
                 "ends", "run_rids", "at", "data", "data_at")

    def __init__(self, rids: list, chunks: list, high: int, store) -> None:
        self.rids = rids  # in memory at the sync point, ascending (sent from the end)
        self.chunks = chunks  # runs' snapshots, in queue (rid) order (read from the end)
        self.high = high  # the newest rid at the sync point
        self.upper = high + 1  # the first rid of the chunk scanned last (none: above high)
        self.moved: dict = {}  # rid -> (chunk, offset): paged into a run since
        self.store = store
        self.left = sum(c[3] for c in chunks)  # records of the chunks not scanned yet
        self.chunk = None  # the chunk being read backwards, its records' offsets, ends, rids
        self.offsets = self.ends = self.run_rids = array("q")
        self.at = -1  # the next record of it to send (-1: none)
        self.data, self.data_at = b"", 0  # the slice read last and where it begins

    def __len__(self) -> int:
        return len(self.rids) + self.at + 1 + self.left

    def _scan(self, replica_set) -> None:
        """The next chunk's records' offsets and rids (a forward scan of their headers)."""
        chunk, offset, nbytes, count, first = self.chunks.pop()
        self.left -= count
        upper, self.upper = self.upper, first
        self.chunk = chunk
        offsets, ends, rids = array("q"), array("q"), array("q")
        segment, store = chunk.segment, self.store
        if store.segments.get(segment.number) is not segment:
            # deleted: every record of it is dead; its messages still held are in memory or
            # in a newer run, found by rid (up to the next chunk's first rid)
            self._by_rid(replica_set, first, upper)
            self.offsets = self.ends = self.run_rids = offsets
            self.at = -1
            return
        unpack, size = HEADER.unpack_from, HEADER.size
        position, end = offset, offset + nbytes
        while position < end and len(offsets) < count:
            data = store.read_now(segment, position, min(end - position, SCAN))
            at = 0
            while at + size <= len(data) and len(offsets) < count:
                fields = unpack(data, at)
                offsets.append(position + at)
                rids.append(fields[7])
                at += size + fields[0]
                ends.append(position + at)
            if at == 0:
                break  # a torn record: nothing more of this chunk can be read
            position += at
        if any(rids[i] >= rids[i + 1] for i in range(len(rids) - 1)):
            order = sorted(range(len(rids)), key=rids.__getitem__)  # not in rid order
            offsets = array("q", (offsets[i] for i in order))
            ends = array("q", (ends[i] for i in order))
            rids = array("q", (rids[i] for i in order))
        self.offsets, self.ends, self.run_rids = offsets, ends, rids
        self.at = len(rids) - 1
        self.data, self.data_at = b"", 0

    def _by_rid(self, replica_set, first: int, upper: int) -> None:
        """A chunk whose segment is gone: its messages still held, rids from ``first`` up to
        the newer chunk's first, merged into ``rids``."""
        have = set(self.rids)
        found = [v for v in list(replica_set.index) + list(self.moved)
                 if first <= v < upper and v not in have]
        if found:
            self.rids = sorted(have.union(found))

    def _record(self, i: int) -> bytes:
        """The body of record ``i`` of the chunk being read (a slice read when needed)."""
        start, stop = self.offsets[i], self.ends[i]
        data, base = self.data, self.data_at
        if not (base <= start and stop <= base + len(data)):
            first = bisect_left(self.offsets, stop - SLICE, 0, i) if i else 0
            base = min(self.offsets[first], start)
            if stop - base > SLICE:
                base = start
            data = self.store.read_now(self.chunk.segment, base, stop - base)
            self.data, self.data_at = data, base
        return _payload(data, start - base, self.chunk.segment, start)

    def _moved(self, value: int):
        where = self.moved.pop(value, None)
        if where is None:
            return None
        chunk, offset = where
        if chunk.state != ON_DISK or offset < chunk.offset:
            return None  # read back (then it is in the index) or gone since
        store = self.store
        data = store.read_now(chunk.segment, offset, RECORD)
        whole = HEADER.size + HEADER.unpack_from(data)[0]
        if whole > len(data):
            data = store.read_now(chunk.segment, offset, whole)
        return _payload(data, 0, chunk.segment, offset)


def _payload(data: bytes, at: int, segment, where: int) -> bytes:
    length, crc = HEADER.unpack_from(data, at)[:2]
    payload = data[at + HEADER.size:at + HEADER.size + length]
    if len(payload) != length or crc32(payload) != crc:
        raise OSError(f"a page record of segment {segment.number} at {where} does not read "
                      "back (catch-up)")
    return payload


def take(replica_set, stream, events: list, size: int, max_events: int, max_bytes: int) -> bool:
    """Catch-up events for ``stream`` appended to ``events`` (``size`` bytes so far), within
    ``max_events`` / ``max_bytes``; True when this batch ends the catch-up."""
    catchup = stream.catchup
    index = replica_set.index
    acquired = replica_set.acquired
    rids = catchup.rids
    while len(events) < max_events and size < max_bytes:
        while catchup.at < 0 and catchup.chunks:
            catchup._scan(replica_set)
            rids = catchup.rids
        top = rids[-1] if rids else -1
        at = catchup.at
        in_run = catchup.run_rids[at] if at >= 0 else -1
        if top < 0 and in_run < 0:
            break
        flag = False
        if in_run > top:
            value = in_run
            catchup.at = at - 1
            chunk = catchup.chunk
            if chunk.state == ON_DISK and catchup.offsets[at] >= chunk.offset:
                payload = catchup._record(at)  # still in its run: the record is the message
            else:
                payload = None
        else:
            value = rids.pop()
            payload = None
        if payload is None:
            message = index.get(value)
            if message is not None:
                payload, flag = body(message), value in acquired
            else:
                payload = catchup._moved(value)
                if payload is None:
                    continue  # dequeued since the sync point: consumers shrank the work
        event = Event(FRONT, value, payload, flag)
        events.append(event)
        size += event.size
    if not len(catchup) and len(events) < max_events:  # the end of the catch-up
        events.append(Event(CATCHUP_DONE, 0))
        stream.catchup = None
        return True
    return False
