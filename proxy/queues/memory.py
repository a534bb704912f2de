"""The node's memory for messages: ``[limits] max_memory`` (docs/paging.md)."""

from __future__ import annotations

from typing import Callable


class MemoryUse:
    """Bytes held by all local queues of a node, against ``[limits] max_memory`` (0: no limit).

    ``used`` counts every payload byte the queues hold (waiting and handed out, not settled),
    ``paged`` those whose body is on disk only (``proxy.paging``); ``resident`` is what is in
    memory. Without paging, ``ceiling`` is the limit itself: there, queues give their
    producers no new credit (they join ``blocked``); once ``resident`` falls below
    ``RESUME`` of it, ``on_room`` is called with them, for their producers to be topped up
    again. With a pager the limit is the budget the pager keeps ``resident`` under, and the
    ceiling is higher (``proxy.paging.pager.HEADROOM``), or the budget again while a disk
    bound holds. Producers that send to no one queue (the anonymous relay: each message has
    its own destination) ask ``withholds`` instead and wait in ``waiting``; they are topped
    up at the same moment. Consumers go on draining meanwhile, and what was sent on credit
    already given is taken.
    """

    RESUME = 0.9

    __slots__ = ("limit", "used", "paged", "pager", "blocked", "waiting", "on_room")

    def __init__(self, limit: int = 0) -> None:
        self.limit = limit
        self.used = 0
        self.paged = 0
        self.pager = None  # proxy.paging.pager.Pager when the node pages
        self.blocked: set = set()
        self.waiting: set = set()  # producers (with ``top_up()``) given no credit by ``withholds``
        self.on_room: Callable[[set], None] = lambda queues: None

    @property
    def ceiling(self) -> int:
        """Where producers stop (0: never)."""
        pager = self.pager
        return self.limit if pager is None else pager.ceiling()

    @property
    def resident(self) -> int:
        return self.used - self.paged

    @property
    def over(self) -> bool:
        return bool(self.ceiling) and self.used - self.paged >= self.ceiling

    def withholds(self, producer) -> bool:
        """Over the ceiling: True, no new credit for ``producer``; its ``top_up()`` is called
        once use falls below ``RESUME`` of it (``freed``)."""
        if self.ceiling and self.used - self.paged >= self.ceiling:
            self.waiting.add(producer)
            return True
        return False

    def freed(self) -> None:
        if self.used - self.paged < self.ceiling * self.RESUME:
            queues, self.blocked = self.blocked, set()
            producers, self.waiting = self.waiting, set()
            self.on_room(queues)
            for producer in producers:
                producer.top_up()
