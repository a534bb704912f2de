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

A plain FIFO queue's backlog from its first message left in the journal on goes into
journal runs (``into_runs``, ``proxy.queues.journal_runs``): about 20 bytes a message, no
object each. A queue that is not one (a priority other than 4, a scheduled message after
that point, ``[paging] runs = false``) gets a paged message each (``JournalPages.page``).
"""

from __future__ import annotations

from collections import deque
from itertools import islice

from proxy.amqp import message_header
from proxy.queues import schedule
from proxy.queues.journal_runs import JournalRun
from proxy.queues.runs import RunQueue
from proxy.queues.store import DEFAULT_PRIORITY

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


def run_start(queue, messages: list, pages) -> int | None:
    """Where ``queue``'s recovered ``messages`` ((id, body or header), id order) may go on
    as journal runs (``proxy.queues.journal_runs``): the first whose body stayed in the
    journal, when the node pages in runs, the queue keeps runs and every message from there
    is a plain FIFO one (priority 4, not scheduled); None: restored one by one."""
    pager = queue.memory.pager
    if pages is None or pager is None or not (pager.runs and queue.runs and queue.pages):
        return None
    start = next((i for i, (_, kept) in enumerate(messages) if type(kept) is not bytes), None)
    if start is None:
        return None
    for _, kept in islice(messages, start, None):
        if type(kept) is bytes:
            kept = header_of(kept, 0, len(kept))
        if type(kept) is not int or kept < 0 or kept & 15 != DEFAULT_PRIORITY:
            return None
    return start


def into_runs(queue, name: str, messages: list, start: int, pages, now: float) -> int | None:
    """``messages[start:]`` appended to ``queue`` as journal runs, nothing read (their
    header's fields kept by recovery); how many. None: the queue's head is not a plain FIFO
    (a message kept in memory had a priority): restored one by one instead."""
    if type(queue.messages) is not deque or queue.paged_count or queue.page_writes:
        return None
    ready = RunQueue(queue, queue.memory.pager, queue.messages, deque())
    run = None
    seq = queue._seq
    count = total = 0
    for message_id, kept in islice(messages, start, None):
        held = pages.hold(name, message_id)
        if held is None:  # not live (cannot happen)
            continue
        number, offset, size, overhead = held
        if type(kept) is bytes:  # a body recovery kept, after one it left: in the run too
            kept = header_of(kept, 0, len(kept))
        ttl = kept >> 4
        if run is None or run.full:
            run = JournalRun(pages, overhead, seq + 1, now)
            ready.runs.append(run)
        run.add(number, offset, size, message_id, now + ttl / 1000.0 if ttl else 0.0)
        seq += 1
        count += 1
        total += size
    if not count:
        return 0
    queue._seq = seq
    ready.count = count
    queue.messages = ready
    queue.stats.enqueued += count
    queue.bytes += total
    queue.paged_bytes += total
    queue.paged_count += count
    memory = queue.memory
    memory.used += total
    memory.paged += total
    return count
