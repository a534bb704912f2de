"""The live routing table: the current RuleSet plus a version number.

State is one immutable ``(version, ruleset)`` snapshot held in a single
attribute, so readers (``resolve``, ``current``) never lock and always
see a consistent pair. ``replace`` takes a lock only to make the
expected-version check and the increment atomic among writers, swaps the
snapshot with one assignment, then calls subscribers outside the lock
with ``(old_ruleset, new_ruleset, version)``. A failing subscriber is
logged on ``fedgate.routing`` and never blocks the swap or the others.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import NamedTuple

from .decision import Decision
from .errors import VersionConflict
from .ruleset import RuleSet

__all__ = ["RoutingTable", "Snapshot", "Listener"]

log = logging.getLogger("fedgate.routing")

Listener = Callable[[RuleSet, RuleSet, int], None]


class Snapshot(NamedTuple):
    version: int
    ruleset: RuleSet


class RoutingTable:
    """Holds the current RuleSet; version starts at 1."""

    def __init__(self, initial: RuleSet | None = None) -> None:
        if initial is not None and not isinstance(initial, RuleSet):
            raise TypeError(f"expected RuleSet, got {type(initial).__name__}")
        self._snapshot = Snapshot(1, initial if initial is not None else RuleSet.empty())
        self._lock = threading.Lock()
        self._listeners: tuple[Listener, ...] = ()

    @property
    def current(self) -> RuleSet:
        return self._snapshot.ruleset

    @property
    def version(self) -> int:
        return self._snapshot.version

    def snapshot(self) -> Snapshot:
        """The current ``(version, ruleset)`` pair, read atomically."""
        return self._snapshot

    def resolve(self, address: str) -> Decision:
        return self._snapshot.ruleset.resolve(address)

    def replace(self, new_ruleset: RuleSet, *, expected_version: int | None = None) -> int:
        """Swap in ``new_ruleset``; return the new version.

        Raises :class:`VersionConflict` if ``expected_version`` is given and
        is not the current version (nothing is changed then).
        """
        if not isinstance(new_ruleset, RuleSet):
            raise TypeError(f"expected RuleSet, got {type(new_ruleset).__name__}")
        with self._lock:
            old = self._snapshot
            if expected_version is not None and expected_version != old.version:
                raise VersionConflict(expected_version, old.version)
            new = Snapshot(old.version + 1, new_ruleset)
            self._snapshot = new
            listeners = self._listeners
        for callback in listeners:
            try:
                callback(old.ruleset, new.ruleset, new.version)
            except Exception:
                log.exception(
                    "routing table subscriber %r failed for version %d; continuing",
                    callback,
                    new.version,
                )
        return new.version

    def subscribe(self, callback: Listener) -> Callable[[], None]:
        """Call ``callback(old, new, version)`` after each swap.

        Returns a function that unsubscribes (idempotent).
        """
        if not callable(callback):
            raise TypeError("callback must be callable")
        with self._lock:
            self._listeners = self._listeners + (callback,)

        def unsubscribe() -> None:
            with self._lock:
                items = list(self._listeners)
                for i, cb in enumerate(items):
                    if cb is callback:
                        del items[i]
                        self._listeners = tuple(items)
                        return

        return unsubscribe
