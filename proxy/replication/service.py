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
import json
import logging

from uhashring import HashRing

from .address import PromoteRefused, ReplicatedAddress, ReplicationSettings

log = logging.getLogger("fedgate.replication")

OWNERS = "queue/"  # coordinator resources: queue/<address>
STATE = "replication/"  # coordinator state: replication/<address> -> the ISR record


class ReplicationService:
    browsable = True  # a replicated queue can be browsed (on its primary, or through the proxy)

    def __init__(self, node) -> None:
        self.node = node
        self.node_id = node.node_id
        self.coordinator = node.coordinator
        self.addresses: dict[str, ReplicatedAddress] = {}
        self.peer_options = None  # upstream options for node-to-node links (the pools' defaults)
        self._tasks: set[asyncio.Task] = set()
        self._ring = None  # (member ids, their ketama ring)
        node.serve_kind("replicated", self)
        node.add_view("replicated", self.describe)
        node.routing.subscribe(self._rules_changed)

    @property
    def automatic(self) -> bool:
        """Failover by itself: only with a coordinator that decides ownership (etcd)."""
        return self.coordinator.kind == "etcd"

    async def start(self) -> None:
        self.coordinator.on_owner(OWNERS, self._owner_changed)
        self.coordinator.on_fenced(self._fenced)
        self.coordinator.on_members(self._members_changed)
        self._adopt_recovered()

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for entry in self.addresses.values():
            entry.close()

    def spawn(self, coro) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # -- the kind handler ------------------------------------------------------------------
    def attach(self, client, link, decision) -> None:
        self.entry(decision.address, decision.rule).attach(client, link)

    def entry(self, address: str, rule) -> ReplicatedAddress:
        entry = self.addresses.get(address)
        if entry is None:
            entry = self.addresses[address] = ReplicatedAddress(self, address,
                                                                ReplicationSettings.of(rule))
        return entry

    def _adopt_recovered(self) -> None:
        """Durable messages this node's journal brought back for replicated addresses: a copy
        of unknown freshness, used if this node may claim the queue (ReplicatedAddress)."""
        for name, queue in list(self.node.queues.queues.items()):
            decision = self.node.routing.resolve(name)
            if decision.kind == "replicated" and queue.messages:
                self.entry(name, decision.rule).recovered(queue)

    # -- placement and members ---------------------------------------------------------------
    def members(self) -> dict[str, str]:
        """Live members: id -> AMQP URL (this node's own too)."""
        return {m.id: m.amqp for m in self.coordinator.members()}

    def placement(self, address: str, settings: ReplicationSettings) -> list[str]:
        """The replica set, preferred primary first: the rule's nodes, else the ketama ring."""
        live = self.members()
        if settings.nodes:
            listed = [n for n in settings.nodes if n in live or n == self.node_id]
            return listed[:settings.replicas]
        if not live:
            return [self.node_id]
        names = tuple(sorted(live))
        if self._ring is None or self._ring[0] != names:
            self._ring = (names, HashRing(nodes=list(names)))  # made again when members change
        return [c["nodename"] for c in self._ring[1].range(address, size=settings.replicas)]

    def url_of(self, node_id: str) -> str | None:
        return self.members().get(node_id)

    def _members_changed(self, members) -> None:
        for entry in list(self.addresses.values()):
            entry.members_changed()

    def _rules_changed(self, old, new, version) -> None:
        for address, entry in list(self.addresses.items()):
            decision = new.resolve(address)
            if decision.kind == "replicated":
                entry.settings = ReplicationSettings.of(decision.rule)
                entry.members_changed()

    # -- ownership -------------------------------------------------------------------------
    def _owner_changed(self, resource: str, claim) -> None:
        address = resource[len(OWNERS):]
        entry = self.addresses.get(address)
        if entry is None:
            if claim is None or claim.owner == self.node_id:
                return
            decision = self.node.routing.resolve(address)
            if decision.kind != "replicated":
                return
            entry = self.entry(address, decision.rule)
        entry.owner_changed(claim)

    def _fenced(self, fenced: bool) -> None:
        for entry in self.addresses.values():
            if fenced:
                entry.fence("this node's lease may have expired (cut off from etcd)")
            else:
                entry.members_changed()

    async def read_record(self, address: str) -> tuple[bytes | None, dict | None]:
        """The ISR record of ``address`` as stored (bytes, for a conditional claim) and read."""
        stored = (await self.coordinator.get_state(STATE + address)).get(STATE + address)
        if stored is None:
            return None, None
        try:
            return stored, json.loads(stored)
        except ValueError:
            return stored, None

    async def claim(self, address: str, record_bytes: bytes | None, epoch_at_least: int = 0):
        """Claim ``address`` if its ISR record is still ``record_bytes``; the new record says
        this node is primary with no backup in sync yet. None: someone else was faster."""
        record = json.dumps({"primary": self.node_id, "isr": []}).encode()
        return await self.coordinator.claim(
            OWNERS + address, require_state={STATE + address: record_bytes},
            put_state={STATE + address: record}, epoch_at_least=epoch_at_least)

    def write_isr(self, copy, isr: frozenset) -> None:
        """Write a primary's proposed in-sync set (conditional on its claim); tell it after."""
        entry = self.addresses.get(copy.address)
        claim = entry.claim if entry is not None else None

        async def write() -> None:
            body = json.dumps({"primary": self.node_id, "isr": sorted(isr),
                               "epoch": copy.epoch}).encode()
            try:
                await self.coordinator.put_state(STATE + copy.address, body, if_owner=claim)
            except Exception as exc:  # unreachable, fenced, or no longer the owner
                log.warning("queue %s: in-sync set %s not written: %s", copy.address, sorted(isr), exc)
                copy.isr_written(None)
                return
            copy.isr_written(isr)

        self.spawn(write())

    def stale(self, address: str, why: str) -> None:
        entry = self.addresses.get(address)
        if entry is not None:
            entry.fence(why)

    # -- promote by hand ------------------------------------------------------------------------
    async def promote(self, address: str, *, force: bool = False) -> dict:
        """Make this node the primary of ``address`` (an operator's request)."""
        decision = self.node.routing.resolve(address)
        if decision.kind != "replicated":
            raise PromoteRefused(f"{address!r} is not a replicated queue ({decision.reason})")
        entry = self.entry(address, decision.rule)
        return await entry.promote(force=force)

    def describe(self) -> list[dict]:
        return [entry.describe() for entry in self.addresses.values()]
