"""Reading proton's event collector with the low-level calls.

proton's ``Event`` wrapper builds wrappers for the delivery, link, session,
connection and transport of every event, which costs more than the work most
events need. ``EventPump`` reads the collector through ``cproton`` and hands
the handler the event type (an int, ``PN_*``) and the raw event; handlers wrap
only what they use (``transient(Link, pn_event_link(event))``) and key their
own tables by the raw pointers (cffi pointers hash and compare by address).

Wrappers: ``proton.Link.wrap`` and friends store the wrapper's Python
attributes as a dict in proton's record of the C object, kept (with a cffi
handle in ``cproton.retained_objects``) for the object's whole life: about
300 bytes per object, for every link and connection of 10,000 idle clients.
``transient(cls, ptr)`` gives the same wrapper class with its attributes in
the wrapper only; they go with it. Our code keeps raw pointers and makes a
transient wrapper for the rare operations that want proton's Python API.

Freeing (a proton rule, not an AMQP one): a link or session stays in its
connection until ``pn_link_free`` / ``pn_session_free``, even after both ends
closed it. Handlers free them once both ends have closed, so long-lived
connections (upstream pools, clients attaching and detaching links) do not
keep every link they ever had.

A pump never runs re-entrantly: an event handler that causes more events on
the same connection (closing it, say) leaves them for the running loop.

The C fast path (``proxy/amqp/_fastpath.c``, an optional extension): every call
into proton through cffi costs about 0.2 µs (argument conversion, the GIL let go
and taken back). The pumps' loop, ``relay_transfer``'s common case and the
accepted-and-settled pair are made in C when the module is built, each a single
call from Python; the Python code here does the same otherwise (and with
``FEDGATE_NO_FASTPATH`` set, for comparison).
"""

from __future__ import annotations

from typing import Protocol

from cproton import (  # noqa: F401  (re-exported for handlers)
    PN_CONNECTION_REMOTE_CLOSE,
    PN_CONNECTION_REMOTE_OPEN,
    PN_DELIVERY,
    PN_EOS,
    PN_LINK_FLOW,
    PN_LINK_REMOTE_CLOSE,
    PN_LINK_REMOTE_DETACH,
    PN_LINK_REMOTE_OPEN,
    PN_SESSION_REMOTE_CLOSE,
    PN_SESSION_REMOTE_OPEN,
    PN_TRANSPORT_CLOSED,
    PN_TRANSPORT_ERROR,
)
from cproton import ffi as _ffi
from cproton import lib as _lib
from cproton import (
    pn_collector_peek,
    pn_collector_pop,
    pn_event_delivery,
    pn_event_link,
    pn_event_session,
    pn_event_type,
    pn_incref,
)
from proton import Link

from proxy.amqp import fastpath
from proxy.amqp.fastpath import RELAY_IN_PYTHON, fastpath_off  # noqa: F401
from proxy.amqp.partials import (  # noqa: F401  (incomplete transfers; hold is re-exported)
    _partial_sizes,
    forget_link,
    frame_watches,
    hold,
    late_links,
    late_refused as _late_refused,
    partial_transfers,
    updated as _updated,
    watch_partial as _watch_partial,
)

# the hot byte paths call proton's C functions directly: cproton's Python
# wrappers copy every buffer once more and check for errors we test ourselves
_capacity = _lib.pn_transport_capacity
_push = _lib.pn_transport_push
_pending = _lib.pn_transport_pending
_peek = _lib.pn_transport_peek
_pop = _lib.pn_transport_pop
_from_buffer = _ffi.from_buffer
_new_delivery = _lib.pn_delivery
_link_send = _lib.pn_link_send
_link_recv = _lib.pn_link_recv
_link_advance = _lib.pn_link_advance
_event_connection = _lib.pn_event_connection
_event_delivery = _lib.pn_event_delivery
_delivery_link = _lib.pn_delivery_link


def transient(cls, impl):
    """A proton wrapper of class ``cls`` for ``impl`` whose Python attributes die with it.

    ``cls.wrap`` would keep them in proton's record of ``impl`` for its whole
    life (see the module note); this wrapper holds them itself. Attributes that
    proton copies into the C object on an operation (``condition`` on
    ``close()``) work as usual within one wrapper.
    """
    wrapper = cls.__new__(cls)
    pn_incref(impl)  # released by Wrapper.__del__, as for cls.wrap
    wrapper.__dict__["_impl"] = impl
    wrapper.__dict__["_attrs"] = {}
    wrapper._init()
    return wrapper


class ClientLinkEndpoint:
    """Base of our endpoints for client links: a held ``link_ptr``, a wrapper on demand.

    ``drain_requested``: on our sending links, the client's flow asked for a drain
    (§2.6.7) that the endpoint has not answered yet (``proxy.amqp.drain``); the
    client handler sets it from the flow event, the endpoint clears it when it answers.
    """

    __slots__ = ()
    drain_requested = False

    @property
    def link(self) -> Link:
        return transient(Link, self.link_ptr)

    def read_whole(self, delivery, max_size: int):
        """A small control message on our receiving link (a coordinator's, ``$cbs``): its bytes
        once complete; None while frames are still coming, or when it was refused (sent
        beyond credit, or over ``max_size``: the link is detached with the condition)."""
        handler = self.handler
        if beyond_credit(self.link_ptr):
            handler.refuse_beyond_credit(self.link)
            return None
        payload = read_transfer(self.link_ptr, delivery, max_size)
        if payload is False:
            handler.refuse_oversized(self.link)
            return None
        return payload


def session_bytes(connection) -> int:
    """Bytes of deliveries proton holds unwritten in the sessions of ``connection`` (a raw pointer)."""
    held = 0
    session = _lib.pn_session_head(connection, 0)
    while session:
        held += _lib.pn_session_outgoing_bytes(session)
        session = _lib.pn_session_next(session, 0)
    return held


def links_held(connection) -> int:
    """Links proton still keeps on ``connection`` (a raw pointer): attached, closing or unfreed."""
    count = 0
    link = _lib.pn_link_head(connection, 0)
    while link:
        count += 1
        link = _lib.pn_link_next(link, 0)
    return count


def send_message(link, tag: bytes, payload) -> object:
    """A new delivery on sender ``link`` carrying the encoded message ``payload``, complete."""
    delivery = _new_delivery(link, (len(tag), _from_buffer(tag)))
    _link_send(link, _from_buffer(payload), len(payload))
    _link_advance(link)
    return delivery


# Messages are read through one buffer: a complete delivery that fits is read with a
# single call, without asking proton first for its size or whether it was aborted
# (pn_link_recv answers PN_ABORTED itself). One event loop per process, and the
# bytes are copied out before anything else can use the buffer.
_READ_SIZE = 64 * 1024
_read_buffer = bytearray(_READ_SIZE)
_read_view = memoryview(_read_buffer)
_read_cbuffer = _from_buffer(_read_buffer)
_EOS = PN_EOS
_delivery_partial = _lib.pn_delivery_partial
_delivery_pending = _lib.pn_delivery_pending
_delivery_aborted = _lib.pn_delivery_aborted
_delivery_settle = _lib.pn_delivery_settle
_link_current = _lib.pn_link_current


_link_queued = _lib.pn_link_queued
_link_credit = _lib.pn_link_credit
link_session = _lib.pn_link_session  # the link holds its session: the pointer lives as long
session_outgoing_bytes = _lib.pn_session_outgoing_bytes  # sent into proton, not yet written out


def beyond_credit(link) -> bool:
    """Whether the sender on receiver ``link`` sent more transfers than it had credit for.

    proton counts a transfer as queued when it arrives and takes it off the
    credit when we advance past it; we only ever add credit. A sender that keeps
    within the credit it was given (§2.6.7) never has more queued than credit left.
    """
    return _link_queued(link) > _link_credit(link)


def read_transfer(link, delivery, max_size: int = 0):
    """The bytes of ``delivery``, the current delivery on receiver ``link``, once complete.

    Returns None while it is partial and for an aborted transfer (§2.6.14: it is
    discarded and settled), False if it is larger than ``max_size`` (0: no limit;
    the delivery stays current, for the caller to refuse). Advances past a
    delivery it returns. None too for a delivery that is not current: its event is
    the peer's disposition of a transfer read already, never a transfer (reading
    would take the current delivery's bytes as its own); a transactional
    connection hears of it (``proxy.amqp.partials.updated``).
    """
    if _link_current(link) != delivery:
        if frame_watches:
            _updated(link, delivery)
        return None
    if _delivery_partial(delivery):
        return _partial(link, delivery, max_size)
    if _partial_sizes:
        partial_transfers.done(link)
    if late_links and _late_refused(link, delivery):
        return None
    received = _link_recv(link, _read_cbuffer, _READ_SIZE)
    if 0 <= received < _READ_SIZE and not (max_size and received > max_size):
        _link_advance(link)
        return bytes(_read_view[:received])
    return _read_rest(link, delivery, received, max_size)


def _partial(link, delivery, max_size: int):
    """A delivery whose last frame has not come: False if it is already too large, else None."""
    if frame_watches and link not in late_links:
        _watch_partial(link, delivery)
    if max_size and _delivery_pending(delivery) > max_size:
        partial_transfers.done(link)
        return False
    memory = partial_transfers.memory
    if memory is None or not memory.limit:
        return None  # not counted: nothing to count against
    return None if partial_transfers.grew(link, delivery) else False


# the C fast path when it is built (proxy.amqp.fastpath), else None: the Python here does it all
_fastpath = fastpath.load(_partial_sizes, late_links)
fastpath_loaded = _fastpath is not None


def _read_rest(link, delivery, received: int, max_size: int):
    """``read_transfer`` after the first read into the buffer, for the uncommon cases."""
    if 0 <= received < _READ_SIZE:  # over max_size
        return False  # read, but not advanced: the caller refuses it
    if received == _EOS:  # complete and empty
        _link_advance(link)
        return b""
    if received < 0:
        if _delivery_aborted(delivery):
            _link_advance(link)  # before settling: settling the current one advances too
            _delivery_settle(delivery)
        return None
    # larger than the buffer: what was read, then the rest, into one of the whole size
    size = received + _delivery_pending(delivery)
    if max_size and size > max_size:
        return False
    whole = bytearray(size)
    whole[:received] = _read_view[:received]
    _link_recv(link, _from_buffer(whole) + received, size - received)
    _link_advance(link)
    return bytes(whole)


def relay_transfer(link, delivery, target, tag: int, max_size: int = 0):
    """Move the complete ``delivery`` on receiver ``link`` to sender ``target`` as a new delivery.

    The bytes go from proton to proton through the one read buffer: no Python
    object per message but the new delivery, which is returned; its tag is the
    decimal digits of ``tag``. Same answers as ``read_transfer`` otherwise: None
    (partial, aborted), False (over ``max_size``). ``fast_relay`` does the common
    case in C.
    """
    tag = str(tag).encode()
    if _link_current(link) != delivery:  # a disposition's event (read_transfer)
        if frame_watches:
            _updated(link, delivery)
        return None
    if _delivery_partial(delivery):
        return _partial(link, delivery, max_size)
    if _partial_sizes:
        partial_transfers.done(link)
    if late_links and _late_refused(link, delivery):
        return None
    received = _link_recv(link, _read_cbuffer, _READ_SIZE)
    if 0 <= received < _READ_SIZE and not (max_size and received > max_size):
        _link_advance(link)
        out = _new_delivery(target, (len(tag), _from_buffer(tag)))
        _link_send(target, _read_cbuffer, received)
        _link_advance(target)
        return out
    payload = _read_rest(link, delivery, received, max_size)
    if payload is None or payload is False:
        return payload
    return send_message(target, tag, payload)


# fast_relay(...): relay_transfer's arguments; the new delivery, or RELAY_IN_PYTHON (nothing
# read) when relay_transfer must do it: partial, aborted or large deliveries.
# fast_relay_kept(...): the same, answering (the message's bytes, the new delivery).
# settle_accepted(delivery, other): see fastpath.settle_accepted.
if _fastpath is not None:
    fast_relay, fast_relay_kept, settle_accepted = _fastpath.relay, _fastpath.relay_kept, _fastpath.settle_accepted
else:
    fast_relay, fast_relay_kept, settle_accepted = relay_transfer, fastpath.relay_kept, fastpath.settle_accepted


class EventHandler(Protocol):
    def on_event(self, event_type: int, event) -> None: ...


class EventPump:
    """Hands one connection's events to its handler.

    With ``links`` (link pointer -> owner, kept by the handler: an upstream pool
    member's), a delivery event of a known link goes straight to
    ``owner.on_upstream_delivery(delivery)``, as ``SharedEventPump`` does for
    client links: the event every message brings skips the handler's dispatch.
    """

    __slots__ = ("_collector", "_handler", "_running", "_links")

    def __init__(self, collector, handler: EventHandler, links: dict | None = None) -> None:
        self._collector = collector  # raw pn_collector_t
        self._handler = handler
        self._running = False
        self._links = links

    def run(self) -> None:
        if self._running:
            return
        self._running = True
        try:
            if _fastpath is not None:
                _fastpath.pump(self._collector, self._links, "on_upstream_delivery", None, self._handler)
                return
            collector = self._collector
            on_event = self._handler.on_event
            links = self._links
            while True:
                event = pn_collector_peek(collector)
                if not event:
                    break
                try:
                    # a delivery's event is the only one whose context is a delivery
                    # (proton's pn_work_update): asking for it saves asking for the type
                    delivery = _event_delivery(event)
                    if delivery:
                        owner = links.get(_delivery_link(delivery)) if links is not None else None
                        if owner is not None:
                            owner.on_upstream_delivery(delivery)
                            continue
                        on_event(PN_DELIVERY, event)
                    else:
                        on_event(pn_event_type(event), event)
                finally:  # a handler's exception must not leave the event to run again
                    pn_collector_pop(collector)
        finally:
            self._running = False


class SharedEventPump:
    """One collector for many connections; each event goes to its connection's handler.

    The client connections of a node share one. A collector keeps every event it
    has handed out in a pool for reuse (proton's event.c) and never gives the
    pool back: about 1 KB per connection after the handshake, and as many events
    as one read of a busy connection produced. Shared, the pool is the size of
    the largest burst on any one connection.

    Events reach the handler registered for ``pn_event_connection(event)``;
    events of a connection that has left (still queued when it went) are
    dropped. A delivery event whose link is in ``links`` (link pointer ->
    endpoint, kept by the handlers) goes straight to ``endpoint.on_delivery``:
    the one event every message brings needs no connection lookup. Like
    ``EventPump`` it never runs re-entrantly: events a handler causes, on any
    client connection, are left for the running loop.
    """

    __slots__ = ("_collector", "_handlers", "_running", "links")

    def __init__(self) -> None:
        self._collector = _lib.pn_collector()
        self._handlers: dict = {}  # raw pn_connection_t -> EventHandler
        self.links: dict = {}  # raw pn_link_t -> endpoint with on_delivery(delivery)
        self._running = False

    def __del__(self) -> None:
        _lib.pn_collector_free(self._collector)

    def add(self, connection, handler: EventHandler) -> None:
        self._handlers[connection] = handler
        _lib.pn_connection_collect(connection, self._collector)

    def remove(self, connection) -> None:
        """``connection`` posts no more events; those still queued are dropped."""
        _lib.pn_connection_collect(connection, _ffi.NULL)
        self._handlers.pop(connection, None)

    def run(self) -> None:
        if self._running:
            return
        self._running = True
        try:
            if _fastpath is not None:
                _fastpath.pump(self._collector, self.links, "on_delivery", self._handlers, None)
                return
            collector = self._collector
            handlers = self._handlers
            links = self.links
            while True:
                event = pn_collector_peek(collector)
                if not event:
                    break
                try:
                    delivery = _event_delivery(event)  # as in EventPump.run
                    if delivery:
                        endpoint = links.get(_delivery_link(delivery))
                        if endpoint is not None:
                            endpoint.on_delivery(delivery)
                            continue
                        event_type = PN_DELIVERY
                    else:
                        event_type = pn_event_type(event)
                    handler = handlers.get(_event_connection(event))
                    if handler is not None:
                        handler.on_event(event_type, event)
                finally:  # a handler's exception must not leave the event to run again
                    pn_collector_pop(collector)
        finally:
            self._running = False


class ProtonPipe:
    """A proton transport + connection + collector, fed with bytes (sans-I/O).

    Used for both ends: the AMQP phase of a client connection and the node's
    own connections to primaries. ``push`` respects proton's input capacity
    (processing events to make room), ``output`` drains what proton wrote.
    Takes raw pointers and owns the collector, or with ``shared`` registers the
    connection with that ``SharedEventPump`` instead; with ``owned`` it also holds
    the caller's reference to the transport and connection and releases them
    with itself (a client connection keeps no wrapper at all), otherwise the
    caller keeps them alive (the upstream side holds proton wrappers).
    """

    __slots__ = ("_transport", "_connection", "_collector", "pump")

    def __init__(self, transport, connection, handler: EventHandler, *, owned: bool = False,
                 shared: SharedEventPump | None = None, links: dict | None = None) -> None:
        if shared is not None:
            if not owned:
                raise ValueError("a pipe on a shared pump must own its connection")
            collector = None
            shared.add(connection, handler)
            self.pump = shared
        else:
            collector = _lib.pn_collector()
            _lib.pn_connection_collect(connection, collector)
            self.pump = EventPump(collector, handler, links)
        _lib.pn_transport_bind(transport, connection)
        self._transport = transport
        self._connection = connection if owned else None
        self._collector = collector

    def __del__(self) -> None:
        if self._collector is not None:
            _lib.pn_collector_free(self._collector)
        else:
            self.pump.remove(self._connection)
        if self._connection is not None:
            _lib.pn_decref(self._transport)
            _lib.pn_decref(self._connection)

    def release(self) -> None:
        """The socket is gone: leave the shared pump now, not when this pipe is collected.

        The shared pump's table holds the handler, which holds (through its
        output) the protocol, which holds this pipe: left there, a closed
        connection stayed reachable for the node's whole life (about 27 KB each).
        """
        if self._collector is None:
            self.pump.remove(self._connection)

    def push(self, data: bytes) -> bool:
        """Feed bytes to proton; False if proton cannot take them (input closed or stuck)."""
        transport = self._transport
        view = memoryview(data)
        while view:
            capacity = _capacity(transport)
            if capacity < 0:  # tail closed: proton reads no more
                return False
            if capacity == 0:
                self.pump.run()  # let proton process, then retry
                capacity = _capacity(transport)
                if capacity <= 0:
                    return False
            chunk, view = view[:capacity], view[capacity:]
            if _push(transport, _from_buffer(chunk), len(chunk)) < 0:
                return False  # proton's transport error: its condition tells the peer
            self.pump.run()
        return True

    def output(self) -> bytes:
        """Everything proton has to write now.

        proton hands out at most its output buffer's size at a time (8 KiB at
        first): a frame larger than that comes out over several rounds, and
        stopping after one would leave the rest of a large message in proton
        until something else happened on the connection.
        """
        transport = self._transport
        pending = _pending(transport)
        if pending <= 0:
            return b""
        out = bytearray(pending)
        _peek(transport, _from_buffer(out), pending)
        _pop(transport, pending)
        while (pending := _pending(transport)) > 0:
            chunk = bytearray(pending)
            _peek(transport, _from_buffer(chunk), pending)
            _pop(transport, pending)
            out += chunk
        return out

    @property
    def finished(self) -> bool:
        """Proton has written everything it ever will (its head is closed)."""
        return _pending(self._transport) < 0

    def tick(self, now: float) -> float | None:
        """proton's timers (§2.4.5); the next deadline in the same clock, or None."""
        deadline = _lib.pn_transport_tick(self._transport, int(now * 1000))
        self.pump.run()
        return deadline / 1000.0 if deadline else None

    def close_input(self) -> None:
        _lib.pn_transport_close_tail(self._transport)
        self.pump.run()
