"""Durable messages paged in the journal: their bodies read back from its segment files.

How this works (docs/paging.md, "Durable messages: the journal as page store")
--------------------------------------------------------------------------------
A restart with a durable backlog larger than memory keeps, beyond the body budget, only
each message's index: a ``StoredMessage`` whose ``payload`` and ``page`` are a
``proxy.paging.store.Page`` pointing at the message's ENQUEUE record in the journal
(segment, offset of the record, body size). The page store and the pager treat it as any
paged message (the read-ahead reads it back, in order, in the I/O thread); its segment is
*foreign* to the store: ``JournalView.read`` reads and checks the whole record,
``JournalView.dead`` is told when the queue no longer needs it.

* A ``JournalFile`` is one journal segment opened read-only, shared by every page in it;
  ``live`` counts them. While it is above 0 the journal does not relocate the segment's
  records (``Journal.pin``): a location stays right. At 0 the file is closed and unpinned.
  A segment the journal deletes meanwhile (every message in it dequeued) stays readable
  through the open descriptor until then.
* A ``JournalView`` is a file seen through one queue name's record layout: the bytes
  before the body (record header, id, name) are the same for every record of that queue.
* A journal run (``proxy.queues.journal_runs``) holds its messages' records the same way
  without a page each (``hold``, ``let_go``): a page made for one when it is read back
  takes its hold over.
* Only the event loop makes views and counts pages; the I/O thread reads (``os.pread``)
  and closes a file's descriptor, as its last job for it (``PageStore.after_io``): a
  read asked before the last page died never finds it closed.
"""

from __future__ import annotations

import os

from proxy.journal.format import ENQUEUE_HEAD, RECORD_HEADER, enqueue_payload
from proxy.journal.journal import Journal
from proxy.paging.store import PAGED, Page, PageStore
from proxy.queues import journal_restore


class JournalFile:
    __slots__ = ("pages", "number", "fd", "live")

    def __init__(self, pages: "JournalPages", number: int) -> None:
        self.pages = pages
        self.number = number
        self.fd = os.open(pages.journal.segment_path(number), os.O_RDONLY)
        self.live = 0


class JournalView:
    """A journal segment as a foreign segment of the page store (for one record layout)."""

    __slots__ = ("file", "overhead", "number")
    foreign = True

    def __init__(self, file: JournalFile, overhead: int) -> None:
        self.file = file
        self.overhead = overhead  # bytes of a record before its body
        self.number = file.number

    def read(self, page: Page) -> bytes:
        """The body of ``page``'s record, read and checked (any thread: the fd stays open)."""
        data = os.pread(self.file.fd, self.overhead + page.size, page.offset)
        return enqueue_payload(data, self.overhead)

    def dead(self, page: Page) -> None:
        """The loop: the queue no longer needs the record (the store marked the page DEAD)."""
        self.file.pages.released(self.file)


class JournalPages:
    """The node's journal pages: files opened, views per (segment, layout), pins."""

    def __init__(self, journal: Journal, store: PageStore) -> None:
        self.journal = journal
        self.store = store
        self.files: dict[int, JournalFile] = {}
        self._views: dict[tuple[int, int], JournalView] = {}
        self._overheads: dict[str, int] = {}  # queue -> bytes of its records before the body
        self.made = 0  # pages made, ever
        self.live = 0  # pages not dead

    @staticmethod
    def open_options() -> dict:
        """``Journal.open``'s keyword arguments: recovery keeps what restore needs of a body
        it leaves in the journal (proxy.queues.journal_restore)."""
        return journal_restore.open_options()

    def page(self, queue: str, message_id: int) -> Page | None:
        """A ``PAGED`` page for live message ``message_id`` of queue ``queue``; None if the
        journal does not know it."""
        held = self.hold(queue, message_id)
        if held is None:
            return None
        number, offset, size, overhead = held
        page = Page(self.view(number, overhead), offset, size)
        page.state = PAGED
        return page

    def hold(self, queue: str, message_id: int) -> tuple[int, int, int, int] | None:
        """Live message ``message_id``'s record held (its segment open and pinned until
        ``let_go`` or the death of a page made for it): (segment, offset, body size, bytes
        before the body); None if the journal does not know it."""
        where = self.journal.location(message_id)
        if where is None:
            return None
        number, offset, length = where
        overhead = self._overheads.get(queue)
        if overhead is None:
            overhead = self._overheads[queue] = \
                RECORD_HEADER.size + ENQUEUE_HEAD.size + len(queue.encode())
        file = self.files.get(number)
        if file is None:
            file = self.files[number] = JournalFile(self, number)
        if file.live == 0:
            self.journal.pin(number)
        file.live += 1
        self.made += 1
        self.live += 1
        return number, offset, length - overhead, overhead

    def view(self, number: int, overhead: int) -> JournalView:
        """Held segment ``number`` seen through a record layout."""
        view = self._views.get((number, overhead))
        if view is None:
            view = self._views[(number, overhead)] = JournalView(self.files[number], overhead)
        return view

    def let_go(self, number: int) -> None:
        """One hold on segment ``number`` is no longer wanted (a journal run purged, a
        scheduled one's record no longer wanted: proxy.queues.schedule_journal)."""
        self.released(self.files[number])

    def released(self, file: JournalFile) -> None:
        self.live -= 1
        file.live -= 1
        if file.live:
            return
        self.journal.pin(file.number, -1)
        del self.files[file.number]
        for key in [key for key, view in self._views.items() if view.file is file]:
            del self._views[key]
        fd = file.fd
        self.store.after_io(lambda: os.close(fd))  # after the reads asked before

    def close(self) -> None:
        for file in self.files.values():
            os.close(file.fd)
        self.files.clear()
        self._views.clear()
