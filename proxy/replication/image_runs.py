"""A backup's copy in runs: its paged messages on disk with no object each.

How this works (docs/paging.md, "A backup's copy in runs")
----------------------------------------------------------
A ``ReplicaImage`` keeps its in-memory entries in a dict by rid (in rid order) and its
paged stretches as ``ImageRun``s, a list sorted by first rid, disjoint ranges, none
holding a rid of the dict. A run names consecutive page records of one segment (their
index fields carry the rid) and keeps, per message, in arrays: the rid (ascending), the
body's size (``GONE``: dequeued; ``CHANGED``: its body rewritten, the new ``Entry`` in
``changed``, the record dead), the record's offset from the run's (4 bytes) and, when
durable, the journal id: 16 bytes a message (24). The records carry the index fields a
queue's run needs from them once promoted (``record_fields``: priority, delivery-count,
the ttl in seconds, journal id, rid); a record a queue's run may not hold (a priority, a
delivery time) is noted in ``special``.

The event loop alone changes runs. The pager writes a batch's added entries one page
each, as before; when the write is reported, ``make_runs`` turns the entries that are
still in the dict with that page into runs (their ``Entry`` and ``Page`` dropped).
Events on a rid in a run go to ``event``; a promotion hands the runs to the new primary's
queue as they are (``proxy.replication.promote_runs``); ``unrun`` turns every run back into
entries paged one by one, in rid order (a promotion that cannot keep runs); ``drop`` (a new
catch-up, the copy closed) lets their records go.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left

from proxy.amqp import message_header
from proxy.paging.store import DEAD, HEADER, PAGED, Page, records
from proxy.queues import schedule

from .events import ACQUIRE, DEQUEUE, FRONT, RELEASE

GONE, CHANGED = -1, -2
SCAN = 1024 * 1024  # bytes read at a time when a run is turned back into entries


class ImageRun:
    __slots__ = ("segment", "offset", "span", "rids", "sizes", "offsets", "journal_ids", "live",
                 "acquired", "changed", "special")

    def __init__(self, segment, offset: int) -> None:
        self.segment = segment
        self.offset = offset  # of its first record
        self.span = 0  # bytes from there to the end of its last record (dead ones between)
        self.rids = array("Q")
        self.sizes = array("i")
        self.offsets = array("I")  # each record's, from ``offset``
        self.journal_ids: array | None = None
        self.live = 0
        self.acquired: set | None = None
        self.changed: dict | None = None
        self.special: dict | None = None  # rid -> priority: restored as a message at promotion

    def first(self) -> int:
        return self.rids[0]

    def journal_id(self, i: int) -> int:
        return self.journal_ids[i] if self.journal_ids is not None else 0


def find(runs: list, value: int):
    """``(run, index)`` of a live message ``value`` in ``runs``, or None."""
    at = bisect_left(runs, value, key=ImageRun.first)
    if at == len(runs) or runs[at].rids[0] != value:
        at -= 1
    if at < 0:
        return None
    run = runs[at]
    i = bisect_left(run.rids, value)
    if i == len(run.rids) or run.rids[i] != value or run.sizes[i] == GONE:
        return None
    return run, i


def event(image, run: ImageRun, i: int, event_, changes, entry_type) -> None:
    """One event on message ``run.rids[i]`` of ``image``: what it changed, into ``changes``."""
    kind, value = event_.kind, event_.rid
    size = run.sizes[i]
    changed = run.changed.get(value) if size == CHANGED else None
    if kind == FRONT:
        return  # it came live already
    if kind == ACQUIRE or (kind == RELEASE and event_.payload is None):
        if changed is not None:
            changed.acquired = kind == ACQUIRE
        elif kind == ACQUIRE:
            if run.acquired is None:
                run.acquired = set()
            run.acquired.add(value)
        elif run.acquired is not None:
            run.acquired.discard(value)
        return
    if kind == RELEASE:  # a new body: kept in memory, the record dead
        payload = bytes(event_.payload)
        if changed is not None:
            image.bytes += len(payload) - len(changed.payload)
            changed.payload = payload
            changed.acquired = False
        else:
            changed = entry_type(payload, journal_id=run.journal_id(i))
            if run.changed is None:
                run.changed = {}
            run.changed[value] = changed
            run.sizes[i] = CHANGED
            image.bytes += len(payload) - size
            image.run_bytes -= size
            changes.dead_records.append((run.segment, size))
            if run.acquired is not None:
                run.acquired.discard(value)
        changes.rewritten.append((value, changed))
        return
    if kind != DEQUEUE:
        return
    if changed is not None:
        del run.changed[value]
        image.bytes -= len(changed.payload)
        changes.removed.append(changed)
    else:
        image.bytes -= size
        image.run_bytes -= size
        changes.dead_records.append((run.segment, size))
        journal_id = run.journal_id(i)
        if journal_id:
            changes.removed.append(entry_type(b"", journal_id=journal_id))
        if run.acquired is not None:
            run.acquired.discard(value)
    run.sizes[i] = GONE
    run.live -= 1
    image.run_count -= 1
    if not run.live:
        image.runs.remove(run)


def record_fields(image, value: int, entry) -> tuple:
    """The index fields of a copy's record (the store's ``HEADER`` meta): what a promoted
    copy's run gives its queue (``proxy.queues.runs``: ``Chunk.since``): no seq, the
    priority, the delivery-count, the ttl in seconds, the journal id, the rid. A record with
    a priority other than 4 or a delivery time is noted (``image.special``): a queue's run
    does not hold it."""
    payload = entry.payload
    ttl, priority = message_header.ttl_and_priority(payload)
    if priority != 4 or schedule.marked(payload):
        image.special[value] = priority
    return (0, priority, _delivery_count(payload), ttl / 1000.0, entry.journal_id, value, 0.0)


def _delivery_count(payload: bytes) -> int:
    """The header's delivery-count, decoded only when the header may have one (five fields)."""
    if payload.startswith(b"\x00\x53\x70"):
        code = payload[3]
        if code == 0x45 or (code == 0xC0 and len(payload) > 5 and payload[5] < 5):
            return 0
    elif not payload.startswith(b"\x00\x80"):
        return 0
    try:
        return message_header.delivery_count(payload)
    except Exception:  # noqa: BLE001 - an odd encoding: counted from 0, as before
        return 0


def make_runs(image, done: list) -> int:
    """The write of ``done`` (``[((rid, entry), page)]``, one write, in rid order) was
    reported: the entries still in the copy's dict become runs; their body bytes (which the
    pager counted as one-by-one paged) returned."""
    messages = image.messages
    special = image.special
    if image.closed:
        for (value, _), _ in done:
            special.pop(value, None)
        return 0
    run = None
    moved = 0
    for (value, entry), page in done:
        priority = special.pop(value, None)
        if messages.get(value) is not entry:
            continue  # dequeued (or the copy restarted) meanwhile: its record is dead
        if entry.page is page and page.state == PAGED:
            size = page.size
            moved += size
            image.run_bytes += size
        elif page.state == DEAD and entry.page is None:
            size = CHANGED  # rewritten meanwhile: the new body stays in memory
        else:
            continue  # not written, or handed over meanwhile
        if run is None or page.segment is not run.segment:
            run = ImageRun(page.segment, page.offset)
            _insert(image.runs, run, value)
        run.rids.append(value)
        run.sizes.append(size)
        run.offsets.append(page.offset - run.offset)
        if priority is not None:
            if run.special is None:
                run.special = {}
            run.special[value] = priority
        run.span = page.offset + HEADER.size + page.size - run.offset
        if entry.journal_id and run.journal_ids is None:
            run.journal_ids = array("q", bytes(8 * (len(run.rids) - 1)))
        if run.journal_ids is not None:
            run.journal_ids.append(entry.journal_id)
        if size == CHANGED:
            if run.changed is None:
                run.changed = {}
            run.changed[value] = entry
        elif entry.acquired:
            if run.acquired is None:
                run.acquired = set()
            run.acquired.add(value)
        entry.page = None
        del messages[value]
        run.live += 1
        image.run_count += 1
    return moved


def _insert(runs: list, run: ImageRun, value: int) -> None:
    """``run`` (first rid ``value``, its rids still to come) into ``runs`` by first rid."""
    at = len(runs)
    while at and runs[at - 1].rids[0] > value:
        at -= 1
    runs.insert(at, run)


def unrun(image, store, entry_type) -> int:
    """Every run back as entries paged one by one (each with a ``PAGED`` ``Page``), merged
    with the dict's in rid order: a promotion needs objects. Their body bytes returned (the
    pager counts them as one-by-one paged from now on)."""
    if not image.runs:
        return 0
    out = {}
    old = iter(image.messages.items())
    pending = next(old, None)
    moved = 0
    for run in image.runs:
        first = run.rids[0]
        while pending is not None and pending[0] < first:
            out[pending[0]] = pending[1]
            pending = next(old, None)
        found = _records(store, run)
        acquired = run.acquired or ()
        for i, value in enumerate(run.rids):
            size = run.sizes[i]
            if size == GONE:
                continue
            if size == CHANGED:
                out[value] = run.changed[value]
                continue
            for offset, length, meta, _ in found:
                if meta[5] == value:
                    break
            else:
                raise OSError(f"the record of rid {value} is not in its run's span")
            page = Page(run.segment, offset, length)
            page.state = PAGED
            out[value] = entry_type(page, acquired=value in acquired,
                                    journal_id=run.journal_id(i), page=page)
            moved += length
    while pending is not None:
        out[pending[0]] = pending[1]
        pending = next(old, None)
    image.messages.clear()
    image.messages.update(out)
    image.runs.clear()
    image.run_bytes = image.run_count = 0
    return moved


def _records(store, run: ImageRun):
    """The records in ``run``'s span, read ``SCAN`` bytes at a time: ``(offset, size, meta,
    payload)``."""
    offset, remaining = run.offset, run.span
    while remaining > 0:
        data = store.read_now(run.segment, offset, min(remaining, SCAN))
        if len(data) >= HEADER.size:
            whole = HEADER.size + HEADER.unpack_from(data)[0]
            if whole > len(data):
                data = store.read_now(run.segment, offset, whole)
        taken = 0
        for at, length, meta, payload in records(data):
            yield offset + at, length, meta, payload
            taken = at + HEADER.size + length
        if not taken:
            return
        offset += taken
        remaining -= taken


def drop(image, store, entry_type) -> list:
    """Every run's live records dead (a new catch-up, the copy closed); the entries whose
    journal records go too (rewritten ones, and one per journal id of a record)."""
    journaled = []
    for run in image.runs:
        count = size = 0
        for i, length in enumerate(run.sizes):
            if length == GONE:
                continue
            if length == CHANGED:
                journaled.append(run.changed[run.rids[i]])
                continue
            count += 1
            size += HEADER.size + length
            journal_id = run.journal_id(i)
            if journal_id:
                journaled.append(entry_type(b"", journal_id=journal_id))
        store.dead_records(run.segment, count, size)
    image.runs.clear()
    image.run_bytes = image.run_count = 0
    return journaled
