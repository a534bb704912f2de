"""A backup's copy of a replicated queue, built from the primary's events.

How this works
--------------
``ReplicaImage`` is plain data: ``apply(batch)`` takes one batch of events
(``proxy.replication.events``) in order and says what changed (for the
backup's journal, when the queue is durable). Messages are kept by rid, in
the primary's order: live enqueues at the tail, catch-up ``front`` messages
at the head (they come newest first), so the image is always in rid order.

During a catch-up, events can name a rid whose ``front`` has not come yet
(a live dequeue, acquire or release of an old message): they are kept in
``early`` and applied when it comes; a ``front`` for a rid dequeued meanwhile
is dropped. ``catchup-done`` ends it; what is still in ``early`` then names
messages the primary no longer held at its sync point, and is forgotten.

A batch whose epoch is lower than the highest this copy has seen is refused
(``StaleEpoch``): it comes from a primary that was replaced.

``promote()`` makes the copy a queue's content: in rid order, and a message
that was out with a consumer at the old primary comes again with its
delivery-count raised (at-least-once, docs/replication.md).

Paged stretches of the copy may be kept as runs (``proxy.replication.image_runs``,
docs/paging.md "A backup's copy in runs"): ``runs``, outside ``messages``, no object per
message; events on their rids are applied there.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from proxy.amqp import message_header

from . import image_runs
from .events import ACQUIRE, CATCHUP_DONE, DEQUEUE, ENQUEUE, FRONT, IN_SYNC, RELEASE, Batch


class StaleEpoch(Exception):
    """A batch from a primary older than one this copy has already followed."""


@dataclass(slots=True)
class Entry:
    payload: bytes
    acquired: bool = False
    journal_id: int = 0  # its ENQUEUE record on this node, when durable
    # its record in the node's page store (proxy.paging); while the body is on disk only,
    # ``payload`` is that record too (docs/paging.md)
    page: object = None


@dataclass(slots=True)
class Early:
    """What live events said about a rid whose catch-up copy has not come yet."""

    acquired: bool = False
    payload: bytes | None = None
    dequeued: bool = False


@dataclass
class Changes:
    """What one batch changed, for the journal: (rid, entry) added, entries removed."""

    added: list
    removed: list
    rewritten: list  # entries whose bytes changed
    fronts: list = field(default_factory=list)  # (rid, entry) of ``added`` that came at the head
    dead_records: list = field(default_factory=list)  # (segment, body size): runs' records


class ReplicaImage:
    def __init__(self, name: str, epoch: int = 0) -> None:
        self.name = name
        self.epoch = epoch  # the highest seen
        self.messages: OrderedDict[int, Entry] = OrderedDict()
        self.bytes = 0
        self.catching_up = True
        self.in_sync = False  # the primary wrote this copy into the in-sync set (an S event)
        self.early: dict[int, Early] = {}
        self.batches = 0  # applied, in all
        self.last_batch = 0  # the number of the last applied batch on the current link
        self.unknown = 0  # events naming a rid never seen outside a catch-up (counted, ignored)
        self.runs: list = []  # image_runs.ImageRun, by first rid: paged, no object per message
        self.run_bytes = 0  # bodies of the runs' live records (on disk only)
        self.run_count = 0  # messages in runs
        self.closed = False  # promoted or dropped: no more runs are made
        self.special: dict = {}  # rid -> priority: written, not yet in a run (image_runs)

    def restart(self, epoch: int, store=None) -> list[Entry]:
        """A new catch-up (a new link, maybe a new primary): the copy starts empty (its runs'
        records let go in ``store``, the node's page store).

        Returns the entries dropped (for the journal)."""
        if epoch < self.epoch:
            raise StaleEpoch(f"epoch {epoch} < {self.epoch}")
        dropped = self.drop_runs(store) + list(self.messages.values())
        self.epoch = epoch
        self.messages.clear()
        self.bytes = 0
        self.catching_up = True
        self.in_sync = False
        self.early.clear()
        self.special.clear()
        self.last_batch = 0
        return dropped

    def apply(self, batch: Batch) -> Changes:
        if batch.epoch < self.epoch:
            raise StaleEpoch(f"batch of epoch {batch.epoch}, this copy follows {self.epoch}")
        self.epoch = batch.epoch
        changes = Changes([], [], [])
        messages = self.messages
        for event in batch.events:
            kind, value = event.kind, event.rid
            entry = messages.get(value)
            if entry is None and self.runs and (found := image_runs.find(self.runs, value)):
                image_runs.event(self, found[0], found[1], event, changes, Entry)
            elif kind == ENQUEUE:
                entry = Entry(bytes(event.payload))
                messages[value] = entry
                self.bytes += len(entry.payload)
                changes.added.append((value, entry))
            elif kind == FRONT:
                early = self.early.pop(value, None)
                if early is not None and early.dequeued:
                    continue
                if entry is not None:
                    continue  # it came live already
                entry = Entry(bytes(early.payload if early is not None and early.payload is not None
                                    else event.payload),
                              acquired=early.acquired if early is not None else event.acquired)
                messages[value] = entry
                messages.move_to_end(value, last=False)
                self.bytes += len(entry.payload)
                changes.added.append((value, entry))
                changes.fronts.append((value, entry))
            elif kind == CATCHUP_DONE:
                self.catching_up = False
                self.early.clear()
            elif kind == IN_SYNC:
                self.in_sync = not self.catching_up
            elif entry is None:
                if self.catching_up:
                    early = self.early.setdefault(value, Early())
                    if kind == ACQUIRE:
                        early.acquired = True
                    elif kind == RELEASE:
                        early.acquired = False
                        if event.payload is not None:
                            early.payload = bytes(event.payload)
                    elif kind == DEQUEUE:
                        early.dequeued = True
                else:
                    self.unknown += 1
            elif kind == ACQUIRE:
                entry.acquired = True
            elif kind == RELEASE:
                entry.acquired = False
                if event.payload is not None:
                    self.bytes += len(event.payload) - len(entry.payload)
                    entry.payload = bytes(event.payload)
                    changes.rewritten.append((value, entry))
            elif kind == DEQUEUE:
                del messages[value]
                self.bytes -= len(entry.payload)
                changes.removed.append(entry)
        self.batches += 1
        self.last_batch = batch.number
        return changes

    def record_fields(self, value: int, entry: Entry) -> tuple:
        """The index fields the pager writes with an entry's record (``image_runs``)."""
        return image_runs.record_fields(self, value, entry)

    def runs_written(self, done: list) -> int:
        """A write of added entries was reported (the pager): those still here become runs;
        their body bytes returned."""
        return image_runs.make_runs(self, done)

    def drop_runs(self, store) -> list:
        """The runs' records let go (a new catch-up, the copy closed); the entries whose
        journal records go too."""
        return image_runs.drop(self, store, Entry) if self.runs else []

    def close(self, store) -> None:
        """The copy is promoted or dropped: no runs are made any more, those left let go."""
        self.closed = True
        self.drop_runs(store)

    def unrun(self, store) -> int:
        """The runs back as entries paged one by one (a promotion); their body bytes."""
        return image_runs.unrun(self, store, Entry)

    @property
    def depth(self) -> int:
        return len(self.messages) + self.run_count

    def promote(self) -> list[tuple[int, Entry]]:
        """The copy as a queue's content, in rid order; what was out with a consumer comes
        again with its delivery-count raised (§3.2.1: it may have been processed). Runs are
        handed over first (``promote_runs``) or turned back into entries (``unrun``)."""
        if self.runs:
            raise RuntimeError("a copy's runs are turned into entries before its promotion")
        out = []
        for value, entry in self.messages.items():
            if entry.acquired:
                entry.payload = message_header.modify(entry.payload, increment_count=True)
                entry.acquired = False
            out.append((value, entry))
        return out
