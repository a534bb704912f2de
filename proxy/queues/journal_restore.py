"""Recovered durable messages whose bodies stay in the journal: what recovery keeps of them.

How this works (docs/paging.md, "Durable messages: the journal as page store")
--------------------------------------------------------------------------------
Recovery (``Journal.open``) reads every segment whole. For a message beyond its body budget
it keeps, instead of the body, what the queue needs of it at restore: ``header_of``, its
header's ttl and priority packed in one int (``ttl << 4 | priority``; 4, the default,
costs no object), or ``SCHEDULED`` when the body may carry a delivery time (such a message
is held in memory until its time: restore reads its body, as before). So restoring a
message beyond the budget reads nothing: the ``pread`` per message that took about a third
of the restore (and the record's CRC check) is gone. Its body is read (and checked) when
the read-ahead brings it back, as before.
"""

from __future__ import annotations

from proxy.amqp import message_header
from proxy.queues import schedule

PEEK = 256  # bytes of the body given to the header's decoder: the header section is < 64
SCHEDULED = -1


def header_of(data: bytes, start: int, end: int) -> int:
    """What recovery keeps of the body data[start:end] (``Journal.open``'s ``peek``)."""
    if data.find(schedule.MARK, start, min(end, start + schedule.HEAD)) >= 0:
        return SCHEDULED
    ttl, priority = message_header.ttl_and_priority(data[start:min(end, start + PEEK)])
    return ttl << 4 | priority


def open_options() -> dict:
    """``Journal.open``'s keyword arguments for a restore that keeps the headers' fields."""
    return {"peek": header_of}


def header(kept) -> tuple[int, int] | None:
    """(ttl, priority) from what ``header_of`` kept; None: unknown (read the body)."""
    if type(kept) is not int or kept < 0:
        return None
    return kept >> 4, kept & 15

