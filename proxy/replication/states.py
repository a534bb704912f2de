"""Where one node's copy of a replicated queue is: its states and their moves, as data.

How this works
--------------
docs/replication.md draws the machine; ``COPY_TRANSITIONS`` is the same
drawing as a table (as h11's ``_state.py`` does), and ``CopyRole.move`` raises
on a move it does not list, so a bug shows up as an error where it happens,
not as a queue served by two primaries.
"""

from __future__ import annotations

import enum


class CopyState(enum.StrEnum):
    ABSENT = "absent"  # this node keeps no copy (not in the replica set, or not started)
    CATCHING_UP = "catching-up"  # a backup copying what the primary held when it joined
    READY = "ready"  # a backup that holds everything the primary accepted: in the ISR
    LAGGING = "lagging"  # a backup dropped from the ISR (slow, or its link broke)
    PRIMARY = "primary"  # serves the queue
    FENCED = "fenced"  # was primary, may no longer act (lease lost, higher epoch seen)


COPY_TRANSITIONS: dict[CopyState, frozenset[CopyState]] = {
    CopyState.ABSENT: frozenset({CopyState.CATCHING_UP, CopyState.PRIMARY, CopyState.ABSENT}),
    CopyState.CATCHING_UP: frozenset({CopyState.READY, CopyState.LAGGING, CopyState.CATCHING_UP,
                                      CopyState.ABSENT, CopyState.PRIMARY}),  # PRIMARY: forced
    CopyState.READY: frozenset({CopyState.PRIMARY, CopyState.LAGGING, CopyState.CATCHING_UP,
                                CopyState.ABSENT}),
    CopyState.LAGGING: frozenset({CopyState.CATCHING_UP, CopyState.ABSENT, CopyState.LAGGING,
                                  CopyState.PRIMARY}),  # PRIMARY: forced only
    CopyState.PRIMARY: frozenset({CopyState.FENCED, CopyState.ABSENT}),
    CopyState.FENCED: frozenset({CopyState.CATCHING_UP, CopyState.PRIMARY, CopyState.ABSENT}),
}

# a backup in these states may be promoted without --force
PROMOTABLE = frozenset({CopyState.READY})


class CopyStateError(RuntimeError):
    """A move ``COPY_TRANSITIONS`` does not allow."""


class CopyRole:
    """The state of one copy, moved only along ``COPY_TRANSITIONS``; ``history`` for the admin API."""

    __slots__ = ("state", "since", "history")

    def __init__(self, now: float) -> None:
        self.state = CopyState.ABSENT
        self.since = now
        self.history: list[tuple[float, str]] = []

    def move(self, to: CopyState, now: float, why: str = "") -> None:
        if to not in COPY_TRANSITIONS[self.state]:
            raise CopyStateError(f"copy cannot go from {self.state} to {to} ({why})")
        if to != self.state:
            self.history.append((now, f"{self.state} -> {to}{': ' + why if why else ''}"))
            del self.history[:-20]
        self.state = to
        self.since = now
