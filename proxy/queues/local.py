"""Local queues: the embedded broker's storage and dispatch, as plain data.

How this works
--------------
A ``LocalQueue`` holds encoded messages (``StoredMessage``: the bytes exactly
as the producer sent them) in a deque, plus the consumers attached to it.
Nothing here touches proton or sockets: the broker layer (``proxy.broker``)
turns AMQP events into calls on this module and turns ``Consumer.deliver``
callbacks back into proton transfers.

* Enqueue appends at the tail; released / modified / orphaned messages go back
  to the head (AMQP 1.0 §3.4.4 released, §3.4.5 modified).
* A message whose header has a ttl (§3.2.1) expires that long after it was
  stored. Expired messages are taken out when they reach the head of the
  queue (``dispatch``; the broker drops or dead-letters them), so the depth
  counts them until then; browsers never see them.
* ``dispatch()`` hands head messages to consumers with credit, round-robin,
  skipping consumers a message is marked undeliverable-here for. It never
  sends without credit: ``Consumer.credit`` is the link credit proton reports.
* Bytes: ``bytes`` counts the payloads a queue holds (waiting and handed out,
  not yet settled), and every queue adds to the node's ``MemoryUse``. A queue at
  its ``max_bytes`` (overflow ``reject-publish``) or a node at ``[limits]
  max_memory`` gives its producers no new credit; with ``drop-head`` the oldest
  waiting messages make room instead (``Broker.enqueue``).
* Producer credit is computed from the depth limit: ``room()`` is how many more
  messages may be granted to senders so that the depth limit is never passed
  (§2.6.7 flow control: credit withheld = backpressure, nothing dropped).
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field
from time import monotonic
from typing import ClassVar, Iterable, Protocol

from proxy.amqp import message_header
from proxy.paging.store import PAGED, STORED, WRITING, Page, body
from proxy.queues import schedule, selective
from proxy.queues.level_runs import LevelRuns
from proxy.queues.memory import MemoryUse
from proxy.queues.message import StoredMessage
from proxy.queues.runs import RunQueue
from proxy.queues.schedule_pages import Scheduled
from proxy.queues.store import DEFAULT_PRIORITY, PriorityStore

__all__ = ["Consumer", "LocalQueue", "QueueStats", "StoredMessage"]


class Consumer(Protocol):
    """What a queue needs from a consumer link (implemented by the broker)."""

    consumer_id: int

    @property
    def credit(self) -> int: ...

    def deliver(self, message: StoredMessage) -> None: ...


REJECT_PUBLISH = "reject-publish"
DROP_HEAD = "drop-head"
OVERFLOW_POLICIES = (REJECT_PUBLISH, DROP_HEAD)


@dataclass
class QueueStats:
    enqueued: int = 0
    delivered: int = 0
    acknowledged: int = 0
    released: int = 0
    modified: int = 0
    rejected: int = 0
    dead_lettered: int = 0
    expired: int = 0
    dropped: int = 0  # taken from the head by overflow drop-head
    delivery_limited: int = 0  # came back delivery_limit times: dead-lettered or dropped


@dataclass(eq=False)  # identity semantics: queues live in sets
class LocalQueue:
    name: str
    max_depth: int = 0  # 0 = unlimited
    dead_letter: str | None = None
    temporary: bool = False
    durable: bool = False  # durable messages are journaled (proxy.journal_queues)
    max_bytes: int = 0  # 0 = unlimited
    overflow: str = REJECT_PUBLISH  # at max_bytes: no credit and refused transfers, or drop-head
    bytes: int = 0  # payload bytes held: waiting and handed out, not settled
    memory: MemoryUse = field(default_factory=MemoryUse)  # the node's (QueueRegistry's)
    creator: object = None  # a temporary queue's: the client handler that made it
    messages: deque[StoredMessage] = field(default_factory=deque)
    consumers: list[Consumer] = field(default_factory=list)
    producers: list = field(default_factory=list)  # links sending into this queue
    producers_blocked: bool = False  # a producer was granted less than its window
    stats: QueueStats = field(default_factory=QueueStats)
    # messages handed to consumers and not yet settled by them
    unacked: int = 0
    # messages received but waiting for the journal before they are enqueued
    incoming: int = 0
    _next: int = 0  # round-robin position in consumers
    # Standby consumers: served only when no ordinary consumer can take the
    # message (fragments: other nodes' stealers, local consumers first).
    standby_consumers: list = field(default_factory=list)
    delivered_to_standby: int = 0  # messages taken by standby consumers
    # Called by the broker with the queue after each dispatch (an observer; fragments
    # decide there whether to fetch from elsewhere).
    after_dispatch: object = None
    # Asked by the broker before it answers a consumer's drain on an empty queue
    # (§2.6.7): True keeps the drain open for now (fragments: messages are being
    # fetched from another worker for that consumer). None: never held.
    holds_drain: object = None
    # Called with each message dispatch hands to a consumer (a replicated queue tells its
    # backups: proxy.replication). None: nobody asks.
    on_acquired: object = None
    # A replicated queue's replica set while this node is its primary (proxy.replication):
    # producers' deliveries are accepted once the in-sync copies hold them. None: at once.
    replica_set: object = None
    # What a transaction's commit into this queue waits for before it is answered
    # (proxy.transactions): called as ``commit_barrier(done)`` once the commit's changes are
    # applied here; ``done()`` when they are durable and replicated (a replicated queue's
    # in-sync copies hold them: proxy.replication). None: nothing more to wait for.
    commit_barrier: object = None
    # Links browsing the queue (distribution-mode copy): sent copies, take nothing
    browsers: list = field(default_factory=list)
    _seq: int = 0  # the last StoredMessage.seq given
    # messages that expired at the head, for the broker to journal / dead-letter
    expired: list = field(default_factory=list)
    # times a message may come back from consumers before it is dead-lettered (0: no limit)
    delivery_limit: int = 0
    # messages that reached delivery_limit, for the broker to journal / dead-letter
    limited: list = field(default_factory=list)
    # consumers with a selector (each with its own store of the messages it selects)
    selective: list = field(default_factory=list)
    # messages held until their delivery time: a heap of (time, seq, message), and those
    # paged in runs (proxy.queues.schedule_pages; ``total`` counts both)
    scheduled: Scheduled = field(default_factory=Scheduled)
    # the queue's one timer for scheduled messages, kept by the broker
    timer: object = None
    # paging (proxy.paging, docs/paging.md): bodies of waiting messages on disk only, and
    # whether a read-ahead is under way
    paged_bytes: int = 0
    paged_count: int = 0
    page_writes: int = 0  # bodies being written one by one (not in runs)
    reading: bool = False
    pages: ClassVar[bool] = True  # whether the pager may take its messages' bodies to disk
    runs: ClassVar[bool] = True  # whether they may go in runs (proxy.queues.runs)
    # whether a priority queue keeps runs per level (proxy.queues.level_runs), given ``runs``
    priority_runs: ClassVar[bool] = True
    # whether its scheduled messages may page (docs/paging-scheduled.md; not a replicated
    # primary's: its rid index and catch-up name them)
    scheduled_runs: ClassVar[bool] = True

    # -- producer side -----------------------------------------------------
    def enqueue(self, message: StoredMessage, *, expiry: bool = True,
                header: tuple[int, int] | None = None) -> None:
        """Store at the tail. With ``expiry`` the header's ttl (§3.2.1) starts now.
        ``header``: its (ttl, priority), known already (a recovered durable message on disk
        only, not scheduled: proxy.queues.journal_restore); None: read from the body."""
        self._seq += 1
        message.seq = self._seq
        payload = message.payload
        memory = self.memory
        if type(payload) is Page:  # on disk only (a backup's entry, promoted, a recovered one)
            if header is None:  # read its header
                payload = payload.read()
            if header is None and schedule.marked(payload) and not self.scheduled_runs:
                # in memory until due
                message.payload = payload
                message.page.state = STORED
            else:
                self.paged_bytes += len(payload)
                self.paged_count += 1
                memory.paged += len(payload)
        ttl, priority = header or message_header.ttl_and_priority(payload)
        if expiry and ttl:
            message.expires_at = monotonic() + ttl / 1000.0
        message.priority = priority
        self.stats.enqueued += 1
        size = len(payload)
        self.bytes += size
        memory.used += size
        if memory.pager is not None and memory.used - memory.paged > memory.limit:
            memory.pager.wake()
        if header is None and schedule.marked(payload) and schedule.hold(self, message, payload):
            return
        self._ready(message)

    def _ready(self, message: StoredMessage) -> None:
        """Into the ready place, at the tail of its priority."""
        messages = self.messages
        if message.priority != DEFAULT_PRIORITY and (type(messages) is deque
                                                     or type(messages) is RunQueue):
            messages = self._prioritise()
        messages.append(message)
        if self.selective:
            selective.offered(self, message, head=False)

    def _prioritise(self, selector: bool = False):
        """From a plain deque to a PriorityStore (a priority other than 4, or a selector); a
        FIFO queue's runs become level 4 of a LevelRuns as they are (docs/paging.md, "A
        priority queue in runs"); a selector needs message objects (``unrun``)."""
        messages = self.messages
        if type(messages) is RunQueue:
            if not selector and self.priority_runs:
                self.messages = LevelRuns.of_runs(self, messages)
                return self.messages
            messages.unrun()  # runs back to messages, one by one (a stall: a read of each)
        elif type(messages) is LevelRuns:
            return messages.unrun() if selector else messages
        if type(self.messages) is deque:
            self.messages = PriorityStore(self.messages)
        return self.messages

    def _came_back(self, message: StoredMessage, failed: bool) -> None:
        """Back from a consumer: at the head of its priority, held again when a modified
        outcome gave it a delivery time, or out for good at the delivery limit. ``failed``: a
        delivery that counts (modified with delivery-failed, a consumer gone or a transaction
        rolled back with it unsettled; released does not count: docs/queue-semantics.md)."""
        if failed:
            message.attempts += 1
        if failed and self.delivery_limit and message.attempts >= self.delivery_limit:
            self.stats.delivery_limited += 1
            self._left(message)
            self.limited.append(message)
            return
        if schedule.marked(message.payload) and schedule.hold(self, message):
            return
        messages = self.messages
        if message.priority != DEFAULT_PRIORITY and (type(messages) is deque
                                                     or type(messages) is RunQueue):
            messages = self._prioritise()
        messages.appendleft(message)
        if self.selective:
            selective.offered(self, message, head=True)

    @property
    def next_due(self) -> float:
        """When the first scheduled message is due (seconds since the epoch); 0: none."""
        scheduled = self.scheduled
        return scheduled.next_due(schedule.clock()) if scheduled or scheduled.in_runs else 0.0

    def _released(self, size: int) -> None:
        """``size`` payload bytes left the queue for good."""
        self.bytes -= size
        memory = self.memory
        memory.used -= size
        if memory.blocked or memory.waiting:
            memory.freed()

    def _left(self, message: StoredMessage) -> None:
        """``message`` left the queue for good (its page record too)."""
        if message.page is not None:
            self.memory.pager.gone(self, message)
        self._released(len(message.payload))

    def _resized(self, message: StoredMessage, payload: bytes) -> None:
        if message.page is not None:  # the record on disk is the old body
            self.memory.pager.gone(self, message)
        change = len(payload) - len(message.payload)
        message.payload = payload
        self.bytes += change
        self.memory.used += change

    def refuses(self, size: int) -> bool:
        """Whether a message of ``size`` bytes is refused: reject-publish and no room under max_bytes."""
        return bool(self.max_bytes) and self.overflow == REJECT_PUBLISH and self.bytes + size > self.max_bytes

    def drop_head(self) -> list[StoredMessage]:
        """Overflow drop-head: the oldest waiting messages taken out until under max_bytes."""
        dropped = []
        while self.bytes > self.max_bytes and self.messages:
            message = self.messages.popleft()
            if self.selective:
                selective.taken(self, message)
            if self.dead_letter and type(message.payload) is Page:
                self.memory.pager.load_now(self, message)
            self._left(message)
            dropped.append(message)
        self.stats.dropped += len(dropped)
        return dropped

    def room(self) -> int | None:
        """How many more messages may arrive before the depth limit; None = no limit."""
        if not self.max_depth:
            return None
        return max(0, self.max_depth - len(self.messages) - self.unacked - self.incoming)

    def credit_within_room(self, want: int) -> int:
        """How much of ``want`` more producer credit the depth limit allows (§2.6.7).

        Credit already granted to any producer counts as used room; a producer
        granted less than it wanted marks the queue so it is topped up later.
        """
        memory = self.memory
        ceiling = memory.ceiling
        if ceiling and memory.used - memory.paged >= ceiling:
            memory.blocked.add(self)  # topped up again once the node's use falls (on_room)
            self.producers_blocked = True
            return 0
        if self.max_bytes and self.bytes >= self.max_bytes and self.overflow == REJECT_PUBLISH:
            self.producers_blocked = True  # topped up again as consumers settle
            return 0
        room = self.room()
        if room is None:
            return want
        room -= sum(p.outstanding_credit for p in self.producers)
        if room < want:
            self.producers_blocked = True
            return max(0, room)
        return want

    @property
    def depth(self) -> int:
        return len(self.messages)

    # -- consumer side -----------------------------------------------------
    def add_consumer(self, consumer: Consumer, *, standby: bool = False) -> None:
        (self.standby_consumers if standby else self.consumers).append(consumer)
        if getattr(consumer, "selector", None) is not None:
            self._prioritise(selector=True)
            selective.added(self, consumer)

    def remove_consumer(self, consumer: Consumer) -> None:
        if consumer in self.selective:
            selective.removed(self, consumer)
        if consumer in self.standby_consumers:
            self.standby_consumers.remove(consumer)
            return
        try:
            index = self.consumers.index(consumer)
        except ValueError:
            return
        del self.consumers[index]
        if index < self._next:
            self._next -= 1
        if self._next >= len(self.consumers):
            self._next = 0

    def dispatch(self) -> int:
        """Give head messages to consumers with credit, round-robin. Returns how many.

        Expired messages that reach the head are taken out first, consumers or
        not (into ``expired``).
        """
        scheduled = self.scheduled  # first: a priority released may make a PriorityStore
        if scheduled or scheduled.in_runs:
            schedule.release_due(self)
        messages = self.messages
        consumers = self.consumers
        standby = self.standby_consumers
        acquired = self.on_acquired
        if self.selective:
            return selective.dispatch(self)
        sent = 0
        now = 0.0
        runs = type(messages) is RunQueue or type(messages) is LevelRuns
        while messages:
            if runs and not messages.head:  # a run comes next: read back, at once or later
                if not (consumers or standby) or not messages.read_ahead():
                    break
                continue
            message = messages[0]
            page = message.page
            if message.expires_at:
                now = now or monotonic()
                if message.expires_at <= now:
                    messages.popleft()
                    if self.dead_letter and type(message.payload) is Page:
                        self.memory.pager.load_now(self, message)
                    self._left(message)
                    self.stats.expired += 1
                    self.expired.append(message)
                    continue
            if not (consumers or standby):
                break
            if page is not None and page.state >= PAGED:  # its body is on disk: read ahead
                self.memory.pager.read_ahead(self)
                break
            consumer = self._pick(message)
            if consumer is None:
                consumer = self._pick_standby(message) if standby else None
                if consumer is None:
                    break
                self.delivered_to_standby += 1
            messages.popleft()
            if page is not None:
                self._handed_out(page)
            self.unacked += 1
            sent += 1
            if acquired is not None:
                acquired(message)
            consumer.deliver(message)
        self.stats.delivered += sent
        return sent

    def _handed_out(self, page: Page) -> None:
        """A message with a page record leaves for a consumer (its body is in memory)."""
        if page.state == WRITING:
            page.state = STORED  # the write goes on; the body stays with the message
        if page.trigger:  # the window ahead of the consumers is half used: read the next
            page.trigger = False
            self.memory.pager.read_ahead(self)

    def page_out(self, pager, keep: int, wanted: int) -> int | None:
        """Up to ``wanted`` bytes of the tail to disk as runs (proxy.queues.runs): bytes
        freed; None where this queue pages message by message (replicated, or messages
        paged one by one already). A priority queue keeps runs per level (LevelRuns)."""
        messages = self.messages
        kind = type(messages)
        if kind is deque or kind is PriorityStore:
            if not (self.runs and pager.runs) or self.paged_count or self.page_writes \
                    or (kind is PriorityStore and not self.priority_runs) \
                    or len(messages) <= keep:  # runs only once nothing is paged one by one
                return None
            messages = self.messages = RunQueue(self, pager, messages, deque()) \
                if kind is deque else LevelRuns.of_store(self, pager, messages)
        elif kind is not RunQueue and kind is not LevelRuns:
            return None
        return messages.page_out(keep, wanted)

    def body(self, message: StoredMessage) -> bytes:
        """A waiting message's body, read from the page store if it is there (browsers,
        selectors: it stays paged)."""
        return body(message)

    def _pick(self, message: StoredMessage) -> Consumer | None:
        consumers = self.consumers
        count = len(consumers)
        start = self._next
        excluded = message.excluded
        for offset in range(count):
            index = (start + offset) % count
            consumer = consumers[index]
            if consumer.credit > 0 and consumer.consumer_id not in excluded:
                self._next = (index + 1) % count
                return consumer
        return None

    def _pick_standby(self, message: StoredMessage) -> Consumer | None:
        for consumer in self.standby_consumers:
            if consumer.credit > 0 and consumer.consumer_id not in message.excluded:
                return consumer
        return None

    def browse(self, after: int, limit: int, selector=None) -> list[StoredMessage]:
        """Up to ``limit`` waiting messages enqueued after ``seq`` ``after``, in queue order.

        For browsers (§3.5.3 distribution-mode ``copy``): they see what waits in
        the queue, not what is out with a consumer, and each message once. The
        queue is in enqueue order except for messages that came back to its head
        (released, modified): the first candidate is found by bisection, and a
        message that returned after a browser went past its place is not shown
        to that browser again.
        """
        messages = self.messages
        if limit <= 0 or not messages:
            return []
        if type(messages) is not deque or selector is not None:  # not in seq order, or filtered
            now = monotonic()
            found = []
            for m in messages.iterate(after) if hasattr(messages, "iterate") else messages:
                if m.seq > after and not (m.expires_at and m.expires_at <= now) \
                        and (selector is None or selector.matches(self.body(m))):
                    found.append(m)
                    if len(found) == limit:
                        break
            return found
        low, high = 0, len(messages)
        while low < high:
            middle = (low + high) // 2
            if messages[middle].seq <= after:
                low = middle + 1
            else:
                high = middle
        found = []
        now = monotonic()
        for message in itertools.islice(messages, low, None):
            if message.seq > after and not (message.expires_at and message.expires_at <= now):
                found.append(message)
                if len(found) == limit:
                    break
        return found

    def local_credit(self) -> int:
        """Credit held by ordinary (not standby) consumers."""
        return sum(c.credit for c in self.consumers)

    # -- outcomes (§3.4) ---------------------------------------------------
    def settled_accepted(self, message: StoredMessage) -> None:
        self.unacked -= 1
        self.stats.acknowledged += 1
        self._left(message)

    def settled_released(self, message: StoredMessage) -> None:
        """Released (§3.4.4): back to the head, delivery-count unchanged."""
        self.unacked -= 1
        self.stats.released += 1
        self._came_back(message, False)

    def settled_modified(
        self,
        message: StoredMessage,
        *,
        delivery_failed: bool,
        undeliverable_here: bool,
        consumer_id: int,
        annotations: dict | None = None,
    ) -> None:
        """Modified (§3.4.5): back to the head, count+1 if failed, maybe excluded."""
        self.unacked -= 1
        self.stats.modified += 1
        if delivery_failed or annotations:
            self._resized(message, message_header.modify(
                message.payload, increment_count=delivery_failed, annotations=annotations
            ))
        if undeliverable_here:
            message.excluded = message.excluded | {consumer_id}
        self._came_back(message, delivery_failed)

    def settled_rejected(self, message: StoredMessage) -> StoredMessage | None:
        """Rejected (§3.4.3): returns the message to dead-letter, or None to drop it."""
        self.unacked -= 1
        self.stats.rejected += 1
        self._left(message)
        if self.dead_letter:
            self.stats.dead_lettered += 1
            return message
        return None

    def orphaned(self, messages: Iterable[StoredMessage]) -> None:
        """Unsettled messages of a consumer that went away: back to the head, in order.

        The delivery-count goes up: the consumer may have processed them (§3.2.1).
        """
        returned = list(messages)
        for message in reversed(returned):
            self.unacked -= 1
            self._resized(message, message_header.modify(message.payload, increment_count=True))
            self._came_back(message, True)
        self.stats.released += len(returned)

    def forget(self, message: StoredMessage) -> None:
        """``message`` left the queue for good outside an outcome (expired, dropped): for
        subclasses that keep track (a replicated queue tells its backups)."""

    def purge(self) -> int:
        held = [entry[2] for entry in self.scheduled]
        count = len(self.messages) + self.scheduled.total
        in_runs = 0
        if type(self.messages) is RunQueue:  # the runs' records die; head and tail stay
            in_runs = self.messages.drop_runs()
            self.messages = self.messages.head
        elif type(self.messages) is LevelRuns:  # every level's runs, likewise
            in_runs = self.messages.drop_runs()
        in_runs += self.scheduled.drop(self)  # its runs' records die, the heap is emptied
        if self.memory.pager is not None:
            for message in itertools.chain(self.messages, held):
                if message.page is not None:
                    self.memory.pager.gone(self, message)
        self._released(in_runs + sum(len(m.payload) for m in self.messages)
                       + sum(len(m.payload) for m in held))
        self.messages.clear()
        self.scheduled.clear()
        for consumer in self.selective:
            consumer.matched.clear()
        return count

    def waiting_names(self):
        """``(journal_id, rid)`` of every message ``waiting`` yields, runs' from memory (no
        record read: a purge's journal dequeues and dequeue events; docs/paging_purge.md)."""
        names = getattr(self.messages, "names", None)
        yield from (names() if names is not None else
                    ((m.journal_id, m.rid) for m in list(self.messages)))
        yield from self.scheduled.names()

    def waiting(self):
        """Every message held and not out with a consumer: ready, then scheduled."""
        yield from self.messages
        yield from self.scheduled.in_order(self.memory.pager)
