"""Incomplete (multi-frame) transfers on the process's links: their bytes, and later frames.

``PartialTransfers`` counts the bytes of transfers whose last frame has not
come against the node's memory (issue #21). ``frame_watches`` and
``late_links`` let a transactional connection hear of an incomplete transfer,
its end, and a disposition of a transfer read already (``proxy.transactions.late_state``, issue #41). ``proxy.amqp.engine``
reads deliveries and calls these; they sit here to keep the engine's module to
its size.
"""

from __future__ import annotations

from cproton import ffi as _ffi
from cproton import lib as _lib
from cproton import pn_incref

_delivery_pending = _lib.pn_delivery_pending
_delivery_partial = _lib.pn_delivery_partial


def hold(ptr):
    """Our reference to proton object ``ptr``: keeps it allocated while we hold it.

    Same pointer (hashes and compares equal to the raw one, so tables keyed by
    event pointers find it), no wrapper and no Python state in proton's record.
    (Re-exported by ``proxy.amqp.engine``, where the rest of the code takes it.)
    """
    pn_incref(ptr)
    return _ffi.gc(ptr, _lib.pn_decref)


class PartialTransfers:
    """Bytes of multi-frame transfers not complete yet, over every link of the process (#21).

    A sender may spread a message over many transfer frames (§2.6.14); proton
    keeps what came until the last one, up to max_message_size per link. Their
    sum counts with what the queues hold against ``memory`` (the node's
    ``MemoryUse``: ``[limits] max_memory``); a transfer that would pass it is
    refused as too large. A link has at most one incomplete delivery (the next
    starts after its last frame), so sizes are kept per link (held while
    listed). Client links leave the list when they close (``forget``); others
    (a primary's) when the sum is checked over the limit, if their link or
    connection has ended.
    """

    def __init__(self) -> None:
        self.sizes: dict = _partial_sizes
        self.total = 0
        self.memory = None  # set by the node: proxy.queues.memory.MemoryUse

    def grew(self, link, delivery) -> bool:
        """``delivery`` on ``link`` got more bytes: False if the node has no room for them."""
        size = _delivery_pending(delivery)
        sizes = self.sizes
        old = sizes.get(link)
        if old is None:
            sizes[hold(link)] = size  # the key holds the link while it is listed
            old = 0
        else:
            sizes[link] = size  # an existing key stays (the held one)
        self.total += size - old
        memory = self.memory
        if self.total + memory.resident <= memory.ceiling:
            return True
        self._recount()
        if self.total + memory.resident <= memory.ceiling:
            return True
        self.done(link)
        return False

    def done(self, link) -> None:
        self.total -= self.sizes.pop(link, 0)

    forget = done  # a link that closed

    def _recount(self) -> None:
        ended = _lib.PN_LOCAL_CLOSED | _lib.PN_REMOTE_CLOSED
        for link in list(self.sizes):
            connection = _lib.pn_session_connection(_lib.pn_link_session(link))
            if _lib.pn_link_state(link) & ended or _lib.pn_connection_transport(connection) == _ffi.NULL:
                self.done(link)
                continue
            current = _lib.pn_link_current(link)
            if current == _ffi.NULL or not _delivery_partial(current):
                self.done(link)


_partial_sizes: dict = {}  # link (held) -> bytes of its incomplete delivery
partial_transfers = PartialTransfers()

# Later frames of a transfer (proxy.transactions.late_state): a connection with a coordinator
# registers a watch (raw connection -> watch, ``frame_watches``); a delivery that is partial
# there is offered to it (``watch.partial(link, delivery)``: True to hear of its end), and its
# link is listed in ``late_links`` until it is complete, when ``watch.complete(link, delivery)``
# may refuse it (True: settled and passed, the reader gets None).
frame_watches: dict = {}
late_links: dict = {}  # link (held) -> watch


def watch_partial(link, delivery) -> None:
    watch = frame_watches.get(_lib.pn_session_connection(_lib.pn_link_session(link)))
    if watch is not None and watch.partial(link, delivery):
        late_links[hold(link)] = watch


def updated(link, delivery) -> None:
    """A disposition of a transfer read already, on a connection with a watch: it is told."""
    watch = frame_watches.get(_lib.pn_session_connection(_lib.pn_link_session(link)))
    if watch is not None:
        watch.updated(delivery)


def late_refused(link, delivery) -> bool:
    watch = late_links.pop(link, None)
    return watch is not None and watch.complete(link, delivery)


def forget_link(link) -> None:
    """A client link closed: what the engine kept for its incomplete delivery goes."""
    if _partial_sizes:
        partial_transfers.forget(link)
    if late_links:
        watch = late_links.pop(link, None)
        if watch is not None:
            watch.forget(link)
