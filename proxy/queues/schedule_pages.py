"""Scheduled runs: a queue's scheduled messages beyond the budget, on disk (issue #44).

How this works (docs/paging-scheduled.md)
-----------------------------------------
``LocalQueue.scheduled`` is a ``Scheduled``: the heap of in-memory entries
``(time, seq, message)`` (a ``list``, for ``heapq``), plus **runs**: batches of scheduled
messages the pager took, sorted by ``(time, seq)`` and written as consecutive page records
of one segment, each record with the message's index fields (``proxy.paging.store.HEADER``).
A run keeps per message only its time and seq, in two arrays (16 bytes), and reads back
from its front. ``total`` counts every scheduled message the queue holds, in runs too;
``len()`` and truth are the heap's (a queue holds scheduled messages when ``scheduled or
scheduled.in_runs``).

A run's states: ``WRITING_RUN`` (its messages are still objects, held by the run, until the
I/O thread reports the write), ``ON_DISK`` (objects dropped: 16 bytes a message), ``DEAD``
(read back whole, purged, or its write failed: its messages went back to the heap). The
event loop alone changes them: the pager makes runs (``page_out``: the entries due last,
never the ``keep`` earliest), ``release`` and ``read_ahead`` take a run's front back into
the heap (asynchronously when it is on disk: one read per queue at a time), purge drops
them. Release goes strictly in ``(time, seq)`` order over the heap and every run's front.

Recovered durable scheduled messages beyond the budget are a *journal run*
(``proxy.queues.schedule_journal.JournalRun``): their bodies in the journal, their places
in arrays; it is one of the runs here (``run.journal``: it reads, drops and iterates
itself).
"""

from __future__ import annotations

import heapq
import itertools
from array import array
from collections import deque

from proxy.paging.pager import LOW
from proxy.paging.store import HEADER, STORED, Page, records
from proxy.queues.runs import message_of

WRITING_RUN, ON_DISK, DEAD = range(3)
LEAD = 2.0  # seconds before its time a paged scheduled message is read back
MANY = 1 << 30
SCAN = 1024 * 1024  # bytes read at a time when a run is iterated (peek, purge's journal)
FIRST_READ = 16 * 1024  # the first read of each run when iterated
_serials = itertools.count(1)


class SchedRun:
    """``count`` records of ``segment`` from ``offset`` (``nbytes`` with headers, ``size`` of
    bodies); the times and seqs of its messages from ``front``; ``messages`` while written."""

    __slots__ = ("segment", "offset", "nbytes", "count", "size", "dues", "seqs", "front",
                 "messages", "state", "serial", "ids")
    journal = False  # (a JournalRun, proxy.queues.schedule_journal: True)

    def __init__(self, segment, offset: int) -> None:
        self.segment = segment
        self.offset = offset
        self.nbytes = self.count = self.size = self.front = 0
        self.dues = array("d")
        self.seqs = array("Q")
        self.ids: array | None = None  # journal ids, once one is durable: a purge reads nothing
        self.messages: deque | None = deque()
        self.state = WRITING_RUN
        self.serial = next(_serials)

    def key(self) -> tuple:
        return self.dues[self.front], self.seqs[self.front]

    def advance(self, count: int, size: int) -> None:
        taken = count * HEADER.size + size
        self.offset += taken
        self.nbytes -= taken
        self.count -= count
        self.size -= size
        self.front += count


def _room(pager, queue, size: int) -> int:
    """How many bodies of ``size`` bytes a read back may bring now (0: none; at most
    ``MANY``): as many as fit under the ceiling producers stop at, so that reads never
    outrun the pager's writes (many due at once). At none the queue waits with the blocked
    producers' queues and is dispatched again when the bodies in memory fall
    (``MemoryUse.freed``); one always fits when the pager has done its work (under ``LOW``
    of the budget: a body larger than the headroom)."""
    memory = pager.memory
    room = memory.ceiling - memory.resident
    if room >= size:
        return min(MANY, room // max(1, size))
    if memory.resident <= memory.limit * LOW:
        return 1
    memory.blocked.add(queue)
    return 0


def ahead_of(heap: list, key: tuple, limit: int) -> int:
    """How many heap entries come before ``key`` (counted up to ``limit``)."""
    size = list.__len__(heap)
    count = 0
    stack = [0] if size else []
    while stack and count < limit:
        index = stack.pop()
        entry = heap[index]
        if (entry[0], entry[1]) >= key:
            continue
        count += 1
        stack.extend(c for c in (2 * index + 1, 2 * index + 2) if c < size)
    return count


class Scheduled(list):
    """The heap of in-memory scheduled entries, and the queue's scheduled runs."""

    __slots__ = ("runs", "fronts", "in_runs", "paged", "paged_bytes", "reading", "full",
                 "pending")

    def __init__(self, entries=()) -> None:
        super().__init__(entries)
        self.runs: list[SchedRun] = []
        self.fronts: list = []  # (time, seq, serial, run) of each run's front; stale ones skipped
        self.in_runs = 0  # messages in runs (being written or on disk)
        self.paged = 0  # of them on disk only
        self.paged_bytes = 0
        self.reading = False  # one read back under way (a run's front, or recovered pages)
        self.full = False  # the read-ahead window ahead of the first run was found full
        # a journal run being filled by a restore (proxy.queues.schedule_journal), not sorted
        self.pending = None

    @property
    def total(self) -> int:
        """Every scheduled message held: in memory and in runs. (``len()`` and truth stay
        the list's, the in-memory heap's: truth is asked at every dispatch.)"""
        return len(self) + self.in_runs

    def first_run(self) -> SchedRun | None:
        fronts = self.fronts
        while fronts:
            due, seq, _, run = fronts[0]
            if run.state != DEAD and run.count and run.dues[run.front] == due \
                    and run.seqs[run.front] == seq:
                return run
            heapq.heappop(fronts)
        return None

    def _front_moved(self, run: SchedRun) -> None:
        if run.count:
            heapq.heappush(self.fronts, (*run.key(), run.serial, run))
        else:
            run.state = DEAD
            self.runs.remove(run)

    def next_due(self, now: float) -> float:
        """When the broker's timer should fire: the earliest in-memory time, or ``LEAD``
        before the earliest run's front (its read ahead); 0: nothing held."""
        if self.pending is not None:
            self.pending.seal(self)
        due = self[0][0] if list.__len__(self) else 0.0
        if self.in_runs and not self.reading and not self.full:
            run = self.first_run()
            if run is not None:
                at = max(run.dues[run.front] - LEAD, now + 0.05)
                due = min(due, at) if due else at
        return due

    # -- release and read back ---------------------------------------------------------------
    def release(self, queue, now: float) -> int:
        """Messages whose time came, into the ready order, in (time, seq) order; stops at
        one whose body is still on disk (its read asked)."""
        if self.pending is not None:
            self.pending.seal(self)
        moved = 0
        while True:
            run = self.first_run() if self.in_runs else None
            top = self[0] if list.__len__(self) else None
            if run is not None and (top is None or run.key() < (top[0], top[1])):
                if run.dues[run.front] > now:
                    break
                if run.state == WRITING_RUN:  # bodies in memory still: at once
                    self._take(run, now)
                    continue
                self._read(queue, run, now)
                break
            if top is None or top[0] > now:
                break
            message = top[2]
            heapq.heappop(self)
            self.full = False
            queue._ready(message)
            moved += 1
        if self.in_runs:
            self.read_ahead(queue, now)
        return moved

    def read_ahead(self, queue, now: float) -> None:
        """Read back what comes due within ``LEAD``, while the window ahead has room."""
        pager = queue.memory.pager
        if self.reading or pager is None:
            return
        horizon = now + LEAD
        run = self.first_run() if self.in_runs else None
        if run is None or run.dues[run.front] > horizon or self.full:
            return
        if ahead_of(self, run.key(), pager.read_ahead_count) >= pager.read_ahead_count:
            self.full = True  # until an entry is released
            return
        if run.state == WRITING_RUN:
            self._take(run, horizon)
        else:
            self._read(queue, run, horizon)

    def _count(self, run: SchedRun, horizon: float, limit: int) -> int:
        """How many of ``run``'s front are due by ``horizon`` (at least one)."""
        dues, front, end = run.dues, run.front, run.front + min(run.count, limit)
        n = 1
        while front + n < end and dues[front + n] <= horizon:
            n += 1
        return n

    def _take(self, run: SchedRun, horizon: float) -> None:
        """A run still being written: its front's messages back to the heap (no read)."""
        n = self._count(run, horizon, run.count)
        size = 0
        for i in range(run.front, run.front + n):
            message = run.messages.popleft()
            size += len(message.payload)
            heapq.heappush(self, (run.dues[i], run.seqs[i], message))
        run.advance(n, size)
        self.in_runs -= n
        self._front_moved(run)

    def _read(self, queue, run: SchedRun, horizon: float, whole: int = 0) -> None:
        if self.reading:
            return
        if run.journal:  # recovered, in the journal (proxy.queues.schedule_journal)
            run.read(self, queue, horizon)
            return
        pager = queue.memory.pager
        fits = 1 if whole else _room(pager, queue, run.size // max(1, run.count))
        if not fits:
            return
        n = 1 if whole else self._count(run, horizon, min(fits, max(
            1, pager.read_ahead_count // 2)))
        size = whole or min(run.nbytes, max(HEADER.size + 1, pager.read_ahead_bytes // 2))
        offset = run.offset
        self.reading = True
        pager.store.read_range(run.segment, offset, size, lambda data, error: self._read_back(
            queue, run, offset, n, data, error))

    def _read_back(self, queue, run: SchedRun, offset: int, n: int, data, error) -> None:
        self.reading = False
        pager = queue.memory.pager
        if error is None and run.state == ON_DISK and run.offset == offset:
            try:
                got = self._absorb(queue, run, data, n)
            except OSError as exc:
                error = exc
            else:
                if not got and len(data) >= HEADER.size:  # its first record is longer
                    self._read(queue, run, 0.0, HEADER.size + HEADER.unpack_from(data)[0])
                    return
        pager.loaded(queue, error)

    def _absorb(self, queue, run: SchedRun, data: bytes, n: int) -> int:
        count = size = 0
        base = run.offset
        index = run.front
        push = heapq.heappush
        for at, length, meta, payload in records(data, 0, n):
            page = Page(run.segment, base + at, length)
            page.state = STORED  # its record stays until the message is settled
            push(self, (run.dues[index + count], meta[0], message_of(page, meta, payload)))
            count += 1
            size += length
        if count:
            run.advance(count, size)
            self.in_runs -= count
            self.paged -= count
            self.paged_bytes -= size
            queue.paged_bytes -= size
            pager = queue.memory.pager
            pager.memory.paged -= size
            pager.read_back += count
            self._front_moved(run)
        return count

    # -- the pager's side ----------------------------------------------------------------------
    def page_out(self, queue, pager, keep: int, wanted: int) -> int:
        """The entries due last, up to ``wanted`` bytes, written as new runs (never the
        ``keep`` earliest); bytes freed."""
        if list.__len__(self) <= keep and not self._large(keep, pager.read_ahead_bytes):
            return 0
        entries = sorted(self)
        held = 0  # the earliest kept: ``keep`` of them, or fewer when their bodies are large
        for index, entry in enumerate(entries[:keep]):
            held += len(entry[2].payload)
            if held > pager.read_ahead_bytes:
                keep = index
                break
        taken = []
        freed = 0
        for index in range(len(entries) - 1, keep - 1, -1):
            message = entries[index][2]
            page = message.page
            if message.excluded or message.origin is not None or type(message.payload) is Page \
                    or (page is not None and page.state != STORED):
                continue  # never in a run
            taken.append(entries[index])
            freed += len(message.payload)
            if freed >= wanted:
                break
        if not taken:
            return 0
        gone = {id(entry) for entry in taken}
        self[:] = [entry for entry in entries if id(entry) not in gone]  # sorted: a heap
        self.full = False
        taken.reverse()  # in (time, seq) order
        for _, _, message in taken:
            if message.page is not None:  # read back before: a fresh record with its index
                pager.gone(queue, message)
        metas = [(m.seq, m.priority, m.attempts, m.expires_at, m.journal_id, m.rid,
                  m.enqueued_at) for _, _, m in taken]
        made: list[SchedRun] = []
        pages = pager.store.write([(m.payload, m) for _, _, m in taken], lambda done, error:
                                  self._written(queue, pager, made, done, error), metas)
        run = None
        for (due, seq, message), page in zip(taken, pages):
            message.page = page
            if run is None or page.segment is not run.segment:
                run = SchedRun(page.segment, page.offset)
                made.append(run)
            run.dues.append(due)
            run.seqs.append(seq)
            if message.journal_id and run.ids is None:
                run.ids = array("q", bytes(8 * run.count))
            if run.ids is not None:
                run.ids.append(message.journal_id)
            run.messages.append(message)
            run.count += 1
            run.size += page.size
            run.nbytes += HEADER.size + page.size
            pager.writing += page.size
        for run in made:
            self.runs.append(run)
            heapq.heappush(self.fronts, (*run.key(), run.serial, run))
        self.in_runs += len(taken)
        pager.paged_out += len(taken)
        return freed

    def _large(self, keep: int, limit: int) -> bool:
        """Whether the in-memory entries (at most ``keep``) hold more than ``limit`` bytes."""
        return sum(len(entry[2].payload) for entry in self) > limit

    def _written(self, queue, pager, made: list, done: list, error) -> None:
        pager.run_pages_written(done, error)
        memory = pager.memory
        for run in made:
            if run.state != WRITING_RUN:
                continue
            if error is not None:  # back to the heap, in memory for good
                for i, message in enumerate(run.messages):
                    heapq.heappush(self, (run.dues[run.front + i], run.seqs[run.front + i],
                                          message))
                self.in_runs -= run.count
                run.state = DEAD
                self.runs.remove(run)
                continue
            run.state = ON_DISK
            run.messages = None
            self.paged += run.count
            self.paged_bytes += run.size
            queue.paged_bytes += run.size
            memory.paged += run.size
        pager.runs_written(error)

    # -- leaving -------------------------------------------------------------------------------
    def drop(self, queue) -> int:
        """Purge: every run's records dead (no read); their body bytes."""
        pager = queue.memory.pager
        if self.pending is not None:
            self.pending.seal(self)
        size = 0
        for run in self.runs:
            if run.journal:  # its pins go
                size += run.drop(queue)
                continue
            size += run.size
            if run.state == ON_DISK:
                pager.store.dead_records(run.segment, run.count, run.nbytes)
                queue.paged_bytes -= run.size
                pager.memory.paged -= run.size
            elif run.state == WRITING_RUN:
                for message in run.messages:
                    pager.gone(queue, message)
            run.state = DEAD
        self.runs.clear()
        self.fronts.clear()
        self.in_runs = self.paged = self.paged_bytes = 0
        self.full = False
        list.clear(self)
        return size

    def names(self):
        """``(journal_id, rid)`` of every scheduled message, nothing read (purge)."""
        if self.pending is not None:
            self.pending.seal(self)
        for _, _, message in list.__iter__(self):
            yield message.journal_id, message.rid
        for run in list(self.runs):
            if run.journal:
                yield from ((run.ids[i], 0) for i in range(run.front, run.front + run.count))
            elif run.state != ON_DISK:
                for message in list(run.messages or ()):
                    yield message.journal_id, message.rid
            elif run.ids is not None:
                yield from ((run.ids[i], 0) for i in range(run.front, run.front + run.count))

    def in_order(self, pager=None):
        """Every scheduled message in (time, seq) order; a run's as transient objects read
        from disk, synchronously (peek, purge's journal dequeues, a subscription's removal)."""
        if self.pending is not None:
            self.pending.seal(self)
        sources = [iter(sorted(self))]
        for run in list(self.runs):
            sources.append(self._entries(run, pager))
        for _, _, message in heapq.merge(*sources, key=lambda entry: (entry[0], entry[1])):
            yield message

    def _entries(self, run: SchedRun, pager):
        if run.journal:
            yield from run.entries()
            return
        front = run.front
        if run.state != ON_DISK:
            for i, message in enumerate(list(run.messages or ())):
                yield run.dues[front + i], run.seqs[front + i], message
            return
        read_now = pager.store.read_now
        offset, left, remaining, index = run.offset, run.count, run.nbytes, front
        step = FIRST_READ  # a peek merges every run's first record: small reads first
        while left > 0 and remaining > 0:
            data = read_now(run.segment, offset, min(remaining, step))
            step = min(SCAN, step * 4)
            if len(data) >= HEADER.size and HEADER.size + HEADER.unpack_from(data)[0] > len(data):
                data = read_now(run.segment, offset, HEADER.size + HEADER.unpack_from(data)[0])
            taken = 0
            for _, length, meta, payload in records(data, 0, left):
                yield run.dues[index], run.seqs[index], message_of(None, meta, payload)
                index += 1
                taken += HEADER.size + length
                left -= 1
            if not taken:
                return
            offset += taken
            remaining -= taken
