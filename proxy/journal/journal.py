"""Append-only journal of durable queues: recovery, group commit, cleaning.

How this works
--------------
Every message a durable queue must keep gets a message id (a counter that
only goes up) and an ENQUEUE record; when it leaves the queue for good
(accepted, or rejected and dropped / dead-lettered) its id goes into a DEQUEUE
record. Records go into numbered segment files under ``<data_dir>/journal``
(format: ``proxy.journal_format``). The live set is "enqueued and not yet
dequeued"; restart rebuilds exactly that set, per queue, in message-id order
(the order the node accepted them).

Threads. All bookkeeping below runs on the event loop thread. ``enqueue``
encodes the record, decides where it lands (segment and offset: the loop
knows every size, so it also decides when to start a new segment) and stages
it; once per loop iteration the staged items go to the writer thread as one
numbered batch (``proxy.journal_writer``), which writes and fsyncs everything
submitted meanwhile in one go (group commit) and reports back through
``loop.call_soon_threadsafe``. ``enqueue`` returns the batch number; a
``waiter`` (a producer link holding deliveries) is told when that batch is
durable and only then settles (``journal_progress``). Dequeues need no wait:
losing one in a crash means a redelivery, never a loss. A transaction's
commit (``commit``) is one TXN record holding its enqueues and dequeues:
recovered whole or not at all.

Cleaning. Per segment the loop counts the live messages whose record is in it
and remembers, per older segment, which ids its DEQUEUE records remove from
there (a dequeue must outlive the enqueue it cancels, or a restart would bring
the message back). A segment that is not the current one and has no live
message is deleted (after the writer's next fsync) once the segments it
points into are gone, or at once if the few ids still needed are carried
forward into a DEQUEUE record in the current segment. When a new segment
starts, older segments that are mostly dead (live bytes under
``sparse_ratio`` of the segment) get their live records copied verbatim into
the current segment; the old copy is then dead and the segment can go. So
neither a long-lived message nor a long-lived backlog segment pins the
segments written after it.

Recovery (``open``) reads segments in order. The first record that is cut
short or fails its checksum ends recovery: nothing after it is applied, even
in later segments, because a damaged record may be a DEQUEUE and applying
later records without it could deliver a message twice in a different order
or resurrect a dead one; the recovered state is always the exact state at
one point of the journal's history. If the bad record is the tail of the last
segment (a torn write from a crash: cut short, or the final bytes / zero
fill) it is truncated away with a warning. Anywhere else it is corruption:
the segment is truncated at that record, later segments are moved to a
``quarantine-<time>`` directory, and an error is logged. New records always
go to a fresh segment after recovery (the cutting: ``proxy.journal.repair``).
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import time
from pathlib import Path
from typing import Protocol

from proxy.journal.format import (
    DEQUEUE,
    ENQUEUE,
    ENQUEUE_HEAD,
    FILE_HEADER,
    MAX_QUEUE_NAME,
    NESTED_TYPES,
    RECORD_HEADER,
    TXN,
    ScanStop,
    decode_dequeue,
    JournalError,
    check_journal_format,
    decode_file_header,
    encode_dequeue,
    encode_enqueue,
    encode_transaction,
    scan,
    segment_name,
    segment_number,
)
from proxy.journal.recovery import LiveSet
from proxy.journal.repair import repair
from proxy.journal.state import JournalStats, Recovered, Segment
from proxy.journal.where import Where, prune_old_copies
from proxy.journal.writer import Copy, Delete, Roll, SegmentWriter

log = logging.getLogger("fedgate.journal")

DEFAULT_SEGMENT_SIZE = 64 * 1024 * 1024
MAX_IDS_PER_DEQUEUE = 8192
SYNC_STAGED = 1024  # without a loop: hand staged items over every this many
_LOW32 = 0xFFFFFFFF


class Waiter(Protocol):
    def journal_progress(self, durable_batch: int, error: OSError | None) -> bool:
        """Durability advanced (or failed). Return True to keep waiting."""


def _loc(number: int, offset: int, length: int) -> int:
    """Where a record is, packed in one int: segment << 64 | offset << 32 | length."""
    return (number << 64) | (offset << 32) | length


class Journal:
    def __init__(self, directory: str | Path, *, fsync: bool = True,
                 segment_size: int = DEFAULT_SEGMENT_SIZE, batch_delay: float = 0.0,
                 sparse_ratio: float = 0.25,
                 loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.directory = Path(directory)
        self.fsync = fsync
        self.segment_size = segment_size
        self.batch_delay = batch_delay
        self.sparse_ratio = sparse_ratio
        self.loop = loop
        self.stats = JournalStats()
        self.error: OSError | None = None
        self.on_progress: list = []  # callables run (on the loop) after waiters were told
        self._segments: dict[int, Segment] = {}
        self._active: Segment | None = None
        self._where = Where()  # live message id -> packed location (docs/journal-index.md)
        self._old_copies: dict[int, list[int]] = {}  # relocated id -> segments of older copies
        # segment -> records in it that a queue reads by location (paged durable messages,
        # docs/paging.md): never relocated, so a location stays right while it is pinned
        self.pinned: dict[int, int] = {}
        self._next_id = 1
        self._names: dict[str, bytes] = {}
        self._staged: list = []
        self._dequeued: list[int] = []  # ids waiting for the next DEQUEUE record
        self._dequeued_from: list[tuple[int, int]] = []  # (segment, id) of their ENQUEUEs
        self._submitted = 0  # batches handed to the writer
        self._durable = 0  # batches known durable
        self._handoff_scheduled = False
        self._rolled = False
        self._maybe_dead = False
        self._waiters: dict[Waiter, None] = {}
        self._writer: SegmentWriter | None = None
        self._closed = False
        self._lock_fd: int | None = None

    # -- public API (loop thread) -------------------------------------------------
    @property
    def live(self) -> int:
        return len(self._where)

    @property
    def segment_count(self) -> int:
        return len(self._segments)

    @property
    def durable_batch(self) -> int:
        return self._durable

    def enqueue(self, queue: str, payload: bytes) -> tuple[int, int]:
        """Journal a message; returns (message id, batch number to wait for)."""
        if self.error is not None or self._closed:
            raise JournalError(f"journal unavailable: {self.error or 'closed'}")
        name = self._names.get(queue) or self._name(queue)
        message_id = self._next_id
        self._next_id = message_id + 1
        record = encode_enqueue(message_id, name, payload)
        length = len(record)
        segment = self._active
        if segment.size + length > self.segment_size and segment.size > FILE_HEADER.size:
            segment = self._roll()
        self._where[message_id] = _loc(segment.number, segment.size, length)
        segment.size += length
        segment.live += 1
        segment.live_bytes += length
        self._staged.append(record)
        self.stats.enqueued += 1
        batch = self._submitted + 1  # the next hand-off carries it
        self._schedule_handoff()
        return message_id, batch

    def location(self, message_id: int) -> tuple[int, int, int] | None:
        """(segment, offset, length) of a live message's ENQUEUE record; None if not live."""
        loc = self._where.get(message_id)
        return None if loc is None else (loc >> 64, (loc >> 32) & _LOW32, loc & _LOW32)

    def segment_path(self, number: int) -> Path:
        return self.directory / segment_name(number)

    def pin(self, number: int, change: int = 1) -> None:
        """``change`` more (or fewer) records of segment ``number`` are read by location."""
        count = self.pinned.get(number, 0) + change
        if count > 0:
            self.pinned[number] = count
        else:
            self.pinned.pop(number, None)

    def dequeue(self, message_id: int) -> None:
        """The message left its queue for good; unknown ids are ignored."""
        sources = self._drop_live(message_id)
        if sources is None:
            return
        self._dequeued.append(message_id)
        self._dequeued_from.extend((n, message_id) for n in sources)
        self.stats.dequeued += 1
        self._schedule_handoff()

    def commit(self, enqueues: list[tuple[str, bytes]], dequeues: list[int]) -> tuple[list[int], int]:
        """A transaction's changes as one TXN record: ``enqueues`` ((queue, bytes)) and the ids in
        ``dequeues`` (unknown ones left out), recovered all or none. Returns (ids, batch)."""
        if self.error is not None or self._closed:
            raise JournalError(f"journal unavailable: {self.error or 'closed'}")
        names = [self._names.get(queue) or self._name(queue) for queue, _ in enqueues]
        ids = list(range(self._next_id, self._next_id + len(enqueues)))
        self._next_id += len(enqueues)
        records = [encode_enqueue(message_id, name, payload)
                   for message_id, name, (_, payload) in zip(ids, names, enqueues)]
        gone = [message_id for message_id in dequeues if message_id in self._where]
        records += [encode_dequeue(gone[start:start + MAX_IDS_PER_DEQUEUE])
                    for start in range(0, len(gone), MAX_IDS_PER_DEQUEUE)]
        if not records:
            return ids, self._durable
        record = encode_transaction(records)
        loc = self._place(len(record))
        number = loc >> 64
        segment = self._segments[number]
        offset = ((loc >> 32) & _LOW32) + RECORD_HEADER.size  # each nested record is a record
        for message_id, nested in zip(ids, records):
            self._where[message_id] = _loc(number, offset, len(nested))
            segment.live += 1
            segment.live_bytes += len(nested)
            offset += len(nested)
        for message_id in gone:  # the DEQUEUE inside is in this segment: it keeps its refs
            for source in self._drop_live(message_id):
                if source != number:
                    segment.add_ref(source, message_id)
        self._staged.append(record)
        self.stats.enqueued += len(ids)
        self.stats.dequeued += len(gone)
        self._schedule_handoff()
        return ids, self._submitted + 1  # the next hand-off carries it

    def _name(self, queue: str) -> bytes:  # its bytes, checked once
        name = queue.encode()
        if len(name) > MAX_QUEUE_NAME:
            raise JournalError(f"queue name longer than {MAX_QUEUE_NAME} bytes")
        self._names[queue] = name
        return name

    def _drop_live(self, message_id: int) -> list[int] | None:
        """``message_id`` is no longer live: the segments holding its copies, or None if unknown."""
        loc = self._where.pop(message_id, None)
        if loc is None:
            return None
        number = loc >> 64
        segment = self._segments[number]
        segment.live -= 1
        segment.live_bytes -= loc & _LOW32
        if not segment.live:
            self._maybe_dead = True
        return [number, *self._old_copies.pop(message_id, ())]

    def wait(self, waiter: Waiter) -> None:
        """Call ``waiter.journal_progress`` whenever durability advances, until it returns False."""
        self._waiters[waiter] = None

    def sync(self, timeout: float | None = 30.0) -> None:
        """Block until everything journaled so far is on disk; runs the waiters."""
        self._handoff()
        target = self._submitted
        writer = self._writer
        if writer is not None and not writer.wait_synced(target, timeout):
            raise JournalError(f"journal sync timed out after {timeout}s")
        if writer is not None:
            self._progress(writer.synced_batch, writer.error)
        if self.error is not None:
            raise JournalError(f"journal write failed: {self.error}")

    def close(self, timeout: float = 30.0) -> None:
        if self._closed:
            return
        try:
            if self.error is None:
                self.sync(timeout)
        finally:
            self._closed = True
            if self._writer is not None:
                self._writer.close(timeout)
            if self._lock_fd is not None:
                os.close(self._lock_fd)  # releases the lock
                self._lock_fd = None

    # -- staging and the hand-off to the writer -------------------------------
    def _schedule_handoff(self) -> None:
        if self._handoff_scheduled:
            return
        if self.loop is not None:
            self._handoff_scheduled = True
            self.loop.call_soon(self._handoff)
        elif len(self._staged) >= SYNC_STAGED:
            self._handoff()

    def _place(self, length: int) -> int:
        segment = self._active
        if segment.size + length > self.segment_size and segment.size > FILE_HEADER.size:
            segment = self._roll()
        loc = _loc(segment.number, segment.size, length)
        segment.size += length
        return loc

    def _roll(self) -> Segment:
        number = self._active.number + 1 if self._active else 1
        return self._start_segment(number)

    def _start_segment(self, number: int) -> Segment:
        segment = Segment(number, FILE_HEADER.size)
        self._segments[number] = segment
        self._staged.append(Roll(number, self._next_id))
        self._active = segment
        self._rolled = True
        self._maybe_dead = True
        self.stats.segments_created += 1
        return segment

    def _handoff(self) -> None:
        self._handoff_scheduled = False
        if self._dequeued:
            self._stage_dequeues()
        if self._rolled:
            self._rolled = False
            self._relocate_sparse()
        if self._maybe_dead:
            self._maybe_dead = False
            self._clean()
        if not self._staged or self._writer is None:
            return
        staged, self._staged = self._staged, []
        self._submitted += 1
        self.stats.batches += 1
        self._writer.submit(staged, self._submitted)

    def _stage_dequeues(self) -> None:
        ids, self._dequeued = self._dequeued, []
        sources, self._dequeued_from = self._dequeued_from, []
        self._stage_dequeue_records(ids, sources)

    def _stage_dequeue_records(self, ids, sources: list[tuple[int, int]]) -> None:
        """DEQUEUE records for ``ids``; each segment they land in remembers ``sources``."""
        landed = set()
        for start in range(0, len(ids), MAX_IDS_PER_DEQUEUE):
            record = encode_dequeue(ids[start:start + MAX_IDS_PER_DEQUEUE])
            landed.add(self._place(len(record)) >> 64)
            self._staged.append(record)
        for number in landed:  # (a hand-off rarely spans two segments)
            add_ref = self._segments[number].add_ref
            for source, message_id in sources:
                if source != number:
                    add_ref(source, message_id)

    # -- cleaning ---------------------------------------------------------------
    def _clean(self) -> None:
        """Delete segments with no live message.

        Such a segment's DEQUEUE records still matter for ids whose ENQUEUE is
        in a segment that is still there. When those are few (a long-lived
        backlog segment, say), they are carried forward into one new DEQUEUE
        record in the current segment and the old segment goes anyway;
        otherwise it waits for the segments it points into to go first.
        """
        segments = self._segments
        progress, deleted = True, False
        while progress:
            progress = False
            for number in sorted(segments):
                segment = segments.get(number)
                if segment is None or segment is self._active or segment.live:
                    continue
                needed = [(source, ids) for source, ids in segment.refs.items()
                          if source in segments]
                if needed:
                    count = sum(len(ids) for _, ids in needed)
                    if count * 8 > segment.size * self.sparse_ratio:
                        continue
                    pairs = [(source, message_id) for source, ids in needed for message_id in ids]
                    self._stage_dequeue_records([message_id for _, message_id in pairs], pairs)
                    self.stats.carried += count
                del segments[number]
                self._staged.append(Delete(number))
                self.stats.segments_deleted += 1
                progress = deleted = True
        if deleted and self._old_copies:  # a deleted segment's old copies need no dequeue
            self._old_copies = prune_old_copies(self._old_copies, segments)

    def _relocate_sparse(self) -> None:
        """Copy the live records of mostly-dead older segments into the current one."""
        newest_closed = self._active.number - 1
        payload_room = self.segment_size * self.sparse_ratio
        sparse = {
            number for number, segment in self._segments.items()
            if number < newest_closed and segment.live and segment.live_bytes < payload_room
            and number not in self.pinned  # a queue reads records there by location
        }
        if not sparse:
            return
        moves = self._where.located_in(sparse)  # (id, location) of the records in them
        segments = self._segments
        for message_id, loc in moves:
            number = loc >> 64
            offset = (loc >> 32) & _LOW32
            length = loc & _LOW32
            new_loc = self._place(length)
            self._staged.append(Copy(number, offset, length))
            self._where[message_id] = new_loc
            old = segments[number]
            old.live -= 1
            old.live_bytes -= length
            new = segments[new_loc >> 64]
            new.live += 1
            new.live_bytes += length
            self._old_copies.setdefault(message_id, []).append(number)
        self.stats.relocated += len(moves)
        self._maybe_dead = True
        log.debug("journal: relocated %d live records out of segments %s",
                  len(moves), sorted(sparse))

    # -- progress from the writer -------------------------------------------------
    def _writer_progress(self, batch: int, error: OSError | None) -> None:
        """Writer thread: hop to the loop."""
        if self.loop is None:
            return  # synchronous use: sync() reports progress
        try:
            self.loop.call_soon_threadsafe(self._progress, batch, error)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            pass

    def _progress(self, batch: int, error: OSError | None) -> None:
        if error is not None and self.error is None:
            self.error = error
        elif batch <= self._durable:
            return
        if batch > self._durable:
            self._durable = batch
        waiters = self._waiters
        for waiter in list(waiters):
            if not waiter.journal_progress(self._durable, self.error):
                waiters.pop(waiter, None)
        for hook in self.on_progress:
            hook()

    # -- recovery ----------------------------------------------------------------
    def open(self, *, loop: asyncio.AbstractEventLoop | None = None,
             body_budget: int | None = None, peek=None) -> Recovered:
        """Recover the live set, repair the tail, start the writer. Call once, first.

        ``loop``: the event loop the writer reports progress to (if not given at construction).
        ``body_budget``: keep at most this many bytes of bodies (the oldest); the others come
        back as None, left in the journal (``location``). None: every body. ``peek(data,
        start, end)``: what to keep instead of such a body (its bytes are data[start:end];
        an int 0-13 costs no object: proxy.journal.recovery)."""
        if loop is not None:
            self.loop = loop
        started = time.monotonic()
        directory = self.directory
        directory.mkdir(parents=True, exist_ok=True)
        self._lock(directory)
        numbers = sorted(
            n for n in (segment_number(p.name) for p in directory.iterdir() if p.is_file())
            if n is not None
        )
        live = LiveSet(body_budget, peek)
        result = Recovered(queues={})
        problem: tuple[int, ScanStop, int] | None = None  # (index, stop, data length)
        for index, number in enumerate(numbers):
            data = (directory / segment_name(number)).read_bytes()
            check_journal_format(directory / segment_name(number), data)  # a newer one: refused
            header = decode_file_header(data)
            if header is None or header[0] != number:
                stop = ScanStop(0, "bad segment file header", len(data) < FILE_HEADER.size)
                problem = (index, stop, len(data))
                break
            self._next_id = max(self._next_id, header[1])
            segment = Segment(number, len(data))
            self._segments[number] = segment
            stops: list[ScanStop] = []
            result.records += self._replay(number, data, live, stops)
            if stops:
                segment.size = stops[0].offset
                problem = (index, stops[0], len(data))
                break
        if problem is not None:
            repair(directory, numbers, problem, result, self._segments)
        result.segments = len(self._segments)
        result.messages = len(live)
        by_queue = result.queues = live.listings()
        del live
        self._where.settle()  # relocated copies met out of id order: into the arrays
        self._writer = SegmentWriter(directory, fsync=self.fsync, batch_delay=self.batch_delay,
                                     on_progress=self._writer_progress)
        self._writer.start()
        # a fresh segment, numbered after every file seen (quarantined ones included)
        self._start_segment((numbers[-1] if numbers else 0) + 1)
        if body_budget is not None:  # no relocation before the queues pin what they read
            self._rolled = False  # by location: it waits for the next segment
        self._handoff()
        result.seconds = time.monotonic() - started
        log.info("journal %s: recovered %d messages in %d queues from %d records, %d segments "
                 "(%.2fs)", directory, result.messages, len(by_queue), result.records,
                 result.segments, result.seconds)
        return result

    def _lock(self, directory: Path) -> None:
        """One process per journal: an advisory lock, released when the process dies."""
        fd = os.open(directory / "lock", os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise JournalError(f"journal {directory} is in use by another process") from None
        self._lock_fd = fd

    def _replay(self, number: int, data: bytes, live: LiveSet, stops: list) -> int:
        """Apply one segment's records to ``live`` and the bookkeeping; returns the count."""
        return self._apply(number, data, live, scan(data, FILE_HEADER.size, stops), stops)

    def _apply(self, number: int, data: bytes, live: LiveSet, records, stops: list) -> int:
        segments = self._segments
        segment = segments[number]
        where = self._where
        old_copies = self._old_copies
        names: dict[bytes, str] = {}
        unpack_head = ENQUEUE_HEAD.unpack_from
        head_size = ENQUEUE_HEAD.size
        max_id = 0
        count = 0
        base = number << 64  # packed locations, as _loc
        for offset, rtype, body_start, body_end in records:
            count += 1
            length = body_end - offset
            if rtype == ENQUEUE:
                message_id, name_length = unpack_head(data, body_start)
                if message_id > max_id:
                    max_id = message_id
                previous = where.get(message_id)
                where[message_id] = base | (offset << 32) | length
                segment.live += 1
                segment.live_bytes += length
                if previous is not None:  # a relocated copy: the older one is dead now
                    old = segments[previous >> 64]
                    old.live -= 1
                    old.live_bytes -= previous & _LOW32
                    old_copies.setdefault(message_id, []).append(previous >> 64)
                    continue
                name_start = body_start + head_size
                name_end = name_start + name_length
                raw_name = data[name_start:name_end]
                name = names.get(raw_name)
                if name is None:
                    name = names[raw_name] = raw_name.decode("utf-8", "replace")
                live.enqueue(message_id, name, data, name_end, body_end)
            elif rtype == DEQUEUE:
                add_ref = segment.add_ref
                for message_id in decode_dequeue(data, body_start, body_end):
                    if message_id > max_id:
                        max_id = message_id
                    loc = where.pop(message_id, None)
                    if loc is None:
                        continue  # its enqueue was in a segment already deleted
                    live.dequeue(message_id)
                    source = loc >> 64
                    owner = segments[source]
                    owner.live -= 1
                    owner.live_bytes -= loc & _LOW32
                    if source != number:
                        add_ref(source, message_id)
                    for older in old_copies.pop(message_id, ()):
                        if older != number:
                            add_ref(older, message_id)
            elif rtype == TXN:  # checked whole before any of it is applied: all or nothing
                bad: list[ScanStop] = []
                nested = list(scan(data, body_start, bad, end=body_end, kinds=NESTED_TYPES))
                if bad:
                    stops.append(ScanStop(offset, f"malformed transaction record: {bad[0].reason}",
                                          False, body_end))
                    break
                count += self._apply(number, data, live, nested, stops) - 1
        self._next_id = max(self._next_id, max_id + 1)
        return count
