"""The page store: message bodies written out of memory, read back in order.

How this works
--------------
Per node (per worker), under ``<data_dir>/paging``: segment files of page records, each
``length (4 bytes), crc32 (4 bytes)``, the message's index fields (``META``: seq, priority,
attempts, expires_at, journal_id, rid, enqueued_at; zeros where the writer gives none) and
the payload: a queue's *runs* (``proxy.queues.runs``) keep no object per record, so the
record itself says what the queue needs to decide on it. The event loop decides everything: it
places a record (``write``: the segment and offset are known at once) and asks for records
back (``read``); one I/O thread does the ``pwritev`` and ``pread`` calls, in the order they
were asked, and reports back on the loop. Nothing is fsynced: paged non-durable messages
may be lost in a crash, and the store is emptied at start (``open``), so it always comes
back consistent (docs/paging.md, "Crash safety").

A ``Page`` is a record's place and state (``WRITING``, ``STORED``: on disk and in memory
too, ``PAGED``: on disk only, ``READING``, ``DEAD``). A segment counts its live records; one
that is full and has none left is deleted (by the I/O thread, after what was asked before).
A paged message's ``payload`` is its ``Page`` (``len()`` gives the body's size), so byte
counts stay right wherever they are taken.

``threads=False`` runs the I/O on the loop itself (``call_soon``): the playbooks' virtual
clock, where a thread's timing is not under the test's control.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import struct
import threading
import zlib
from collections import deque
from pathlib import Path
from typing import Callable

log = logging.getLogger("fedgate.paging")

WRITING, STORED, PAGED, READING, DEAD = range(5)
HEADER = struct.Struct(">IIQBIdQQd")  # length, crc32 of the body, then META
NO_META = (0, 0, 0, 0.0, 0, 0, 0.0)  # seq, priority, attempts, expires_at, journal_id, rid,
# enqueued_at
SEGMENT_SIZE = 64 * 1024 * 1024
IOV_MAX = 512  # buffers per pwritev call (the kernel's limit is 1024)


class Page:
    """Where a message's body is on disk, and what state that copy is in."""

    __slots__ = ("segment", "offset", "size", "state", "trigger")

    def __init__(self, segment: "Segment", offset: int, size: int) -> None:
        self.segment = segment
        self.offset = offset  # of the record's header
        self.size = size  # the body's bytes
        self.state = WRITING
        self.trigger = False  # handing it out asks for the next read-ahead (proxy.paging.pager)

    def __len__(self) -> int:
        return self.size

    def read(self) -> bytes:
        """The body, read here and now (the rare paths that cannot wait for a read-ahead:
        browsers, selectors, dead-lettering, a backup's catch-up). Only while it is live."""
        if self.segment.foreign:  # a record of another file (a durable message's journal)
            return self.segment.read(self)
        data = os.pread(self.segment.fd, HEADER.size + self.size, self.offset)
        return check(self, data, 0)

    def __repr__(self) -> str:
        return f"Page({self.segment.number}:{self.offset}+{self.size}, state {self.state})"


def body(message) -> bytes:
    """``message.payload``, read from its page record if it is on disk only (and left there)."""
    payload = message.payload
    return payload.read() if type(payload) is Page else payload


class Segment:
    __slots__ = ("number", "path", "fd", "size", "live", "full")
    # False: a page store segment. A *foreign* segment is a file the store does not own (a
    # journal segment, proxy.queues.journal_pages): its pages are read with
    # ``segment.read(page)`` and their death is told to ``segment.dead(page)``.
    foreign = False

    def __init__(self, number: int, path: Path) -> None:
        self.number = number
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        self.size = 0  # bytes placed (written or being written)
        self.live = 0  # records not dead
        self.full = False  # no more records go here


class PageStore:
    def __init__(self, directory: str | Path, *, segment_size: int = SEGMENT_SIZE,
                 threads: bool = True) -> None:
        self.directory = Path(directory)
        self.segment_size = segment_size
        self.threads = threads
        self.segments: dict[int, Segment] = {}
        self.current: Segment | None = None
        self._numbers = 0
        self.disk_bytes = 0  # bytes of the segment files
        self.live_bytes = 0  # bytes of live records
        self.error: OSError | None = None  # the last I/O error (paging stops at a write error)
        self._jobs: deque = deque()
        self._pending: list = []  # (page, payload, owner) placed and not yet handed to the thread
        self._pending_done: list = []  # their callbacks
        self._flush_scheduled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closing = False
        self.writes = 0  # records written
        self.reads = 0  # records read back
        self.reads_now = 0  # synchronous range reads (a run's front needed at once)

    # -- life --------------------------------------------------------------------------------
    def open(self, loop: asyncio.AbstractEventLoop) -> None:
        """Empty the directory (what a crash left is not wanted) and start the I/O thread."""
        self._loop = loop
        shutil.rmtree(self.directory, ignore_errors=True)
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        if self.threads:
            self._thread = threading.Thread(target=self._run, name="fedgate-paging", daemon=True)
            self._thread.start()

    def close(self) -> None:
        with self._wake:
            self._closing = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout=30)
        for segment in self.segments.values():
            try:
                os.close(segment.fd)
            except OSError:
                pass
        self.segments.clear()
        shutil.rmtree(self.directory, ignore_errors=True)

    # -- the loop's side ---------------------------------------------------------------------
    def write(self, items: list, done: Callable[[list, OSError | None], None],
              metas: list | None = None) -> list[Page]:
        """Place each ``(payload, owner)`` (with ``metas[i]``: its record's index fields);
        ``done([(owner, page), ...], error)`` once written."""
        batch = []
        for i, (payload, owner) in enumerate(items):
            page = self._place(len(payload))
            batch.append((owner, page, payload, metas[i] if metas is not None else NO_META))
        self._pending.append((batch, done))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)
        return [page for _, page, _, _ in batch]

    def read(self, items: list, done: Callable[[list, OSError | None], None]) -> None:
        """Read each ``(owner, page)``; ``done([(owner, page, payload), ...], error)``."""
        if self._pending:  # the writes placed before go to the thread first
            self._flush()
        self._submit(("read", items, done))

    def read_range(self, segment: "Segment", offset: int, size: int,
                   done: Callable[[bytes | None, OSError | None], None]) -> None:
        """``size`` bytes of ``segment`` from ``offset`` (records of a run), in the thread."""
        if self._pending:
            self._flush()
        self._submit(("range", (segment, offset, size), done))

    def read_now(self, segment: "Segment", offset: int, size: int) -> bytes:
        """The same, here and now (a run's front needed at once; only once it is written)."""
        self.reads_now += 1
        return os.pread(segment.fd, size, offset)

    def after_io(self, call: Callable[[], None]) -> None:
        """Run ``call`` in the I/O thread after every job asked before it (closing a foreign
        segment's file once no read of it is left)."""
        if self._pending:
            self._flush()
        self._submit(("call", call, None))

    def dead_records(self, segment: "Segment", count: int, size: int) -> None:
        """``count`` records of ``size`` bytes (headers included) of ``segment`` are no longer
        wanted (a run purged)."""
        if not count:
            return
        segment.live -= count
        self.live_bytes -= size
        if segment.live == 0 and segment.full and segment.number in self.segments:
            self._drop(segment)

    def dead(self, page: Page) -> None:
        """The record is no longer wanted; its segment goes when it has none left."""
        if page.state == DEAD:
            return
        page.state = DEAD
        segment = page.segment
        if segment.foreign:
            segment.dead(page)
            return
        segment.live -= 1
        self.live_bytes -= page.size + HEADER.size
        if segment.live == 0 and segment.full:
            self._drop(segment)

    # -- placing -----------------------------------------------------------------------------
    def _place(self, size: int) -> Page:
        segment = self.current
        length = HEADER.size + size
        if segment is None or (segment.size and segment.size + length > self.segment_size):
            if segment is not None:
                segment.full = True
                if segment.live == 0:
                    self._drop(segment)
            self._numbers += 1
            segment = self.current = Segment(self._numbers,
                                             self.directory / f"{self._numbers:08d}.page")
            self.segments[segment.number] = segment
        page = Page(segment, segment.size, size)
        segment.size += length
        segment.live += 1
        self.disk_bytes += length
        self.live_bytes += length
        return page

    def _drop(self, segment: Segment) -> None:
        if self._pending:  # its writes go to the thread before its delete
            self._flush()
        del self.segments[segment.number]
        self.disk_bytes -= segment.size
        if self.current is segment:
            self.current = None
        self._submit(("delete", segment, None))

    def _flush(self) -> None:
        self._flush_scheduled = False
        pending, self._pending = self._pending, []
        for batch, done in pending:
            self._submit(("write", batch, done))

    def _submit(self, job) -> None:
        if self.threads:
            with self._wake:
                self._jobs.append(job)
                self._wake.notify()
        else:
            self._loop.call_soon(self._do_and_report, job)

    # -- the I/O thread ------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._jobs and not self._closing:
                    self._wake.wait()
                if not self._jobs:
                    return
                job = self._jobs.popleft()
            self._do_and_report(job)

    def _do_and_report(self, job) -> None:
        kind, items, done = job
        error = None
        result = None
        try:
            if kind == "write":
                self._write(items)
                result = [(owner, page) for owner, page, _, _ in items]
            elif kind == "read":
                result = self._read(items)
            elif kind == "range":
                segment, offset, size = items
                result = os.pread(segment.fd, size, offset)
            elif kind == "call":
                items()
            else:
                os.close(items.fd)
                os.unlink(items.path)
        except OSError as exc:
            error = exc
            log.error("paging: %s failed: %s", kind, exc)
            if kind == "write":
                result = [(owner, page) for owner, page, _, _ in items]
            elif kind == "read":  # none of them read: they stay on disk
                result = [(owner, page, None) for owner, page in items]
        if done is None:
            return
        if self.threads:
            try:
                self._loop.call_soon_threadsafe(self._report, done, result, error, kind)
            except RuntimeError:  # the loop is closed: nobody waits any more
                pass
        else:
            self._report(done, result, error, kind)

    def _report(self, done, result, error, kind) -> None:
        if error is not None:
            self.error = error
        elif kind == "write":
            self.writes += len(result)
        elif kind == "read":
            self.reads += len(result)
        done(result, error)

    def _write(self, items: list) -> None:
        """Records of one batch, by runs of one segment, each run one or more pwritev calls."""
        index = 0
        while index < len(items):
            segment = items[index][1].segment
            start = items[index][1].offset
            buffers = []
            while index < len(items) and items[index][1].segment is segment \
                    and len(buffers) < IOV_MAX:
                _, page, payload, meta = items[index]
                buffers.append(HEADER.pack(page.size, zlib.crc32(payload), *meta))
                buffers.append(payload)
                index += 1
            expected = sum(len(b) for b in buffers)
            written = os.pwritev(segment.fd, buffers, start)
            if written != expected:  # a short write: the rest, plainly
                data = b"".join(buffers)
                while written < expected:
                    written += os.pwrite(segment.fd, data[written:], start + written)

    def _read(self, items: list) -> list:
        """Records in order; neighbours in one segment are read with one pread."""
        result = []
        index = 0
        while index < len(items):
            first = items[index][1]
            if first.segment.foreign:  # one record of a journal segment
                result.append((items[index][0], first, first.segment.read(first)))
                index += 1
                continue
            end = index + 1
            stop = first.offset + HEADER.size + first.size
            while end < len(items) and items[end][1].segment is first.segment \
                    and items[end][1].offset == stop and stop - first.offset < 4 * 1024 * 1024:
                stop += HEADER.size + items[end][1].size
                end += 1
            data = os.pread(first.segment.fd, stop - first.offset, first.offset)
            for owner, page in items[index:end]:
                result.append((owner, page, check(page, data, page.offset - first.offset)))
            index = end
        return result


def check(page: Page, data: bytes, at: int) -> bytes:
    """The body of ``page``'s record at ``at`` in ``data``; OSError if it is not whole."""
    length, crc = HEADER.unpack_from(data, at)[:2]
    payload = data[at + HEADER.size:at + HEADER.size + length]
    if length != page.size or len(payload) != length or zlib.crc32(payload) != crc:
        raise OSError(f"page record {page!r} does not read back (length {length}, crc {crc:#x})")
    return payload


def records(data: bytes, at: int = 0, limit: int = 0):
    """The whole records in ``data`` from ``at``, in order: ``(offset in data, size, meta,
    payload)``; at most ``limit`` (0: all). OSError for a record that does not check."""
    end = len(data)
    found = 0
    while at + HEADER.size <= end:
        fields = HEADER.unpack_from(data, at)
        length = fields[0]
        stop = at + HEADER.size + length
        if stop > end:
            return
        payload = data[at + HEADER.size:stop]
        if zlib.crc32(payload) != fields[1]:
            raise OSError(f"a page record at {at} does not read back (crc)")
        yield at, length, fields[2:], payload
        at = stop
        found += 1
        if found == limit:
            return
