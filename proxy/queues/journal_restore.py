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

A queue's backlog from its first message left in the journal on goes into journal runs
(``into_runs``, ``proxy.queues.journal_runs``): about 20 bytes a message, no object each;
a run per priority level when the backlog holds another priority than 4 (as many
clients send, priority 0 included). With ``[paging] runs = false``, or at a queue that
keeps no runs, each gets a paged message (``JournalPages.page``).
"""

from __future__ import annotations

from collections import deque
from itertools import islice

from proxy.amqp import message_header
from proxy.queues import schedule
from proxy.queues.journal_runs import JournalRun
from proxy.queues.level_runs import LevelRuns
from proxy.queues.message import StoredMessage
from proxy.queues.runs import RunQueue
from proxy.queues.store import DEFAULT_PRIORITY, PriorityStore

PEEK = 256  # bytes of the body given to the header's decoder: the header section is < 64
SCHEDULED = -1


def header_of(data: bytes, start: int, end: int) -> int:
    """What recovery keeps of the body data[start:end] (``Journal.open``'s ``peek``)."""
    if data.find(schedule.MARK, start, min(end, start + schedule.HEAD)) >= 0:
        return SCHEDULED
    ttl, priority = message_header.ttl_and_priority(data[start:min(end, start + PEEK)])
    return ttl << 4 | priority


def open_options() -> dict:
    """``Journal.open``'s keyword arguments for a restore that keeps the headers' fields (a
    header without a ttl, a priority 0-9, costs no object: ``proxy.journal.recovery``)."""
    return {"peek": header_of}


def header(kept) -> tuple[int, int] | None:
    """(ttl, priority) from what ``header_of`` kept; None: unknown (read the body)."""
    if type(kept) is not int or kept < 0:
        return None
    return kept >> 4, kept & 15


def run_start(queue, messages, pages) -> int | None:
    """Where ``queue``'s recovered ``messages`` ((id, body or header), id order) may go on
    as journal runs (``proxy.queues.journal_runs``): the first whose body stayed in the
    journal, when the node pages in runs and the queue keeps runs; None: one by one."""
    pager = queue.memory.pager
    if pages is None or pager is None or not (pager.runs and queue.runs and queue.pages):
        return None
    return next((i for i, (_, kept) in enumerate(messages) if type(kept) is not bytes), None)


def _code(kept) -> int:
    return header_of(kept, 0, len(kept)) if type(kept) is bytes else kept


def into_runs(queue, name: str, messages, start: int, pages, now: float) -> int | None:
    """``messages[start:]`` appended to ``queue`` as journal runs, nothing read (their
    header's fields kept by recovery), a run per priority (the levels of a priority queue
    in runs, ``LevelRuns``, when there is one other than 4); a scheduled one is restored as
    before (its body read: held in memory until its time). How many. None: the queue
    cannot take runs (a priority other than 4 and no runs per level): one by one instead."""
    kind = type(queue.messages)
    if queue.paged_count or queue.page_writes or (kind is not deque
                                                  and kind is not PriorityStore):
        return None
    codes = [_code(kept) for _, kept in islice(messages, start, None)]
    plain = all(code & 15 == DEFAULT_PRIORITY for code in codes if code != SCHEDULED)
    if not plain and not queue.priority_runs:
        return None
    pager = queue.memory.pager
    if kind is deque and plain:
        ready = RunQueue(queue, pager, queue.messages, deque())
    elif kind is deque:
        ready = LevelRuns.of_runs(queue, RunQueue(queue, pager, queue.messages, deque()))
    else:
        ready = LevelRuns.of_store(queue, pager, queue.messages)
    runs: dict[int, JournalRun] = {}
    scheduled = []
    seq_base = queue._seq - messages[start][0] + 1  # seqs in id order, above the head's
    count = total = 0
    for (message_id, _), code in zip(islice(messages, start, None), codes):
        if code == SCHEDULED:
            scheduled.append(message_id)
            continue
        held = pages.hold(name, message_id)
        if held is None:  # not live (cannot happen)
            continue
        number, offset, size, overhead = held
        priority = code & 15
        level = ready if type(ready) is RunQueue else ready.levels[priority]
        run = runs.get(priority)
        if run is None or run.full:
            run = runs[priority] = JournalRun(pages, overhead, seq_base, priority, now)
            level.runs.append(run)
            if level is not ready:
                ready.high = max(ready.high, priority)
        level.count += 1
        ttl = code >> 4
        run.add(number, offset, size, message_id, now + ttl / 1000.0 if ttl else 0.0)
        count += 1
        total += size
    queue._seq = seq_base + messages[len(messages) - 1][0]
    queue.messages = ready
    queue.stats.enqueued += count
    queue.bytes += total
    queue.paged_bytes += total
    queue.paged_count += count
    memory = queue.memory
    memory.used += total
    memory.paged += total
    for message_id in scheduled:  # read, held until its time (after the runs if due)
        page = pages.page(name, message_id)
        if page is not None:
            queue.enqueue(StoredMessage(page, journal_id=message_id, page=page))
            count += 1
    return count

