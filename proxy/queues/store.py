"""Waiting messages by priority, with removal from the middle (docs/queue-semantics.md).

A ``LocalQueue`` keeps its ready messages in a plain deque until a message with a
priority other than the default arrives or a consumer with a selector attaches; then
they move into a ``PriorityStore``: one ordered dict per priority (0-9), keyed by the
message's sequence number. It answers the deque operations the queue and its
neighbours use (``append``, ``appendleft``, ``popleft``, ``[0]``, ``len``, iteration
in delivery order, ``clear``) plus ``remove`` of any message in O(1): a consumer with a
selector takes messages from the middle. Higher priorities come first; within one
priority, the order of arrival, with messages put back at the head (``appendleft``).
"""

from __future__ import annotations

from collections import OrderedDict

DEFAULT_PRIORITY = 4
LEVELS = 10


def top_level(store):
    """The highest non-empty level of ``store`` (``levels``, ``high``: a ``PriorityStore``
    or a ``LevelRuns``), ``high`` lowered to it on the way; None when all are empty."""
    levels = store.levels
    for priority in range(store.high, -1, -1):
        level = levels[priority]
        if level:
            store.high = priority
            return level
    return None


class PriorityStore:
    __slots__ = ("levels", "count", "high")

    def __init__(self, messages=()) -> None:
        self.levels: list[OrderedDict | None] = [None] * LEVELS
        self.count = 0
        self.high = 0  # no level above this one holds a message
        for message in messages:
            self.append(message)

    def _level(self, priority: int) -> OrderedDict:
        level = self.levels[priority]
        if level is None:
            level = self.levels[priority] = OrderedDict()
        return level

    def append(self, message) -> None:
        self._put(message)

    def appendleft(self, message) -> None:
        self._put(message).move_to_end(message.seq, last=False)

    def _put(self, message) -> OrderedDict:
        priority = message.priority
        if priority > self.high:
            self.high = priority
        level = self._level(priority)
        if message.seq not in level:
            self.count += 1
        level[message.seq] = message
        return level

    def _top(self) -> OrderedDict | None:
        return top_level(self) if self.count else None

    def popleft(self):
        level = self._top()
        if level is None:
            raise IndexError("pop from an empty PriorityStore")
        self.count -= 1
        return level.popitem(last=False)[1]

    def __getitem__(self, index: int):
        if index != 0:
            raise IndexError("a PriorityStore is read from its head only")
        level = self._top()
        if level is None:
            raise IndexError("PriorityStore index out of range")
        return next(iter(level.values()))

    def first(self, consumer_id: int):
        """The first message not excluded for ``consumer_id`` (undeliverable-here); None."""
        if self.count:
            levels = self.levels
            for priority in range(self.high, -1, -1):
                level = levels[priority]
                if level:
                    for message in level.values():
                        if consumer_id not in message.excluded:
                            return message
        return None

    def remove(self, message) -> bool:
        """Take ``message`` out wherever it is; False when it is not here."""
        level = self.levels[message.priority]
        if level is None or level.pop(message.seq, None) is None:
            return False
        self.count -= 1
        return True

    def __contains__(self, message) -> bool:
        level = self.levels[message.priority]
        return level is not None and message.seq in level

    def __len__(self) -> int:
        return self.count

    def __bool__(self) -> bool:
        return self.count > 0

    def __iter__(self):
        for priority in range(LEVELS - 1, -1, -1):
            level = self.levels[priority]
            if level:
                yield from list(level.values())

    def in_order(self):
        """Delivery order without a copy (nothing may be added or taken meanwhile)."""
        for priority in range(LEVELS - 1, -1, -1):
            level = self.levels[priority]
            if level:
                yield from level.values()

    def __reversed__(self):
        """From the tail (the last to be delivered), without a copy (as ``in_order``)."""
        for level in self.levels:
            if level:
                yield from reversed(level.values())

    def clear(self) -> None:
        self.levels = [None] * LEVELS
        self.count = 0
        self.high = 0

    def by_priority(self) -> dict[int, int]:
        """How many wait at each priority in use."""
        return {p: len(level) for p, level in enumerate(self.levels) if level}
