"""A transactional-state that comes on a later frame of a transfer (issue #41).

§2.7.5: a transfer's ``state`` "is the state of the delivery ... at the point the
frame was sent", as if a disposition came just before that frame. A sender may
so set ``transactional-state`` on the second or a later frame of a multi-frame
transfer whose first frame had none: proton's engine reads a transfer's state
from its first frame only and drops the rest, so the node would take the
message outside the transaction and answer its commit as if it held it.

A connection with a coordinator registers a ``LateStateWatch`` with the engine
(``proxy.amqp.engine.frame_watches``). When a delivery on it is incomplete and
its first frame had no state, the watch turns on proton's frame trace for the
connection until no such delivery is in progress (large messages only; the
common path pays nothing). Each incoming transfer frame traced is read for a
``transactional-state``: one on a frame that continues a delivery which began
before the trace (its first frame was not seen) belongs to that delivery,
found by its delivery-tag, or, with no tag, when only one such delivery is in
progress. When that delivery is complete the engine offers it back
(``complete``): it is rejected with ``amqp:not-allowed`` (never taken), and its
transaction can only roll back, its commit refused with the reason. A state
that cannot be tied to one delivery fails its transaction all the same: a
commit is never answered for work the node did not take in it.

The same for a ``transactional-state`` that a disposition gives a transfer the
node read without one and has not settled yet (a durable or replicated queue's,
a primary's outcome awaited): the engine tells the watch (``updated``), and the
transaction can only roll back. (One the node settled already is gone: proton
drops a disposition for a settled delivery, and the client was answered with a
plain ``accepted``, not ``transactional-state``.)
"""

from __future__ import annotations

import logging
import re

from cproton import ffi as _ffi
from cproton import lib as _lib
from cproton import (
    PN_TRACE_FRM,
    PN_TRACE_OFF,
    pn_delivery_remote_state,
    pn_delivery_settle,
    pn_link_advance,
    pn_transport_trace,
)
from proton import Transport

from proxy.amqp import engine
from proxy.transactions.wire import TRANSACTIONAL_STATE, reject

log = logging.getLogger("fedgate.transactions")

NOT_ALLOWED = "amqp:not-allowed"
_TRANSFER = re.compile(r"^FRAME: (\d+) <- @transfer\(20\) \[")
_HANDLE = re.compile(r"\bhandle=(0x[0-9a-f]+)")
_TAG = re.compile(r'\bdelivery-tag=b"((?:[^"\\]|\\.)*)"')
_TXN = re.compile(r'@transactional-state\(52\) \[txn-id=b"((?:[^"\\]|\\.)*)"')
_MORE = ", more=true"
REASON = ("its transactional-state came on a later frame of the transfer, not its first: this node "
          "takes a transfer into a transaction by the state on its first frame (§4.4.1)")


def _printed(tag: bytes) -> str:
    """``tag`` as proton's frame trace prints a binary (printable ASCII as is, else \\xNN)."""
    return "".join(chr(b) if 32 <= b < 127 and b not in (34, 92) else f"\\x{b:02x}" for b in tag)


def _unprinted(text: str) -> bytes:
    return text.encode("latin-1").decode("unicode_escape").encode("latin-1")


class LateStateWatch:
    """One transactional connection's watch over the later frames of its transfers."""

    def __init__(self, table, transport_ptr, connection_ptr) -> None:
        self.table = table
        self.transport_ptr = transport_ptr
        self.connection_ptr = connection_ptr
        self.watched: dict = {}  # link (held) -> [printed tag, txn-id found or None]
        self.ended: set = set()  # (channel, handle) whose delivery ended while tracing
        self.tracing = False
        engine.frame_watches[connection_ptr] = self

    # -- the engine's calls ---------------------------------------------------------------------
    def partial(self, link, delivery) -> bool:
        """An incomplete delivery on this connection: watched if its first frame had no state."""
        if pn_delivery_remote_state(delivery):
            return False
        tag = _lib.pn_delivery_tag(delivery)  # binary: read as bytes (PROTON-2531)
        self.watched[engine.hold(link)] = [_printed(_ffi.buffer(tag.start, tag.size)[:]), None]
        if not self.tracing:
            self.tracing = True
            self.ended.clear()
            Transport.wrap(self.transport_ptr).tracer = self._frame
            pn_transport_trace(self.transport_ptr, PN_TRACE_FRM)
        return True

    def complete(self, link, delivery) -> bool:
        """The watched delivery on ``link`` is complete: True if it was refused here."""
        entry = self.watched.pop(link, None)
        self._maybe_stop()
        if entry is None or entry[1] is None:
            return False
        txn_id = entry[1]
        self.table.late_state(txn_id, REASON)
        reject(delivery, NOT_ALLOWED, f"transaction {txn_id!r}: {REASON}", settle=False)
        pn_link_advance(link)  # its bytes are dropped
        pn_delivery_settle(delivery)
        self.table.handler.mark_dirty()
        return True

    def updated(self, delivery) -> None:
        """The client changed the state of a transfer the node has read and not yet settled:
        a ``transactional-state`` now, for one not posted in a transaction, is too late."""
        if pn_delivery_remote_state(delivery) == TRANSACTIONAL_STATE and delivery not in self.table.posted:
            self.table.state_after_transfer(delivery)

    def forget(self, link) -> None:
        self.watched.pop(link, None)
        self._maybe_stop()

    def close(self) -> None:
        for link in list(self.watched):
            engine.late_links.pop(link, None)
        self.watched.clear()
        self._maybe_stop()
        engine.frame_watches.pop(self.connection_ptr, None)

    # -- the trace --------------------------------------------------------------------------------
    def _maybe_stop(self) -> None:
        if self.tracing and not self.watched:
            self.tracing = False
            pn_transport_trace(self.transport_ptr, PN_TRACE_OFF)

    def _frame(self, transport, line: str) -> None:
        match = _TRANSFER.match(line)
        if match is None:
            return
        head = line.split("] (", 1)[0]  # the performative, not the payload's dump
        handle = _HANDLE.search(head)
        key = (match.group(1), handle.group(1) if handle else None)
        continues = key not in self.ended  # its delivery began before the trace did
        if _MORE not in head:
            self.ended.add(key)
        state = _TXN.search(head) if continues else None
        if state is None:
            return
        txn_id = _unprinted(state.group(1))
        tag = _TAG.search(head)
        if tag is not None:
            entries = [e for e in self.watched.values() if e[0] == tag.group(1)]
        else:
            entries = list(self.watched.values())
        if len(entries) == 1:
            entries[0][1] = txn_id
        else:  # not tied to one delivery: its transaction cannot commit all the same
            self.table.late_state(txn_id, REASON)
