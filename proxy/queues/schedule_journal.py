"""Journal runs: recovered durable scheduled messages whose bodies stay in the journal.

How this works (docs/paging-scheduled.md, "Durable scheduled messages and a restart")
-------------------------------------------------------------------------------------
At a restart, recovery keeps bodies up to half the budget; a scheduled message beyond it
comes to ``LocalQueue.enqueue`` as a journal page (``proxy.queues.journal_pages``), read
once for its header. Instead of a ``StoredMessage`` and a ``Page`` in the heap (about 400
bytes), ``keep`` puts its place in the queue's *journal run*: per message its time, seq,
journal id, segment number, offset and body size, in arrays (40 bytes). The page object
goes, its **pin** stays with the run: the journal does not relocate a pinned segment, so
the offset stays right (``Journal._relocate_sparse`` moves ``_where`` at once and writes
the copy later: a location looked up by id could name a copy not yet written).

Once restore is done the run is sorted by ``(time, seq)`` (``seal``, on the first look of
the queue's ``Scheduled``) and joins the queue's scheduled runs: released in order with
them, its front read back ahead of its time (``read``: a page made for each record under
the pin it holds, all read in one job of the I/O thread, one ``pread`` a record: they are
not contiguous), each record's priority and ttl taken from its header (the ttl counted
from the restore, as for every recovered message). A message read back keeps its page
(``STORED``) until it is settled: then the pin goes (``JournalView.dead``). Purge
releases the pins of what is left (``drop``); a read under way finds its run dead and
lets its pages die. The event loop alone does all this; the I/O thread only reads.
"""

from __future__ import annotations

import heapq
from array import array
from time import monotonic

from proxy.amqp import message_header
from proxy.paging.store import PAGED, READING, STORED, Page
from proxy.queues.message import StoredMessage
from proxy.queues.schedule_pages import DEAD, ON_DISK, _room, _serials

FIELDS = ("dues", "seqs", "ids", "numbers", "offsets", "sizes")


class JournalRun:
    """Recovered scheduled messages of one queue, their bodies in the journal: arrays from
    ``front``; the pins of their segments held (``pages``: the node's ``JournalPages``)."""

    __slots__ = (*FIELDS, "pages", "overhead", "front", "count", "size", "state", "serial",
                 "restored_at", "inflight")
    journal = True
    messages = None

    def __init__(self, pages, overhead: int) -> None:
        self.pages = pages
        self.overhead = overhead  # the queue's record layout: bytes before a body
        self.dues, self.seqs, self.ids = array("d"), array("Q"), array("Q")
        self.numbers, self.offsets, self.sizes = array("I"), array("Q"), array("I")
        self.front = self.count = self.size = self.inflight = 0
        self.state = ON_DISK
        self.serial = next(_serials)
        self.restored_at = 0.0

    def key(self) -> tuple:
        return self.dues[self.front], self.seqs[self.front]

    def seal(self, scheduled) -> None:
        """Restore is done: sorted by (time, seq), among the queue's runs."""
        scheduled.pending = None
        order = sorted(range(self.count), key=lambda k: (self.dues[k], self.seqs[k]))
        for name in FIELDS:
            old = getattr(self, name)
            setattr(self, name, array(old.typecode, (old[k] for k in order)))
        self.restored_at = monotonic()
        scheduled.runs.append(self)
        heapq.heappush(scheduled.fronts, (*self.key(), self.serial, self))

    # -- reading back ------------------------------------------------------------------------
    def read(self, scheduled, queue, horizon: float) -> None:
        pager = queue.memory.pager
        fits = _room(pager, queue, self.size // max(1, self.count))
        if not fits:
            return
        n = scheduled._count(self, horizon, min(fits, max(1, pager.read_ahead_count // 2)))
        view = self.pages.view
        batch = []
        for i in range(self.front, self.front + n):
            page = Page(view(self.numbers[i], self.overhead), self.offsets[i], self.sizes[i])
            page.state = READING
            batch.append((i, page))
        self.inflight = n
        scheduled.reading = True
        pager.store.read(batch, lambda done, error: self._back(scheduled, queue, done, error))

    def _back(self, scheduled, queue, done: list, error) -> None:
        scheduled.reading = False
        self.inflight = 0
        pager = queue.memory.pager
        if self.state == DEAD:  # purged meanwhile: these records' pins are their pages' now
            for _, page, _ in done:
                pager.store.dead(page)
            pager.loaded(queue, None)
            return
        if error is not None or any(payload is None for _, _, payload in done):
            pager.loaded(queue, error or OSError("a journal record was not read"))
            return  # (the records stay in the run, their pins too: asked again)
        size = 0
        push = heapq.heappush
        for i, page, payload in done:
            page.state = STORED  # its record (and pin) stays until the message is settled
            ttl, priority = message_header.ttl_and_priority(payload)
            message = StoredMessage(payload, journal_id=self.ids[i], enqueued_at=self.restored_at,
                                    seq=self.seqs[i], priority=priority, page=page,
                                    expires_at=self.restored_at + ttl / 1000.0 if ttl else 0.0)
            push(scheduled, (self.dues[i], self.seqs[i], message))
            size += page.size
        count = len(done)
        self.front += count
        self.count -= count
        self.size -= size
        scheduled.in_runs -= count
        scheduled.paged -= count
        scheduled.paged_bytes -= size
        queue.paged_bytes -= size
        pager.memory.paged -= size
        pager.read_back += count
        scheduled._front_moved(self)
        pager.loaded(queue, None)

    # -- leaving -------------------------------------------------------------------------------
    def drop(self, queue) -> int:
        """Purge: the pins of the records left go (a read under way lets its own go)."""
        release = self.pages.let_go
        for i in range(self.front + self.inflight, self.front + self.count):
            release(self.numbers[i])
        queue.paged_bytes -= self.size
        queue.memory.paged -= self.size
        self.state = DEAD
        return self.size

    def entries(self):
        """Its messages in order, as transient messages whose payload is a page of the
        journal (read only if asked: a peek; a purge needs only the journal ids)."""
        view = self.pages.view
        for i in range(self.front, self.front + self.count):
            page = Page(view(self.numbers[i], self.overhead), self.offsets[i], self.sizes[i])
            page.state = PAGED
            yield self.dues[i], self.seqs[i], StoredMessage(page, journal_id=self.ids[i],
                                                            seq=self.seqs[i])


def keep(scheduled, queue, due: float, message) -> None:
    """Restore: ``message`` (its payload a journal page, counted paged one by one by
    ``enqueue``) kept as its place in the queue's journal run; the page object goes, its
    pin stays with the run."""
    page = message.payload
    view = page.segment
    run = scheduled.pending
    if run is None:
        run = scheduled.pending = JournalRun(view.file.pages, view.overhead)
    run.dues.append(due)
    run.seqs.append(message.seq)
    run.ids.append(message.journal_id)
    run.numbers.append(view.number)
    run.offsets.append(page.offset)
    run.sizes.append(page.size)
    run.count += 1
    run.size += page.size
    scheduled.in_runs += 1
    scheduled.paged += 1
    scheduled.paged_bytes += page.size
    queue.paged_count -= 1  # in a run now, not one by one (its bytes stay paged)
    message.page = message.payload = None
