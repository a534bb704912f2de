"""On-disk format of the durable-queue journal: segment files and records.

A segment file is a 24-byte file header followed by records, appended only::

    file header   b"FGJRNL" | journal format u16 (big-endian) | segment number u64 | first message id u64
    record        magic 0xA5 u8 | type u8 | body length u32 | crc32 u32 | body
    ENQUEUE body  message id u64 | queue name length u16 | queue name (UTF-8) | message bytes
    DEQUEUE body  message id u64 * n
    TXN body      records (ENQUEUE and DEQUEUE, each whole: header, CRC, body), one after another

A TXN record is one transaction's commit (``proxy.transactions``): its
enqueues and dequeues are applied together or not at all. Its own CRC covers
every record nested in it, so a torn or damaged TXN record is dropped whole.
Each nested record is a complete record of its own: the cleaner can copy a
live message's nested ENQUEUE out of it verbatim, like any other.

The journal format is 1 (0.5.0 wrote the same bytes, ``FGJRNL\\x00\\x01``, as its magic: read
as format 1). A segment of a greater format was written by a newer fedgate: it is refused
at start (``journal_format``; docs/upgrades.md), never taken for a damaged segment.

The other integers are little-endian. The CRC (``zlib.crc32``) covers the first six
header bytes (magic, type, length) and the body, so a length or type damaged
on disk is caught like damaged content. A zero-filled region (a file extended
by the file system but never written) fails the magic byte check.

The message bytes are the AMQP encoding exactly as the producer sent it; the
journal never decodes them.

``scan`` walks a segment's bytes and stops at the first record that is
incomplete (runs past the end: a torn write) or fails a check (corrupt); the
caller decides what that means (see ``proxy.journal``).
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from typing import Iterator

FILE_PREFIX = b"FGJRNL"
JOURNAL_FORMAT = 1  # what this release writes
READS_JOURNAL_FORMATS = (1,)  # what it reads: its own and the previous release's (0.5.0: 1)
FILE_MAGIC = FILE_PREFIX + JOURNAL_FORMAT.to_bytes(2, "big")
FILE_HEADER = struct.Struct("<8sQQ")
RECORD_MAGIC = 0xA5
RECORD_HEADER = struct.Struct("<BBII")  # magic, type, body length, crc32
RECORD_PREFIX = struct.Struct("<BBI")  # the part of the header the CRC covers
ENQUEUE_HEAD = struct.Struct("<QH")  # message id, queue name length
ID = struct.Struct("<Q")
_NAME_LENGTH = struct.Struct("<H")  # at offset 8 of an ENQUEUE body

ENQUEUE = 1
DEQUEUE = 2
TXN = 3
RECORD_TYPES = (ENQUEUE, DEQUEUE, TXN)
NESTED_TYPES = (ENQUEUE, DEQUEUE)  # what a TXN record may hold

MAX_QUEUE_NAME = 0xFFFF
SEGMENT_SUFFIX = ".seg"

_crc32 = zlib.crc32
_prefix_pack = RECORD_PREFIX.pack
_enqueue_head_pack = ENQUEUE_HEAD.pack


def segment_name(number: int) -> str:
    return f"{number:016d}{SEGMENT_SUFFIX}"


def segment_number(name: str) -> int | None:
    """The number in a segment file name, None for any other file."""
    stem = name[: -len(SEGMENT_SUFFIX)]
    if not name.endswith(SEGMENT_SUFFIX) or len(stem) != 16 or not stem.isdigit():
        return None
    return int(stem)


def encode_file_header(number: int, first_id: int) -> bytes:
    return FILE_HEADER.pack(FILE_MAGIC, number, first_id)


def journal_format(data: bytes) -> int | None:
    """The journal format a segment's header says; None when it is no segment header."""
    if len(data) < len(FILE_PREFIX) + 2 or not data.startswith(FILE_PREFIX):
        return None
    return int.from_bytes(data[len(FILE_PREFIX):len(FILE_PREFIX) + 2], "big")


class JournalError(Exception):
    """The journal cannot take more records (write failed, closed, timed out), or cannot be
    read (a newer format)."""


class JournalFormatError(JournalError):
    """A segment written by a newer fedgate (a greater journal format): refused at start, not
    repaired as if damaged (docs/upgrades.md)."""


def check_journal_format(path, data: bytes) -> None:
    found = journal_format(data)
    if found is None or found in READS_JOURNAL_FORMATS:
        return
    raise JournalFormatError(
        f"journal segment {path} was written by a newer fedgate (journal format {found}); this "
        f"fedgate reads journal formats up to {max(READS_JOURNAL_FORMATS)}: a downgrade is "
        "refused (start the newer release on this data dir)")


def decode_file_header(data: bytes) -> tuple[int, int] | None:
    """(segment number, first message id), or None if the header is missing or bad."""
    if len(data) < FILE_HEADER.size:
        return None
    magic, number, first_id = FILE_HEADER.unpack_from(data, 0)
    if magic != FILE_MAGIC:
        return None
    return number, first_id


def encode_enqueue(message_id: int, queue: bytes, payload: bytes) -> bytes:
    """One ENQUEUE record. ``queue`` is the UTF-8 queue name."""
    head = _enqueue_head_pack(message_id, len(queue)) + queue
    length = len(head) + len(payload)
    prefix = _prefix_pack(RECORD_MAGIC, ENQUEUE, length)
    crc = _crc32(payload, _crc32(head, _crc32(prefix)))
    return b"".join((prefix, crc.to_bytes(4, "little"), head, payload))


def encode_dequeue(message_ids: list[int]) -> bytes:
    """One DEQUEUE record removing every id in ``message_ids``."""
    body = struct.pack(f"<{len(message_ids)}Q", *message_ids)
    prefix = _prefix_pack(RECORD_MAGIC, DEQUEUE, len(body))
    crc = _crc32(body, _crc32(prefix))
    return b"".join((prefix, crc.to_bytes(4, "little"), body))


def encode_transaction(records: list[bytes]) -> bytes:
    """One TXN record holding ``records`` (encoded ENQUEUE / DEQUEUE records), applied as one."""
    body = b"".join(records)
    prefix = _prefix_pack(RECORD_MAGIC, TXN, len(body))
    crc = _crc32(body, _crc32(prefix))
    return b"".join((prefix, crc.to_bytes(4, "little"), body))


@dataclass
class ScanStop:
    """Where and why a scan stopped before the end of the data."""

    offset: int
    reason: str
    incomplete: bool  # the record runs past the end of the data (a torn write)
    end: int | None = None  # where the record says it ends, when its header was readable


def scan(data: bytes, start: int = FILE_HEADER.size, stop: list | None = None, *,
         end: int | None = None,
         kinds: tuple[int, ...] = RECORD_TYPES) -> Iterator[tuple[int, int, int, int]]:
    """Yield ``(offset, type, body_start, body_end)`` for each valid record up to ``end``.

    On the first bad record nothing more is yielded and a ``ScanStop`` is
    appended to ``stop`` (when given). ``kinds``: the record types allowed
    (the records nested in a TXN record: ``NESTED_TYPES``).
    """
    header_size = RECORD_HEADER.size
    unpack = RECORD_HEADER.unpack_from
    enqueue_head_size = ENQUEUE_HEAD.size
    unpack_name_length = _NAME_LENGTH.unpack_from
    if end is None:
        end = len(data)
    view = memoryview(data)
    pos = start
    problem: ScanStop | None = None
    while pos < end:
        if end - pos < header_size:
            problem = ScanStop(pos, "record header cut short", True)
            break
        magic, rtype, length, crc = unpack(data, pos)
        if magic != RECORD_MAGIC:
            problem = ScanStop(pos, f"bad record magic 0x{magic:02x}", False)
            break
        body_start = pos + header_size
        body_end = body_start + length
        if body_end > end:
            problem = ScanStop(pos, f"record of {length} bytes cut short at {end - body_start}",
                               True, body_end)
            break
        if _crc32(view[body_start:body_end], _crc32(view[pos:pos + 6])) != crc:
            problem = ScanStop(pos, "checksum mismatch", False, body_end)
            break
        if rtype not in kinds:
            well_formed = False
        elif rtype == ENQUEUE:
            well_formed = (length >= enqueue_head_size
                           and enqueue_head_size + unpack_name_length(data, body_start + 8)[0]
                           <= length)
        elif rtype == DEQUEUE:
            well_formed = length % 8 == 0
        else:
            well_formed = length > 0  # TXN: its nested records are checked as they are applied
        if not well_formed:
            problem = ScanStop(pos, f"malformed record of type {rtype}", False, body_end)
            break
        yield pos, rtype, body_start, body_end
        pos = body_end
    if problem is not None and stop is not None:
        stop.append(problem)


def decode_enqueue(data: bytes, body_start: int, body_end: int) -> tuple[int, bytes, bytes]:
    """(message id, queue name bytes, message bytes) of a valid ENQUEUE record."""
    message_id, name_length = ENQUEUE_HEAD.unpack_from(data, body_start)
    name_start = body_start + ENQUEUE_HEAD.size
    name_end = name_start + name_length
    return message_id, data[name_start:name_end], data[name_end:body_end]


def decode_dequeue(data: bytes, body_start: int, body_end: int) -> tuple[int, ...]:
    count = (body_end - body_start) // ID.size
    return struct.unpack_from(f"<{count}Q", data, body_start)


def enqueue_payload(data: bytes, overhead: int) -> bytes:
    """The message bytes of the whole ENQUEUE record ``data`` (read back from a segment by
    its location), whose header, id and queue name take ``overhead`` bytes; ``OSError``
    when it is not that record, whole and intact (docs/paging.md, durable pages)."""
    if len(data) < overhead or len(data) < RECORD_HEADER.size:
        raise OSError(f"journal record cut short ({len(data)} bytes)")
    magic, rtype, length, crc = RECORD_HEADER.unpack_from(data, 0)
    if magic != RECORD_MAGIC or rtype != ENQUEUE or RECORD_HEADER.size + length != len(data) \
            or _crc32(memoryview(data)[RECORD_HEADER.size:], _crc32(data[:6])) != crc:
        raise OSError("journal record does not read back (header or crc)")
    return data[overhead:]
