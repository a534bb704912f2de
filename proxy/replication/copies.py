"""A node's copy of one replicated queue, as primary or as backup: the protocol's I/O glue.

How this works
--------------
``PrimaryCopy`` joins a ``ReplicatedQueue`` (what clients use) and its
``ReplicaSet`` (the protocol, ``proxy.replication.primary``) to the links:
one ``ReplicationPusher`` per backup. After every broker cycle that touched
the queue (``after_dispatch``) and whenever a backup grants credit, each
backup gets what waits for it, one batch per credit. Acknowledgements
complete producers' deliveries (``QueueProducer.confirmed``) and may change
the in-sync set: every proposal is written through ``write_isr`` (the
service: etcd, or this node's state) and committed when written. Every
``LAG_CHECK`` seconds lagging backups are dropped (their link is detached;
they come back with a new catch-up after ``REATTACH``). ``fence()`` stops it
all: nothing is settled any more and clients' links end.

``BackupCopy`` keeps a ``ReplicaImage`` filled by the current ``ReplicaSink``
(one at a time: a new primary's link replaces the old one, a lower epoch is
refused). A durable copy journals what each batch adds and removes, and the
batch is acknowledged once the journal has it on disk. ``promote()`` turns
the copy into the queue's content.
"""

from __future__ import annotations

import asyncio
import logging

from proxy.paging.store import body
from proxy.queues import durable as journal_queues
from proxy.queues.local import StoredMessage

from . import catchup, promote_runs
from .backup_silence import cut_off_alone
from .links import LAGGING, STALE_EPOCH, ReplicaSink, ReplicationPusher, announce
from .primary import ReplicaSet
from .replica import ReplicaImage, StaleEpoch
from .states import CopyRole, CopyState

log = logging.getLogger("fedgate.replication")

LAG_CHECK = 0.5  # seconds between looks for lagging backups
# an idle in-sync backup of a queue with clients gets an empty batch at each look (LAG_CHECK)
KEEPALIVE = LAG_CHECK / 2
# per backup, sent and not acknowledged yet. One: while a batch is on its way, events wait,
# and a message consumed meanwhile never goes to the backup at all (primary.py's coalescing).
# With a fast consumer that is most of them: on 2 cores the primary's CPU per message fell
# from 14.2 to 12.2 µs against 2 in flight (bench/README.md, replicated queues).
BATCHES_IN_FLIGHT = 1
REATTACH = 1.0  # seconds before a dropped backup is sent a new catch-up
COMPLETE_AGAIN = 0.05  # seconds before completing again what the lease's clock held back


def aside_margin(lease: float) -> float:
    """Beyond a lease of silence, how long a primary with ``min_in_sync = 1`` waits before it
    tells gone backups (their leases ended) from living ones (docs/replication.md, 5b): etcd
    revokes an expired lease within half a second, and its watch tells at once."""
    return max(0.75, lease / 4)


class PrimaryCopy:
    def __init__(self, service, entry, queue, epoch: int, settings, *,
                 isr: frozenset = frozenset()) -> None:
        """``entry``: the ReplicatedAddress (its ``wire`` name and ``resource`` go on the links)."""
        self.service = service
        self.node = service.node
        self.node_id = service.node.node_id
        self.address = entry.wire
        self.resource = entry.resource
        self.entry = entry
        self.queue = queue
        self.epoch = epoch
        loop = asyncio.get_running_loop()
        self.loop = loop
        self.replica_set = ReplicaSet(entry.wire, epoch, loop.time, min_in_sync=settings.min_in_sync,
                                      catchup_timeout=settings.catchup_timeout, isr=isr,
                                      peers=getattr(service, "backup_silence", None))
        catchup.index_content(self.replica_set, queue)  # promoted or recovered content
        self.pushers: dict[str, ReplicationPusher] = {}
        self._retry: dict[str, asyncio.TimerHandle] = {}
        self.fenced = False
        queue.serve_replicas(self.replica_set, self._changed)
        queue.after_dispatch = self._after_dispatch
        # a transaction's commit into the queue is answered once the in-sync copies hold it
        queue.commit_barrier = self._commit_barrier
        self._timer = loop.call_later(LAG_CHECK, self._check_lag)
        self._stuck_since, self._stuck_at = None, -1  # since when nothing was accepted (_starved)
        self._heard_before = None  # peers' activity when the backups fell silent (_cut_off_alone)
        self._listening_since = 0.0  # when _heard_before was taken
        self._hold_drop = False  # _cut_off_alone: no silent backup dropped at this look
        self._complete_timer: asyncio.TimerHandle | None = None  # _complete, when acting again

    # -- backups ----------------------------------------------------------------------
    def set_backups(self, backups: dict[str, str]) -> None:
        """Replicate to ``backups`` (node id -> AMQP URL), and no longer to anyone else."""
        if self.fenced:
            return
        for node in [n for n in self.pushers if n not in backups]:
            self._drop(node, "no longer in the replica set")
        for node, url in backups.items():
            if node not in self.pushers:
                upstream = self.node.broker.upstreams.for_url(url, self.service.peer_options)
                self.pushers[node] = ReplicationPusher(self, node, upstream)

    def backup_attached(self, pusher: ReplicationPusher) -> None:
        stream = self.replica_set.attach(pusher.backup, self.loop.time())
        log.info("queue %s: backup %s attached (epoch %d): catching up %d messages",
                 self.address, pusher.backup, self.epoch, len(stream.catchup))
        self.flush_backup(pusher)

    def backup_lost(self, pusher: ReplicationPusher, why: str, *, stale: bool = False) -> None:
        if self.replica_set.detach(pusher.backup, why) is not None:
            log.warning("queue %s: backup %s out of sync: %s", self.address, pusher.backup, why)
        self._propose()
        if stale:  # the backup follows a higher epoch: another node is primary now
            self.service.stale(self.entry, f"backup {pusher.backup} follows a higher epoch")
            return
        if not self.fenced and pusher.up_state.value == "refused":
            self._retry_later(pusher.backup)

    def backup_acked(self, pusher: ReplicationPusher, number: int) -> None:
        self.replica_set.acked(pusher.backup, number, self.loop.time())
        self._propose()
        self.flush_backup(pusher)
        self._complete()  # after the flush: a flush of cancelled events only completes some too

    def flush_backup(self, pusher: ReplicationPusher) -> None:
        if self.fenced:
            return
        replica_set, now = self.replica_set, self.loop.time()
        stream = replica_set.streams.get(pusher.backup)
        # at most BATCHES_IN_FLIGHT unacknowledged: under load, events wait for the next
        # batch and an enqueue consumed meanwhile is never sent (primary.py's coalescing)
        while pusher.credit > 0 and stream is not None and len(stream.unacked) < BATCHES_IN_FLIGHT:
            batch = replica_set.take_batch(pusher.backup, now)
            if batch is None:
                break
            pusher.send(*batch)

    def _retry_later(self, node: str) -> None:
        if node in self._retry:
            return

        def again() -> None:
            self._retry.pop(node, None)
            pusher = self.pushers.get(node)
            if pusher is not None and not self.fenced:
                pusher.reattach()
        self._retry[node] = self.loop.call_later(REATTACH, again)

    def _drop(self, node: str, why: str) -> None:
        pusher = self.pushers.pop(node, None)
        if pusher is not None:
            pusher.drop()
        self.replica_set.detach(node, why)
        timer = self._retry.pop(node, None)
        if timer is not None:
            timer.cancel()
        self._propose()

    def _keepalive(self) -> None:
        """With etcd, and clients on the queue (here or through a peer): an empty batch to each
        idle in-sync backup every ``KEEPALIVE``. Producers of other nodes reach this primary
        through its peers; cut off from them, nothing waits here, and without a batch out
        nothing showed that the backups answer nothing: the primary held the queue for the
        whole cut (docs/nemesis.md, finding 17). A queue nobody uses sends one only when no
        queue of this node sent that backup anything for ``LAG_CHECK`` (one per backup node,
        not per queue: a backup's silence is its node's, finding 29). And when a backup node's
        silence crosses half a lease, who has been heard so far is noted for every queue."""
        if not self.service.automatic:
            return
        now, sent = self.loop.time(), False
        in_use, peers = self._in_use(), self.replica_set.peers
        for node, pusher in self.pushers.items():
            if pusher.credit > 0 and (in_use or (peers is not None
                                                 and peers.keepalive_due(node, now, LAG_CHECK))):
                number = self.replica_set.take_keepalive(node, now, KEEPALIVE)
                if number is not None:
                    pusher.send(number, [])
                    sent = True
            if peers is not None and peers.wants_listening(node, now, self.service.lease_ttl() / 2):
                peers.listen(node, now, self.service.peer_activity())
        if sent:  # a timer's doing: no input cycle flushes it
            self.node.broker.run_pending()

    def _in_use(self) -> bool:
        return bool(self.queue.consumers or self.queue.producers)

    def _check_lag(self) -> None:
        self._timer = None
        if self.fenced:
            return
        self._keepalive()
        self._hold_drop = False
        if self._starved() or self._cut_off_alone():
            return
        silent_after = self.service.lease_ttl() if self.service.automatic else None
        if silent_after is not None and self.replica_set.min_in_sync < 2:
            silent_after += aside_margin(silent_after)  # _cut_off_alone looks first
        if self._hold_drop or not (self.replica_set.waiting or self._in_use()):
            # _cut_off_alone listens for other peers a while longer; or nothing waits here
            # and nobody uses the queue: dropping a silent backup would gain nothing
            silent_after = None
        for node, why in self.replica_set.lagging(self.loop.time(), silent_after):
            log.warning("queue %s: backup %s dropped from the in-sync set: %s", self.address, node, why)
            self.replica_set.detach(node, why)
            if self.replica_set.peers is not None:
                self.replica_set.peers.judged(node)
            pusher = self.pushers.get(node)
            if pusher is not None:
                pusher.detach_upstream_link()  # it catches up again after REATTACH
                self._retry_later(node)
        self._propose()
        self._timer = self.loop.call_later(self._next_look(), self._check_lag)

    def _next_look(self) -> float:
        """Seconds to the next look: ``LAG_CHECK``, or sooner when the in-sync backups' silence
        crosses a mark the looks judge by (half a lease, a lease, a lease and the margin): a
        primary cut off stands aside at the mark, not up to a look later."""
        streams = [self.replica_set.streams.get(n) for n in self.replica_set.isr]
        if not self.service.automatic or not streams or None in streams:
            return LAG_CHECK
        now, lease = self.loop.time(), self.service.lease_ttl()
        silence = min(stream.silent_for(now) for stream in streams)
        if silence <= 0.0:
            return LAG_CHECK
        marks = [mark - silence for mark in (lease / 2, lease, lease + aside_margin(lease))
                 if mark > silence]
        return min([LAG_CHECK] + [m + 0.001 for m in marks])

    def _starved(self) -> bool:
        """Producers wait here for copies this primary cannot reach: with ``min_in_sync`` > 1 and
        nothing accepted for longer than a lease, while the backups of the in-sync set stay in
        it (they hold everything accepted), this primary steps down (fenced, its claim
        released) so that one of them, which may reach the others, serves the queue (issue #42:
        a primary cut off from its peers but not from etcd held the queue, accepting nothing,
        for as long as the cut lasted); no other peer heard either: it stands aside. With etcd."""
        replica_set = self.replica_set
        if replica_set.min_in_sync < 2 or not self.service.automatic:
            self._stuck_since = None
            return False
        if not replica_set.waiting or not replica_set.isr:
            self._stuck_since = None
            return False
        now = self.loop.time()
        if replica_set.accepted != self._stuck_at:
            self._stuck_since, self._stuck_at = now, replica_set.accepted
            return False
        if now - self._stuck_since < self.service.lease_ttl():
            return False
        if replica_set.answering(now, self.service.lease_ttl()):
            # another in-sync backup answers: the silent one is dropped (ReplicaSet.lagging),
            # not this primary (issue #42: a backup cut off from its peers made the primary
            # step down, and the cut-off backup took the queue and could reach no copy)
            return False
        why = (f"nothing accepted for {now - self._stuck_since:.1f} s: the in-sync backups "
               f"({', '.join(sorted(replica_set.isr))}) do not answer; one of them takes over")
        peers = replica_set.peers  # no other peer heard either: it stands aside (finding 30)
        if peers is not None and peers.alone(set(replica_set.isr), set(self.service.members()),
                                             self.node_id, self.service.peer_activity()):
            self.entry.stand_aside(why + "; this node is the one cut off")
        else:
            self.service.stale(self.entry, why)
        return True

    def _cut_off_alone(self) -> bool:
        """None of the in-sync backups answers, while producers wait here (``min_in_sync = 1``;
        with more, ``_starved`` judges) or while the queue has clients and nothing waits here
        (any ``min_in_sync``: the keepalives show the silence; clients of other nodes may be
        the ones waiting, docs/nemesis.md, finding 17). Gone (no live member in etcd any
        more), they are dropped and this primary goes on alone (``lagging``). Alive, and no
        other peer heard since the silence began (or none to hear, with two or more of them
        silent): this primary is the one cut off, and it stands aside (docs/replication.md,
        5b; docs/nemesis.md, finding 12)."""
        replica_set = self.replica_set
        waiting = bool(replica_set.waiting)
        # with min_in_sync >= 2 and producers waiting, _starved judges; with nothing waiting
        # here, clients elsewhere may wait: the keepalives show the silence to both
        if (not self.service.automatic or not replica_set.isr
                or (replica_set.min_in_sync >= 2 and waiting)
                or not (waiting or self._in_use())):
            self._heard_before = None
            return False
        now, lease = self.loop.time(), self.service.lease_ttl()
        if replica_set.answering(now, lease / 2):
            self._heard_before = None
            return False
        silent = set(replica_set.isr)
        peers = replica_set.peers
        if peers is not None and all(peers.was_judged(node) for node in silent):
            # the node's other queues found these backups cut off, in this same silence
            # (finding 29): dropped (lagging) without listening again
            self._heard_before = None
            return False
        if self._heard_before is None:  # silent for half a lease: who has been heard so far
            shared = peers.listening(silent) if peers is not None else None
            if shared is None:  # noted here, as the backups' silence crosses half a lease
                self._heard_before = self.service.peer_activity()
                self._listening_since = now
                self._hold_drop = True
                return False
            # noted when the backup nodes' silence crossed half a lease, on any queue
            self._listening_since, self._heard_before = shared
        if replica_set.answering(now, lease + aside_margin(lease)):
            return False
        members = set(self.service.members())
        if not silent <= members:
            return False  # a backup is gone: the silent ones are dropped (lagging)
        if not cut_off_alone(silent, members, self.node_id, self._heard_before,
                             self.service.peer_activity()):
            return False  # the backups are the ones cut off, or nothing tells: dropped
        if now - self._listening_since < lease / 2 + aside_margin(lease) - 0.01:
            # the silence was long already when this queue began to listen (its backups
            # silent on the node's other queues first, finding 29): listen as long as a
            # queue that saw the silence grow does, before judging this node cut off
            self._hold_drop = True
            return False
        self.entry.stand_aside(
            f"its in-sync backups ({', '.join(sorted(silent))}) answer nothing for "
            f"{lease + aside_margin(lease):.2f} s yet keep their leases, and no other peer was "
            "heard: this node is the one cut off; a backup takes over")
        return True

    # -- the queue's cycle ---------------------------------------------------------------
    def _changed(self, queue) -> None:
        self.node.broker.dirty_queues.add(queue)

    def _after_dispatch(self, queue) -> None:
        for pusher in self.pushers.values():
            if pusher.credit > 0:
                self.flush_backup(pusher)
        self._complete()

    def _commit_barrier(self, done) -> None:
        replica_set = self.replica_set
        replica_set.wait(replica_set.ticket, done)
        self.node.broker.dirty_queues.add(self.queue)  # the batch goes out in this cycle

    def _complete(self) -> None:
        if self.service.automatic and not self.service.coordinator.acting():
            # the lease's clock says this node may act no more, and the fence has not come yet
            # (a pause just ended: its input is read before its timers run): nothing is
            # settled; the fence hands what waits to the new primary (docs/nemesis.md, 20), or
            # a renewal comes in time and it is settled then
            if self._complete_timer is None:
                self._complete_timer = self.loop.call_later(COMPLETE_AGAIN, self._complete_again)
            return
        producers = {}  # each producer's credit is topped up once, after its run (ordered)
        for token in self.replica_set.completed():
            if callable(token):  # a commit's barrier (proxy.transactions)
                token()
            else:
                producer, delivery = token[0], token[1]
                producer.confirmed(delivery)
                producers[producer] = None
        for producer in producers:
            producer.after_confirmed()

    def _complete_again(self) -> None:
        self._complete_timer = None
        if not self.fenced:
            self._complete()

    # -- the in-sync set ------------------------------------------------------------------
    def _propose(self) -> None:
        if self.fenced:
            return
        proposal = self.replica_set.proposal()
        if proposal is not None:
            self.service.write_isr(self, proposal)

    def isr_written(self, isr: frozenset | None) -> None:
        """The service wrote the proposal (``isr``), or could not (None: proposed again)."""
        if self.fenced:
            return
        self.replica_set.isr_committed(isr)
        if isr is not None:
            log.info("queue %s: in-sync backups now %s (epoch %d)", self.address,
                     sorted(isr) or "none", self.epoch)
            self.entry.in_sync_changed(isr)
            self._complete()
            for pusher in self.pushers.values():
                self.flush_backup(pusher)
            self._propose()  # what changed meanwhile
        else:
            self.loop.call_later(REATTACH, self._propose)
        self.node.broker.run_pending()

    # -- the end of the reign ---------------------------------------------------------------
    def fence(self, why: str) -> None:
        """Stop acting at once (docs/replication.md): settle nothing more. Clients' links stay to
        go on at the new primary (``entry.clients_moved``), with producers' unconfirmed ones."""
        if self.fenced:
            return
        self.fenced = True
        self.replica_set.fenced = True
        log.warning("queue %s: primary fenced (epoch %d): %s", self.address, self.epoch, why)
        if self._timer is not None:
            self._timer.cancel()
        for timer in self._retry.values():
            timer.cancel()
        for pusher in self.pushers.values():
            pusher.drop()
        self.pushers.clear()
        held: dict = {}  # producer -> [(payload, delivery)] not accepted yet, in order
        for _, token in self.replica_set.waiting:
            if isinstance(token, tuple):
                producer, delivery, payload = token
                held.setdefault(producer, []).append((payload, delivery))
        self.replica_set.waiting.clear()
        for producer in held:
            producer.unconfirmed = 0
        queue = self.queue
        queue.stop_replicas()
        queue.after_dispatch = None
        queue.commit_barrier = None  # commits waiting here end with their outcome unknown
        self.entry.clients_moved(queue, f"queue {self.address}: this node is no longer its "
                                        f"primary ({why})", held)
        self.node.broker.run_pending()

    def describe(self) -> dict:
        out = self.replica_set.describe(self.loop.time())
        for backup in out["backups"]:  # its release, as its link's attach said (docs/upgrades.md)
            pusher = self.pushers.get(backup["node"])
            backup["version"] = pusher.peer_version if pusher and pusher.attached_once else None
        return out


class BackupCopy:
    def __init__(self, service, address: str, *, durable: bool) -> None:
        self.service = service
        self.node = service.node
        self.address = address
        self.durable = durable
        loop = asyncio.get_running_loop()
        self.loop = loop
        self.image = ReplicaImage(address)
        self.role = CopyRole(loop.time())
        self.sink: ReplicaSink | None = None
        self.primary: str | None = None
        # caught up, link lost before the primary said it is in sync (proxy.replication.eligible)
        self.unconfirmed_at: float | None = None
        self.unconfirmed_seen: float | None = None  # the owner first seen gone since

    @property
    def ready(self) -> bool:
        """Caught up and written into the in-sync set by the primary (an ``S`` event), and not
        dropped by it since. Its link may be gone (the primary died): whether it may take over
        is for the in-sync set recorded in etcd to say (proxy.replication.eligible)."""
        return not self.image.catching_up and self.image.in_sync

    def accept(self, handler, link, primary: str, epoch: int) -> ReplicaSink | None:
        """A primary's replication link: a new catch-up, or refused when its epoch is stale."""
        if epoch < self.image.epoch:
            handler.refuse_link(link, STALE_EPOCH, f"queue {self.address}: this copy follows "
                                                   f"epoch {self.image.epoch}, not {epoch}")
            return None
        if self.sink is not None:
            self.sink.fail(LAGGING, "replaced by a new replication link")
        store = getattr(getattr(self.node, "pager", None), "store", None)  # its runs' records
        self._pages_removed(self._journal_removed(self.image.restart(epoch, store)))
        self.unconfirmed_at = self.unconfirmed_seen = None
        self.primary = primary
        announce(link)  # our release and features, in our answer (docs/upgrades.md)
        handler.open_link(link)
        sink = ReplicaSink(handler, link, self, primary, epoch)
        handler.links[sink.link_ptr] = sink
        self.sink = sink
        self.role.move(CopyState.CATCHING_UP, self.loop.time(), f"primary {primary}, epoch {epoch}")
        sink.grant()
        return sink

    def apply(self, sink: ReplicaSink, batch, item) -> None:
        if sink is not self.sink:
            return
        try:
            changes = self.image.apply(batch)
        except StaleEpoch as exc:
            sink.fail(STALE_EPOCH, f"queue {self.address}: {exc}")
            return
        if self.image.in_sync and self.role.state == CopyState.CATCHING_UP:
            self.role.move(CopyState.READY, self.loop.time(), "in the in-sync set")
        journal = self.node.broker.journal if self.durable else None
        wait_for = self._journal(journal, changes) if journal is not None and \
            journal.error is None else None
        pager = getattr(self.node, "pager", None)
        if pager is not None:  # bodies to disk beyond the node's budget (docs/paging.md),
            pager.image_changes(self.image, changes)  # with their journal ids (a promotion)
        if not wait_for or wait_for <= journal.durable_batch:
            sink.settle(item)
            return
        journal.wait(_BatchOnDisk(sink, item, wait_for))

    def _journal(self, journal, changes) -> int:
        """A batch's changes journaled; the journal batch to wait for (0: none)."""
        wait_for = 0
        for _, entry in changes.added:
            if journal_queues.header_durable(entry.payload):
                entry.journal_id, wait_for = journal.enqueue(self.address, entry.payload)
        for entry in changes.removed:
            if entry.journal_id:
                journal.dequeue(entry.journal_id)  # a lost dequeue only means a redelivery
        for _, entry in changes.rewritten:
            if entry.journal_id:
                journal.dequeue(entry.journal_id)
                entry.journal_id, wait_for = journal.enqueue(self.address, entry.payload)
        return wait_for

    def _journal_removed(self, entries) -> list:
        journal = self.node.broker.journal if self.durable else None
        if journal is not None:
            for entry in entries:
                if entry.journal_id:
                    journal.dequeue(entry.journal_id)
        return entries

    def _pages_removed(self, entries) -> None:
        pager = getattr(self.node, "pager", None)
        if pager is not None:
            for entry in entries:
                pager.entry_gone(entry)

    def sink_gone(self, sink: ReplicaSink, dropped: bool) -> None:
        """The link ended: ``dropped`` by the primary (lagging: out of the in-sync set), else
        lost with its connection (the copy stays what it was: the primary may be dead)."""
        if sink is not self.sink:
            return
        self.sink = None
        if not dropped and self.role.state == CopyState.CATCHING_UP and \
                not self.image.catching_up and not self.image.in_sync:
            self.unconfirmed_at = self.loop.time()  # caught up; the S never came
        if dropped or self.role.state == CopyState.CATCHING_UP:
            self.image.in_sync = False
            self.role.move(CopyState.LAGGING, self.loop.time(),
                           "dropped by the primary" if dropped else "link lost during catch-up")

    def promote(self) -> list:
        """The copy as the queue's content (rids kept, in order; out with a consumer: counted):
        messages, and its runs handed over as they are (``promote_runs``: not read)."""
        if self.sink is not None:
            self.sink.fail(STALE_EPOCH, f"queue {self.address}: promoted to primary")
            self.sink = None
        content = promote_runs.promote(self.image, getattr(self.node, "pager", None))
        self._journal_rewrites([m for m in content if type(m) is StoredMessage])
        return content

    def _journal_rewrites(self, content: list[StoredMessage]) -> None:
        """Delivery-counts raised by promotion are journaled too (a restart keeps them); the
        runs' messages keep their journal records (docs/paging_failover.md)."""
        journal = self.node.broker.journal if self.durable else None
        if journal is None:
            return
        for message in content:
            if message.journal_id:
                journal.dequeue(message.journal_id)
                message.journal_id, _ = journal.enqueue(self.address, body(message))

    def close(self) -> None:
        if self.sink is not None:
            self.sink.fail(LAGGING, f"queue {self.address}: copy dropped here")
            self.sink = None
        self.image.close(getattr(getattr(self.node, "pager", None), "store", None))
        self._pages_removed(list(self.image.messages.values()))

    def describe(self) -> dict:
        return {"state": str(self.role.state), "primary": self.primary, "epoch": self.image.epoch,
                "depth": self.image.depth, "bytes": self.image.bytes,
                "catching_up": self.image.catching_up, "in_sync": self.image.in_sync,
                "unconfirmed": self.unconfirmed_at is not None}


class _BatchOnDisk:
    """Waits for the journal to have a backup's batch on disk, then acknowledges it."""

    def __init__(self, sink: ReplicaSink, item: list, batch: int) -> None:
        self.sink, self.item, self.batch = sink, item, batch

    def journal_progress(self, durable_batch: int, error) -> bool:
        if durable_batch < self.batch and error is None:
            return True  # still waiting
        if error is None:
            self.sink.settle(self.item)
        else:
            self.sink.fail("amqp:internal-error", f"journal write failed: {error}")
        return False
