"""Runs of journal records: a restarted node's durable FIFO backlog, no object per message.

How this works (docs/paging.md, "Recovered durable messages in runs")
--------------------------------------------------------------------
After a restart, the durable messages of a plain FIFO queue beyond the body budget are in
the journal, each an ENQUEUE record at a known place. A ``JournalRun`` is a stretch of them
in queue order (id order), kept as compact arrays: per message its journal segment, the
record's offset, the body's size (``array('I')``) and its journal id (``array('q')``), its
expiry time (``array('d')``) only where one has a ttl: 20 bytes a message (28 with ttls),
one object per ``RUN_MESSAGES``. A run holds messages of one priority (a FIFO queue's runs,
or one level of a priority queue in runs: ``proxy.queues.level_runs``); a message's seq is
``seq_base`` + its journal id (in id order, as the queue's enqueues were), attempts 0, one
``enqueued_at``. A ``RunQueue`` holds it among its runs as it holds a page-store run
(``proxy.queues.runs.Chunk``): the same attributes ``count``, ``size``, ``max_seq``,
``state``; only reading and dropping differ.

* *Holds.* Each message of a run holds its journal segment open and pinned
  (``JournalPages.hold``: the file's count, as a ``JournalView`` page does), so its
  records are never relocated while a run names them. The hold passes to the message's
  page when it is read back (a ``JournalView`` page, ``STORED``: paging it again writes
  nothing, its death lets the segment go); a purge lets the run's holds go
  (``release``).
* *Reading back* (the loop asks, the I/O thread reads): the front's next messages, up to
  half the read-ahead window, as pages of the store's ``read`` (one ``pread`` of the
  whole record each, its CRC checked); what comes back that is still the run's front
  becomes messages at the end of the head. ``load_now`` reads the front on the loop (the
  rare paths that need the next message at once).
* The event loop alone makes (restore), shortens (read-back) and drops runs.
"""

from __future__ import annotations

from array import array

from proxy.paging.store import PAGED, STORED, Page
from proxy.queues.message import StoredMessage

ON_DISK, DEAD = 1, 3  # proxy.queues.runs' states (checked there)
RUN_MESSAGES = 65536  # messages a run at most: its arrays go when it is read


class JournalRun:
    __slots__ = ("pages", "overhead", "numbers", "offsets", "sizes", "ids", "expires",
                 "seq_base", "priority", "front", "count", "size", "max_seq", "enqueued_at",
                 "state")
    messages = None  # a page-store run's objects while it is written: never here

    def __init__(self, pages, overhead: int, seq_base: int, priority: int,
                 enqueued_at: float) -> None:
        self.pages = pages  # the node's JournalPages
        self.overhead = overhead  # bytes of a record before its body (one queue's layout)
        self.numbers = array("I")
        self.offsets = array("I")
        self.sizes = array("I")
        self.ids = array("q")
        self.expires: array | None = None  # only once a message has an expiry
        self.seq_base = seq_base  # a message's seq: this + its journal id
        self.priority = priority
        self.front = 0  # index of the first message still in the run
        self.count = 0
        self.size = 0  # body bytes still in the run
        self.max_seq = 0
        self.enqueued_at = enqueued_at
        self.state = ON_DISK

    @property
    def full(self) -> bool:
        return len(self.ids) >= RUN_MESSAGES

    def add(self, number: int, offset: int, size: int, message_id: int,
            expires_at: float) -> None:
        """One more message at the end (restore): its hold taken already."""
        if expires_at and self.expires is None:
            self.expires = array("d", bytes(8 * len(self.ids)))
        self.numbers.append(number)
        self.offsets.append(offset)
        self.sizes.append(size)
        self.ids.append(message_id)
        if self.expires is not None:
            self.expires.append(expires_at)
        self.count += 1
        self.size += size
        self.max_seq = self.seq_base + message_id

    def page(self, i: int) -> Page:
        """A page for message ``i``'s record (it takes over the message's hold once kept)."""
        return Page(self.pages.view(self.numbers[i], self.overhead), self.offsets[i],
                    self.sizes[i])

    def message(self, i: int, page: Page, payload) -> StoredMessage:
        expires = self.expires
        message_id = self.ids[i]
        return StoredMessage(payload, frozenset(), message_id, self.enqueued_at, None,
                             self.seq_base + message_id,
                             expires[i] if expires is not None else 0.0, 0, self.priority, 0,
                             page)

    def advance(self, count: int, size: int) -> None:
        """``count`` messages of ``size`` body bytes left its front (their holds with them)."""
        self.front += count
        self.count -= count
        self.size -= size

    def transient(self):
        """Its messages, bodies read here and now, as objects nothing may keep (browsing,
        a purge's journal ids)."""
        for i in range(self.front, self.front + self.count):
            page = self.page(i)
            yield self.message(i, None, page.segment.read(page))

    def names(self):
        """``(journal_id, rid)`` of each message from its front: its ids, nothing read (purge)."""
        for i in range(self.front, self.front + self.count):
            yield self.ids[i], 0

    def release(self) -> None:
        """Purged: every hold it still has let go."""
        let_go = self.pages.let_go
        numbers = self.numbers
        for i in range(self.front, self.front + self.count):
            let_go(numbers[i])
        self.state = DEAD

    def unrun(self) -> list:
        """Its messages as messages paged one by one (``PAGED`` journal pages, the holds
        passed to them; counted as paged already, as the run was)."""
        out = []
        for i in range(self.front, self.front + self.count):
            page = self.page(i)
            page.state = PAGED
            out.append(self.message(i, page, page))
        self.state = DEAD
        return out


def read_ahead(runs, chunk: JournalRun) -> bool:
    """``RunQueue.read_ahead`` for a journal run: its front's next messages asked of the I/O
    thread (up to half the read-ahead window, by count and bytes). False: under way."""
    queue = runs.queue
    pager = runs.pager
    half = max(1, pager.read_ahead_count // 2)
    room = max(1, pager.read_ahead_bytes // 2)
    start = chunk.front
    items = []
    for i in range(start, start + min(half, chunk.count)):
        if items and room <= 0:
            break
        room -= chunk.sizes[i]
        items.append((i, chunk.page(i)))
    queue.reading = True
    pager.store.read(items, lambda done, error: _read_back(runs, chunk, done, error))
    return False


def _read_back(runs, chunk: JournalRun, done: list, error) -> None:
    queue = runs.queue
    pager = runs.pager
    queue.reading = False
    if error is None and runs.runs and runs.runs[0] is chunk and chunk.state == ON_DISK:
        # what was loaded meanwhile at once (load_now) is not the front any more
        _absorb(runs, chunk, [(i, page, payload) for i, page, payload in done
                              if i >= chunk.front])
    if queue.messages is runs and not runs.runs:
        queue.messages = runs.head  # runs all read: a plain deque again
    pager.loaded(queue, error)


def load_now(runs, chunk: JournalRun, limit: int) -> None:
    """The run's front into the head, read here and now."""
    got = []
    for i in range(chunk.front, chunk.front + min(limit, chunk.count)):
        page = chunk.page(i)
        got.append((i, page, page.segment.read(page)))
    runs.pager.store.reads_now += 1
    _absorb(runs, chunk, got)


def _absorb(runs, chunk: JournalRun, got: list) -> None:
    """Messages read back from the run's front (``got``: (index, page, body), in order)."""
    if not got:
        return
    append = runs.head.append
    message = chunk.message
    size = 0
    for i, page, payload in got:
        page.state = STORED  # the message's hold is its page's now
        append(message(i, page, payload))
        size += page.size
    got[0][1].trigger = True  # handing it out asks for the next read-ahead
    count = len(got)
    chunk.advance(count, size)
    queue = runs.queue
    queue.paged_bytes -= size
    queue.paged_count -= count
    runs.pager.memory.paged -= size
    runs.pager.read_back += count
    runs._shortened(chunk, count)
