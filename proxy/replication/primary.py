"""The primary's side of one replicated queue: rids, a stream per backup, delayed completion.

How this works
--------------
``ReplicaSet`` is plain data driven by calls (no I/O, time passed in), so the
protocol is tested on a virtual clock (docs/replication.md has the design):

* The queue reports what happens to its messages (``enqueued``, ``acquired``,
  ``released``, ``dequeued``); each becomes an event appended to every
  attached backup's ``BackupStream``. An enqueue gets the next rid
  (``epoch << 40 | n``) and a **ticket** (the count of enqueues so far).
* ``take_batch`` packs a stream's waiting events (live ones first, then the
  catch-up's ``front`` events, newest first, skipping what was dequeued
  meanwhile) into one batch of at most ``MAX_BATCH_BYTES`` / ``MAX_BATCH_EVENTS``.
  Each batch remembers the ticket it carries enqueues *through*: once a backup
  acknowledges it, that backup holds every message with that ticket or less.
* **Delayed completion**: a producer's delivery waits (``wait(ticket, token)``)
  until every backup in the in-sync set (ISR) holds its ticket and the copies
  holding it number at least ``min_in_sync``; ``completed()`` hands back the
  tokens whose time has come, in order.
* **The ISR** changes only through proposals (``proposals()``): the I/O layer
  writes the proposed set where failover reads it (etcd), then calls
  ``isr_committed``. A backup leaves the ISR when it lags (its oldest event
  not acknowledged for ``catchup_timeout`` seconds, or more than
  ``MAX_STREAM_BYTES`` waiting) or its link ends; it joins once it has
  acknowledged its catch-up's end. Until a removal is committed the removed
  backup still counts: nothing is accepted that it might not hold.
* ``fenced``: nothing completes any more.
"""

from __future__ import annotations

import os
import sys
from collections import deque
from dataclasses import dataclass, field

from . import catchup, dequeue_runs
from .dequeue_runs import RUN, entry_cost
from .events import ACQUIRE, DEQUEUE, ENQUEUE, IN_SYNC, RELEASE, Event, rid
from .states import CopyState

MAX_BATCH_BYTES = 1 << 20
# one batch in flight per backup (copies.BATCHES_IN_FLIGHT): a queue's rate is at most this
# many events per round trip to its backup; 4,096 was slower than 512 on 16 cores, side by side
# (bench/README.md, issue #45); FEDGATE_REPLICATION_BATCH_EVENTS sets it for such a benchmark
MAX_BATCH_EVENTS = int(os.environ.get("FEDGATE_REPLICATION_BATCH_EVENTS", "512"))
# memory of the events waiting for one backup before it is dropped (``BackupStream.memory``:
# what the entries cost, proxy.replication.dequeue_runs, not their size in a batch)
MAX_STREAM_BYTES = 64 << 20
_EMPTY_TABLES = sys.getsizeof({}) + sys.getsizeof(set())  # a stream with nothing waiting: 0
ASKED_AGAIN = 1.0  # a batch sent this soon after the last acknowledgement: silence counts from it


@dataclass
class SentBatch:
    number: int
    sent_at: float
    through: int  # tickets up to this one are in this batch or an earlier one
    ends_catchup: bool = False


@dataclass
class BackupStream:
    """What one attached backup has been sent and has acknowledged."""

    node: str
    state: CopyState = CopyState.CATCHING_UP
    # (event, ticket stamp, appended at); consecutive dequeues as one DequeueRun
    pending: deque = field(default_factory=deque)
    pending_bytes: int = 0  # their memory (dequeue_runs.entry_cost), counted until they go
    # coalescing (module note): enqueues not sent yet, by rid; acquires not sent yet. A
    # pending enqueue whose rid is no longer here was dequeued before it went: skipped.
    unsent_enqueues: dict = field(default_factory=dict)
    unsent_acquires: set = field(default_factory=set)
    catchup: object = None  # catchup.Catchup: what the catch-up still sends; None: done
    catchup_total: int = 0
    unacked: deque = field(default_factory=deque)  # SentBatch, in order
    next_number: int = 1
    held_through: int = 0  # tickets this backup holds (its acknowledged batches)
    acked_at: float = 0.0
    catchup_acked: bool = False  # the batch with catchup-done was acknowledged
    last_sent: float = 0.0  # when the last batch went (keepalives: copies.KEEPALIVE)
    dropped: str | None = None  # why it leaves the ISR (lagging, link lost)
    peers: "BackupSilence | None" = None  # the backup node's silence across its queues

    def add(self, event: Event, ticket: int, now: float) -> None:
        self.pending.append((event, ticket, now))
        self.pending_bytes += entry_cost(event)
        if event.kind == ENQUEUE:
            self.unsent_enqueues[event.rid] = event

    def live(self, event: Event) -> bool:
        """Whether a pending ``event`` is still to be sent (not an enqueue dequeued meanwhile)."""
        return event.kind != ENQUEUE or event.rid in self.unsent_enqueues

    def acquire(self, value: int) -> None:
        self.unsent_acquires.add(value)  # sent with the next batch, unless settled before

    def release(self, event: Event, ticket: int, now: float) -> None:
        if value_unsent := event.rid in self.unsent_acquires:
            self.unsent_acquires.discard(event.rid)
        if value_unsent and event.payload is None:
            return  # acquired and released between two batches: nothing to tell
        self.add(event, ticket, now)

    def cancel(self, value: int) -> bool:
        """Message ``value`` is gone: True if its enqueue was never sent (then the backup
        need not hear of it at all), False if a dequeue event must follow."""
        self.unsent_acquires.discard(value)
        # its entry stays in ``pending`` (skipped when reached), counted until it goes: it
        # holds the message's bytes until then
        return self.unsent_enqueues.pop(value, None) is not None

    def silent_for(self, now: float) -> float:
        """How long this backup has owed an answer and not been heard: from its last
        acknowledgement when it was asked again soon after (a busy stream, or one kept alive
        by copies.KEEPALIVE), else from the oldest batch it owes; 0 when it owes nothing."""
        if not self.unacked:
            return 0.0
        first = self.unacked[0].sent_at
        since = self.acked_at if self.acked_at and first - self.acked_at <= ASKED_AGAIN else first
        if self.peers is not None:  # silent on the node's other queues since before
            since = min(since, now - self.peers.silent_for(self.node, now))
        return now - since

    def behind_since(self) -> float | None:
        """When the oldest event this backup has not acknowledged was made."""
        if self.unacked:
            return self.unacked[0].sent_at
        for event, _, appended_at in self.pending:
            if self.live(event):
                return appended_at
        if self.catchup:
            return None  # catch-up paces itself by credit; its end is what counts
        return None

    @property
    def memory(self) -> int:
        """What the stream holds in memory: its entries (``pending_bytes``) and the tables of
        what is not sent yet, measured beyond empty ones (a dict keeps its table after its
        entries go)."""
        return (self.pending_bytes + sys.getsizeof(self.unsent_enqueues)
                + sys.getsizeof(self.unsent_acquires) - _EMPTY_TABLES)

    @property
    def lag_events(self) -> int:
        return (sum(entry[0].left if entry[0].kind == RUN else 1
                    for entry in self.pending if self.live(entry[0])) + len(self.unsent_acquires)
                + (len(self.catchup) if self.catchup else 0))


class ReplicaSet:
    """The primary's state for one replicated queue (see the module note)."""

    def __init__(self, name: str, epoch: int, clock, *, min_in_sync: int = 1,
                 catchup_timeout: float = 10.0, isr: frozenset = frozenset(),
                 index: dict | None = None, peers=None) -> None:
        """``clock()``: the time now (the event loop's; a virtual one in tests). ``peers``: the
        node's ``BackupSilence``, shared by its queues."""
        self.name = name
        self.peers = peers
        self.clock = clock
        self.epoch = epoch
        self.min_in_sync = min_in_sync
        self.catchup_timeout = catchup_timeout
        self.n = 0  # rids given in this epoch
        self.ticket = 0  # enqueues so far
        # rid -> message, every message the primary holds in memory (waiting or out with a
        # consumer); those in the queue's runs on disk are not in it (proxy.replication.catchup)
        self.index: dict = index if index is not None else {}
        self.acquired: set = set()  # rids out with a consumer
        self.streams: dict[str, BackupStream] = {}
        self.isr: frozenset = isr  # as committed where failover reads it
        self._proposed: frozenset | None = None  # written, not yet committed
        self.waiting: deque = deque()  # (ticket, token) of deliveries not yet accepted
        self.fenced = False
        self.accepted = 0  # deliveries completed (admin)
        # the ReplicatedQueue served (its runs: proxy.replication.catchup); None in tests
        self.queue = None

    # -- what happens to the queue's messages -------------------------------------
    def enqueued(self, message) -> int:
        """``message`` (with ``payload``, ``rid``) was stored: its rid, event, ticket (returned)."""
        self.n += 1
        message.rid = rid(self.epoch, self.n)
        self.ticket += 1
        self.index[message.rid] = message
        if self.streams:
            event = Event(ENQUEUE, message.rid, message.payload)
            ticket, now = self.ticket, self.clock()
            for stream in self.streams.values():
                stream.add(event, ticket, now)
        return self.ticket

    def acquired_by_consumer(self, message) -> None:
        value = message.rid
        self.acquired.add(value)
        for stream in self.streams.values():
            stream.acquire(value)

    def released(self, message, changed: bool) -> None:
        """Back in the queue (released, modified, orphaned); ``changed``: its bytes differ now."""
        self.acquired.discard(message.rid)
        if self.streams:
            event = Event(RELEASE, message.rid, message.payload if changed else None)
            ticket, now = self.ticket, self.clock()
            for stream in self.streams.values():
                stream.release(event, ticket, now)

    def dequeued(self, message, in_run: bool = False) -> None:
        """Gone for good; ``in_run``: a message of the queue's runs (purge), not in the index."""
        self.dequeued_rid(message.rid, in_run)

    def dequeued_rid(self, value: int, in_run: bool = False) -> None:
        """``dequeued`` by rid (a purge names a run's messages from its arrays)."""
        if self.index.pop(value, None) is None and not in_run:
            return
        self.acquired.discard(value)
        event = None
        for stream in self.streams.values():
            if stream.cancel(value):
                continue  # consumed before its enqueue went out (the common case under load)
            if dequeue_runs.coalesce(stream, value):
                continue  # one more rid in the run of dequeues the stream ends with
            if event is None:
                event = Event(DEQUEUE, value)
                ticket, now = self.ticket, self.clock()
            stream.add(event, ticket, now)

    # -- backups ----------------------------------------------------------------------
    def attach(self, node: str, now: float) -> BackupStream:
        """A backup's link arrived: a fresh stream, beginning with a catch-up of everything."""
        stream = BackupStream(node, peers=self.peers)
        stream.catchup = catchup.start(self)  # the sync point; sent newest first
        stream.catchup_total = len(stream.catchup)
        stream.acked_at = now
        self.streams[node] = stream
        return stream

    def run_written(self, chunk) -> None:
        """A run of the queue is on disk (``proxy.queues.runs``): its messages leave the index."""
        catchup.run_written(self, chunk)

    def run_read(self, messages) -> None:
        """Messages of a run read back into memory: in the index again."""
        index = self.index
        for message in messages:
            index[message.rid] = message

    def detach(self, node: str, why: str = "link lost") -> BackupStream | None:
        """The backup's link ended, or it lags: its stream goes, and it leaves the ISR (by a
        proposal: until that is committed, nothing completes that it might not hold)."""
        stream = self.streams.pop(node, None)
        if stream is not None:
            stream.dropped = why
            stream.state = CopyState.LAGGING
        return stream

    def take_batch(self, node: str, now: float) -> tuple[int, list[Event]] | None:
        """The next batch for ``node`` (live events first, then catch-up), or None."""
        stream = self.streams.get(node)
        if stream is None:
            return None
        events, size, through = [], 0, None
        pending = stream.pending
        unsent_enqueues = stream.unsent_enqueues
        while pending and len(events) < MAX_BATCH_EVENTS:
            event, ticket, _ = pending[0]
            kind = event.kind
            if kind == RUN:  # consecutive dequeues: as many as fit, 9 bytes each
                room = min(MAX_BATCH_EVENTS - len(events), (MAX_BATCH_BYTES - size) // 9)
                if room <= 0:
                    break
                size += 9 * dequeue_runs.take(stream, event, events, room)
                through = ticket
                continue
            is_enqueue = kind == ENQUEUE
            if is_enqueue and event.rid not in unsent_enqueues:
                pending.popleft()  # an enqueue dequeued before it was sent
                stream.pending_bytes -= entry_cost(event)
                through = ticket
                continue
            event_size = event.size
            if events and size + event_size > MAX_BATCH_BYTES:
                break
            pending.popleft()
            stream.pending_bytes -= entry_cost(event)
            if is_enqueue:
                del unsent_enqueues[event.rid]
            events.append(event)
            size += event_size
            through = ticket
        if not pending:
            through = self.ticket  # nothing of this stream is older than now
            if stream.unsent_acquires and len(events) < MAX_BATCH_EVENTS:
                # acquires not sent and not settled since: after their enqueues, always
                for value in stream.unsent_acquires:
                    events.append(Event(ACQUIRE, value))
                stream.unsent_acquires.clear()
        ends_catchup = False
        if stream.catchup is not None:
            ends_catchup = catchup.take(self, stream, events, size, MAX_BATCH_EVENTS,
                                        MAX_BATCH_BYTES)
        if not events:
            if through is not None:
                # only enqueues consumed before they were sent (and their dequeues): the backup
                # need not hold them, so it holds those tickets as soon as it holds what it
                # was sent before -- now, or with the last batch still on its way
                if stream.unacked:
                    batch = stream.unacked[-1]
                    batch.through = max(batch.through, through)
                else:
                    stream.held_through = max(stream.held_through, through)
            return None
        number = stream.next_number
        stream.next_number += 1
        stream.unacked.append(SentBatch(number, now, through if through is not None else stream.held_through,
                                        ends_catchup))
        stream.last_sent = now
        if self.peers is not None:
            self.peers.sent(node, now)
        return number, events

    def take_keepalive(self, node: str, now: float, every: float) -> int | None:
        """The number of an empty batch for ``node``, an in-sync backup sent nothing for
        ``every`` seconds and owing nothing, or None. Its acknowledgement is all it is for:
        unanswered, it makes the silence of a backup visible (``answering``) while nothing
        waits here (docs/nemesis.md, finding 17)."""
        stream = self.streams.get(node)
        if (stream is None or node not in self.isr or stream.unacked or stream.pending
                or stream.unsent_acquires or stream.catchup is not None
                or now - stream.last_sent < every):
            return None
        number = stream.next_number
        stream.next_number += 1
        stream.unacked.append(SentBatch(number, now, self.ticket))
        stream.last_sent = now
        if self.peers is not None:
            self.peers.sent(node, now)
        return number

    def acked(self, node: str, number: int, now: float) -> None:
        """``node`` holds batch ``number`` (and, the link being ordered, every earlier one)."""
        stream = self.streams.get(node)
        if stream is None:
            return
        while stream.unacked and stream.unacked[0].number <= number:
            batch = stream.unacked.popleft()
            stream.held_through = max(stream.held_through, batch.through)
            stream.catchup_acked = stream.catchup_acked or batch.ends_catchup
        stream.acked_at = now
        if self.peers is not None:
            self.peers.answered(node)

    def lagging(self, now: float, silent_after: float | None = None) -> list[tuple[str, str]]:
        """Backups to drop now: (node, why). ``silent_after``: an in-sync backup that has not
        acknowledged a batch sent that long ago (it answers nothing: paused, cut off) is
        dropped then, not after ``catchup_timeout``, while the copies left still make
        ``min_in_sync`` (issue #42; with fewer the primary steps down instead, copies.py)."""
        out = []
        left = 1 + len(self.isr)
        # with min_in_sync >= 2, silent backups are dropped only while another in-sync backup
        # answers: when none does, this primary is the one cut off, and steps down instead
        # (copies.py _starved), leaving the in-sync set whole for the one that takes over
        if silent_after is not None and self.min_in_sync >= 2 \
                and not self.answering(now, silent_after):
            silent_after = None
        for node, stream in self.streams.items():
            since = stream.behind_since()
            if since is not None and now - since > self.catchup_timeout:
                out.append((node, f"{now - since:.1f}s behind (catchup_timeout {self.catchup_timeout:g}s)"))
            elif stream.memory > MAX_STREAM_BYTES:
                out.append((node, f"{stream.memory} bytes waiting for it"))
            elif (silent_after is not None and node in self.isr
                  and stream.silent_for(now) > silent_after and left - 1 >= self.min_in_sync):
                left -= 1
                out.append((node, f"no acknowledgement for {stream.silent_for(now):.1f}s"))
        return out

    def answering(self, now: float, silent_after: float) -> bool:
        """Whether some in-sync backup acknowledges: none has owed an answer unheard for longer
        than ``silent_after`` (``BackupStream.silent_for``)."""
        for node in self.isr:
            stream = self.streams.get(node)
            if stream is not None and stream.silent_for(now) <= silent_after:
                return True
        return False

    # -- the in-sync set ----------------------------------------------------------------
    def wanted_isr(self) -> frozenset:
        """Who should be in the ISR now: the committed members still attached and not
        dropped, and every backup whose catch-up is acknowledged."""
        keep = {node for node in self.isr if node in self.streams}
        keep |= {node for node, s in self.streams.items() if s.catchup_acked}
        return frozenset(keep)

    def proposal(self) -> frozenset | None:
        """An ISR to write, if it differs from the committed one and none is being written."""
        if self._proposed is not None:
            return None
        wanted = self.wanted_isr()
        if wanted == self.isr:
            return None
        self._proposed = wanted
        return wanted

    def isr_committed(self, isr: frozenset | None) -> None:
        """The proposal was written (``isr``), or failed (None: propose again later)."""
        self._proposed = None
        if isr is None:
            return
        self.isr = isr
        now = self.clock()
        for node, stream in self.streams.items():
            if node in isr and stream.catchup_acked and stream.state != CopyState.READY:
                stream.state = CopyState.READY
                stream.add(Event(IN_SYNC, 0), self.ticket, now)  # it may be promoted now
            elif node not in isr and stream.state == CopyState.READY:
                stream.state = CopyState.LAGGING

    # -- delayed completion -------------------------------------------------------------
    def wait(self, ticket: int, token) -> None:
        self.waiting.append((ticket, token))

    def completed(self) -> list:
        """Tokens of deliveries that may be accepted now, in order."""
        if self.fenced or not self.waiting:
            return []
        if any(node not in self.streams for node in self.isr):
            return []  # an ISR member without a link: wait until its removal is committed
        # a backup being added counts once its joining is committed
        members = [self.streams[node] for node in self.isr]
        if 1 + len(members) < self.min_in_sync:
            return []
        held = min((s.held_through for s in members), default=self.ticket)
        done = []
        waiting = self.waiting
        while waiting and waiting[0][0] <= held:
            done.append(waiting.popleft()[1])
        self.accepted += len(done)
        return done

    def forget(self, which) -> None:
        """Waiting deliveries whose link went away (``which(token)`` true) wait no more
        (their messages stay in the queue)."""
        if self.waiting:
            self.waiting = deque(item for item in self.waiting if not which(item[1]))

    def describe(self, now: float) -> dict:
        return {
            "epoch": self.epoch,
            "in_sync": sorted(self.isr),
            "waiting_acceptance": len(self.waiting),
            "backups": [
                {"node": node, "state": str(s.state),
                 "lag_messages": s.lag_events + sum(1 for _ in s.unacked),
                 "lag_ms": round(1000 * (now - s.behind_since()), 1) if s.behind_since() else 0.0,
                 "catchup_left": len(s.catchup) if s.catchup else 0,
                 "stream_bytes": s.memory}
                for node, s in sorted(self.streams.items())
            ],
        }
