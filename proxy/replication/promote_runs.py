"""A promoted backup keeps its paged backlog in runs (docs/paging_failover.md).

How this works
--------------
``promote(image, pager)`` turns a backup's copy (``ReplicaImage``) into the new primary's
content, in rid order, without reading its runs' records: a list of

* ``Chunk``s (``proxy.queues.runs``) over the copy's runs (``image_runs.ImageRun``): each
  a stretch of consecutive live records of one segment, split where a record is dead (a
  message dequeued), where a record may not be in a queue's run (out with a consumer at
  the old primary: its delivery-count is raised, a new body; a body rewritten; a priority
  or a delivery time, ``ImageRun.special``) and where an entry of the copy's dict comes
  between them in rid order. A record's place is ``ImageRun.offsets``; its index fields
  are the copy's (``image_runs.record_fields``): the chunk reads them through
  ``Chunk.since`` / ``first_seq`` (given by ``restore``);
* ``StoredMessage``s for the rest: the copy's entries in memory, and those records (read
  one each, here: the rare ones).

``restore(queue, item)`` puts one item at the tail of the queue (``ReplicatedQueue.restore``),
in the order given: messages before the first chunk go to its head, chunks to its runs, and
messages between two chunks into a chunk held in memory (``FAILED``: as a failed write's,
taken by ``RunQueue._take``); after the last, the tail. The records change hands: the copy's
count (``run_bytes``) ends, the queue's (``paged_bytes``) begins; the store is not told (they
stay live; a segment with a live record is never deleted).

A copy holding a message with a priority other than 4 cannot keep runs: a replicated
primary's priority queue is one ``PriorityStore`` (``ReplicatedQueue.priority_runs``), so
its runs are turned into entries paged one by one first (``image_runs.unrun``), as before.

Who may do what, when: the event loop alone, in one turn (``ReplicatedAddress.become_primary``):
nothing else runs between the copy's last batch and the queue's first dispatch.
"""

from __future__ import annotations

from array import array
from collections import deque

from proxy.amqp import message_header
from proxy.paging.store import HEADER, Page, body
from proxy.queues import local
from proxy.queues.message import StoredMessage
from proxy.queues.runs import FAILED, ON_DISK, Chunk, RunQueue

from .image_runs import CHANGED, GONE


def promote(image, pager) -> list:
    """The copy as the queue's content, in rid order (the module note); the copy is left
    empty, its records the queue's."""
    messages = image.messages
    if image.runs:
        for entry in messages.values():  # paged one by one: a queue does not mix the two
            if type(entry.payload) is Page:
                entry.payload = body(entry)
                pager.entry_gone(entry)
        if _priorities(image):  # runs turned back into entries paged one by one, as before
            pager.image_paged += image.unrun(pager.store)
    keys = list(messages)
    out: list = []
    at = 0
    for run in image.runs:
        at = _run(run, pager, messages, keys, at, out)
    for value in keys[at:]:
        out.append(_entry(value, messages[value], pager))
    messages.clear()
    image.runs.clear()
    image.run_bytes = image.run_count = 0
    return out


def _priorities(image) -> bool:
    """Whether the copy holds a message with a priority other than 4 (read from the bodies
    in memory, and from the runs' ``special``)."""
    for run in image.runs:
        if run.special and any(p != 4 for p in run.special.values()):
            return True
        for entry in (run.changed or {}).values():
            if message_header.ttl_and_priority(entry.payload)[1] != 4:
                return True
    return any(type(entry.payload) is bytes and message_header.ttl_and_priority(
        entry.payload)[1] != 4 for entry in image.messages.values())


def _run(run, pager, messages, keys: list, at: int, out: list) -> int:
    """``run``'s live records as chunks and messages into ``out``, merged with the dict's
    entries ``keys[at:]`` that come before its end; the next entry's place returned."""
    rids, sizes, offsets = run.rids, run.sizes, run.offsets
    count = len(rids)
    while at < len(keys) and keys[at] < rids[0]:
        out.append(_entry(keys[at], messages[keys[at]], pager))
        at += 1
    if (run.live == count and not run.acquired and not run.changed and not run.special
            and (at == len(keys) or keys[at] > rids[-1])
            and run.span == sum(sizes) + count * HEADER.size):  # whole: one chunk
        chunk = _chunk(run.segment, run.offset)
        chunk.count, chunk.size, chunk.nbytes = count, run.span - count * HEADER.size, run.span
        if run.journal_ids is not None:  # what a purge names (docs/paging_purge.md)
            chunk.ids = array("q", run.journal_ids)
        if rids[-1] - rids[0] == count - 1:  # ascending: consecutive
            chunk.rid0 = rids[0]
        else:
            chunk.rids = array("q", rids)
        out.append(chunk)
        return at
    acquired = run.acquired or ()
    special = run.special or ()
    chunk = None
    end = 0
    for i in range(count):
        value = rids[i]
        while at < len(keys) and keys[at] < value:
            chunk = None
            out.append(_entry(keys[at], messages[keys[at]], pager))
            at += 1
        size = sizes[i]
        if size == GONE:
            continue
        if size == CHANGED:
            chunk = None
            out.append(_entry(value, run.changed[value], pager))
            continue
        where = run.offset + offsets[i]
        if value in acquired or value in special:
            chunk = None
            out.append(_record(run, i, value in acquired, pager))
            continue
        if chunk is None or where != end:
            chunk = _chunk(run.segment, where)
            out.append(chunk)
        chunk.add_name(run.journal_id(i), value)
        chunk.count += 1
        chunk.size += size
        chunk.nbytes += HEADER.size + size
        end = where + HEADER.size + size
    return at


def _chunk(segment, offset: int) -> Chunk:
    chunk = Chunk(segment, offset)
    chunk.state = ON_DISK
    chunk.messages = None
    return chunk


def _record(run, i: int, acquired: bool, pager) -> StoredMessage:
    """A record a queue's run may not hold, read (its record dead): out with a consumer at
    the old primary (its delivery-count raised: §3.2.1, it may have been processed), or a
    priority or a delivery time (the queue's ``enqueue`` reads its header)."""
    size = run.sizes[i]
    payload = Page(run.segment, run.offset + run.offsets[i], size).read()
    pager.store.dead_records(run.segment, 1, HEADER.size + size)
    if acquired:
        payload = message_header.modify(payload, increment_count=True)
    return StoredMessage(payload, journal_id=run.journal_id(i), rid=run.rids[i],
                         attempts=message_header.delivery_count(payload))


def _entry(value: int, entry, pager) -> StoredMessage:
    """An entry of the copy (in memory, or paged one by one) as a message of the queue."""
    if entry.acquired:  # out with a consumer: its delivery-count is raised, a new body
        if pager is not None and entry.page is not None:
            entry.payload = body(entry)
            pager.entry_gone(entry)
        entry.payload = message_header.modify(entry.payload, increment_count=True)
        entry.acquired = False
    # a body on disk stays there: its record goes with it (LocalQueue.enqueue)
    page = pager.hand_over(entry) if pager is not None else None
    # failed deliveries so far go on counting (delivery_limit): every one raised the
    # delivery-count the copy holds (docs/queue-semantics.md; a body on disk: from 0)
    payload = entry.payload
    attempts = message_header.delivery_count(payload) if type(payload) is bytes else 0
    return StoredMessage(payload, journal_id=entry.journal_id, rid=value, page=page,
                         attempts=attempts)


def restore(queue, chunk: Chunk) -> None:
    """A promoted copy's ``chunk`` at the tail of ``queue`` (the module note): its seqs and
    its ttls' start given, its bytes counted as the queue's, paged."""
    messages = queue.messages
    memory = queue.memory
    if type(messages) is not RunQueue:
        if type(messages) is not deque:
            raise RuntimeError(f"queue {queue.name}: a run promoted into a priority queue")
        messages = queue.messages = RunQueue(queue, memory.pager, messages, deque())
    tail = messages.tail
    if messages.runs and tail:  # messages between two runs: a run held in memory
        held = Chunk(None, 0)
        held.state = FAILED
        held.messages, messages.tail = tail, deque()
        held.count = len(tail)
        held.size = sum(len(message.payload) for message in tail)
        held.nbytes = held.count * HEADER.size + held.size
        held.max_seq = max(message.seq for message in tail)
        messages.runs.append(held)
        messages.count += held.count
    elif tail:  # cannot be: a queue without runs has no tail
        messages.head.extend(tail)
        messages.tail = deque()
    chunk.since = local.monotonic()
    chunk.first_seq = queue._seq + 1
    queue._seq += chunk.count
    chunk.max_seq = queue._seq
    messages.runs.append(chunk)
    messages.count += chunk.count
    size = chunk.size
    queue.stats.enqueued += chunk.count
    queue.bytes += size
    queue.paged_bytes += size
    queue.paged_count += chunk.count
    memory.used += size
    memory.paged += size
