"""The replication service: serves addresses whose rule is of kind ``replicated``.

How this works
--------------
A plug-in like the fragments service: it registers as the handler of the
``replicated`` kind and as the ``replicated`` view of the admin API. It keeps
one ``ReplicatedAddress`` per queue this node knows of and follows the
cluster coordinator (``node.coordinator``, ``proxy.cluster``):

* **owners** (``on_owner("queue/")``): a new owner elsewhere makes this node's
  proxies move there and fences a primary copy here; an owner gone makes the
  eligible copies claim the queue (``ReplicatedAddress.owner_gone``);
* **fencing** (``on_fenced``): every primary copy here stops at once;
* **members** (``on_members``): the replica sets follow the live members.

The in-sync set each primary proposes is written under the state key
``replication/<address>`` as ``{"epoch", "primary", "isr"}``, on condition
that the primary still owns the queue at that epoch (``write_isr``); a claim
is made on condition that this record is what the claimant read, and writes
the new primary's record in the same transaction. So only a copy the last
primary declared in sync can take over (docs/replication.md).

Without etcd (a static cluster) nothing fails over by itself: the preferred
node (the first of the replica set) is the primary, with an epoch from its
own data dir, and ``promote`` (admin API, ``fedgate promote``) moves the
queue by hand; backups learn the primary from its replication link.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from urllib.parse import urlsplit

from uhashring import HashRing

from proxy.broker.handler import LinkRefused
from proxy.workers.ownership import BACKUP

from .address import NOT_ALLOWED, PromoteRefused, ReplicatedAddress, ReplicationSettings
from .links import link_properties
from .backup_silence import BackupSilence
from .silence import SilentPeers

log = logging.getLogger("fedgate.replication")

OWNERS = ("queue/", "fragment/")  # coordinator resources: queue/<address>, fragment/<address>/<member>
STEP_OUT_TRIES = 5  # reads of one record at start when stepping out of it loses a race
STATE = "replication/"  # coordinator state: replication/<resource> -> the ISR record


class ReplicationService:
    browsable = True  # a replicated queue can be browsed (on its primary, or through the proxy)
    selective = True  # its consumers may have selectors (applied on its primary)

    def __init__(self, node) -> None:
        self.node = node
        self.node_id = node.node_id
        self.coordinator = node.coordinator
        self.known: dict[str, str] = {}  # every member seen: id -> AMQP URL (relay_url)
        self.entries: dict[str, ReplicatedAddress] = {}  # by resource
        self.peer_options = None  # upstream options for node-to-node links (the pools' defaults)
        self._tasks: set[asyncio.Task] = set()
        self._rings: dict[tuple, HashRing] = {}  # member ids -> their ketama ring
        self.silent_peers = SilentPeers(self)  # fenced: clients of peers that answer nothing
        self.backup_silence = BackupSilence()  # each backup node's silence, across its queues
        # fragmented addresses -> a function giving the fragment group to tell (fragments)
        self.fragment_listeners: dict = {}
        node.serve_kind("replicated", self)
        node.broker.address_checks.append(self._adopted_name)
        node.add_view("replicated", self.describe)
        pager = getattr(node, "pager", None)
        if pager is not None:  # backups' copies page too (docs/paging.md)
            pager.images = lambda: [e.backup.image for e in self.entries.values()
                                    if e.backup is not None]
        node.routing.subscribe(self._rules_changed)

    @property
    def automatic(self) -> bool:
        """Failover by itself: only with a coordinator that decides ownership (etcd)."""
        return self.coordinator.kind == "etcd"

    @property
    def addresses(self) -> dict[str, ReplicatedAddress]:
        """Replicated queues (not fragments) by address."""
        return {e.address: e for e in self.entries.values() if e.home is None}

    async def start(self) -> None:
        for prefix in OWNERS:
            self.coordinator.on_owner(prefix, self._owner_changed)
        self.coordinator.on_fenced(self._fenced)
        self.coordinator.on_members(self._members_changed)
        self._adopt_recovered()
        if self.automatic:
            self.spawn(self._leave_stale_records())

    async def _leave_stale_records(self) -> None:
        """Started again without a copy (not durable, or nothing in the journal): this node steps
        out of every ISR record that names it and that no address here settles by itself (an
        adopted fragment of another member, a queue no client asked for here yet). Left in, it
        would keep the queue from anyone (only a named copy may claim, and this node holds
        none) until a client here happened to ask for it (issue #42: a fragment stuck after a
        rolling restart)."""
        for attempt in range(20):
            try:
                records = await self.coordinator.get_state(STATE)
                break
            except Exception as exc:  # etcd not reached yet: again in a moment
                log.debug("replication: records not read yet: %s", exc)
                await asyncio.sleep(0.5)
        else:
            return
        for key, stored in records.items():
            resource = key[len(STATE):] if key.startswith(STATE) else key
            if not self.mine(resource):
                continue  # another worker of this node keeps it, and settles its record
            for _ in range(STEP_OUT_TRIES):
                if resource in self.entries or self._journal_holds(resource):
                    break  # its address settles its own record (ReplicatedAddress._resolve_owner)
                if not await self._step_out_at_start(resource, stored):
                    break
                # the record changed under the swap: the other members of a record step out
                # of it at the same moment after a power loss. Read it again and try again: a
                # lost swap left this node named, with no copy, for good (docs/nemesis.md, 26)
                with contextlib.suppress(Exception):
                    stored = (await self.coordinator.get_state(STATE + resource)).get(STATE + resource)
                if stored is None:
                    break

    async def _step_out_at_start(self, resource: str, stored: bytes) -> bool:
        """Take this node out of ``resource``'s record as ``stored``; True: the record changed
        meanwhile (to be read again), False: done, or nothing to do."""
        try:
            record = json.loads(stored)
        except ValueError:
            return False
        if record.get("primary") != self.node_id and self.node_id not in record.get("isr", ()):
            return False
        changed = dict(record)
        if changed.get("primary") == self.node_id:
            changed["primary"] = None
        changed["isr"] = [n for n in changed.get("isr", ()) if n != self.node_id]
        try:
            swapped = await self.coordinator.swap_state(STATE + resource, stored,
                                                        json.dumps(changed).encode())
        except Exception:
            return False
        if swapped:
            log.warning("%s: started without a copy; out of its record (%s)", resource, changed)
        return not swapped

    async def stop(self) -> None:
        self.silent_peers.stop()
        for task in list(self._tasks):
            task.cancel()
        for entry in self.entries.values():
            entry.close()

    def spawn(self, coro) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # -- the kind handler ------------------------------------------------------------------
    def attach(self, client, link, decision) -> None:
        self.entry(decision.address, decision.rule).attach(client, link)

    def owner_worker(self, resource: str) -> int | None:
        """With workers (issue #45): the worker of this node that keeps ``resource``, when it
        is another; None: this process. A queue's: its owner, as for a local queue; a
        fragment's (``fragment/<queue>/<member>``): the owner of its fragmented queue, which
        serves that queue on this node and every copy of its fragments here
        (proxy.workers.ownership)."""
        worker = self.node.worker
        if worker is None or worker.count < 2:
            return None
        kind, _, rest = resource.partition("/")
        if kind == "fragment":
            rest = rest.rpartition("/")[0]
        # a name first used here by its primary's replication link: a backup copy (weighs less)
        owner = worker.owners.owner(rest, BACKUP)
        return None if owner == worker.index else owner

    def mine(self, resource: str) -> bool:
        return self.owner_worker(resource) is None

    def entry(self, address: str, rule) -> ReplicatedAddress:
        resource = "queue/" + address
        entry = self.entries.get(resource)
        if entry is None:
            entry = self.entries[resource] = ReplicatedAddress(self, address,
                                                               ReplicationSettings.of(rule))
        return entry

    def fragment(self, address: str, home: str, rule, listener=None) -> ReplicatedAddress:
        """``home``'s fragment of the fragmented queue ``address`` (rule ``replicas`` > 1)."""
        resource = f"fragment/{address}/{home}"
        entry = self.entries.get(resource)
        if entry is None:
            wire = f"{address}@{home}"
            entry = self.entries[resource] = ReplicatedAddress(
                self, address if home == self.node_id else wire, ReplicationSettings.of(rule),
                resource=resource, wire=wire, home=home, listener=listener)
        elif listener is not None:
            entry.listener = listener
        return entry

    def _adopted_name(self, address: str) -> str | None:
        """``<address>@<member>``: a fragment this node adopted; refused when it does not serve
        it now (a stealer that has not heard it moved), never made as an empty local queue."""
        base, at, member = address.rpartition("@")
        if not at or not base or self.node.queues.get(address) is not None:
            return None
        decision = self.node.routing.resolve(base)
        if decision.kind != "fragmented" or decision.rule is None:
            return None
        return f"fragment {member} of {base!r} is not served here (it moved)"

    def attach_replication(self, client, link) -> None:
        """A primary's replication link (the client handler saw its capability)."""
        primary, epoch, resource = link_properties(link)
        if not primary or not epoch or not resource:
            raise LinkRefused(NOT_ALLOWED, "a replication link says its primary, epoch and resource")
        owner = self.owner_worker(resource)
        if owner is not None:  # another worker of this node keeps it: the link goes on there
            self._forward(client, link, owner, resource)
            return
        entry = self.entries.get(resource) or self._entry_for(resource)
        if entry is None:
            raise LinkRefused("amqp:not-found", f"{resource}: no replicated rule here for it")
        entry.replication_link(client, link, primary, epoch)

    def _forward(self, client, link, owner: int, resource: str) -> None:
        """A replication link that landed on a worker that does not keep its queue (a
        connection placed by another link's first attach): forwarded to the owner, as a
        client's link to a local queue is, its properties and capability with it."""
        address = link.remote_target.address
        decision = self.node.worker.forward(owner, address, f"{resource} on worker {owner}")
        upstream = self.node.broker.upstreams.for_decision(decision)
        log.info("%s: replication link forwarded to worker %d of this node, which keeps it",
                 resource, owner)
        client.attach_proxy_producer(link, upstream, address, rule=decision.rule,
                                     properties=dict(link.remote_properties or {}))

    def _entry_for(self, resource: str) -> ReplicatedAddress | None:
        kind, _, rest = resource.partition("/")
        if kind == "queue":
            decision = self.node.routing.resolve(rest)
            return self.entry(rest, decision.rule) if decision.kind == "replicated" else None
        if kind == "fragment":
            address, _, home = rest.rpartition("/")
            decision = self.node.routing.resolve(address)
            if decision.kind == "fragmented" and address and home:
                listener = self.fragment_listeners.get(address)
                return self.fragment(address, home, decision.rule,
                                     listener() if listener is not None else None)
        return None

    def _journal_holds(self, resource: str) -> bool:
        """Whether this node's journal brought messages back for ``resource``'s queue (a queue's
        address; a fragment's: the address itself at home, ``address@member`` adopted)."""
        kind, _, rest = resource.partition("/")
        names = [rest]
        if kind == "fragment":
            address, _, member = rest.rpartition("/")
            names = [address, f"{address}@{member}"]
        return any((q := self.node.queues.get(n)) is not None and q.messages for n in names)

    def _adopt_recovered(self) -> None:
        """Durable messages this node's journal brought back for replicated addresses: a copy
        of unknown freshness, used if this node may claim the queue (ReplicatedAddress) --
        which it tries at once: clients elsewhere may be waiting for it."""
        for name, queue in list(self.node.queues.queues.items()):
            decision = self.node.routing.resolve(name)
            if decision.kind == "replicated" and queue.messages and self.mine("queue/" + name):
                entry = self.entry(name, decision.rule)
                entry.recovered(queue)
                entry.resolve()

    # -- placement and members ---------------------------------------------------------------
    def members(self) -> dict[str, str]:
        """Live members: id -> AMQP URL (this node's own too)."""
        live = {m.id: m.amqp for m in self.coordinator.members()}
        self.known.update(live)
        return live

    def relay_url(self, placement: list[str]) -> str | None:
        """Cut off from etcd (this node may not act, and learns nothing new): the URL of another
        node, of the replica set first, that knows or will know where the queue is served."""
        if not self.automatic or self.coordinator.acting():
            return None
        self.members()
        for node in [*placement, *sorted(self.known)]:
            if node != self.node_id and self.known.get(node):
                return self.known[node]
        return None

    def placement(self, address: str, settings: ReplicationSettings) -> list[str]:
        """The replica set, preferred primary first: the rule's nodes, else the ketama ring."""
        live = self.members()
        if settings.nodes:
            listed = [n for n in settings.nodes if n in live or n == self.node_id]
            return listed[:settings.replicas]
        if not live:
            return [self.node_id]
        ring = self._ring_of(tuple(sorted(live)))
        return [c["nodename"] for c in ring.range(address, size=settings.replicas)]

    def fragment_placement(self, wire: str, home: str, settings: ReplicationSettings) -> list[str]:
        """A fragment's replica set: its home member, then the ring's next live members."""
        others = sorted(m for m in self.members() if m != home)
        if not others or settings.replicas < 2:
            return [home]
        ring = self._ring_of(tuple(others))
        return [home] + [c["nodename"] for c in ring.range(wire, size=settings.replicas - 1)]

    def _ring_of(self, names: tuple[str, ...]) -> HashRing:
        """The ketama ring of ``names``, made once per member set (making one hashes 160 points
        per node: too dear for every describe() and every placement look-up)."""
        ring = self._rings.get(names)
        if ring is None:
            if len(self._rings) >= 32:  # members changed many times: forget the old sets
                self._rings.clear()
            ring = self._rings[names] = HashRing(nodes=list(names))
        return ring

    def peer_of(self, handler) -> str | None:
        """The node id of another fedgate node whose upstream connection ``handler`` serves (its
        container id is ``<node id>-up-<n>``, proxy.upstream.member), or None: a client."""
        connection = handler.server_connection
        container = connection.remote_container if connection is not None else ""
        node, sep, _ = container.partition("-up-")
        if not sep or node == self.node_id:
            return None
        return node if node in self.known or node in self.members() else None

    def is_peer(self, handler) -> bool:
        return self.peer_of(handler) is not None

    def lease_ttl(self) -> float:
        return getattr(self.coordinator, "lease_ttl", None) or 5.0

    def parked_limit(self) -> float:
        """Seconds a client link waits for a queue's new primary before its connection is
        closed: twice the lease (a new owner is known within about one), 4 s at least."""
        return max(4.0, 2 * self.lease_ttl())

    def relay_limit(self) -> float:
        """Seconds a fenced node waits for a peer to answer a parked link's relay before the
        client's connection is closed (half a lease: a peer that answers does so at once)."""
        return max(1.0, self.lease_ttl() / 2)

    def peer_activity(self) -> dict[str, tuple]:
        """Per peer node: what changes whenever it is heard (reads on the connections it
        opened to this node, the last bytes on this node's upstream connections to it)."""
        out: dict[str, list] = {}
        for protocol in self.node.connections:
            handler = getattr(protocol, "handler", None)
            peer = self.peer_of(handler) if handler is not None else None
            if peer is not None:
                out.setdefault(peer, [0, 0.0])[0] += getattr(protocol, "reads", 0)
        by_address = self.peers_by_address()
        for pool in self.node.broker.upstreams.pools.values():
            peer = by_address.get((pool.target.host, pool.target.port))
            if peer is None:
                continue
            entry = out.setdefault(peer, [0, 0.0])
            for member in [*pool.members, pool.alone]:
                if member.protocol is not None:
                    entry[1] = max(entry[1], member.protocol.heard_at)
        return {peer: tuple(entry) for peer, entry in out.items()}

    def peers_by_address(self) -> dict[tuple, str]:
        """(host, port) of every other member's AMQP listener -> its node id."""
        by_address = {}
        for node_id, url in self.known.items():
            if node_id != self.node_id and url:
                parts = urlsplit(url)
                by_address[(parts.hostname, parts.port)] = node_id
        return by_address

    def cut_off(self) -> bool:
        """Whether this node knows itself cut off: from etcd (fenced), or from every peer (a
        primary stood aside for it, proxy.replication.silence)."""
        return (self.automatic and not self.coordinator.acting()) or self.silent_peers.isolated

    def url_of(self, node_id: str) -> str | None:
        return self.members().get(node_id)

    def _members_changed(self, members) -> None:
        for entry in list(self.entries.values()):
            entry.members_changed()

    def _rules_changed(self, old, new, version) -> None:
        for entry in list(self.entries.values()):
            decision = new.resolve(entry.address if entry.home is None else
                                   entry.resource.split("/", 1)[1].rpartition("/")[0])
            if decision.kind in ("replicated", "fragmented"):
                entry.settings = ReplicationSettings.of(decision.rule)
                entry.members_changed()

    # -- ownership -------------------------------------------------------------------------
    def _owner_changed(self, resource: str, claim) -> None:
        if not self.mine(resource):
            return  # another worker of this node follows it
        entry = self.entries.get(resource)
        if entry is None:
            if claim is None or claim.owner == self.node_id:
                return
            entry = self._entry_for(resource)
            if entry is None:
                return
        entry.owner_changed(claim)

    def _fenced(self, fenced: bool) -> None:
        if fenced and self.automatic:
            self.silent_peers.fenced()
        else:
            self.silent_peers.acting()
        for resource, entry in list(self.entries.items()):
            if fenced:
                entry.fence("this node's lease may have expired (cut off from etcd)", keep=True)
                continue
            entry.members_changed()
            # acting again on the same lease (etcd came back before it ended: a new etcd
            # leader keeps the leases): a claim this node gave up when it fenced itself, and
            # could not release while cut off, would be kept alive by that lease, and nobody
            # would serve the queue. Released now (only if it is still exactly that claim).
            claim = self.coordinator.current_owner(resource) if self.automatic else None
            if claim is not None and claim.owner == self.node_id and entry.primary is None:
                log.warning("%s: claim of epoch %d given up while fenced: released now",
                            resource, claim.epoch)
                self.spawn(self.release(claim))

    async def read_record(self, resource: str) -> tuple[bytes | None, dict | None]:
        """The ISR record of ``resource`` as stored (bytes, for a conditional claim) and read."""
        stored = (await self.coordinator.get_state(STATE + resource)).get(STATE + resource)
        if stored is None:
            return None, None
        try:
            return stored, json.loads(stored)
        except ValueError:
            return stored, None

    async def claim(self, resource: str, record_bytes: bytes | None, epoch_at_least: int = 0):
        """Claim ``resource`` if its ISR record is still ``record_bytes``; the new record says
        this node is primary with no backup in sync yet. None: someone else was faster."""
        record = json.dumps({"primary": self.node_id, "isr": []}).encode()
        return await self.coordinator.claim(
            resource, require_state={STATE + resource: record_bytes},
            put_state={STATE + resource: record}, epoch_at_least=epoch_at_least)

    async def release(self, claim) -> None:
        try:
            await self.coordinator.release(claim)
        except Exception as exc:  # unreachable: the lease will end it, or it was taken over
            log.info("%s: not released (%s)", claim.resource, exc)

    def write_isr(self, copy, isr: frozenset) -> None:
        """Write a primary's proposed in-sync set (conditional on its claim); tell it after."""
        claim = copy.entry.claim

        async def write() -> None:
            body = json.dumps({"primary": self.node_id, "isr": sorted(isr),
                               "epoch": copy.epoch}).encode()
            written = None
            try:
                await self.coordinator.put_state(STATE + copy.resource, body, if_owner=claim)
                written = isr
            except Exception as exc:  # unreachable, fenced, or no longer the owner
                log.warning("queue %s: in-sync set %s not written: %s", copy.address, sorted(isr), exc)
            finally:
                # answered whatever happened (a cancelled write too): until it is, the primary
                # proposes nothing more and no backup gets in sync (docs/nemesis.md, 25)
                copy.isr_written(written)

        self.spawn(write())

    def stale(self, entry, why: str) -> None:
        entry.fence(why)

    # -- promote by hand ------------------------------------------------------------------------
    async def promote(self, address: str, *, force: bool = False) -> dict:
        """Make this node the primary of ``address`` (an operator's request)."""
        decision = self.node.routing.resolve(address)
        if decision.kind != "replicated":
            raise PromoteRefused(f"{address!r} is not a replicated queue ({decision.reason})")
        entry = self.entry(address, decision.rule)
        return await entry.promote(force=force)

    def learn_owner(self, address: str, owner: str, epoch: int) -> bool:
        """Another node says ``owner`` is the primary of ``address`` at ``epoch`` (a promote
        by hand in a static cluster): this node's proxies go there. False when ignored: not a
        replicated queue, this node itself, or an epoch lower than the one known here."""
        decision = self.node.routing.resolve(address)
        if decision.kind != "replicated" or owner == self.node_id or not self.mine("queue/" + address):
            return False
        entry = self.entry(address, decision.rule)
        if entry.owner is not None and entry.owner[1] > epoch:
            return False
        entry._learn_owner(owner, epoch)
        return True

    def describe(self) -> list[dict]:
        return [entry.describe() for entry in self.entries.values()]
