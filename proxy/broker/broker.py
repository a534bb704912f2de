"""The embedded broker: AMQP events of client connections -> local queues.

How this works
--------------
``Broker`` is node-wide: the queue registry, the routing table, and two
"needs attention" sets. ``ClientHandler`` (``proxy.broker.handler``) is one
per client connection; its links' endpoints on local queues are
``proxy.queues.endpoints``.

Work caused by one connection's input often lands on another connection
(a producer's message goes out to a consumer). Such queues and connections are
marked dirty; ``Broker.run_pending`` dispatches the queues and flushes the
connections once per input chunk, so many transfers share one write.

Proton objects are reached through raw pointers on the hot path (see
``proxy.amqp.engine``); tables are keyed by those pointers, never by attributes
hung on proton objects.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import time
from typing import TYPE_CHECKING, Callable

from cproton import PN_ACCEPTED, pn_link_credit
from proton import timestamp

from proxy.amqp import engine, message_header
from proxy.amqp.drain import answer_drain
from proxy.exchanges.exchange import Exchanges
from proxy.metrics import Histogram
from proxy.net.network import TcpNetwork
from proxy.queues import durable as journal_queues
from proxy.queues import schedule
from proxy.queues.endpoints import DEAD_LETTER_COPY
from proxy.queues.local import DROP_HEAD, LocalQueue, StoredMessage
from proxy.queues.registry import QueueRegistry
from proxy.transactions.manager import Transactions
from proxy.upstream.pool import UpstreamRegistry

if TYPE_CHECKING:
    from proxy.broker.handler import ClientHandler

log = logging.getLogger("fedgate.broker")


class Broker:
    """Node-wide broker state shared by all client connections."""

    def __init__(
        self,
        *,
        node_id: str,
        queues: QueueRegistry,
        resolve: Callable,
        credit_window: int = 1000,
        producer_window_growth: int = 1,
        producer_window_bytes: int = 0,
        max_message_size: int = 0,
        max_output_buffer: int = 256 * 1024,
        max_temporary_queues: int = 0,
        authorize: Callable | None = None,
        journal=None,
        exchange_config=None,
        queue_options: Callable[[str], dict] | None = None,
        relay_limit: int = 0,
        network=None,
        max_transactions: int = 64,
        transaction_timeout: float = 60.0,
    ) -> None:
        """``exchange_config``: what has ``exchanges`` and ``bindings`` (the node's Config);
        ``queue_options(name)``: a declared queue's options; ``relay_limit``: upstream
        senders the anonymous relay may open (0: no limit); ``network``: where upstream
        connections go (``proxy.net.network``; default: TCP); ``max_transactions`` (per
        connection) and ``transaction_timeout``: ``[limits]`` (``proxy.transactions``)."""
        self.node_id = node_id
        self.journal = journal  # proxy.journal.journal.Journal for durable queues, or None
        self.queues = queues
        self.resolve = resolve
        self.credit_window = credit_window
        # a proxied sender's window: grown up to this many times credit_window, and above
        # credit_window to at most this many bytes (proxy.links.proxy_producer)
        self.producer_window_growth = producer_window_growth
        self.producer_window_bytes = producer_window_bytes
        self.max_message_size = max_message_size
        self.max_output_buffer = max_output_buffer or 1 << 62  # per session (ClientHandler.can_send)
        self.max_temporary_queues = max_temporary_queues  # per connection; 0 = no limit
        self.authorize = authorize or (lambda identity, address, direction: True)
        self.dirty_queues: set[LocalQueue] = set()
        self.dirty_handlers: set[ClientHandler] = set()
        # [limits] max_memory: queues that withheld credit get their producers topped up
        queues.memory.on_room = self.dirty_queues.update
        self.handlers: dict[int, ClientHandler] = {}
        self.consumer_ids = itertools.count(1)
        self.connection_ids = itertools.count(1)
        # the proton events of every client connection (engine.SharedEventPump)
        self.client_events = engine.SharedEventPump()
        self.temp_prefix = f"tmp.{node_id}."
        # address kinds served by packages above the node (fragments):
        # kind -> object with attach(client_handler, link, decision)
        self.kind_handlers: dict[str, object] = {}
        # address -> a reason to refuse it as a local queue, or None (names a package above
        # reserves: proxy.replication's adopted fragments, "<address>@<member>")
        self.address_checks: list = []
        # seconds from enqueue to accepted settlement (read by the admin API)
        self.delivery_latency = Histogram()
        # the broker's own parts, built here with what they need: connections to the
        # primaries (their links mark our handlers dirty and run our cycle) and exchanges
        self.upstreams = UpstreamRegistry(node_id=node_id, dirty=self.dirty_handlers,
                                          run_pending=self.run_pending,
                                          network=network or TcpNetwork())
        self.exchanges = Exchanges(exchange_config, self, self.upstreams,
                                   queue_options or (lambda name: {}), relay_limit=relay_limit)
        # AMQP transactions of every client connection (coordinator links, held work, timeouts)
        self.transactions = Transactions(self, max_per_connection=max_transactions,
                                         timeout=transaction_timeout)

    # -- the per-input-chunk cycle ----------------------------------------
    def run_pending(self) -> None:
        """Dispatch queues that changed, then flush every connection touched."""
        # The sets are shared (upstream pools add to dirty_handlers): clear, never rebind.
        while self.dirty_queues:
            queues = list(self.dirty_queues)
            self.dirty_queues.clear()
            for queue in queues:
                queue.dispatch()
                if queue.expired:
                    self._expired(queue)
                if queue.limited:
                    self._limited(queue)
                if queue.scheduled or queue.scheduled.in_runs:
                    self._arm(queue)
                _finish_drains(queue)
                for browser in queue.browsers:  # after the consumers: they take first
                    browser.serve()
                if queue.after_dispatch is not None:
                    queue.after_dispatch(queue)
                if queue.producers_blocked:
                    _replenish_producers(queue)
        while self.dirty_handlers:
            handlers = list(self.dirty_handlers)
            self.dirty_handlers.clear()
            for handler in handlers:
                handler.flush()

    def queue_loaded(self, queue: LocalQueue) -> None:
        """Paged messages of ``queue`` are back in memory (proxy.paging): dispatch it."""
        self.dirty_queues.add(queue)
        self.run_pending()

    def enqueue(self, queue: LocalQueue, message: StoredMessage, *, expiry: bool = True) -> None:
        queue.enqueue(message, expiry=expiry)
        self.dirty_queues.add(queue)
        if queue.max_bytes and queue.bytes > queue.max_bytes and queue.overflow == DROP_HEAD:
            self._dropped(queue, queue.drop_head())

    def _dropped(self, queue: LocalQueue, dropped: list) -> None:
        """Overflow drop-head (as RabbitMQ's): the oldest are dead-lettered if the queue says so."""
        self._taken_out(queue, dropped, "overflow")
        if dropped:
            log.debug("queue %s: %d messages dropped from the head (max_bytes)", queue.name, len(dropped))

    def dead_letter(self, queue: LocalQueue, message: StoredMessage, reason: str,
                    then: Callable[[], None]) -> None:
        """A copy of ``message`` into ``queue``'s dead-letter queue, then ``then()`` (the
        original let go: ``let_go``) once the copy is safe: at once for a dead-letter queue of
        this node (stored, journaled first); once its in-sync copies hold it for a replicated
        one this node serves (its commit barrier: proxy.replication); once the owner accepted
        it when another worker of this node owns it (``proxy.workers``). A crash or a failover
        in between leaves the message in both queues, never in neither. The copy carries
        annotations naming the queue, the ``reason`` and the time (docs/queue-semantics.md)."""
        payload = message_header.modify(message.payload, increment_count=False, annotations={
            "x-opt-dead-letter-address": queue.name,
            "x-opt-dead-letter-reason": reason,
            "x-opt-dead-letter-time": timestamp(int(time.time() * 1000))})
        decision = self.resolve(queue.dead_letter)
        if decision.kind == "proxy" and (decision.primary or "").startswith("worker-"):
            self._dead_letter_elsewhere(queue, payload, decision, then)
            return
        target = self.queues.lookup_or_create(queue.dead_letter)
        if target is None:
            log.warning("queue %s: dead-letter queue %s unavailable; message dropped",
                        queue.name, queue.dead_letter)
            then()
            return
        copy = StoredMessage(payload)
        journal_queues.dead_lettered(self.journal, target, copy)
        # a dead-lettered copy does not expire (an expired one would again, for ever)
        self.enqueue(target, copy, expiry=False)
        barrier = target.commit_barrier  # a replicated queue served here: its copies first
        if barrier is None:
            then()
        else:
            barrier(then)

    def let_go(self, queue: LocalQueue, message: StoredMessage) -> None:
        """A message leaves ``queue`` for good outside an outcome (dead-lettered once its copy
        is safe, or dropped): its removal told to the backups (a replicated queue) and
        journaled."""
        queue.forget(message)
        journal_queues.dequeued(self.journal, message)

    def _dead_letter_elsewhere(self, queue: LocalQueue, payload: bytes, decision, then) -> None:
        """Through an internal sender to the worker that owns the dead-letter queue."""
        def done(state, condition=None) -> None:
            if state != PN_ACCEPTED:
                log.warning("queue %s: dead-letter queue %s (%s) did not take a message (%s %s); "
                            "dropped", queue.name, queue.dead_letter, decision.primary, state,
                            getattr(condition, "name", ""))
            then()

        upstream = self.upstreams.for_decision(decision)
        # marked: the owner stores it as a dead-lettered copy, which does not expire again
        self.exchanges.destinations.get(upstream, decision.remote_address,
                                        (DEAD_LETTER_COPY,)).send(payload, done)

    def _expired(self, queue: LocalQueue) -> None:
        """Messages past their ttl (§3.2.1): dead-lettered if the queue says so, else dropped."""
        expired, queue.expired = queue.expired, []
        self._taken_out(queue, expired, "expired")
        log.debug("queue %s: %d messages expired", queue.name, len(expired))

    def _limited(self, queue: LocalQueue) -> None:
        """Messages that came back ``delivery_limit`` times: dead-lettered, or dropped when the
        queue has no dead-letter address (docs/queue-semantics.md)."""
        limited, queue.limited = queue.limited, []
        self._taken_out(queue, limited, "delivery-limit")
        log.info("queue %s: %d messages at the delivery limit (%d) %s", queue.name, len(limited),
                 queue.delivery_limit, "dead-lettered" if queue.dead_letter else "dropped")

    def _taken_out(self, queue: LocalQueue, messages: list, reason: str) -> None:
        """Messages the queue let go of by itself: to its dead-letter queue, or dropped."""
        for message in messages:
            if queue.dead_letter:
                queue.stats.dead_lettered += 1
                self.dead_letter(queue, message, reason, functools.partial(self.let_go, queue,
                                                                           message))
            else:
                self.let_go(queue, message)

    def _arm(self, queue: LocalQueue) -> None:
        """The queue's one timer, for its earliest scheduled message (proxy.queues.schedule)."""
        due = queue.next_due
        timer = queue.timer
        if timer is not None:
            if timer[0] <= due:
                return
            timer[1].cancel()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a test driving the broker by hand): dispatch finds it
            return

        def fire() -> None:
            queue.timer = None
            self.dirty_queues.add(queue)
            self.run_pending()

        queue.timer = (due, loop.call_later(max(0.0, due - schedule.clock()) + 0.001, fire))

    def delete_temporary(self, queue: LocalQueue) -> None:
        if queue.consumers or queue.producers or queue.browsers:
            return
        self.queues.delete(queue.name)
        if queue.creator is not None:
            queue.creator.temporary_queues -= 1
            queue.creator = None
        dropped = queue.purge()
        if dropped:
            log.info("temporary queue %s deleted with %d messages", queue.name, dropped)


def _finish_drains(queue: LocalQueue) -> None:
    """Consumers whose drain request is open, after dispatch: answered (§2.6.7).

    Dispatch gave each consumer what it could take: one with credit left and
    room in its output has nothing more coming for now (an empty queue, or only
    messages it may not take), one without credit used it all up. Either way the
    client gets its flow state, once per request. A consumer whose output is
    blocked waits: the queue is dispatched again when its output has room.
    """
    hold = queue.holds_drain
    for consumer in itertools.chain(queue.consumers, queue.standby_consumers):
        if not consumer.drain_requested:
            continue
        ptr = consumer.link_ptr
        if pn_link_credit(ptr) > 0:
            if not consumer.handler.can_send(consumer):
                continue
            if queue.reading:  # paged messages on their way back from disk (proxy.paging)
                continue
            if hold is not None and hold(consumer):
                continue
        consumer.drain_requested = False
        answer_drain(ptr)
        consumer.handler.mark_dirty()


def _replenish_producers(queue: LocalQueue) -> None:
    queue.producers_blocked = False
    for producer in queue.producers:
        producer.top_up()
