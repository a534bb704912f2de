"""The pager: which waiting messages go to disk, which come back, and the disk bounds.

How this works (docs/paging.md)
-------------------------------
The event loop alone decides. The node's ``MemoryUse`` counts every payload byte its
queues hold (``used``) and those on disk only (``paged``); ``resident`` is the difference.

* **Out**: when ``resident`` passes the budget (``[limits] max_memory``), ``wake`` runs one
  round on the next loop turn: queues are taken by most resident bytes first, and from
  each the in-memory messages at its **tail** (the oldest of them first, so that the paged
  part stays one piece), never the first ``read_ahead`` of its order (where consumers
  are), until ``resident`` less what is being written is under ``LOW`` of
  the budget. A message whose body is on disk already (read back before) is paged again
  without a write. A queue with a selective consumer, or one that does not page
  (``queue.pages``: replicated queues), is left alone.
* **Back**: a queue's dispatch that meets a paged message at its head asks ``read_ahead``:
  the next paged messages of its order, up to half the read-ahead window, are read in one
  job; the first of them is marked (``Page.trigger``): handing it out asks for the next
  batch, so the window stays between a half and a whole of ``read_ahead`` ahead of the
  consumers. When a batch is back, ``on_loaded(queue)`` dispatches the queue.
* **Bounds**: producers stop (``MemoryUse.ceiling`` falls back to the budget) while the
  store is at ``[limits] max_disk`` or the file system's free space under
  ``min_free_disk`` (looked at every ``DISK_CHECK`` seconds),
  or after a write error. Otherwise they stop only when ``resident`` passes ``HEADROOM``
  times the budget: the disk does not keep up.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Callable

from proxy.paging.store import DEAD, HEADER, PAGED, READING, STORED, WRITING, Page, PageStore

log = logging.getLogger("fedgate.paging")

LOW = 0.85  # a round pages out until resident bytes are under this share of the budget
HEADROOM = 1.25  # producers stop when resident bytes pass the budget by this much
DISK_CHECK = 1.0  # seconds between looks at the file system's free space
ROUND_BYTES = 8 * 1024 * 1024  # at most this much is handed to the writer per round


class Pager:
    def __init__(self, store: PageStore, memory, queues: Callable[[], object], *,
                 read_ahead: int = 1000, read_ahead_bytes: int = 4 * 1024 * 1024,
                 max_disk: int = 0, min_free_disk: int = 0, runs: bool = True) -> None:
        self.store = store
        self.memory = memory
        self.queues = queues  # -> the node's queues (an iterable of LocalQueue)
        self.read_ahead_count = read_ahead
        self.read_ahead_bytes = read_ahead_bytes
        self.max_disk = max_disk
        self.runs = runs  # FIFO queues keep paged messages in runs (proxy.queues.runs)
        self.min_free_disk = min_free_disk
        self.on_loaded: Callable[[object], None] = lambda queue: None
        # the broker's cycle: producers topped up once pages made room (MemoryUse.freed)
        self.run_pending: Callable[[], None] = lambda: None
        self.writing = 0  # bytes handed to the writer, not yet written
        self.bound: str | None = None  # "disk", "free-disk" or "error": producers stop
        self.free_disk: int | None = None
        self.paged_out = 0  # messages paged out (written or not), ever
        # backups' copies (proxy.replication.replica.ReplicaImage, given by the replication
        # service): their entries page as they arrive while the node is over its budget
        self.images: Callable[[], object] = lambda: ()
        self.image_paged = 0  # bytes of backups' entries on disk only
        self.read_back = 0  # messages read back, ever
        self._woken = False
        self._timer = None
        self._loop: asyncio.AbstractEventLoop | None = None
        memory.pager = self

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.store.open(loop)
        self._look_at_disk()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.store.close()

    # -- bounds ------------------------------------------------------------------------------
    def _look_at_disk(self) -> None:
        self._timer = self._loop.call_later(DISK_CHECK, self._look_at_disk)
        if self.min_free_disk:
            try:
                stats = os.statvfs(self.store.directory)
                self.free_disk = stats.f_bavail * stats.f_frsize
            except OSError:
                self.free_disk = None
        self._check_bounds()

    def _check_bounds(self) -> None:
        """Which bound holds now (the free space as last looked at: every DISK_CHECK s)."""
        bound = None
        if self.store.error is not None:
            bound = "error"
        elif self.max_disk and self.store.disk_bytes >= self.max_disk:
            bound = "disk"
        elif self.min_free_disk and self.free_disk is not None \
                and self.free_disk < self.min_free_disk:
            bound = "free-disk"
        if bound != self.bound:
            if bound is None:
                log.info("paging: the disk has room again")
            else:
                log.warning("paging: stopped at the %s bound (store %d bytes, free %s): "
                            "producers get no credit above the memory budget", bound,
                            self.store.disk_bytes, self.free_disk)
            self.bound = bound
        memory = self.memory
        if bound is None and (memory.blocked or memory.waiting):
            memory.freed()
            self.run_pending()

    def ceiling(self) -> int:
        """Where producers stop: above the budget while pages can be written."""
        limit = self.memory.limit
        return limit if self.bound else int(limit * HEADROOM)

    # -- out ---------------------------------------------------------------------------------
    def wake(self) -> None:
        """Over the budget: one round of paging out, on the next loop turn."""
        if not self._woken and self._loop is not None:
            self._woken = True
            self._loop.call_soon(self._round)

    def _round(self) -> None:
        self._woken = False
        self._check_bounds()
        if self.bound:
            return
        memory = self.memory
        excess = memory.resident - self.writing - int(memory.limit * LOW)
        if excess <= 0:
            return
        excess = min(excess, ROUND_BYTES)
        candidates = [q for q in self.queues() if q.pages and not q.selective
                      and q.bytes - q.paged_bytes > 0]
        candidates.sort(key=lambda q: q.bytes - q.paged_bytes, reverse=True)
        for queue in candidates:
            excess -= self._page_out(queue, excess)
            if excess <= 0:
                break
        self.run_pending()  # pages again without a write may have made room

    def _page_out(self, queue, wanted: int) -> int:
        """Scheduled messages due last first (the coldest: docs/paging-scheduled.md), then
        the ready order's tail."""
        freed = 0
        scheduled = getattr(queue, "scheduled", None)
        if scheduled is not None and list.__len__(scheduled) and queue.scheduled_runs:
            freed = scheduled.page_out(queue, self, self.read_ahead_count, wanted)
        if freed < wanted:
            freed += self._page_out_ready(queue, wanted - freed)
        return freed

    def _page_out_ready(self, queue, wanted: int) -> int:
        """In-memory messages of ``queue``'s tail, up to ``wanted`` bytes: to disk, the
        oldest of them first, so that the paged part is one piece between the messages kept
        at the head and the newest. A priority queue is taken level by level, the lowest
        first: each level is a FIFO like a plain queue. A queue that keeps runs does it
        itself (``queue.page_out``)."""
        freed = queue.page_out(self, self.read_ahead_count, wanted)
        if freed is not None:
            return freed
        messages = queue.messages
        levels = getattr(messages, "levels", None)
        if levels is None:
            runs = [(messages, len(messages))]
        else:
            runs = []
            after = len(messages)  # messages up to the end of this level, in delivery order
            for level in levels:
                if level:
                    runs.append((level.values(), after))
                    after -= len(level)
        keep = self.read_ahead_count
        fresh = []
        freed = 0
        for run, position in runs:
            if freed >= wanted or position <= keep:
                break
            tail = []  # the in-memory messages after the paged part, newest first
            for message in reversed(run):
                position -= 1
                if position < keep:
                    break
                page = message.page
                if page is not None and page.state >= PAGED:
                    break
                tail.append(message)
            for message in reversed(tail):  # the oldest first: the paged part stays one piece
                if freed >= wanted:
                    break
                page = message.page
                if page is None:
                    payload = message.payload
                    fresh.append((payload, (queue, message)))
                    freed += len(payload)
                elif page.state == STORED:  # on disk already: only the memory goes
                    message.payload = page
                    page.state = PAGED
                    self._now_paged(queue, page.size)
                    freed += page.size
        if fresh:
            pages = self.store.write(fresh, self._written)
            for (payload, (_, message)), page in zip(fresh, pages):
                message.page = page
                self.writing += page.size
            queue.page_writes += len(fresh)
            self.paged_out += len(fresh)
        return freed

    def _now_paged(self, queue, size: int) -> None:
        queue.paged_bytes += size
        queue.paged_count += 1
        memory = self.memory
        memory.paged += size
        if memory.blocked or memory.waiting:
            memory.freed()

    def _written(self, done: list, error: OSError | None) -> None:
        for (queue, message), page in done:
            self.writing -= page.size
            queue.page_writes -= 1
            if error is not None:  # the body stays in memory, without a record
                if message.page is page:
                    message.page = None
                self.store.dead(page)
                continue
            if page.state == WRITING and message.page is page:
                message.payload = page
                page.state = PAGED
                self._now_paged(queue, page.size)
        if error is not None:
            self._check_bounds()
        elif self.memory.resident - self.writing > self.memory.limit:
            self.wake()
        self.run_pending()

    # -- back --------------------------------------------------------------------------------
    def read_ahead(self, queue) -> None:
        """The next paged messages of ``queue``'s order, read back (one job at a time)."""
        if queue.reading or not queue.paged_count:
            return
        if getattr(queue.messages, "runs", None):  # a RunQueue with runs (proxy.queues.runs)
            queue.messages.read_ahead()
            return
        half_count = max(1, self.read_ahead_count // 2)
        half_bytes = max(1, self.read_ahead_bytes // 2)
        resident = 0
        batch = []
        size = 0
        order = queue.messages.in_order() if hasattr(queue.messages, "in_order") \
            else queue.messages
        for message in order:
            page = message.page
            if page is None or page.state < PAGED:
                if batch:
                    continue
                resident += 1
                if resident >= self.read_ahead_count:
                    return  # enough is in memory ahead of the consumers
                continue
            if page.state == READING:
                return
            batch.append(((queue, message), page))
            size += page.size
            if len(batch) >= half_count or size >= half_bytes:
                break
        if not batch:
            return
        for _, page in batch:
            page.state = READING
        batch[0][1].trigger = True
        queue.reading = True
        self.store.read(batch, self._read_back)

    def _read_back(self, done: list, error: OSError | None) -> None:
        queues = set()
        memory = self.memory
        for (queue, message), page, payload in done:
            queues.add(queue)
            if page.state != READING:  # gone meanwhile
                continue
            if payload is None:  # not read (an I/O error): stays paged, asked again later
                page.state = PAGED
                continue
            message.payload = payload
            page.state = STORED
            queue.paged_bytes -= page.size
            queue.paged_count -= 1
            memory.paged -= page.size
            self.read_back += 1
        for queue in queues:
            queue.reading = False
            self.loaded(queue, error)

    def loaded(self, queue, error: OSError | None) -> None:
        """A read back for ``queue`` is done (its messages', a run's, a scheduled run's): the
        queue dispatched (asked again in a second after an error, not in a tight loop), and
        the pager woken when the bodies in memory passed the budget."""
        if error is None:
            self.on_loaded(queue)
        else:
            self._loop.call_later(1.0, self.on_loaded, queue)
        memory = self.memory
        if memory.resident - self.writing > memory.limit:
            self.wake()

    def run_pages_written(self, done: list, error: OSError | None) -> None:
        """The pages of a run's write (``(message, page)`` pairs) back: after an error each
        is dead and its message keeps its body; a page taken meanwhile keeps its record
        (``STORED``); the owner then settles its runs and calls ``runs_written``."""
        store = self.store
        for message, page in done:
            self.writing -= page.size
            if error is not None:
                if message.page is page:
                    message.page = None
                store.dead(page)
            elif page.state == WRITING:
                page.state = STORED

    def runs_written(self, error: OSError | None) -> None:
        """A run's write is done, its records counted as paged by its owner (a queue's runs,
        scheduled runs): the bounds looked at again after an error; else producers let go
        and the pager woken if memory is still over the budget; what waited for the writer
        goes on."""
        memory = self.memory
        if error is not None:
            self._check_bounds()
        else:
            if memory.blocked or memory.waiting:
                memory.freed()
            if memory.resident - self.writing > memory.limit:
                self.wake()
        self.run_pending()

    # -- what the queue tells ------------------------------------------------------------------
    def load_now(self, queue, message) -> None:
        """A paged message's body, read here and now and kept (selective consumers,
        dead-lettering): the rare paths that cannot wait for a read-ahead."""
        page = message.payload
        if type(page) is not Page:
            return
        message.payload = page.read()
        page.state = STORED  # a read under way for it finds it back already
        queue.paged_bytes -= page.size
        queue.paged_count -= 1
        self.memory.paged -= page.size
        self.read_back += 1

    def gone(self, queue, message) -> None:
        """``message`` left ``queue`` for good, or its body changed: its record is dead."""
        page = message.page
        message.page = None
        if page is None:
            return
        if page.state in (PAGED, READING):
            queue.paged_bytes -= page.size
            queue.paged_count -= 1
            self.memory.paged -= page.size
        if page.state != DEAD:
            self.store.dead(page)

    # -- backups' copies ------------------------------------------------------------------------
    # A backup's copy is never dispatched: its entries need their bodies only when it is
    # promoted (or rewritten). So they are paged as they come (``image_changes``) while the
    # node's bodies in memory, queues' and copies' together, are over ``LOW`` of the budget,
    # and read back one by one when the copy becomes a queue (``LocalQueue.enqueue`` of a
    # paged message: read for its header, then left on disk).
    def image_resident(self) -> int:
        return sum(image.bytes - image.run_bytes for image in self.images()) - self.image_paged

    def image_runs_paged(self) -> int:
        return sum(image.run_bytes for image in self.images())

    def image_changes(self, image, changes) -> None:
        """One applied batch: records of removed or rewritten entries die; added entries go
        to disk when the node is over the budget."""
        for entry in changes.removed:
            self.entry_gone(entry)
        for _, entry in changes.rewritten:  # the body changed: the record is stale
            self.entry_gone(entry)
        store = self.store
        for segment, size in changes.dead_records:  # of the copy's runs
            store.dead_records(segment, 1, HEADER.size + size)
        if not changes.added or self.bound:
            return
        memory = self.memory
        if memory.resident + self.image_resident() - self.writing <= memory.limit * LOW:
            return
        if not self.runs:
            self._write_entries(None, changes.added)
            return
        # in runs (image.runs_written, once written): the head's and the tail's apart, each
        # in rid order, so that a run's rids are one stretch of the copy's order
        fronts = {value for value, _ in changes.fronts}
        self._write_entries(image, sorted(p for p in changes.added if p[0] in fronts))
        self._write_entries(image, sorted(p for p in changes.added if p[0] not in fronts))

    def _write_entries(self, image, added: list) -> None:
        fresh = [(entry.payload, (value, entry)) for value, entry in added
                 if entry.page is None and type(entry.payload) is bytes]
        if not fresh:
            return
        metas = None if image is None else \
            [image.record_fields(value, entry) for _, (value, entry) in fresh]
        pages = self.store.write(fresh, lambda done, error: self._entries_written(
            done, error, image), metas)
        for (_, (_, entry)), page in zip(fresh, pages):
            entry.page = page
            self.writing += page.size
        self.paged_out += len(fresh)

    def _entries_written(self, done: list, error: OSError | None, image=None) -> None:
        for (_, entry), page in done:
            self.writing -= page.size
            if error is not None:
                if entry.page is page:
                    entry.page = None
                self.store.dead(page)
            elif page.state == WRITING:
                if entry.page is page:
                    entry.payload = page
                    page.state = PAGED
                    self.image_paged += page.size
                else:  # handed over to a queue meanwhile (promoted): on disk, body in memory
                    page.state = STORED
        if error is not None:
            self._check_bounds()
        elif image is not None:  # still in the copy: runs (no object per message)
            self.image_paged -= image.runs_written(done)

    def entry_gone(self, entry) -> None:
        """A backup's entry left its copy, or its body changed: its record is dead."""
        page = entry.page
        if page is None:
            return
        entry.page = None
        if page.state == PAGED:
            self.image_paged -= page.size
        self.store.dead(page)

    def hand_over(self, entry):
        """A promoted entry becomes a queue's message: its page record (or None) goes with it,
        no longer counted as a copy's."""
        page = entry.page
        if page is not None:
            entry.page = None
            if page.state == PAGED:
                self.image_paged -= page.size
        return page

    def describe(self) -> dict:
        store = self.store
        return {"budget": self.memory.limit, "resident_bytes": self.memory.resident,
                "paged_bytes": self.memory.paged, "writing_bytes": self.writing,
                "disk_bytes": store.disk_bytes, "live_bytes": store.live_bytes,
                "segments": len(store.segments), "max_disk": self.max_disk,
                "min_free_disk": self.min_free_disk, "free_disk": self.free_disk,
                "bound": self.bound, "paged_out": self.paged_out, "read_back": self.read_back,
                "backups_paged_bytes": self.image_paged + self.image_runs_paged(),
                "backups_resident_bytes": self.image_resident(),  # backups' bodies in memory
                "error": str(store.error) if store.error else None}
