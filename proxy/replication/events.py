"""Replication events and the batches that carry them from a primary to a backup.

How this works
--------------
A primary tells each backup what happens to a replicated queue as events,
each naming a message by its replication id (``rid``), never by a position
(docs/replication.md). Events go in order on one AMQP link per backup, packed
into batches: one transfer carries one batch. Only fedgate nodes read them, so
the transfer's payload is this module's binary format, not an AMQP message;
message bytes inside are the producer's, untouched.

A batch::

    version u8 | epoch u64 | batch number u64 | events u32 | event...

``version`` is the batch format: 1 in 0.5.0 and 0.6.0. A backup reads every version of
``proxy.config.compat.BATCH_VERSIONS`` (its own release's and the previous one's); the
primary sends the greatest the backup announced on the link (docs/upgrades.md).

An event starts with its kind (one ASCII byte) and its rid (u64):

* ``E`` enqueue: ``len u32`` + the message's bytes, at the tail;
* ``F`` front (catch-up): ``acquired u8`` + ``len u32`` + bytes, at the head;
* ``A`` acquire: handed to a consumer (its outcome is pending);
* ``R`` release: back in the queue; ``len u32`` + new bytes when they changed
  (modified: delivery-count, annotations), ``len`` 0xFFFFFFFF when not;
* ``D`` dequeue: gone for good (accepted, rejected, expired, dropped);
* ``C`` catch-up done (rid 0): every message the primary held at the sync
  point has been sent;
* ``S`` in sync (rid 0): the primary has written this backup into the in-sync
  set (it may now be promoted).

Encoding copies each payload once, into the batch; decoding hands out
``memoryview`` slices of the batch (the receiver copies what it keeps).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from proxy.config.compat import BATCH_VERSIONS

VERSION = 1  # what 0.5.0 sends and reads, and what a backup that announced nothing gets
ENQUEUE, FRONT, ACQUIRE, RELEASE, DEQUEUE, CATCHUP_DONE, IN_SYNC = b"EFARDCS"
KINDS = {ENQUEUE, FRONT, ACQUIRE, RELEASE, DEQUEUE, CATCHUP_DONE, IN_SYNC}
UNCHANGED = 0xFFFFFFFF  # a release that keeps the message's bytes

_HEADER = struct.Struct(">BQQI")
_EVENT = struct.Struct(">BQ")
_LENGTH = struct.Struct(">I")
_FLAG = struct.Struct(">B")
_EVENT_WITH_LENGTH = struct.Struct(">BQI")  # E, R: the event, then its bytes' length
_FRONT = struct.Struct(">BQBI")  # F: the event, acquired, length
_EVENT_WITH_LENGTH_SIZE = _EVENT_WITH_LENGTH.size
_EVENT_SIZE, _LENGTH_SIZE, _FLAG_SIZE = _EVENT.size, _LENGTH.size, _FLAG.size

RID_BITS = 40  # a rid is epoch << RID_BITS | n (docs/replication.md)


def rid(epoch: int, n: int) -> int:
    return (epoch << RID_BITS) | n


def rid_epoch(value: int) -> int:
    return value >> RID_BITS


class BatchError(ValueError):
    """A batch that does not parse: the backup ends the link (its primary is not a fedgate)."""


class Event:
    """One event: its kind, its rid, and for some its bytes; ``size`` is its size in a batch.

    A plain class with slots (one is made per message and per backup at the primary, and
    per event at the backup: a frozen dataclass's ``__init__`` costs several times more)."""

    __slots__ = ("kind", "rid", "payload", "acquired", "size")

    def __init__(self, kind: int, rid: int, payload=None, acquired: bool = False) -> None:
        self.kind = kind
        self.rid = rid
        self.payload = payload  # bytes (E, F; R when changed)
        self.acquired = acquired  # F: out with a consumer at the primary
        if kind == ENQUEUE or kind == RELEASE:
            self.size = _EVENT_SIZE + _LENGTH_SIZE + (len(payload) if payload is not None else 0)
        elif kind == FRONT:
            self.size = _EVENT_SIZE + _LENGTH_SIZE + _FLAG_SIZE + len(payload)
        else:
            self.size = _EVENT_SIZE

    def __eq__(self, other) -> bool:
        return isinstance(other, Event) and (self.kind, self.rid, self.payload, self.acquired) == \
            (other.kind, other.rid, other.payload, other.acquired)

    def __repr__(self) -> str:
        return f"Event({bytes([self.kind])!r}, {self.rid}, {len(self.payload or b'')} bytes)"


@dataclass(frozen=True, slots=True)
class Batch:
    epoch: int
    number: int
    events: list


def encode(epoch: int, number: int, events: list[Event], version: int = VERSION) -> bytearray:
    out = bytearray(_HEADER.size + sum(e.size for e in events))
    _HEADER.pack_into(out, 0, version, epoch, number, len(events))
    at = _HEADER.size
    for event in events:
        kind = event.kind
        payload = event.payload
        if kind == ENQUEUE or (kind == RELEASE and payload is not None):
            size = len(payload)
            _EVENT_WITH_LENGTH.pack_into(out, at, kind, event.rid, size)
            at += _EVENT_WITH_LENGTH_SIZE
            out[at:at + size] = payload
            at += size
        elif kind == RELEASE:
            _EVENT_WITH_LENGTH.pack_into(out, at, kind, event.rid, UNCHANGED)
            at += _EVENT_WITH_LENGTH_SIZE
        elif kind == FRONT:
            size = len(payload)
            _FRONT.pack_into(out, at, kind, event.rid, 1 if event.acquired else 0, size)
            at += _FRONT.size
            out[at:at + size] = payload
            at += size
        else:
            _EVENT.pack_into(out, at, kind, event.rid)
            at += _EVENT_SIZE
    return out


def decode(data) -> Batch:
    view = memoryview(data)
    try:
        version, epoch, number, count = _HEADER.unpack_from(view, 0)
        if version not in BATCH_VERSIONS:
            raise BatchError(f"replication batch version {version}, this node reads "
                             f"{', '.join(map(str, BATCH_VERSIONS))} (a newer fedgate's "
                             "primary that did not negotiate?)")
        at = _HEADER.size
        events = []
        for _ in range(count):
            kind, value = _EVENT.unpack_from(view, at)
            at += _EVENT.size
            if kind not in KINDS:
                raise BatchError(f"unknown replication event {bytes([kind])!r}")
            acquired = False
            payload = None
            if kind == FRONT:
                acquired = bool(_FLAG.unpack_from(view, at)[0])
                at += _FLAG.size
            if kind in (ENQUEUE, FRONT, RELEASE):
                (size,) = _LENGTH.unpack_from(view, at)
                at += _LENGTH.size
                if size != UNCHANGED:
                    if at + size > len(view):
                        raise BatchError("replication event longer than its batch")
                    payload = view[at:at + size]
                    at += size
                elif kind != RELEASE:
                    raise BatchError("an enqueue without bytes")
            events.append(Event(kind, value, payload, acquired))
    except struct.error as exc:
        raise BatchError(f"truncated replication batch: {exc}") from None
    if at != len(view):
        raise BatchError("bytes after the last replication event")
    return Batch(epoch, number, events)
