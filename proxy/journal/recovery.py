"""What recovery keeps of the live messages while it scans the journal, compactly.

How this works (docs/paging.md, "Recovered durable messages in runs": recovery's memory)
---------------------------------------------------------------------------------------
``Journal.open`` reads every segment and applies its records to a ``LiveSet``: per live
message id one small int (``queue_of``: its queue name's code * 16 + a tag; no object
while there are fewer than 16 queues). The tag is what ``peek`` made of a body beyond the
budget when that is an int 0-13 (a header's fields without a ttl:
``proxy.queues.journal_restore``), or says that ``kept`` holds it (the body while the body
budget lasts, or a larger peek value), or that nothing is known (no peek). So a message
beyond the budget costs recovery one dict entry while it scans, where it cost a tuple, an
entry and a list's tuple (about 170 bytes more, and a process does not give back to the
system the memory such passing objects leave spread between the lasting ones). At the end
each queue gets a ``Listing``: its ids (``array('q')``) and tags (``array('b')``), read as
``(id, bytes or what was kept)`` pairs in id order, made as they are read.
"""

from __future__ import annotations

from array import array


INLINE = 14  # tags 0-13: peek gave this small int (kept in the tag, no object)
NOTHING = 14  # beyond the budget, no peek: nothing known of it
KEPT = 15  # in ``kept``: its body, or what peek gave that is not a small int


class Listing:
    """One queue's recovered messages: ``(message id, bytes | what peek kept | None)``, in id
    order, made as they are read from its arrays."""

    __slots__ = ("ids", "tags", "kept")

    def __init__(self, ids: array, tags: array, kept: dict) -> None:
        self.ids = ids
        self.tags = tags
        self.kept = kept  # shared by the queues: id -> body bytes or what peek kept

    def __len__(self) -> int:
        return len(self.ids)

    def _value(self, message_id: int, tag: int):
        if tag < INLINE:
            return tag
        return self.kept[message_id] if tag == KEPT else None

    def __iter__(self):
        value = self._value
        for message_id, tag in zip(self.ids, self.tags):
            yield message_id, value(message_id, tag)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [(i, self._value(i, t)) for i, t in zip(self.ids[index], self.tags[index])]
        return self.ids[index], self._value(self.ids[index], self.tags[index])

    def __eq__(self, other) -> bool:
        return list(self) == list(other)


class LiveSet:
    """The live messages as recovery finds them (``Journal.open``)."""

    def __init__(self, body_room: int | None, peek=None) -> None:
        self.room = body_room  # body bytes it may still keep (None: all)
        self.peek = peek  # (data, start, end) -> what to keep of a body beyond the room
        self.names: list[str] = []
        self.codes: dict[str, int] = {}
        # live id -> its queue name's code * 16 + a tag (a small int: no object while there
        # are fewer than 16 queues)
        self.queue_of: dict[int, int] = {}
        self.kept: dict[int, object] = {}  # live id -> body bytes, or peek's (tag KEPT)

    def __len__(self) -> int:
        return len(self.queue_of)

    def enqueue(self, message_id: int, name: str, data: bytes, start: int, end: int) -> None:
        """A live message of queue ``name`` whose body is data[start:end]."""
        code = self.codes.get(name)
        if code is None:
            code = self.codes[name] = len(self.names)
            self.names.append(name)
        room = self.room
        if room is None or room >= end - start:
            if room is not None:
                self.room = room - (end - start)
            self.kept[message_id] = data[start:end]
            tag = KEPT
        elif self.peek is None:  # beyond the budget: read back by location when wanted
            tag = NOTHING
        else:
            value = self.peek(data, start, end)
            if type(value) is int and 0 <= value < INLINE:
                tag = value
            else:
                self.kept[message_id] = value
                tag = KEPT
        self.queue_of[message_id] = code * 16 + tag

    def dequeue(self, message_id: int) -> None:
        """No longer live (its enqueue was seen)."""
        if self.queue_of.pop(message_id) & 15 == KEPT:
            kept = self.kept.pop(message_id)
            if type(kept) is bytes and self.room is not None:
                self.room += len(kept)

    def listings(self) -> dict[str, Listing]:
        """Per queue its messages in id order; the scan's bookkeeping let go."""
        by_code: dict[int, tuple[array, array]] = {}
        queue_of = self.queue_of
        for message_id in sorted(queue_of):
            value = queue_of[message_id]
            arrays = by_code.get(value >> 4)
            if arrays is None:
                arrays = by_code[value >> 4] = (array("q"), array("b"))
            arrays[0].append(message_id)
            arrays[1].append(value & 15)
        self.queue_of = {}
        return {self.names[code]: Listing(ids, tags, self.kept)
                for code, (ids, tags) in sorted(by_code.items())}
