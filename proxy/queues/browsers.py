"""Browsing a local queue: a receiver whose source asks for distribution-mode ``copy``.

How this works
--------------
AMQP 1.0 §3.5.3 (``distribution-mode``): with ``copy`` the node sends copies
and the messages stay where they are; with ``move`` (the default) they are
taken. Qpid JMS's ``QueueBrowser`` and proton's ``Copy()`` option ask for
``copy``. A ``QueueBrowser`` endpoint is attached in place of a consumer:

* ``LocalQueue.browse(after, n)`` gives the next waiting messages after the
  last one this browser was sent (``after``, a ``StoredMessage.seq``), so each
  message reaches a browser once, in queue order, including those enqueued
  after it attached. Messages out with a consumer are not in the queue and are
  not shown; consumers are served first (the broker serves browsers after
  ``dispatch``).
* Copies go out with the link's credit like any delivery (§2.6.7). A browser
  in drain mode is answered once it has nothing more to see, which is how a
  JMS browser learns the enumeration ended.
* The client's outcome for a copy changes nothing in the queue: an unsettled
  copy is settled when the client settles or gives an outcome.
"""

from __future__ import annotations

import itertools

from cproton import (
    pn_delivery_settle,
    pn_link_credit,
)

from proxy.amqp import engine
from proxy.amqp.drain import answer_drain
from proxy.amqp.outcomes import outcome_of
from proxy.queues.local import LocalQueue


class QueueBrowser(engine.ClientLinkEndpoint):
    """Local queue -> client, as copies. Our side is a proton Sender."""

    __slots__ = ("handler", "link_ptr", "session_ptr", "queue", "presettled", "after", "tags", "address",
                 "sent", "drain_requested", "selector")

    def __init__(self, handler, link, queue: LocalQueue, *, presettled: bool) -> None:
        self.handler = handler
        self.link_ptr = engine.hold(link._impl)
        self.session_ptr = engine.link_session(self.link_ptr)
        self.selector = None  # a JMS selector (proxy.selectors): only what it selects is shown
        self.queue = queue
        self.presettled = presettled
        self.after = 0  # seq of the last message sent; 0 before the first
        self.tags = itertools.count(1)
        self.address = queue.name
        self.sent = 0
        self.drain_requested = False  # as QueueConsumer's

    @property
    def credit(self) -> int:
        if not self.handler.can_send(self):
            return 0
        return pn_link_credit(self.link_ptr)

    def serve(self) -> None:
        """Send what there is to see, as far as credit goes; answer a drain when done."""
        ptr = self.link_ptr
        if not self.handler.can_send(self):
            return  # output blocked: served again when it has room
        credit = pn_link_credit(ptr)
        if credit <= 0:
            if self.drain_requested:  # a drain at credit 0, or all credit used: answered
                self.drain_requested = False
                answer_drain(ptr)
                self.handler.mark_dirty()
            return
        batch = self.queue.browse(self.after, credit, self.selector)
        for message in batch:
            delivery = engine.send_message(ptr, str(next(self.tags)).encode(), self.queue.body(message))
            if self.presettled:
                pn_delivery_settle(delivery)
            self.after = max(self.after, message.seq)
        self.sent += len(batch)
        if self.drain_requested:  # §2.6.7: nothing more to see for now, or all credit used
            self.drain_requested = False
            answer_drain(ptr)
            self.handler.mark_dirty()
        elif batch:
            self.handler.mark_dirty()

    def on_delivery(self, delivery) -> None:
        # an outcome or a settlement for a copy: the queue keeps its message
        if outcome_of(delivery) is not None:
            pn_delivery_settle(delivery)

    def on_flow(self) -> None:
        self.handler.broker.dirty_queues.add(self.queue)

    def detached(self) -> None:
        if self in self.queue.browsers:
            self.queue.browsers.remove(self)
