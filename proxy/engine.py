"""Reading proton's event collector with the low-level calls.

proton's ``Event`` wrapper builds wrappers for the delivery, link, session,
connection and transport of every event, which costs more than the work most
events need. ``EventPump`` reads the collector through ``cproton`` and hands
the handler the event type (an int, ``PN_*``) and the raw event; handlers wrap
only what they use (``proton.Link.wrap(pn_event_link(event))``) and key their
own tables by the raw pointers (cffi pointers hash and compare by address).

A pump never runs re-entrantly: an event handler that causes more events on
the same connection (closing it, say) leaves them for the running loop.
"""

from __future__ import annotations

from typing import Protocol

from cproton import (  # noqa: F401  (re-exported for handlers)
    PN_CONNECTION_REMOTE_CLOSE,
    PN_CONNECTION_REMOTE_OPEN,
    PN_DELIVERY,
    PN_LINK_FLOW,
    PN_LINK_REMOTE_CLOSE,
    PN_LINK_REMOTE_DETACH,
    PN_LINK_REMOTE_OPEN,
    PN_SESSION_REMOTE_CLOSE,
    PN_SESSION_REMOTE_OPEN,
    PN_TRANSPORT_CLOSED,
    PN_TRANSPORT_ERROR,
    pn_collector_peek,
    pn_collector_pop,
    pn_event_delivery,
    pn_event_link,
    pn_event_session,
    pn_event_type,
)


class EventHandler(Protocol):
    def on_event(self, event_type: int, event) -> None: ...


class EventPump:
    __slots__ = ("_collector", "_handler", "_running")

    def __init__(self, collector, handler: EventHandler) -> None:
        self._collector = collector._impl
        self._handler = handler
        self._running = False

    def run(self) -> None:
        if self._running:
            return
        self._running = True
        try:
            collector = self._collector
            on_event = self._handler.on_event
            while True:
                event = pn_collector_peek(collector)
                if not event:
                    break
                try:
                    on_event(pn_event_type(event), event)
                finally:  # a handler's exception must not leave the event to run again
                    pn_collector_pop(collector)
        finally:
            self._running = False


class ProtonPipe:
    """A proton Transport + Connection + Collector, fed with bytes (sans-I/O).

    Used for both ends: the AMQP phase of a client connection and the node's
    own connections to primaries. ``push`` respects proton's input capacity
    (processing events to make room), ``output`` drains what proton wrote.
    """

    __slots__ = ("transport", "connection", "collector", "pump")

    def __init__(self, transport, connection, handler: EventHandler) -> None:
        from proton import Collector

        self.transport = transport
        self.connection = connection
        self.collector = Collector()
        connection.collect(self.collector)
        transport.bind(connection)
        self.pump = EventPump(self.collector, handler)

    def push(self, data: bytes) -> bool:
        """Feed bytes to proton; False if proton cannot take them (input closed or stuck)."""
        transport = self.transport
        while data:
            capacity = transport.capacity()
            if capacity < 0:  # tail closed: proton reads no more
                return False
            if capacity == 0:
                self.pump.run()  # let proton process, then retry
                capacity = transport.capacity()
                if capacity <= 0:
                    return False
            chunk, data = data[:capacity], data[capacity:]
            transport.push(chunk)
            self.pump.run()
        return True

    def output(self) -> bytes:
        transport = self.transport
        pending = transport.pending()
        if pending <= 0:
            return b""
        chunk = transport.peek(pending)
        transport.pop(pending)
        return bytes(chunk)

    @property
    def finished(self) -> bool:
        """Proton has written everything it ever will (its head is closed)."""
        return self.transport.pending() < 0

    def tick(self, now: float) -> float | None:
        deadline = self.transport.tick(now)
        self.pump.run()
        return deadline or None

    def close_input(self) -> None:
        self.transport.close_tail()
        self.pump.run()
