"""A new client connection's first attach, read before proton does (worker placement).

How this works
--------------
With worker processes (``proxy.workers``) a local queue has one owner worker;
a link attached on another worker is forwarded to it, which costs a message
one more AMQP hop inside the node (issue #36: 1.7x the CPU of one process).
The supervisor cannot know where a connection belongs when it accepts it, but
most clients (proton's Container, rhea, the C clients) send ``open``,
``begin`` and their first ``attach`` in one go once SASL is done. So a worker
holds the first frames of a new connection back from proton, and when they
hold an attach to a local queue another worker owns, it hands the socket on
(through the supervisor, ``SCM_RIGHTS``) together with the frames it read and
the identity SASL established: the owner serves the connection from its first
frame, and that client's messages cross nothing.

Nothing is written to the client meanwhile except our AMQP header (§2.2: it
answers the client's header on receipt), so the new worker's proton starts
from the same point: it is given the header again and its own header answer
is dropped.

A client that waits for our ``open`` (and ``begin``) before it attaches, as
go-amqp and Qpid JMS do, sends open and begin frames that end on a frame
boundary (``PASS``): they go to proton, which answers them, and the worker
keeps both what the client sent and what it answered. At the first attach the
new worker is given the client's frames from its ``open`` on and the bytes
already answered: its proton reads the same frames, answers them the same way
(same settings in every worker), and the answers the client already has are
dropped from its output (checked byte for byte).

A connection is served where it is, with the frames passed to proton at once,
when a frame other than open or begin comes before the first attach (an empty
frame too), when more than ``MAX_HELD`` bytes would be held or answered, or
when the attach has no address (a dynamic node, the anonymous relay) or names
anything but a local queue another worker owns or a fragmented queue. This
module is the pure part: reading the frames (§2.3.1 frame layout).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from proton import Data, DataException

REPLICATION = "fedgate:replication"  # proxy.replication.links' target capability (a backup copy)
MAX_HELD = 16 * 1024  # bytes of a new connection's first frames held back at most

OPEN, BEGIN, ATTACH = 0x10, 0x11, 0x12  # performative descriptors (§2.7)


@dataclass(frozen=True, slots=True)
class Sniffed:
    """What the held frames say. ``state``: ``wait`` (a frame is incomplete: hold on),
    ``pass`` (open and begin frames only, all complete: let proton answer them and read
    on), ``serve`` (serve the connection where it is) or ``attach`` (its first attach,
    to ``address``; ``receiver`` when the client receives from it)."""

    state: str
    address: str = ""
    receiver: bool = False
    replication: bool = False  # its target has the capability fedgate:replication (a backup's copy)


WAIT = Sniffed("wait")
PASS = Sniffed("pass")
SERVE = Sniffed("serve")


def _descriptor(body: bytes) -> int | None:
    """The numeric descriptor of a performative body, or None."""
    if len(body) >= 3 and body[0] == 0x00 and body[1] == 0x53:  # smallulong
        return body[2]
    if len(body) >= 10 and body[0] == 0x00 and body[1] == 0x80:  # ulong
        return struct.unpack_from(">Q", body, 2)[0]
    return None


def _attach_address(body: bytes) -> Sniffed:
    data = Data()
    try:
        data.decode(body)
        described = data.get_object()
        fields = list(described.value)
    except (DataException, AttributeError, TypeError, ValueError, KeyError):
        return SERVE  # proton will answer whatever is wrong with it
    receiver = len(fields) > 2 and fields[2] is True  # role: the client receives
    terminus = fields[5 if receiver else 6] if len(fields) > 6 else None
    try:
        address = terminus.value[0] if terminus is not None else None
    except (AttributeError, IndexError, TypeError):
        return SERVE
    if not isinstance(address, str) or not address:
        return SERVE
    return Sniffed("attach", address, receiver, not receiver and _replication(terminus))


def _replication(target) -> bool:
    """Whether a target's capabilities (its 7th field: a symbol or an array of them) name
    ``fedgate:replication``: a primary's link to this node's backup copy."""
    try:
        capabilities = target.value[6] if len(target.value) > 6 else None
    except (AttributeError, TypeError):
        return False
    items = getattr(capabilities, "elements", None)  # proton's Array
    if items is None:
        items = capabilities if isinstance(capabilities, (list, tuple)) else (capabilities,)
    return any(str(item) == REPLICATION for item in items if item is not None)


def sniff(frames: bytes) -> Sniffed:
    """Read the frames after the AMQP header: is the first attach among them yet?"""
    if len(frames) > MAX_HELD:
        return SERVE
    position = 0
    while True:
        if len(frames) - position < 8:
            return WAIT if position < len(frames) else PASS
        size, doff, frame_type = struct.unpack_from(">IBB", frames, position)
        if size < 8 or doff < 2 or doff * 4 > size or frame_type != 0:
            return SERVE  # not an AMQP frame we read: proton answers it
        if len(frames) - position < size:
            return WAIT
        body = frames[position + doff * 4:position + size]
        if not body:  # an empty frame (a heartbeat) before the attach: nothing to read here
            return SERVE
        descriptor = _descriptor(body)
        if descriptor == ATTACH:
            return _attach_address(body)
        if descriptor not in (OPEN, BEGIN):
            return SERVE
        position += size


def only_open_and_begin(frames: bytes) -> bool:
    """Whether ``frames`` (what we answered) are complete open and begin frames only."""
    return sniff(frames) is PASS
