"""Runs: stretches of a FIFO queue's waiting messages on disk with their index fields.

How this works (docs/paging.md, "Runs")
---------------------------------------
A plain (FIFO) queue that pages gets a ``RunQueue`` for ``messages`` the first time the
pager takes messages out of it: ``[head][run][run]...[tail]``. Head and tail are deques of
``StoredMessage``s in memory; a run (``Chunk``) is consecutive page records of one segment,
each record carrying the message's index fields next to its body
(``proxy.paging.store.HEADER``), so the queue keeps one small object per run, none per
message. ``len()`` counts them all (the depth).

A chunk's states: ``WRITING`` (its messages are still objects, held by the chunk, until
the I/O thread reports the write), ``ON_DISK`` (the objects are dropped; its bytes count as
paged), ``FAILED`` (the write failed: it keeps its messages in memory), ``DEAD`` (purged,
or turned back into messages by ``unrun``). The event loop alone changes them: the pager
appends runs (``page_out``, only after the last one: the tail's oldest messages), the
queue's read-ahead shortens the first from its front (``read_ahead``: asynchronous;
``popleft`` / ``[0]`` with an empty head: at once), purge drops them. A read that comes
back after its run was shortened or dropped keeps only what is still the run's front.
A restarted node's durable backlog is in runs of journal records (``JournalRun``,
``proxy.queues.journal_runs``), read and dropped their own way, among the others.
"""

from __future__ import annotations

from array import array
from collections import deque
from itertools import islice
from zlib import crc32

from proxy.paging.store import HEADER, PAGED, STORED, Page, records
from proxy.queues import journal_runs
from proxy.queues.journal_runs import JournalRun
from proxy.queues.message import StoredMessage

WRITING_RUN, ON_DISK, FAILED, DEAD = range(4)
assert (journal_runs.ON_DISK, journal_runs.DEAD) == (ON_DISK, DEAD)
SCAN = 1024 * 1024  # bytes read at a time when a run is iterated


class Chunk:
    """A run: ``count`` records of ``segment`` from ``offset`` (``nbytes`` with headers,
    ``size`` of bodies), seqs up to ``max_seq``; ``messages`` while not ``ON_DISK``."""

    __slots__ = ("segment", "offset", "nbytes", "count", "size", "max_seq", "messages", "state",
                 "since", "first_seq", "front", "ids", "rids", "rid0")

    def __init__(self, segment, offset: int) -> None:
        self.segment = segment
        self.offset = offset
        self.nbytes = 0
        self.count = 0
        self.size = 0
        self.max_seq = 0
        self.messages: deque | None = deque()
        self.state = WRITING_RUN
        # a promoted copy's run (proxy.replication.promote_runs): its records carry the copy's
        # index fields (no seq; the ttl in seconds, not an expiry time). ``since``: when it
        # was promoted (the ttl runs from then); ``first_seq``: the seq of its front record
        self.since: float | None = None
        self.first_seq = 0
        # what a purge names, kept from the write so that it reads nothing (docs/paging_purge.md):
        # from ``front``, each record's journal id (``ids``: only when one is durable) and rid
        # (``rids``; ``rid0`` + k instead while they are consecutive, 0: none has a rid)
        self.front = 0
        self.ids: array | None = None
        self.rids: array | None = None
        self.rid0 = 0

    def add_name(self, journal_id: int, rid: int) -> None:
        """The journal id and rid of the record written at its end (before ``count`` grows)."""
        k = self.front + self.count
        ids = self.ids
        if ids is not None:
            ids.append(journal_id)
        elif journal_id:
            self.ids = ids = array("q", bytes(8 * k))
            ids.append(journal_id)
        rids = self.rids
        if rids is not None:
            rids.append(rid)
        elif k == 0:
            self.rid0 = rid
        elif rid != (self.rid0 + k if self.rid0 else 0):  # not consecutive: an array from here
            base = self.rid0
            self.rids = rids = array("q", range(base, base + k)) if base else array("q", bytes(8 * k))
            self.rid0 = 0
            rids.append(rid)

    def names(self):
        """``(journal_id, rid)`` of each record from its front, from memory."""
        ids, rids, rid0 = self.ids, self.rids, self.rid0
        for i in range(self.front, self.front + self.count):
            yield (ids[i] if ids is not None else 0,
                   rids[i] if rids is not None else (rid0 + i if rid0 else 0))

    def advance(self, count: int, size: int) -> None:
        """``count`` records of ``size`` body bytes left its front."""
        self.first_seq += count
        self.front += count
        taken = count * HEADER.size + size
        self.offset += taken
        self.nbytes -= taken
        self.count -= count
        self.size -= size


def message_of(page, meta, payload, chunk: Chunk | None = None, k: int = 0) -> StoredMessage:
    """The message of a record (``k``: its place from ``chunk``'s front, for a promoted
    copy's run, whose index fields are the copy's: ``Chunk.since``)."""
    seq, priority, attempts, expires_at, journal_id, rid, enqueued_at = meta
    if chunk is not None and chunk.since is not None:
        seq, enqueued_at = chunk.first_seq + k, chunk.since
        if expires_at:
            expires_at += chunk.since
    return StoredMessage(payload, journal_id=journal_id, enqueued_at=enqueued_at, seq=seq,
                         expires_at=expires_at, rid=rid, priority=priority, attempts=attempts,
                         page=page)


class RunQueue:
    """A queue's ready messages with runs on disk: the deque operations the queue uses."""

    __slots__ = ("queue", "pager", "head", "runs", "tail", "count")

    def __init__(self, queue, pager, head: deque, tail: deque) -> None:
        self.queue = queue
        self.pager = pager
        self.head = head
        self.runs: deque[Chunk] = deque()
        self.tail = tail  # empty while there are no runs
        self.count = 0  # messages in runs

    # -- the deque's operations ------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.head) + self.count + len(self.tail)

    def __bool__(self) -> bool:
        return bool(self.head) or bool(self.count) or bool(self.tail)

    def append(self, message) -> None:
        (self.tail if self.runs else self.head).append(message)

    def appendleft(self, message) -> None:
        self.head.appendleft(message)

    def popleft(self):
        if not self.head and self.runs:
            self.load_now()
        return self.head.popleft()

    def __getitem__(self, index: int):
        if index != 0:
            raise IndexError("a RunQueue is read from its head only")
        if not self.head and self.runs:
            self.load_now()
        return self.head[0]

    def remove(self, message) -> None:
        try:
            self.head.remove(message)
        except ValueError:
            self.tail.remove(message)

    def __iter__(self):
        return self.iterate()

    def iterate(self, after: int = 0):
        """Every message in order; a run's as transient objects read from disk, runs whose
        seqs are all up to ``after`` skipped (browsers)."""
        yield from list(self.head)
        for chunk in list(self.runs):
            if chunk.max_seq <= after and after:
                continue
            if type(chunk) is JournalRun:
                yield from chunk.transient()
                continue
            if chunk.state != ON_DISK:
                yield from list(chunk.messages or ())
                continue
            for k, (_, length, meta, payload) in enumerate(self._records(chunk)):
                yield message_of(None, meta, payload, chunk, k)
        yield from list(self.tail)

    def _records(self, chunk: Chunk):
        """A run's records, read ``SCAN`` bytes at a time: ``(offset, size, meta, payload)``."""
        offset, left, remaining = chunk.offset, chunk.count, chunk.nbytes
        while left > 0 and remaining > 0:
            data = self._read(chunk.segment, offset, min(remaining, SCAN))
            taken = 0
            for at, length, meta, payload in records(data, 0, left):
                yield offset + at, length, meta, payload
                taken += HEADER.size + length
                left -= 1
            offset += taken
            remaining -= taken

    def _read(self, segment, offset: int, size: int) -> bytes:
        """``size`` bytes from ``offset``, more if the first record is longer."""
        read_now = self.pager.store.read_now
        data = read_now(segment, offset, size)
        if len(data) >= HEADER.size:
            whole = HEADER.size + HEADER.unpack_from(data)[0]
            if whole > len(data):
                data = read_now(segment, offset, whole)
        return data

    # -- the pager's side ----------------------------------------------------------------------
    def page_out(self, keep: int, wanted: int) -> int | None:
        """The oldest of the tail, up to ``wanted`` bytes, written as new runs after the
        last (only while the head and runs hold ``keep`` messages); bytes freed. None: the
        first message after ``keep`` may not be in a run (``excluded``, ``origin``): the
        queue is a plain deque again, paged message by message this time."""
        if not self.runs:
            head = self.head
            if len(head) <= keep:
                return 0
            self.tail = deque(islice(head, keep, None))
            self.head = deque(islice(head, keep))
        elif len(self.head) + self.count < keep:
            return 0
        tail = self.tail
        taken = []
        freed = 0
        while tail and freed < wanted:
            message = tail[0]
            page = message.page
            if message.excluded or message.origin is not None or (
                    page is not None and page.state != STORED):
                break  # never in a run; the runs end before it
            tail.popleft()
            taken.append(message)
            freed += len(message.payload)
        if not self.runs and not taken:  # the tail starts with what is never in a run
            self.head.extend(tail)
            self.tail = deque()
            if self.queue.messages is self:  # not a level of a LevelRuns (level_runs.py)
                self.queue.messages = self.head
            return None  # paged message by message (proxy.paging.pager), as before runs
        if not taken:
            return 0
        pager = self.pager
        queue = self.queue
        for message in taken:
            if message.page is not None:  # read back before: a fresh record with its index
                pager.gone(queue, message)
        metas = [(m.seq, m.priority, m.attempts, m.expires_at, m.journal_id, m.rid,
                  m.enqueued_at) for m in taken]
        chunks: list[Chunk] = []
        pages = pager.store.write([(m.payload, m) for m in taken],
                                  lambda done, error: self._written(chunks, done, error), metas)
        chunk = None
        for message, page in zip(taken, pages):
            message.page = page
            if chunk is None or page.segment is not chunk.segment:
                chunk = Chunk(page.segment, page.offset)
                chunks.append(chunk)
                self.runs.append(chunk)
            chunk.messages.append(message)
            chunk.add_name(message.journal_id, message.rid)
            chunk.count += 1
            chunk.size += page.size
            chunk.nbytes += HEADER.size + page.size
            if message.seq > chunk.max_seq:
                chunk.max_seq = message.seq
            pager.writing += page.size
        self.count += len(taken)
        pager.paged_out += len(taken)
        return freed

    def _written(self, chunks: list, done: list, error) -> None:
        pager = self.pager
        pager.run_pages_written(done, error)
        queue = self.queue
        memory = pager.memory
        for chunk in chunks:
            if chunk.state != WRITING_RUN:
                continue
            if error is not None:
                chunk.state = FAILED
                continue
            chunk.state = ON_DISK
            written = getattr(queue, "run_written", None)  # a replicated primary's rid index
            if written is not None:
                written(chunk)
            chunk.messages = None
            queue.paged_bytes += chunk.size
            queue.paged_count += chunk.count
            memory.paged += chunk.size
        pager.runs_written(error)

    # -- reading back ------------------------------------------------------------------------
    def read_ahead(self) -> bool:
        """The first run's front, up to half the read-ahead window, into the head; True when
        it is there already (a run not on disk), False when a read is under way or nothing
        is wanted."""
        queue = self.queue
        pager = self.pager
        if queue.reading or not self.runs or len(self.head) >= pager.read_ahead_count:
            return False
        chunk = self.runs[0]
        half = max(1, pager.read_ahead_count // 2)
        if type(chunk) is JournalRun:
            return journal_runs.read_ahead(self, chunk)
        if chunk.state != ON_DISK:
            self._take(chunk, half)
            return True
        offset = chunk.offset
        size = min(chunk.nbytes, max(1, pager.read_ahead_bytes // 2))
        queue.reading = True
        pager.store.read_range(chunk.segment, offset, size,
                               lambda data, error: self._read_back(chunk, offset, data, error))
        return False

    def _read_back(self, chunk: Chunk, offset: int, data, error) -> None:
        queue = self.queue
        pager = self.pager
        queue.reading = False
        if error is None and self.runs and self.runs[0] is chunk and chunk.state == ON_DISK:
            skip = chunk.offset - offset  # loaded meanwhile at once (popleft): only the rest
            if 0 <= skip < len(data):
                half = max(1, pager.read_ahead_count // 2)
                if not self._absorb(chunk, data, skip, half):
                    self.load_now()  # its first record is longer than the read
        if queue.messages is self and not self.runs:
            queue.messages = self.head  # runs all read: a plain deque again
        pager.loaded(queue, error)

    def load_now(self) -> None:
        """The first run's front into the head, here and now."""
        chunk = self.runs[0]
        half = max(1, self.pager.read_ahead_count // 2)
        if type(chunk) is JournalRun:
            journal_runs.load_now(self, chunk, half)
            return
        if chunk.state != ON_DISK:
            self._take(chunk, half)
            return
        size = min(chunk.nbytes, max(1, self.pager.read_ahead_bytes // 2))
        self._absorb(chunk, self._read(chunk.segment, chunk.offset, size), 0, half)

    def _take(self, chunk: Chunk, limit: int) -> None:
        """Messages of a run not on disk (being written, or not written), to the head."""
        head = self.head
        count = min(limit, chunk.count)
        size = 0
        for _ in range(count):
            message = chunk.messages.popleft()
            size += len(message.payload)
            head.append(message)
        chunk.advance(count, size)
        self._shortened(chunk, count)

    def _absorb(self, chunk: Chunk, data: bytes, at: int, limit: int) -> int:
        """Records of ``chunk``'s front found in ``data`` from ``at``, to the head (the
        loop of ``proxy.paging.store.records``, inlined: this is the drain's path)."""
        append = self.head.append
        segment = chunk.segment
        base = chunk.offset - at
        unpack = HEADER.unpack_from
        header = HEADER.size
        end = len(data)
        limit = min(limit, chunk.count)
        empty = frozenset()
        count = size = 0
        first = None
        since = chunk.since  # a promoted copy's run: its seqs and expiry times from here
        while count < limit and at + header <= end:
            length, crc, seq, priority, attempts, expires_at, journal_id, rid, enqueued_at = \
                unpack(data, at)
            if since is not None:
                seq, enqueued_at = chunk.first_seq + count, since
                if expires_at:
                    expires_at += since
            stop = at + header + length
            if stop > end:
                break
            payload = data[at + header:stop]
            if crc32(payload) != crc:
                raise OSError(f"a page record of segment {segment.number} at "
                              f"{base + at} does not read back (crc)")
            page = Page(segment, base + at, length)
            page.state = STORED
            append(StoredMessage(payload, empty, journal_id, enqueued_at, None, seq, expires_at,
                                 rid, priority, attempts, page))
            if first is None:
                first = page
            count += 1
            size += length
            at = stop
        if not count:
            return 0
        first.trigger = True  # handing it out asks for the next read-ahead
        chunk.advance(count, size)
        queue = self.queue
        queue.paged_bytes -= size
        queue.paged_count -= count
        self.pager.memory.paged -= size
        self.pager.read_back += count
        self._shortened(chunk, count)
        return count

    def _shortened(self, chunk: Chunk, count: int) -> None:
        read = getattr(self.queue, "run_read", None)  # a replicated primary's rid index
        if read is not None and count:
            read(islice(reversed(self.head), count))
        self.count -= count
        if chunk.count == 0 and self.runs and self.runs[0] is chunk:
            self.runs.popleft()
            if not self.runs:
                self.head.extend(self.tail)
                self.tail = deque()

    # -- leaving runs --------------------------------------------------------------------------
    def names(self):
        """``(journal_id, rid)`` of every message, in order, nothing read (purge: the journal's
        dequeues, a replicated primary's dequeue events): a run's from its arrays."""
        for message in list(self.head):
            yield message.journal_id, message.rid
        for chunk in list(self.runs):
            if type(chunk) is JournalRun:
                yield from chunk.names()
            elif chunk.state != ON_DISK:
                for message in list(chunk.messages or ()):
                    yield message.journal_id, message.rid
            else:
                yield from chunk.names()
        for message in list(self.tail):
            yield message.journal_id, message.rid

    def drop_runs(self) -> int:
        """Purge: every run's records dead; their body bytes. Head and tail stay (one deque)."""
        pager = self.pager
        queue = self.queue
        size = 0
        for chunk in self.runs:
            size += chunk.size
            if type(chunk) is JournalRun:  # its holds on journal segments let go
                chunk.release()
                queue.paged_bytes -= chunk.size
                queue.paged_count -= chunk.count
                pager.memory.paged -= chunk.size
            elif chunk.state == ON_DISK:
                pager.store.dead_records(chunk.segment, chunk.count, chunk.nbytes)
                queue.paged_bytes -= chunk.size
                queue.paged_count -= chunk.count
                pager.memory.paged -= chunk.size
            else:  # being written, or held in memory (a failed write's, a promoted copy's)
                for message in chunk.messages or ():
                    pager.gone(queue, message)
            chunk.state = DEAD
        self.runs.clear()
        self.count = 0
        self.head.extend(self.tail)
        self.tail = deque()
        return size

    def unrun(self) -> deque:
        """Every run back as messages paged one by one (their records read, synchronously):
        a priority, a selector or the admin API's take needs message objects."""
        out = deque(self.head)
        for chunk in self.runs:
            if type(chunk) is JournalRun:
                out.extend(chunk.unrun())
            elif chunk.state == ON_DISK:
                for k, (position, length, meta, _) in enumerate(self._records(chunk)):
                    page = Page(chunk.segment, position, length)
                    page.state = PAGED  # counted as paged already, as the run was
                    out.append(message_of(page, meta, page, chunk, k))
            else:
                out.extend(chunk.messages)
            chunk.state = DEAD
        out.extend(self.tail)
        self.runs.clear()
        self.count = 0
        self.head, self.tail = out, deque()
        read = getattr(self.queue, "run_read", None)  # a replicated primary's rid index
        if read is not None:
            read(out)
        if self.queue.messages is self:
            self.queue.messages = out
        return out
