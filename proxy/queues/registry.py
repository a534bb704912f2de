"""All local queues of a node, by name (``QueueRegistry``)."""

from __future__ import annotations

import itertools
import logging
from typing import Callable

from proxy.queues.local import LocalQueue, QueueStats
from proxy.queues.memory import MemoryUse

log = logging.getLogger("fedgate.queues")


class QueueRegistry:
    """All local queues of a node, by name; creates them on first use if allowed."""

    def __init__(
        self,
        *,
        auto_create: bool = True,
        defaults: Callable[[str], dict] | None = None,
        max_memory: int = 0,
        temporary_defaults: dict | None = None,
    ) -> None:
        self.auto_create = auto_create
        self.memory = MemoryUse(max_memory)
        self.temporary_defaults = temporary_defaults or {}  # [queues] limits for temporary queues
        self._defaults = defaults or (lambda name: {})
        self.queues: dict[str, LocalQueue] = {}
        self._temp_ids = itertools.count(1)
        # stats of deleted queues, so node-wide totals never go down
        self.retired = QueueStats()

    def get(self, name: str) -> LocalQueue | None:
        return self.queues.get(name)

    def declare(self, name: str, *, kind: type = LocalQueue, **options) -> LocalQueue:
        """The queue called ``name``, made (a ``kind``: LocalQueue or a subclass) if absent."""
        queue = self.queues.get(name)
        if queue is None:
            queue = kind(name=name, memory=self.memory, **options)
            self.queues[name] = queue
            log.debug("queue %s declared", name)
        return queue

    def defaults(self, name: str) -> dict:
        """The options a queue called ``name`` gets when made (config defaults and [[queue]])."""
        return dict(self._defaults(name))

    def lookup_or_create(self, name: str) -> LocalQueue | None:
        queue = self.queues.get(name)
        if queue is None and self.auto_create:
            queue = self.declare(name, **self._defaults(name))
        return queue

    def create_temporary(self, prefix: str, creator=None) -> LocalQueue:
        name = f"{prefix}{next(self._temp_ids)}"
        while name in self.queues:
            name = f"{prefix}{next(self._temp_ids)}"
        return self.declare(name, temporary=True, creator=creator, **self.temporary_defaults)

    def delete(self, name: str) -> LocalQueue | None:
        queue = self.queues.pop(name, None)
        if queue is not None:
            for key, value in vars(queue.stats).items():
                setattr(self.retired, key, getattr(self.retired, key) + value)
        return queue

    def totals(self) -> QueueStats:
        """Message counters summed over every queue, deleted ones included."""
        total = QueueStats(**vars(self.retired))
        for queue in self.queues.values():
            for key, value in vars(queue.stats).items():
                setattr(total, key, getattr(total, key) + value)
        return total
