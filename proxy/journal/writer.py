"""The journal's writer thread: appends, fsyncs in groups, deletes dead segments.

How this works
--------------
The event loop never touches the disk on the hot path. It hands the writer
*batches*: lists of items, each batch numbered (1, 2, 3, ...). Items are

* ``bytes``  — encoded records, appended to the current segment file;
* ``Roll``   — fsync and close the current segment, create the next one;
* ``Copy``   — copy a record of an older segment into the current one
  (the cleaner relocating the few live records of a sparse segment);
* ``Delete`` — unlink a segment whose records are all dead.

One thread takes *every* batch submitted so far, writes it, fsyncs once
(group commit: while one fsync runs, new records pile up for the next), then
reports "durable up to batch N" through ``on_progress`` (the journal passes a
function that hops back to the event loop). Deletes run only after that
fsync, so a segment never disappears before the records that made it dead are
on disk; the directory is fsynced after each unlink and after a segment is
created. With ``fsync=False`` the writer still writes before it reports
(safe against a process crash, not against an OS crash or power loss).

An ``OSError`` (disk full, I/O error) stops the writer: the error is reported
once through ``on_progress`` and every later submit is ignored.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Callable, NamedTuple

from proxy.journal.format import encode_file_header, segment_name

log = logging.getLogger("fedgate.journal")

WRITE_CHUNK = 4 * 1024 * 1024


class Roll(NamedTuple):
    number: int
    first_id: int


class Copy(NamedTuple):
    segment: int
    offset: int
    length: int


class Delete(NamedTuple):
    segment: int


class SegmentWriter:
    def __init__(self, directory: Path, *, fsync: bool = True, batch_delay: float = 0.0,
                 on_progress: Callable[[int, OSError | None], None] | None = None) -> None:
        self._thread = threading.Thread(target=self._run, name="fedgate-journal-writer",
                                        daemon=True)
        self.directory = directory
        self.fsync = fsync
        self.batch_delay = batch_delay
        self.on_progress = on_progress
        self._cond = threading.Condition()
        self._pending: list = []
        self._pending_batch = 0
        self._closing = False
        self.synced_batch = 0  # guarded by _cond
        self.error: OSError | None = None
        self.writes = 0  # group commits done (one fsync each when fsync is on)
        self.bytes_written = 0
        self._fd: int | None = None
        self._readers: dict[int, int] = {}

    # -- any thread ------------------------------------------------------------
    def submit(self, items: list, batch: int) -> None:
        with self._cond:
            if self.error is not None or self._closing:
                return
            self._pending.extend(items)
            self._pending_batch = batch
            self._cond.notify()

    def wait_synced(self, batch: int, timeout: float | None) -> bool:
        """Block until batch ``batch`` is durable (or the writer failed/stopped)."""
        with self._cond:
            return self._cond.wait_for(
                lambda: (self.synced_batch >= batch or self.error is not None
                         or not self._thread.is_alive()),
                timeout,
            )

    def close(self, timeout: float = 30.0) -> None:
        """Write what is pending, then stop the thread."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def start(self) -> None:
        self._thread.start()

    # -- the thread ---------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    while not self._pending and not self._closing:
                        self._cond.wait()
                    if not self._pending:
                        return
                if self.batch_delay:
                    time.sleep(self.batch_delay)  # let more records gather (group commit)
                with self._cond:
                    items, self._pending = self._pending, []
                    batch = self._pending_batch
                try:
                    self._write(items)
                except Exception as exc:  # noqa: BLE001 - any failure stops durability
                    if not isinstance(exc, OSError):
                        log.exception("journal writer crashed")
                        exc = OSError(f"journal writer crashed: {exc!r}")
                    log.critical("journal write failed in %s: %s", self.directory, exc)
                    with self._cond:
                        self.error = exc
                        self._pending = []
                        self._cond.notify_all()
                    self._report(self.synced_batch, exc)
                    return
                with self._cond:
                    self.synced_batch = batch
                    self._cond.notify_all()
                self._report(batch, None)
        finally:
            self._close_files()

    def _report(self, batch: int, error: OSError | None) -> None:
        if self.on_progress is not None:
            self.on_progress(batch, error)

    def _write(self, items: list) -> None:
        chunks: list = []
        size = 0
        deletes: list[int] = []
        new_file = False
        for item in items:
            kind = type(item)
            if kind is bytes:
                chunks.append(item)
                size += len(item)
                if size >= WRITE_CHUNK:
                    self._append(chunks)
                    chunks, size = [], 0
            elif kind is Roll:
                self._append(chunks)
                chunks, size = [], 0
                self._open_segment(item)
                new_file = True
            elif kind is Copy:
                chunks.append(self._read(item))
                size += item.length
            elif kind is Delete:
                deletes.append(item.segment)
        self._append(chunks)
        if self.fsync and self._fd is not None:
            os.fdatasync(self._fd)
            if new_file:
                self._sync_directory()
        self.writes += 1
        for number in deletes:
            self._delete(number)

    def _append(self, chunks: list) -> None:
        if not chunks:
            return
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        view = memoryview(data)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]
        self.bytes_written += len(data)

    def _open_segment(self, roll: Roll) -> None:
        if self._fd is not None:
            if self.fsync:
                os.fdatasync(self._fd)
            os.close(self._fd)
            self._fd = None
        path = self.directory / segment_name(roll.number)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        self._fd = fd
        self._append([encode_file_header(roll.number, roll.first_id)])

    def _read(self, copy: Copy) -> bytes:
        fd = self._readers.get(copy.segment)
        if fd is None:
            fd = os.open(self.directory / segment_name(copy.segment), os.O_RDONLY)
            self._readers[copy.segment] = fd
        data = os.pread(fd, copy.length, copy.offset)
        if len(data) != copy.length:
            raise OSError(f"segment {copy.segment}: short read relocating a record")
        return data

    def _delete(self, number: int) -> None:
        fd = self._readers.pop(number, None)
        if fd is not None:
            os.close(fd)
        try:
            os.unlink(self.directory / segment_name(number))
        except FileNotFoundError:
            return
        if self.fsync:
            # Deletes depend on each other (a segment of dequeues may go only
            # after the segments it points into): make each one stick in order.
            self._sync_directory()

    def _sync_directory(self) -> None:
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _close_files(self) -> None:
        if self._fd is not None:
            try:
                if self.fsync and self.error is None:
                    os.fdatasync(self._fd)
            except OSError as exc:
                log.error("journal: final fsync failed: %s", exc)
            os.close(self._fd)
            self._fd = None
        for fd in self._readers.values():
            os.close(fd)
        self._readers.clear()
