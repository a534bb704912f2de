"""The journal's index of live messages: message id -> where its ENQUEUE record is, compactly.

How this works (docs/journal-index.md)
--------------------------------------
``Journal._where`` was a dict of live message id -> packed location ``segment << 64 |
offset << 32 | length`` (an int wider than 64 bits): about 100 bytes per live message (the
dict's slot and key, a 36-byte int each). ``Where`` keeps the same mapping, with the same
operations (``w[id] = loc``, ``get``, ``pop``, ``in``, ``len``, ``items``), in three
parallel arrays sorted by id: ``ids`` (``array('q')``, 8 bytes), ``segs`` (the segment
number, ``array('I')``, 4 bytes; widened once to ``array('Q')`` should a number pass
2**32 - 1) and ``spans`` (``offset << 32 | length``, ``array('Q')``, 8 bytes): 20 bytes
per live message, plus the arrays' growth room (up to 1/8) and the tombstones not yet
compacted away. A location does not fit one 64-bit word without limits a long-running node
would pass: segment numbers are never reused (one per 64 MiB written by default; 10 bits
left beside a 27-bit offset and a 27-bit length would last 64 GiB of writes).

Invariants. ``ids`` ascend strictly. A removed entry is a tombstone: its span is 0 (a
record is at least its 10-byte header long: a live span is never 0); ``dead`` counts them.
An id is in the arrays (live or a tombstone) or in ``extra``, never both.

Ids are allocated ascending (``Journal._next_id``: ``enqueue`` and ``commit`` alike), so a
new id on a running node is an append (O(1)). A lookup first guesses ``id - ids[0]`` (the
ids are consecutive until a compaction drops scattered ones: O(1)), then bisects (O(log
n)). An id that is not above the last one and not in the arrays goes to ``extra`` (a
dict): recovery meets those, a relocated copy whose older copy's segment is already
deleted comes in a later segment than younger ids. ``extra`` is merged into the arrays
once it passes 1/8 of them, and by ``settle`` (after recovery, which also trims the
arrays' growth room): O(n + k log n), amortised O(log n) per such insert. Tombstones go
once they pass half the arrays: those in front (a FIFO consumer's) by deleting a slice
(C speed), the rest, if still over a quarter, by ``itertools.compress`` (about 100 ns an
entry: a pause of 0.17 s at 2 million entries, on this machine): amortised O(1) per
removal.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from itertools import compress

_LOW64 = (1 << 64) - 1
_SEG = "I" if array("I").itemsize == 4 else "L"
_MIN_COMPACT = 4096  # tombstones before a compaction is worth it
_MIN_MERGE = 64  # out-of-order ids before a merge is worth it


class Where:
    __slots__ = ("ids", "segs", "spans", "dead", "extra")

    def __init__(self) -> None:
        self.ids = array("q")
        self.segs = array(_SEG)
        self.spans = array("Q")
        self.dead = 0  # tombstones in the arrays
        self.extra: dict[int, int] = {}  # out-of-order ids -> packed location

    def __len__(self) -> int:
        return len(self.ids) - self.dead + len(self.extra)

    def _find(self, message_id: int) -> int:
        """Index of ``message_id`` in the arrays (a live entry or a tombstone), or -1. First
        a guess: ids are consecutive from ``ids[0]`` until a compaction drops scattered ones."""
        ids = self.ids
        n = len(ids)
        if not n:
            return -1
        i = message_id - ids[0]
        if 0 <= i < n and ids[i] == message_id:
            return i
        i = bisect_left(ids, message_id)
        return i if i < n and ids[i] == message_id else -1

    def get(self, message_id: int, default=None):
        extra = self.extra
        if extra:
            loc = extra.get(message_id)
            if loc is not None:
                return loc
        ids = self.ids  # _find, inline: a dequeue's lookup runs per message
        n = len(ids)
        if not n:
            return default
        i = message_id - ids[0]
        if not (0 <= i < n and ids[i] == message_id):
            if message_id > ids[-1]:  # a new id (recovery asks before it sets)
                return default
            i = bisect_left(ids, message_id)
            if i >= n or ids[i] != message_id:
                return default
        span = self.spans[i]
        return (self.segs[i] << 64) | span if span else default

    def __contains__(self, message_id: int) -> bool:
        return self.get(message_id) is not None

    def __setitem__(self, message_id: int, loc: int) -> None:
        ids = self.ids
        if not ids or message_id > ids[-1]:  # a new id: an append
            extra = self.extra
            if extra and message_id in extra:
                extra[message_id] = loc
                return
            try:
                self.segs.append(loc >> 64)
            except OverflowError:
                self._widen()
                self.segs.append(loc >> 64)
            ids.append(message_id)
            self.spans.append(loc & _LOW64)
            return
        i = self._find(message_id)
        if i < 0:
            extra = self.extra
            extra[message_id] = loc
            if len(extra) > _MIN_MERGE and len(extra) * 8 > len(ids):
                self.settle()
            return
        if not self.spans[i]:  # a tombstone comes back to life
            self.dead -= 1
        try:
            self.segs[i] = loc >> 64
        except OverflowError:
            self._widen()
            self.segs[i] = loc >> 64
        self.spans[i] = loc & _LOW64

    def pop(self, message_id: int, default=None):
        extra = self.extra
        if extra:
            loc = extra.pop(message_id, None)
            if loc is not None:
                return loc
        ids = self.ids  # _find, inline: a dequeue runs per message
        n = len(ids)
        if not n:
            return default
        i = message_id - ids[0]
        if not (0 <= i < n and ids[i] == message_id):
            if message_id > ids[-1]:  # a new id (recovery asks before it sets)
                return default
            i = bisect_left(ids, message_id)
            if i >= n or ids[i] != message_id:
                return default
        spans = self.spans
        span = spans[i]
        if not span:
            return default
        spans[i] = 0
        dead = self.dead = self.dead + 1
        if dead > _MIN_COMPACT and dead * 2 > n:
            loc = (self.segs[i] << 64) | span
            self._compact()
            return loc
        return (self.segs[i] << 64) | span

    def items(self):
        """(id, packed location) of every live entry: the arrays' (a copy) in id order, then
        the out-of-order ones."""
        spans = self.spans[:]
        for message_id, seg, span in zip(self.ids[:], self.segs[:], spans):
            if span:
                yield message_id, (seg << 64) | span
        yield from list(self.extra.items())

    def located_in(self, numbers) -> list[tuple[int, int]]:
        """(id, packed location) of the live entries whose record is in one of the segments
        ``numbers`` (relocation's question; a location made only for those)."""
        found = [(message_id, (seg << 64) | span) for message_id, seg, span
                 in zip(self.ids, self.segs, self.spans) if seg in numbers and span]
        found += [(message_id, loc) for message_id, loc in self.extra.items()
                  if loc >> 64 in numbers]
        return found

    def _widen(self) -> None:
        """A segment number past 32 bits: 8 bytes per segment number from now on."""
        self.segs = array("Q", self.segs)

    def _compact(self) -> None:
        """Drop the tombstones: those in front (a FIFO consumer's) by a slice's deletion, the
        rest (``compress``: about 100 ns an entry, this machine) when still over a quarter."""
        spans = self.spans
        raw = memoryview(spans).cast("B").tobytes()
        lead = (len(raw) - len(raw.lstrip(b"\0"))) >> 3
        if lead:
            del self.ids[:lead]
            del self.segs[:lead]
            del spans[:lead]
            self.dead -= lead
        if self.dead * 4 > len(spans) or (self.dead and not lead):
            self._compress()

    def _compress(self) -> None:
        spans = self.spans
        self.ids = array("q", compress(self.ids, spans))
        self.segs = array(self.segs.typecode, compress(self.segs, spans))
        self.spans = array("Q", compress(spans, spans))
        self.dead = 0

    def settle(self) -> None:
        """Merge the out-of-order ids into the arrays (tombstones dropped on the way); the
        arrays exactly as long as their entries (no growth room: after recovery)."""
        if self.dead:
            self._compact()
        if self.dead:  # (the few a compaction leaves: the merge below must not meet them)
            self._compress()
        extra = self.extra
        if not extra:
            self.ids, self.segs, self.spans = self.ids[:], self.segs[:], self.spans[:]
            return
        if self.segs.typecode != "Q" and max(extra.values()) >> 64 > 0xFFFFFFFF:
            self._widen()
        ids, segs, spans = self.ids, self.segs, self.spans
        new_ids, new_segs, new_spans = array("q"), array(segs.typecode), array("Q")
        start = 0
        for message_id in sorted(extra):
            at = bisect_left(ids, message_id, start)
            if at > start:
                new_ids.extend(ids[start:at])
                new_segs.extend(segs[start:at])
                new_spans.extend(spans[start:at])
            start = at
            loc = extra[message_id]
            new_ids.append(message_id)
            new_segs.append(loc >> 64)
            new_spans.append(loc & _LOW64)
        new_ids.extend(ids[start:])
        new_segs.extend(segs[start:])
        new_spans.extend(spans[start:])
        self.ids, self.segs, self.spans = new_ids, new_segs, new_spans
        self.extra = {}


def prune_old_copies(old_copies: dict[int, list[int]], segments) -> dict[int, list[int]]:
    """``Journal._old_copies`` (relocated id -> segments of its older copies) without the
    segments deleted: a deleted segment's copy needs no DEQUEUE (about 130 bytes per relocated
    live message were held until its dequeue). O(entries), once per cleaning that deleted."""
    kept = {}
    for message_id, numbers in old_copies.items():
        numbers = [number for number in numbers if number in segments]
        if numbers:
            kept[message_id] = numbers
    return kept
