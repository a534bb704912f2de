"""Cutting a journal at its first bad record (``Journal.open``'s repair step).

How this works
--------------
Recovery stops at the first record that is cut short or fails its checks
(``proxy.journal.format.scan``). If that record is the tail of the last
segment (a torn write from a crash: cut short, or the final bytes / zero
fill) it is truncated away with a warning. Anywhere else it is corruption:
the segment is truncated at that record, later segments are moved to a
``quarantine-<time>`` directory, and an error is logged.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from proxy.journal.format import FILE_HEADER, ScanStop, segment_name

log = logging.getLogger("fedgate.journal")


def repair(directory: Path, numbers: list[int], problem: tuple[int, ScanStop, int],
           result, segments: dict) -> None:
    """Cut the journal at the bad record: truncate, quarantine what follows.

    ``result``: the ``Recovered`` being filled (``torn_tail``, ``corrupt``,
    ``quarantined``); ``segments``: the journal's segments, less a segment whose
    file header itself is bad."""
    index, stop, data_length = problem
    number = numbers[index]
    path = directory / segment_name(number)
    is_last = index == len(numbers) - 1
    torn = is_last and (stop.incomplete or stop.end == data_length
                        or not _has_nonzero(path, stop.offset))
    where = f"segment {number} offset {stop.offset}: {stop.reason}"
    if torn:
        result.torn_tail = where
        log.warning("journal: dropping a torn record at the tail (%s)", where)
    else:
        result.corrupt = where
        log.error("journal: corrupt record (%s); recovery stops there, later records "
                  "are not applied", where)
    if stop.offset < FILE_HEADER.size:
        later = numbers[index:]  # the file header itself is bad: set the whole file aside
        segments.pop(number, None)
    else:
        later = numbers[index + 1:]
        with open(path, "r+b") as handle:
            handle.truncate(stop.offset)
            handle.flush()
            os.fsync(handle.fileno())
    if later:
        if torn:  # an empty or half-created last segment: nothing in it to keep
            for n in later:
                (directory / segment_name(n)).unlink()
        else:
            stamp = time.strftime("%Y%m%dT%H%M%S")
            quarantine = directory / f"quarantine-{stamp}-{number}"
            quarantine.mkdir(exist_ok=True)
            for n in later:
                os.replace(directory / segment_name(n), quarantine / segment_name(n))
                result.quarantined.append(segment_name(n))
            log.error("journal: %d later segment(s) moved to %s", len(later), quarantine.name)
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _has_nonzero(path: Path, offset: int) -> bool:
    with open(path, "rb") as handle:
        handle.seek(offset)
        while True:
            chunk = handle.read(1 << 20)
            if not chunk:
                return False
            if chunk.strip(b"\0"):
                return True
