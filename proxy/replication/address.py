"""One replicated queue as this node sees it: who owns it, this node's copy, clients' links.

How this works
--------------
``ReplicatedAddress`` decides where a client's link goes and what this node's
copy does (docs/replication.md):

* a **replication link** (a primary pushing to this node) makes this node a
  backup of that primary, unless its epoch is stale; a primary copy here that
  sees a higher epoch fences itself first;
* a **client link** goes to the local queue when this node is the primary,
  through the proxy path to the owner when another node is, and waits
  (``PendingLink``: attached, no credit) while nobody knows the owner yet: then
  this node tries to settle it (``_resolve``): a queue nobody ever claimed is
  claimed by its preferred node (the first of the replica set; others proxy
  their clients there, which makes it claim); an existing queue whose owner is
  gone is claimed by an eligible copy only (the last primary or a member of the
  in-sync set it recorded, holding its copy), in a transaction conditional on
  that record. Waiting links go on once the owner is known; proxies follow the
  owner when it changes (``rehome``).

Becoming primary takes the content of the backup copy (or what the journal
recovered), the new epoch, and starts pushing to the other members of the
replica set. A primary fenced (lease lost, another owner seen) ends its
clients' links and keeps nothing: it will be a backup again.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from proxy.broker.handler import LinkRefused
from proxy.paging.store import body
from proxy.queues.local import StoredMessage
from routing.replication import replicas_of

from . import catchup, eligible, recovered
from .copies import BackupCopy, PrimaryCopy
from .parked import PendingLink, hold_link, park, release_links, shed_stuck  # noqa: F401
from .queue import ReplicatedQueue
from .states import CopyState

log = logging.getLogger("fedgate.replication")

NOT_ALLOWED = "amqp:not-allowed"
RETRY = 1.0  # seconds before trying again to settle who owns a queue
HAND_BACK = 2.0  # seconds a fragment's home member is in sync before it gets the fragment back
RECHECK = 0.2  # seconds before looking again when a claim lost to a changed record
REFUSED_RETRY = 0.5  # seconds before a link the owner refused looks for it again


@dataclass(frozen=True)
class ReplicationSettings:
    replicas: int = 2
    nodes: tuple = ()
    min_in_sync: int = 1
    durable: bool = False
    catchup_timeout: float = 10.0

    @classmethod
    def of(cls, rule) -> "ReplicationSettings":
        return cls(replicas=replicas_of(rule), nodes=tuple(rule.nodes), min_in_sync=rule.min_in_sync,
                   durable=rule.durable, catchup_timeout=rule.catchup_timeout)


class PromoteRefused(Exception):
    """A promote request that would lose messages or cannot be done; the message says why."""


class ReplicatedAddress:
    """One replicated thing: a queue (``queue/<address>``) or one member's fragment of a
    fragmented queue (``fragment/<address>/<member>``, its home member first in placement).

    ``address`` is the local queue's name while this node is primary (the address itself;
    for a fragment this node adopted from its home member, ``<address>@<member>``); ``wire``
    names the copy on replication links and in logs; ``listener`` (fragments) hears when
    this node becomes primary or stops being it.
    """

    def __init__(self, service, address: str, settings: ReplicationSettings, *,
                 resource: str | None = None, wire: str | None = None, home: str | None = None,
                 listener=None) -> None:
        self.service = service
        self.node = service.node
        self.node_id = service.node_id
        self.address = address
        self.settings = settings
        self.resource = resource or "queue/" + address
        self.wire = wire or address
        self.home = home
        self.listener = listener
        self.claim = None  # this node's claim while it is primary (proxy.cluster.Claim)
        self.owner = None  # (node id, epoch) as known here
        self.last_primary: str | None = None  # the last owner known (failovers count changes)
        self.primary: PrimaryCopy | None = None
        self.backup: BackupCopy | None = None
        self.proxies: list = []  # proxy endpoints made for clients here
        self.pending: set[PendingLink] = set()
        self.recovered_messages: list | None = None  # from this node's journal, if any
        self._kept_epoch: int | None = None  # recovered_messages kept at a fence, of that epoch
        self.failovers = 0
        self.stood_aside = 0  # times this node stood aside as primary (stand_aside)
        self._resolving = False
        self._handing_back = None  # a timer: a fragment going back to its home member
        self._aside_until = 0.0  # stood aside (stand_aside): no claim before then
        known = service.coordinator.current_owner(self.resource)
        if known is not None:
            self.owner = (known.owner, known.epoch)
            self.last_primary = known.owner

    # -- links ------------------------------------------------------------------------------
    def attach(self, client, link) -> None:
        browse = link.is_sender and link.remote_source.distribution_mode == \
            link.remote_source.DIST_MODE_COPY
        target = self._target_for(client)
        if target is None:
            hold_link(client, link, self, browse)
            self._resolve()
            return
        self._route(client, link, target, browse)

    def _target_for(self, handler) -> str | None:
        """``_target`` for a link of ``handler``'s connection. A link from another fedgate node
        (its proxy) never goes back to that node, and is never relayed on by a node cut off
        from etcd: it waits here for the owner (two nodes with stale views of the owner would
        otherwise hand it to each other without end)."""
        target = self._target()
        if target is None or target == "local":
            return target
        peer = self.service.peer_of(handler)
        if peer is None:
            return target
        service = self.service
        if target == service.known.get(peer) or (service.automatic and not service.coordinator.acting()):
            return None
        return target

    def _route(self, client, link, target: str, browse: bool) -> None:
        if target == "local":
            queue = self.primary.queue
            if not link.is_sender:
                client.attach_queue_producer(link, queue)
            elif browse:
                client.attach_queue_browser(link, queue)
            else:
                client.attach_queue_consumer(link, queue)
            return
        upstream = self.node.broker.upstreams.for_url(target, self.service.peer_options)
        name = self._name_at(target)
        if link.is_sender:
            endpoint = client.attach_proxy_consumer(link, upstream, name)
        else:
            endpoint = client.attach_proxy_producer(link, upstream, name)
        endpoint.moved = self._proxy_ended
        self.proxies = [p for p in self.proxies if not p.closed]
        self.proxies.append(endpoint)

    def _name_at(self, url: str) -> str:
        """The name the owner at ``url`` serves this copy under: a fragment's home member serves
        it as its own fragment, under the fragmented queue's name; any other node as ``wire``
        (``<address>@<member>``). Sent to the home as ``wire``, a parked link was refused (``it
        moved``) and sent again at once, without end (docs/nemesis.md, 19). Not the owner's
        URL (a relay): ``address``, as before."""
        owner = self.owner[0] if self.owner is not None else None
        if self.home is None or owner is None or url != self.service.url_of(owner):
            return self.address
        return self.wire.rpartition("@")[0] if owner == self.home else self.wire

    def clients_moved(self, queue, description: str, held: dict) -> None:
        """This node stopped being the primary (fenced, or the queue handed back): its clients'
        links wait for the new owner and go on there through the proxy path (issue #42), with
        what producers had not had accepted. A link from another fedgate node (its proxy) is
        ended with ``amqp:link:detach-forced``: that node finds the new owner itself
        (``_proxy_ended``). A link still waiting after ``parked_limit`` ends its connection
        (``amqp:connection:forced``: a reset) and the client's failover list takes it elsewhere;
        on a fenced node, already after ``relay_limit`` when no peer answered its relay."""
        parked = []
        # proxies that followed this queue home through this node's own listener: their links
        # are parked below, and they follow the new owner (finding 31: stuck there too)
        followed = [p for p in self.proxies if not p.closed]
        for endpoint in [*queue.consumers, *queue.producers, *queue.browsers]:
            if not getattr(endpoint, "attached", True) or endpoint.link_ptr not in endpoint.handler.links:
                continue
            handler = endpoint.handler
            if self.service.is_peer(handler):
                handler.close_link(endpoint.link, "amqp:link:detach-forced", description)
            else:
                parked.append(park(endpoint, self, held.get(endpoint, [])))
        if not parked:
            return
        log.warning("%s: %d client links wait for the new primary", description, len(parked))
        loop = asyncio.get_running_loop()
        limit = self.service.parked_limit()
        # fenced, this node sends its clients' links on through a peer (relay_url); one that no
        # peer answers within ``relay_limit`` means this node is cut off from its peers too (a
        # one-way partition): its clients are better served by their failover list at once
        # than after ``limit`` (docs/nemesis.md, finding 13)
        relay = self.service.relay_limit()
        if self.service.silent_peers.isolated:  # stood aside: known cut off from every peer
            relay = 0.1
        loop.call_later(relay, shed_stuck, self, parked, description, relay, True, followed)
        loop.call_later(limit, shed_stuck, self, parked, description, limit, False, followed)
        self._go_on()

    def _proxy_ended(self, condition) -> bool:
        """The primary ended a proxy link made here: if it was fenced (it ends every link with
        detach-forced) or no longer has the queue, the link waits for the owner to be known
        again (``_go_on``), instead of ending the client's."""
        name = condition.name if condition is not None else ""
        if name not in ("amqp:link:detach-forced", "amqp:not-found", "fedgate:stale-epoch"):
            return False
        if self.service.automatic and name == "amqp:link:detach-forced":
            self._resolve()
        else:  # refused: looked for again after a pause, never at once (docs/nemesis.md, 19)
            asyncio.get_running_loop().call_later(
                REFUSED_RETRY if self.service.automatic else RETRY,
                self._resolve if self.service.automatic else self._go_on)
        return True

    def _target(self) -> str | None:
        """'local', the owner's AMQP URL, or None (not known yet)."""
        if self.primary is not None and not self.primary.fenced:
            return "local"
        if self.owner is not None and self.owner[0] != self.node_id:
            return self.service.url_of(self.owner[0]) or None
        if self.owner is None and not self.service.automatic:
            preferred = self._preferred()
            if preferred != self.node_id:
                return self.service.url_of(preferred)
        # cut off from etcd: another node routes the link on (it waits there for the owner)
        return self.service.relay_url(self.placement())

    def _go_on(self) -> None:
        """The owner is known now: waiting links are routed, proxies follow it."""
        target = self._target()
        if target is None:
            return
        for pending, handler, link in release_links(self, lambda h: self._target_for(h) != target):
            try:
                self._route(handler, link, target, pending.browse)
            except LinkRefused as refused:
                handler.close_link(link, refused.condition, refused.description)
                continue
            pending.routed()
        # proxies made earlier follow the owner (to this node too, through its own listener)
        url = self.service.url_of(self.node_id) if target == "local" else target
        if url is None:
            return
        pool = self.node.broker.upstreams.for_url(url, self.service.peer_options)
        name, live = self._name_at(url), []
        for endpoint in self.proxies:
            if endpoint.closed:
                continue
            endpoint.remote_address = endpoint.address = name
            if endpoint.upstream is not pool:
                endpoint.rehome(pool)
            elif endpoint.up_state.value == "refused":  # parked on the same primary: again
                endpoint.reattach()
            live.append(endpoint)
        self.proxies = live
        self.node.broker.run_pending()

    # -- replication links -------------------------------------------------------------------
    def replication_link(self, client, link, primary: str, epoch: int) -> None:
        """A primary pushes its copy here: this node is (or becomes) a backup of it."""
        if self.primary is not None:
            if epoch <= self.primary.epoch:
                raise LinkRefused("fedgate:stale-epoch", f"queue {self.wire}: this node is its "
                                                        f"primary at epoch {self.primary.epoch}")
            self.fence(f"{primary} replicates it at epoch {epoch}")
        if self.backup is None:
            self.backup = BackupCopy(self.service, self.wire, durable=self.settings.durable)
        if self.backup.accept(client, link, primary, epoch) is not None:
            self._forget_recovered()
            self._learn_owner(primary, epoch)

    def _forget_recovered(self) -> None:
        """Another node serves the queue and this one catches up from it: what its journal
        brought back is stale (and must not come back at the next restart)."""
        if self.recovered_messages is None:
            return
        recovered.let_go(self.node, self.recovered_messages, dequeue=True)  # pins released
        self.recovered_messages = None
        self._kept_epoch = None

    # -- ownership ------------------------------------------------------------------------------
    def placement(self) -> list[str]:
        """The replica set, preferred primary first (a fragment's: its home member)."""
        if self.home is None:
            return self.service.placement(self.address, self.settings)
        return self.service.fragment_placement(self.wire, self.home, self.settings)

    def _preferred(self) -> str:
        placement = self.placement()
        return placement[0] if placement else self.node_id

    def _learn_owner(self, node: str, epoch: int) -> None:
        if self.owner is not None and self.owner[1] > epoch:
            return
        if self.owner != (node, epoch):
            moved = self.owner is None or self.owner[0] != node
            self.owner = (node, epoch)
            self._count_failover(node)
            log.info("queue %s: primary %s (epoch %d)", self.wire, node, epoch)
            if moved and self.listener is not None:
                self.listener.copy_moved(self)
        self._go_on()

    def _count_failover(self, node: str) -> None:
        if self.last_primary is not None and self.last_primary != node:
            self.failovers += 1
        self.last_primary = node

    def owner_changed(self, claim) -> None:
        """The coordinator's watch: ``claim`` (None: nobody owns the queue now)."""
        if claim is None:
            if not self.service.automatic:
                return  # static: releases are this node's own (fence); nobody else is "gone"
            if self.primary is not None and not self.primary.fenced and self.claim is not None:
                self.fence("its claim is gone from etcd", keep=True)
            self.owner = None
            self._resolve()
            return
        if claim.owner != self.node_id and self.primary is not None and not self.primary.fenced:
            self.fence(f"{claim.owner} owns it at epoch {claim.epoch}")
        if claim.owner != self.node_id and self._kept_epoch is not None \
                and claim.epoch > self._kept_epoch:
            self._forget_recovered()  # kept at a fence: the new owner claimed with all of it
        if claim.owner == self.node_id and self.primary is not None:
            return
        self._learn_owner(claim.owner, claim.epoch)

    def resolve(self) -> None:
        """Settle who serves it now (a fragment's home member claims a fresh one)."""
        self._resolve()

    def _resolve(self) -> None:
        if self._resolving:
            return
        self._resolving = True
        self.service.spawn(self._resolve_owner())

    async def _resolve_owner(self) -> None:
        try:
            if not self.service.automatic:
                # static: the preferred node serves, unless a primary was promoted by hand
                if (self._preferred() == self.node_id and self.primary is None
                        and (self.owner is None or self.owner[0] == self.node_id)):
                    claim = await self.service.coordinator.claim(
                        self.resource, epoch_at_least=self._epoch_seen() + 1)
                    self.become_primary(claim)
                self._go_on()
                return
            known = self.service.coordinator.current_owner(self.resource)
            if known is not None:
                self.owner_changed(known)
                return
            record_bytes, record = await self.service.read_record(self.resource)
            log.debug("queue %s: no owner; record %s; this copy %s", self.wire, record,
                      self.backup.describe() if self.backup is not None else None)
            if record is not None and eligible.named(record, self.node_id) and \
                    not eligible.holds_copy(self):
                wait = eligible.unconfirmed_wait(self, record)
                if wait is None:
                    # named, but this node came back without its copy (not durable): it steps
                    # out of the record, so that when nobody named holds one the queue is
                    # served again, empty (docs/replication.md: every copy lost)
                    record_bytes, record = await eligible.step_out(self, record_bytes, record)
                elif wait > 0:  # caught up, never told: a copy that was told claims first
                    asyncio.get_running_loop().call_later(wait, self._recheck)
                    return
            if not self._eligible(record):
                nobody = record is None or (not record.get("primary") and not record.get("isr"))
                if nobody and self._preferred() != self.node_id:
                    # a new queue, or every copy named is gone: its preferred node makes it
                    # (again, empty) on our attach
                    self.owner = None
                    self._proxy_to_preferred()
                elif self.pending or self._preferred() == self.node_id:
                    # an eligible copy claims it (the watch tells us), or the copies named
                    # step out one by one and it falls to the preferred node: look again
                    asyncio.get_running_loop().call_later(RETRY, self._recheck)
                return
            claim = await self.service.claim(self.resource, record_bytes,
                                             epoch_at_least=self._epoch_seen() + 1)
            if claim is None:
                # another copy was faster (the watch tells us), or the record changed under
                # us (a copy stepped out): look again in a moment if nobody owns it then
                asyncio.get_running_loop().call_later(RECHECK, self._recheck)
                return
            self.become_primary(claim)
        except Exception as exc:  # etcd unreachable, fenced: try again in a while
            log.warning("queue %s: no owner settled now: %s", self.wire, exc)
            asyncio.get_running_loop().call_later(RETRY, self._resolve)
        finally:
            self._resolving = False

    def _recheck(self) -> None:
        if self.primary is None and self.service.coordinator.current_owner(self.resource) is None:
            self._resolve()

    def _epoch_seen(self) -> int:
        seen = self.owner[1] if self.owner is not None else 0
        if self.backup is not None:
            seen = max(seen, self.backup.image.epoch)
        return seen

    def _eligible(self, record: dict | None) -> bool:
        return eligible.eligible(self, record)

    def _proxy_to_preferred(self) -> None:
        url = self.service.url_of(self._preferred())
        if url is None:
            return
        for pending, handler, link in release_links(self):
            self._route(handler, link, url, pending.browse)
            pending.routed()
        self.node.broker.run_pending()

    def recovered(self, queue) -> None:
        """The journal brought messages back under this address before the service started."""
        self.recovered_messages = recovered.take(self.node, queue)  # bodies left in the journal
        self.node.queues.delete(queue.name)

    # -- roles ------------------------------------------------------------------------------------
    def become_primary(self, claim) -> None:
        registry = self.node.queues
        queue = registry.get(self.address)
        if queue is not None and not isinstance(queue, ReplicatedQueue):
            registry.delete(self.address)
            queue = None
        if queue is None:
            options = registry.defaults(self.address)
            options["durable"] = self.settings.durable
            queue = registry.declare(self.address, kind=ReplicatedQueue, **options)
        content, kept = [], self.recovered_messages or []
        if self.backup is not None and self.backup.image.depth:
            content = self.backup.promote()
            recovered.let_go(self.node, kept, dequeue=False)  # their pins
            kept = []
        if self.backup is not None:
            self.backup.close()
            self.backup = None
        self.recovered_messages = None
        self._kept_epoch = None
        for message in content:
            queue.restore(message)
        recovered.claim_with(queue, kept)
        self.claim = claim
        self.owner = (self.node_id, claim.epoch)
        self._count_failover(self.node_id)
        self.primary = PrimaryCopy(self.service, self, queue, claim.epoch, self.settings)
        if self._aside_until:  # it stood aside and no backup took over: it serves again
            self._aside_until = 0.0
            self.service.silent_peers.serving_again()
        log.warning("queue %s: this node is its primary now (epoch %d, %d messages)",
                    self.wire, claim.epoch, queue.depth)
        self.members_changed()
        if self.listener is not None:
            self.listener.copy_primary(self)
        self._go_on()

    def members_changed(self) -> None:
        if self.primary is None or self.primary.fenced:
            return
        backups = {}
        for node in self.placement():
            if node != self.node_id:
                url = self.service.url_of(node)
                if url is not None:
                    backups[node] = url
        # make before break: an in-sync backup the set leaves out stays until all of the set's
        # are in sync (in_sync_changed drops it then; docs/nemesis.md, finding 28)
        isr = self.primary.replica_set.isr
        if not all(node in isr for node in backups):
            for node in isr:
                url = self.service.url_of(node)
                if node not in backups and url is not None:
                    backups[node] = url
        self.primary.set_backups(backups)

    def fence(self, why: str, *, keep: bool = False) -> None:
        """Stop being the primary. ``keep``: for this node's own lease, not a known new owner:
        what it held is kept as a journal's recovery is, to claim again with while the record
        names it; another node's claim, or being its backup, drops it (docs/nemesis.md, 24)."""
        primary = self.primary
        if primary is None or primary.fenced:
            return
        kept = None
        if keep and self.recovered_messages is None:
            kept = [StoredMessage(body(m), journal_id=m.journal_id, rid=m.rid)
                    for m in catchup.held(primary.replica_set, primary.queue)]
        primary.fence(why)
        self.primary = None
        claim, self.claim = self.claim, None
        registry = self.node.queues
        if registry.get(self.address) is primary.queue:
            registry.delete(self.address)
        primary.queue.purge()  # a backup again: the new primary's catch-up refills it
        if claim is not None and self.service.automatic:  # static: the epoch file stays
            self.service.spawn(self.service.release(claim))
        if self.listener is not None:
            self.listener.copy_fenced(self)
        if kept is not None:
            self.recovered_messages = kept
            self._kept_epoch = primary.epoch

    def stand_aside(self, why: str) -> None:
        """This primary is the one cut off from its peers (copies.py ``_cut_off_alone``): it
        fences itself and releases its claim, as ``fence`` does, but keeps what it held, as a
        journal recovery is kept, and claims nothing for two leases: an in-sync backup takes
        over (this node then becomes its backup and drops what it kept), or, if none did, this
        node claims again with it (docs/replication.md, 5b)."""
        primary = self.primary
        if primary is None or primary.fenced:
            return
        self.stood_aside += 1
        loop = asyncio.get_running_loop()
        hold = 2 * self.service.lease_ttl()
        self._aside_until = loop.time() + hold
        self.service.silent_peers.isolated_from(loop.time() - self.service.lease_ttl())
        self.fence(why, keep=True)
        loop.call_later(hold + 0.05, self._recheck)

    def in_sync_changed(self, isr: frozenset) -> None:
        """The primary's in-sync set was written: a backup kept only until the replica set's
        own were in sync goes (``members_changed``); a fragment held away from home goes back
        once its home member is in sync (with etcd: the home claims it when it is released)."""
        self.members_changed()
        if self.home is None or self.home == self.node_id or self.home not in isr:
            return
        if not self.service.automatic or self._handing_back is not None:
            return

        def hand_back() -> None:
            self._handing_back = None
            primary = self.primary
            if primary is None or primary.fenced or self.home not in primary.replica_set.isr:
                return
            log.warning("fragment %s: handed back to its home member %s", self.wire, self.home)
            self.fence(f"handed back to {self.home}")

        self._handing_back = asyncio.get_running_loop().call_later(HAND_BACK, hand_back)

    async def promote(self, *, force: bool) -> dict:
        """An operator makes this node the primary (docs/replication.md: without etcd)."""
        if self.primary is not None and not self.primary.fenced:
            return self.describe()
        backup = self.backup
        if not force and (backup is None or backup.role.state not in (CopyState.READY,)):
            state = backup.role.state if backup is not None else "no copy"
            raise PromoteRefused(f"queue {self.wire}: this node's copy is {state}, not a ready "
                                 "backup (force promotes it anyway, and loses what it lacks)")
        epoch = self._epoch_seen() + 1
        claim = await self.service.coordinator.claim(self.resource, only_if_owner_gone=False,
                                                     epoch_at_least=epoch)
        if claim is None:
            raise PromoteRefused(f"queue {self.wire}: another node holds it")
        self.become_primary(claim)
        return self.describe()

    def close(self) -> None:
        if self.primary is not None:
            self.primary.fence("node stopping")
        if self.backup is not None:
            self.backup.close()

    def describe(self) -> dict:
        role = "primary" if self.primary is not None and not self.primary.fenced else \
            str(self.backup.role.state) if self.backup is not None else "proxy"
        item = {
            "address": self.wire,
            "resource": self.resource,
            "role": role,
            "primary": self.owner[0] if self.owner else None,
            "epoch": self.owner[1] if self.owner else None,
            "replicas": self.settings.replicas,
            "placement": self.placement(),
            "failovers": self.failovers,
            "stood_aside": self.stood_aside,
            "waiting_links": len(self.pending),
        }
        if self.primary is not None:
            item.update(self.primary.describe())
            item["depth"] = self.primary.queue.depth
        elif self.backup is not None:
            item["copy"] = self.backup.describe()
        return item
