"""Runs per level: a priority queue's paged messages on disk, each level a FIFO with runs.

How this works (docs/paging.md, "A priority queue in runs")
------------------------------------------------------------
A priority queue that pages keeps its ready messages in a ``LevelRuns``: one ``RunQueue``
(``proxy.queues.runs``) per priority level, ``[head][run]...[tail]`` each, holding only
messages of that level. The order is the in-memory ``PriorityStore``'s: the highest level
holding anything first, FIFO within a level, messages put back at their level's head.

* ``head`` is the head of the highest level holding anything: empty when that level's next
  message is in a run, and dispatch then asks ``read_ahead`` and waits, as for a FIFO queue.
* ``read_ahead`` walks the levels from the top and reads the first run it meets while fewer
  than ``read_ahead`` messages are in memory ahead of it.
* ``page_out`` pages from the end of the delivery order: the lowest level first, each
  level's tail, never within the window at the queue's head.
* ``unrun`` turns it into a ``PriorityStore`` of messages paged one by one (a selector, the
  admin API's take): every record read, as ``RunQueue.unrun``.

The event loop alone changes it, as it does a ``RunQueue``.
"""

from __future__ import annotations

from collections import deque

from proxy.paging.store import STORED
from proxy.queues.runs import RunQueue
from proxy.queues.store import DEFAULT_PRIORITY, LEVELS, PriorityStore, top_level


class LevelRuns:
    """A priority queue's ready messages with runs per level: the operations the queue uses."""

    __slots__ = ("queue", "pager", "levels", "high")

    def __init__(self, queue, pager) -> None:
        self.queue = queue
        self.pager = pager
        self.levels = [RunQueue(queue, pager, deque(), deque()) for _ in range(LEVELS)]
        self.high = 0  # no level above this one holds a message

    @classmethod
    def of_store(cls, queue, pager, store: PriorityStore) -> "LevelRuns":
        """A ``PriorityStore``'s messages (none paged one by one), level by level, in order."""
        levels = cls(queue, pager)
        for priority, level in enumerate(store.levels):
            if level:
                levels.levels[priority].head.extend(level.values())
                levels.high = max(levels.high, priority)
        return levels

    @classmethod
    def of_runs(cls, queue, runs: RunQueue) -> "LevelRuns":
        """A FIFO queue's ``RunQueue`` (only default-priority messages) as level 4, as it is."""
        levels = cls(queue, runs.pager)
        levels.levels[DEFAULT_PRIORITY] = runs
        levels.high = DEFAULT_PRIORITY
        return levels

    def _top(self) -> RunQueue | None:
        return top_level(self)

    # -- the deque's operations ------------------------------------------------------------
    def __len__(self) -> int:
        return sum(map(len, self.levels))

    def __bool__(self) -> bool:
        return self._top() is not None

    def append(self, message) -> None:
        priority = message.priority
        if priority > self.high:
            self.high = priority
        self.levels[priority].append(message)

    def appendleft(self, message) -> None:
        priority = message.priority
        if priority > self.high:
            self.high = priority
        self.levels[priority].appendleft(message)

    def popleft(self):
        level = self._top()
        if level is None:
            raise IndexError("pop from an empty LevelRuns")
        return level.popleft()  # a run's front loaded here and now if the head is empty

    def __getitem__(self, index: int):
        if index != 0:
            raise IndexError("a LevelRuns is read from its head only")
        level = self._top()
        if level is None:
            raise IndexError("LevelRuns index out of range")
        return level[0]

    def remove(self, message) -> None:
        self.levels[message.priority].remove(message)

    @property
    def head(self) -> deque:
        """The in-memory head of the highest level holding anything (empty: a run is next)."""
        level = self._top()
        return level.head if level is not None else deque()

    @property
    def runs(self) -> bool:
        """Whether any level keeps runs."""
        return any(level.runs for level in self.levels)

    @property
    def count(self) -> int:
        """Messages in runs, all levels."""
        return sum(level.count for level in self.levels)

    def __iter__(self):
        return self.iterate()

    def iterate(self, after: int = 0):
        """Every message in delivery order; runs' as transient objects (``RunQueue.iterate``)."""
        for priority in range(LEVELS - 1, -1, -1):
            level = self.levels[priority]
            if level:
                yield from level.iterate(after)

    def in_order(self):
        return self.iterate()

    def by_priority(self) -> dict[int, int]:
        """How many wait at each priority in use, runs included."""
        return {p: len(level) for p, level in enumerate(self.levels) if level}

    def clear(self) -> None:
        self.drop_runs()
        for level in self.levels:
            level.head.clear()
        self.high = 0

    # -- the pager's side ----------------------------------------------------------------------
    def page_out(self, keep: int, wanted: int) -> int | None:
        """From the end of the delivery order: the lowest level first, each level's tail, none
        of the first ``keep`` messages of the queue. Bytes freed; None when no level could
        start a run and none keeps one: the queue pages one by one (a ``PriorityStore``)."""
        after = len(self)  # messages up to the end of the level, in delivery order
        freed = 0
        refused = False
        served = self._first_with_runs()  # its head is the read-ahead window, as in a FIFO
        for level in self.levels:
            size = len(level)
            if not size:
                continue
            if after <= keep:
                break
            before = after - size
            window = max(0, keep - before)
            got = level.page_out(window, wanted - freed)
            if got is None:  # its first message past the window may not be in a run
                refused = True
                got = 0
            freed += got
            if level.runs and level is not served and freed < wanted:  # read back, put back
                freed += self._page_head(level, window, wanted - freed)
            if freed >= wanted:
                break
            after = before
        if refused and not freed and not self.runs:
            self.queue.messages = PriorityStore(self.iterate())
            return None
        return freed

    def _page_head(self, level: RunQueue, keep: int, wanted: int) -> int:
        """The newest of ``level``'s head past its window (read back, or released to it, while
        higher levels were served), up to ``wanted`` bytes: a new run before its first, so
        that ten heads never hold the memory. Not for the first level with runs from the top
        (the one read ahead: its head is the window), nor while a read-ahead is under way
        (the run being read must stay the first)."""
        head = level.head
        if self.queue.reading or len(head) <= keep:
            return 0
        taken = []
        size = 0
        for index in range(len(head) - 1, keep - 1, -1):
            message = head[index]
            page = message.page
            if size >= wanted or message.excluded or message.origin is not None or (
                    page is not None and page.state != STORED):
                break  # never in a run: the new run starts after it
            taken.append(message)
            size += len(message.payload)
        if not taken:
            return 0
        front = RunQueue(self.queue, self.pager, deque(reversed(taken)), deque())
        freed = front.page_out(0, size + 1)  # every one of them, as runs of their own
        for _ in taken:
            head.pop()
        level.runs.extendleft(reversed(front.runs))
        level.count += front.count
        return freed or 0

    def _first_with_runs(self) -> RunQueue | None:
        for priority in range(self.high, -1, -1):
            level = self.levels[priority]
            if level.runs:
                return level
        return None

    def read_ahead(self) -> bool:
        """The first run in delivery order read back (``RunQueue.read_ahead``) while fewer
        than ``read_ahead`` messages are in memory ahead of it; True when it was there at
        once (a run not written yet)."""
        window = self.pager.read_ahead_count
        ahead = 0
        levels = self.levels
        for priority in range(self.high, -1, -1):
            level = levels[priority]
            if not level:
                continue
            if level.runs:
                if ahead + len(level.head) >= window:
                    return False
                return level.read_ahead()
            ahead += len(level)
            if ahead >= window:
                return False
        return False

    # -- leaving runs --------------------------------------------------------------------------
    def names(self):
        """``(journal_id, rid)`` of every message, level by level, nothing read (purge)."""
        for level in self.levels:
            yield from level.names()

    def drop_runs(self) -> int:
        """Purge: every level's runs' records dead (no read); their body bytes."""
        return sum(level.drop_runs() for level in self.levels)

    def unrun(self) -> PriorityStore:
        """Every level's runs back as messages paged one by one, in a ``PriorityStore`` that
        becomes the queue's (a selector, the admin API's take need message objects)."""
        store = PriorityStore()
        for level in self.levels:
            for message in level.unrun():
                store.append(message)
        self.queue.messages = store
        return store
