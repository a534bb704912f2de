"""The coordinator on etcd: registration, renewals, the watch, claims, rules (a thin driver).

How this works
--------------
One task (``_run``) keeps a session with etcd through a ``Store``
(``proxy.cluster.store``; ``AetcdStore`` in a node):

1. **connect** to the next endpoint; **sync**: resume the watch of
   ``/fedgate/<name>/`` from the last revision seen + 1 (events missed while
   cut off are replayed in order), or, the first time, after a compaction and
   when etcd is not the one it was (another cluster id, a revision gone back),
   read the whole prefix into the ``ClusterView`` and watch from there;
2. **register** when the node holds no lease: grant a lease of ``lease_ttl``,
   then put ``members/<id>`` under it only if absent (a transaction comparing
   its create revision with 0). At start, a registration of the same id that
   is still there is given ``lease_ttl`` + 1.5 s to expire (a node restarted
   after ``kill -9``); if it stays, its lease is being renewed by a live node
   and start fails with ``DuplicateNode``;
3. **keep**: renew when ``LeaseKeeper`` says so (every ttl/3), sleep until its
   next wake-up; any failure (a renewal, the watch) ends the session, which is
   marked unhealthy and retried with a backoff (0.1 s doubling to 2 s, on the
   next endpoint).

Fencing is the keeper's (``proxy.cluster.lease``): a timer at its deadline
calls the ``on_fenced`` callbacks with True, a renewal in time calls them with
False. ``acting()`` asks the keeper with the loop's time at that moment.
While etcd is unreachable nothing is written: claims, releases, state and
rule changes raise ``CoordinatorUnavailable`` with the reason; what the node
knows (members, owners, rules) stays as the watch last left it.

**Claims.** ``claim(resource)`` reads ``owners/<resource>`` and
``epochs/<resource>`` in one transaction, then in a second one, only if
neither changed since (their mod revisions), writes the epoch + 1 and the
owner record under this node's lease: two claimants racing on the same
reading cannot both succeed, and the loser reads again (and, with
``only_if_owner_gone``, finds a live owner and gets None). Epochs are never
deleted, so they only go up, also across lost leases and restarts of etcd's
clients (Artemis's activation sequence, Kafka's leader epoch). A claim lives
as long as the owner's lease: when the lease goes, etcd deletes the owner key
and the watch tells every node.

**Rules.** ``rules/`` holds the routing rules record; ``swap_rules`` writes
one only if the key's mod revision is still the one this node last saw
(compare-and-swap); ``on_rules`` callbacks get every new record from the
watch (``admin_api.rules_manager`` validates and applies it).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from dataclasses import replace
from collections.abc import Callable

from proxy.config.compat import FEATURES

from .lease import Backoff, LeaseKeeper, LeaseState
from .model import (Claim, CoordinatorError, CoordinatorUnavailable, DuplicateNode, Listeners, Member,
                    claim_value, member_value, parse_claim, parse_member)
from .store import KV, Compare, Delete, Get, Put, Store, StoreCompacted, StoreUnavailable
from .view import Changes, ClusterView, Keys

log = logging.getLogger("fedgate.cluster")

CLAIM_ATTEMPTS = 8  # readings a claim may lose to other writers before it gives up
DUPLICATE_GRACE = 1.5  # seconds beyond lease_ttl an old registration of our id may take to go


class EtcdCoordinator:
    kind = "etcd"

    def __init__(self, *, name: str, node_id: str, amqp: str, admin: str | None, workers: int,
                 version: str, store: Store, endpoints: list[str], lease_ttl: float = 3.0,
                 clock_drift: float = 0.1, start_timeout: float = 10.0, register: bool = True,
                 wall: Callable[[], float] = time.time, backoff: Backoff | None = None,
                 reach: dict[str, str] | None = None, worker: int | None = None) -> None:
        self.name = name
        self.reach = dict(reach or {})  # node id -> how this node reaches it ([cluster] reach)
        self.node_id = node_id
        self.local = Member(node_id, amqp, admin, workers, version, None,
                            features=tuple(sorted(FEATURES)))
        self.store = store
        self.endpoints = list(endpoints)
        self.lease_ttl = lease_ttl
        self.start_timeout = start_timeout
        self.register = register  # the node's member record (False: a worker other than 0)
        # a lease of its own: every process that may claim (a node, each worker of a node with
        # workers: replicated queues are claimed by the worker that owns them, issue #45)
        self.leased = register or worker is not None
        self.worker = worker
        self.keys = Keys(name)
        # the key this process puts under its lease: the member record, or a worker's own
        self.lease_key = (self.keys.member(node_id) if register
                          else f"{self.keys.prefix}workers/{node_id}/w{worker}")
        self.wall = wall
        self.view = ClusterView(self.keys)
        self.keeper = LeaseKeeper(ttl=lease_ttl, clock_drift=clock_drift)
        self.backoff = backoff or Backoff()  # reconnects: 0.1 s doubling to 2 s, with jitter
        self.healthy = False
        self.last_error: str | None = None
        self.reconnects = 0
        self.draining = False
        self.fatal: CoordinatorError | None = None  # our id taken over while we were cut off
        self._members = Listeners(log)
        self._fenced = Listeners(log)
        self._rules = Listeners(log)
        self._owners: list[tuple[str, Callable[[str, Claim | None], None]]] = []
        self._task: asyncio.Task | None = None
        self._ready: asyncio.Future | None = None
        self._wake: asyncio.Event | None = None
        self._watch = None
        self._watch_error: Exception | None = None
        self._fence_timer: asyncio.TimerHandle | None = None
        self._acting_reported: bool | None = None  # None: not acted yet
        self._first_registration = True
        self._registered_at = 0.0
        self._stopping = False
        self._cluster_id: int | None = None  # the etcd cluster the view came from

    # -- the interface ---------------------------------------------------------------------
    @property
    def revision(self) -> int:
        return self.view.revision

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._ready = loop.create_future()
        self._wake = asyncio.Event()
        self._task = loop.create_task(self._run(), name="fedgate-cluster-etcd")
        try:
            await asyncio.wait_for(asyncio.shield(self._ready), self.start_timeout)
        except asyncio.TimeoutError:
            await self.stop()
            raise CoordinatorUnavailable(
                f"etcd at {', '.join(self.endpoints)} did not answer within {self.start_timeout:g}s"
                f" ({self.last_error or 'no answer'})") from None
        except CoordinatorError:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Revoke the lease: the registration and every claim under it go at once."""
        loop = asyncio.get_running_loop()
        self._stopping = True
        if self._fence_timer is not None:
            self._fence_timer.cancel()
        task, self._task = self._task, None
        while task is not None and not task.done():
            task.cancel()  # again if a call it was in swallowed the first one
            await asyncio.wait([task], timeout=1.0)
        watch, self._watch = self._watch, None
        if watch is not None:
            await watch.cancel()
        lease = self.keeper.lease_id
        self.keeper.stop(loop.time())
        if self.leased and lease is not None and self.healthy:
            try:
                await self.store.revoke(lease)
                log.info("cluster %s: lease %x revoked, %s left", self.name, lease, self.node_id)
            except StoreUnavailable as exc:
                log.warning("cluster %s: could not revoke lease %x (%s): it expires within %gs",
                            self.name, lease, exc, self.keeper.ttl)
        await self._drop_session()
        self.healthy = False

    def members(self) -> list[Member]:
        members = self.view.members(self.wall())
        if self.reach:  # [cluster] reach: how this node reaches some of them
            members = [replace(m, amqp=self.reach.get(m.id, m.amqp)) for m in members]
        return members

    def on_members(self, callback: Callable[[list[Member]], None]) -> None:
        self._members.add(callback)

    def acting(self) -> bool:
        if not self.leased or self.fatal is not None:
            return False
        return self.keeper.acting(asyncio.get_running_loop().time())

    def on_fenced(self, callback: Callable[[bool], None]) -> None:
        self._fenced.add(callback)

    def current_owner(self, resource: str) -> Claim | None:
        return self.view.owner(resource)

    def on_owner(self, resource_prefix: str, callback: Callable[[str, Claim | None], None]) -> None:
        self._owners.append((resource_prefix, callback))

    def on_rules(self, callback: Callable[[bytes | None, int], None]) -> None:
        """``callback(record, mod_revision)`` for every new rules record (None: deleted)."""
        self._rules.add(callback)

    def rules_record(self) -> tuple[bytes | None, int]:
        kv = self.view.rules
        return (kv.value, kv.mod_revision) if kv is not None else (None, 0)

    async def claim(self, resource: str, *, only_if_owner_gone: bool = True,
                    require_state: dict[str, bytes | None] | None = None,
                    put_state: dict[str, bytes] | None = None,
                    epoch_at_least: int = 0) -> Claim | None:
        """Also: only while each ``require_state`` key holds that value (None: absent), writing
        ``put_state`` in the same transaction; the epoch at least ``epoch_at_least``."""
        owner_key, epoch_key = self.keys.owner(resource), self.keys.epoch(resource)
        required = {self.keys.state(k): v for k, v in (require_state or {}).items()}
        for _ in range(CLAIM_ATTEMPTS):
            self._must_act(f"claim {resource}")
            lease = self.keeper.lease_id
            reading = await self._txn([], [Get(owner_key), Get(epoch_key),
                                           *(Get(key) for key in required)], [], "claim")
            owner, epoch, *states = reading.gets
            if owner is not None:
                held = parse_claim(owner.value)
                if held is not None and owner.lease == lease:
                    return held  # ours already, under our current lease
                if only_if_owner_gone:
                    return None
            if any((kv.value if kv is not None else None) != value
                   for kv, value in zip(states, required.values())):
                return None  # what the claim was conditional on has changed
            number = max(int(epoch.value) + 1 if epoch is not None else 1, epoch_at_least)
            claim = Claim(resource, self.node_id, number)
            value = claim_value(claim)
            self._must_act(f"claim {resource}")
            compares = [Compare(epoch_key, "mod", epoch.mod_revision if epoch else 0),
                        Compare(owner_key, "mod", owner.mod_revision if owner else 0)]
            compares += [Compare(key, "value", want) if want is not None else Compare(key, "create", 0)
                         for key, want in required.items()]
            puts = [Put(self.keys.state(k), bytes(v)) for k, v in (put_state or {}).items()]
            result = await self._txn(
                compares, [Put(epoch_key, str(number).encode()), Put(owner_key, value, lease), *puts],
                [], "claim")
            if result.succeeded:
                log.info("cluster %s: %s claimed %s at epoch %d", self.name, self.node_id, resource,
                         number)
                self._dispatch(self.view.apply_local_owner(
                    resource, claim, KV(owner_key, value, result.revision, result.revision, lease),
                    result.revision))
                return claim
        raise CoordinatorUnavailable(f"claim {resource}: lost {CLAIM_ATTEMPTS} races in a row")

    async def release(self, claim: Claim) -> None:
        self._must_reach(f"release {claim.resource}")
        owner_key = self.keys.owner(claim.resource)
        result = await self._txn([Compare(owner_key, "value", claim_value(claim))],
                                 [Delete(owner_key)], [], "release")
        if result.succeeded:
            log.info("cluster %s: %s released %s (epoch %d)", self.name, self.node_id,
                     claim.resource, claim.epoch)
            self._dispatch(self.view.apply_local_owner(claim.resource, None, None, result.revision))

    async def put_state(self, key: str, value: bytes, *, if_owner: Claim | None = None) -> None:
        """With ``if_owner``: only while that claim holds (else ``CoordinatorError``); the node
        must be acting then."""
        if if_owner is None:
            self._must_reach(f"put state {key}")
            await self._txn([], [Put(self.keys.state(key), bytes(value))], [], "put state")
            return
        self._must_act(f"put state {key}")
        owner_key = self.keys.owner(if_owner.resource)
        result = await self._txn([Compare(owner_key, "value", claim_value(if_owner))],
                                 [Put(self.keys.state(key), bytes(value))], [], "put state")
        if not result.succeeded:
            raise CoordinatorError(f"put state {key}: {if_owner.resource} is no longer held at "
                                   f"epoch {if_owner.epoch}")

    async def swap_state(self, key: str, expected: bytes | None, value: bytes) -> bool:
        """Write ``value`` only while ``key`` holds ``expected`` (None: absent); True if written."""
        self._must_reach(f"swap state {key}")
        stored = self.keys.state(key)
        compare = Compare(stored, "value", expected) if expected is not None else \
            Compare(stored, "create", 0)
        result = await self._txn([compare], [Put(stored, bytes(value))], [], "swap state")
        return result.succeeded

    async def get_state(self, prefix: str) -> dict[str, bytes]:
        self._must_reach(f"get state {prefix}")
        try:
            _, kvs = await self.store.range(self.keys.state(prefix))
        except StoreUnavailable as exc:
            raise CoordinatorUnavailable(f"get state: etcd unreachable ({exc})") from None
        base = len(self.keys.state(""))
        return {kv.key[base:]: kv.value for kv in kvs}

    async def swap_rules(self, expected_revision: int, record: bytes) -> tuple[bool, bytes | None, int]:
        """Write ``record`` only if the rules key is still at ``expected_revision`` (0: absent).
        Returns (written, the record now in etcd, its mod revision)."""
        self._must_reach("change the rules")
        key = self.keys.rules
        result = await self._txn([Compare(key, "mod", expected_revision)], [Put(key, record)],
                                 [Get(key)], "rules change")
        if result.succeeded:
            self._dispatch(self.view.apply_local_rules(KV(key, record, result.revision,
                                                          result.revision)), rules=False)
            return True, record, result.revision
        current = result.gets[0]
        return False, (current.value if current else None), (current.mod_revision if current else 0)

    async def set_draining(self, draining: bool) -> None:
        """Mark this node as leaving: ``fragments = "*"`` rules list it as draining."""
        self.draining = draining
        lease = self.keeper.lease_id
        if not self.register or lease is None:
            return
        self._must_reach("mark draining")
        value = member_value(self._registration(), registered_at=self._registered_at)
        await self._txn([], [Put(self.keys.member(self.node_id), value, lease)], [], "draining")

    def describe(self) -> dict:
        now = asyncio.get_running_loop().time()
        return {
            "kind": self.kind,
            "name": self.name,
            "endpoints": list(self.endpoints),
            "endpoint": getattr(self.store, "endpoint", None),
            "healthy": self.healthy,
            "revision": self.revision,
            "acting": self.acting(),
            "fenced": self.leased and not self.acting(),
            "lease": self.keeper.describe(now) if self.leased else None,
            "last_error": self.last_error,
            "reconnects": self.reconnects,
            "error": str(self.fatal) if self.fatal else None,
        }

    # -- the session ---------------------------------------------------------------------------
    async def _run(self) -> None:
        backoff = self.backoff
        while True:
            try:
                await self.store.connect()
                await self._sync()
                if self.leased and self.keeper.needs_lease():
                    await self._register()
                self._set_healthy(True)
                backoff.reset()
                if not self._ready.done():
                    self._ready.set_result(None)
                await self._keep()
            except DuplicateNode as exc:
                if not self._ready.done():
                    self._ready.set_exception(exc)
                    return
                self.fatal = exc
                log.error("cluster %s: %s; this node stays fenced", self.name, exc)
                self._check_fencing()
            except StoreUnavailable as exc:
                self.last_error = str(exc)
                log.log(logging.WARNING if self.healthy else logging.INFO,
                        "cluster %s: etcd session lost (%s); reconnecting", self.name, exc)
            except Exception as exc:  # a bug or a client surprise: never a silent end of renewals
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.exception("cluster %s: etcd session failed; reconnecting", self.name)
            self._set_healthy(False)
            await self._drop_session()
            self.reconnects += 1
            await asyncio.sleep(backoff.next_delay())

    async def _sync(self) -> None:
        """Resume the watch where it stopped; read everything when that is not possible:
        revisions compacted away, or another etcd (a new cluster, one restored from a backup:
        its id differs or its revision went back)."""
        self._watch_error = None
        if self.view.revision:
            revision, _ = await self.store.range(self.keys.rules)
            if self.store.cluster_id == self._cluster_id and revision >= self.view.revision:
                try:
                    await self._start_watch(self.view.revision + 1)
                    return
                except StoreCompacted as exc:
                    log.info("cluster %s: %s; reading everything again", self.name, exc)
            else:
                log.warning("cluster %s: etcd is not the one it was (cluster id %x, revision %d; "
                            "was %x at %d); reading everything again", self.name,
                            self.store.cluster_id or 0, revision, self._cluster_id or 0,
                            self.view.revision)
        revision, kvs = await self.store.range(self.keys.prefix)
        self._cluster_id = self.store.cluster_id
        self._dispatch(self.view.load(revision, kvs))
        await self._start_watch(revision + 1)

    async def _start_watch(self, start_revision: int) -> None:
        self._watch = await self.store.watch(self.keys.prefix, start_revision, self._on_events,
                                             self._on_watch_error)

    def _on_events(self, events) -> None:
        self._dispatch(self.view.apply(events))

    def _on_watch_error(self, exc: Exception) -> None:
        self._watch_error = exc
        if self._wake is not None:
            self._wake.set()

    async def _drop_session(self) -> None:
        watch, self._watch = self._watch, None
        if watch is not None:
            await watch.cancel()
        await self.store.close()

    async def _keep(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if self._watch_error is not None:
                raise StoreUnavailable(f"watch: {self._watch_error}")
            now = loop.time()
            if self.leased:
                if self.keeper.needs_lease():
                    await self._register()
                elif self.keeper.renewal_due(now):
                    await self._renew()
                self._check_fencing()  # a passed deadline is a move, not a time to wake at
                wake = self.keeper.next_wakeup(loop.time())
            else:  # a watcher only: prove now and then that etcd still answers
                await self.store.range(self.keys.rules)
                wake = loop.time() + self.lease_ttl / 3
            self._wake.clear()
            if self._watch_error is not None:
                continue
            # a timer sets the event (not wait_for: on Python 3.11 it can lose a cancellation
            # that comes as the wait ends, and stop() would wait forever)
            timer = None if wake is None else loop.call_at(wake, self._wake.set)
            try:
                await self._wake.wait()
            finally:
                if timer is not None:
                    timer.cancel()

    async def _renew(self) -> None:
        loop = asyncio.get_running_loop()
        sent = self.keeper.renewal_sent(loop.time())
        try:
            ttl = await self.store.keepalive(self.keeper.lease_id)
        except Exception:  # also an unexpected one: the renewal is over, it failed
            self.keeper.renewal_failed(sent_at=sent, now=loop.time())
            self._check_fencing()
            raise
        self.keeper.renewal_answered(sent_at=sent, ttl=ttl, now=loop.time())
        if self.keeper.state is LeaseState.EXPIRED:
            log.warning("cluster %s: etcd says lease of %s expired; registering again (claims "
                        "held under it are gone)", self.name, self.node_id)
        self._check_fencing()

    def _registration(self) -> Member:
        return Member(self.local.id, self.local.amqp, self.local.admin, self.local.workers,
                      self.local.version, None, self.draining, self.local.features)

    async def _register(self) -> None:
        loop = asyncio.get_running_loop()
        key = self.lease_key
        if self._first_registration:  # an earlier process of ours may still be registered
            give_up = loop.time() + self.lease_ttl + DUPLICATE_GRACE
            while True:
                _, kvs = await self.store.range(key)
                kvs = [kv for kv in kvs if kv.key == key]
                if not kvs:
                    break
                if loop.time() >= give_up:
                    raise self._duplicate(kvs[0])
                await asyncio.sleep(0.25)
        sent = loop.time()
        lease, ttl = await self.store.grant(int(self.lease_ttl))
        if ttl > self.lease_ttl:
            log.warning("cluster %s: etcd granted %d s for lease_ttl %g (its minimum)", self.name,
                        ttl, self.lease_ttl)
        self._registered_at = self.wall()
        value = member_value(self._registration(), registered_at=self._registered_at)
        if not self.register:  # a worker's lease: its own key, no member record
            value = json.dumps({"worker": self.worker, "pid": os.getpid()}).encode()
        result = await self.store.txn([Compare(key, "create", 0)], [Put(key, value, lease)],
                                      [Get(key)])
        if not result.succeeded:
            try:
                await self.store.revoke(lease)
            except StoreUnavailable:
                pass  # it expires by itself
            raise self._duplicate(result.gets[0])
        self._first_registration = False
        self.fatal = None
        self.keeper.granted(lease, ttl, sent_at=sent, now=loop.time())
        log.info("cluster %s: %s registered (lease %x, ttl %d s, registration %d)", self.name,
                 self.node_id, lease, ttl, self.keeper.registrations)
        self._check_fencing()

    def _duplicate(self, kv: KV | None) -> DuplicateNode:
        if not self.register:
            return DuplicateNode(
                f"worker {self.worker} of node {self.node_id!r} still holds a live lease in etcd "
                f"cluster {self.name!r}: another process runs as this worker of this node")
        other = parse_member(kv.value, now=self.wall()) if kv is not None else None
        where = (f"{other.amqp}, admin {other.admin or '-'}, registered {other.lease_age_s:.0f} s ago"
                 if other else "unknown")
        return DuplicateNode(
            f"node id {self.node_id!r} is already registered in etcd cluster {self.name!r} by a live "
            f"node ({where}); its lease is being renewed. Stop that node or give this one another "
            "[node] id")

    # -- fencing -----------------------------------------------------------------------------------
    def _check_fencing(self) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        self.keeper.tick(now)
        acting = self.acting()
        if self._acting_reported is None and acting:
            self._acting_reported = True  # the first registration: nothing to tell
        elif acting != bool(self._acting_reported):
            self._acting_reported = acting
            if acting:
                log.info("cluster %s: %s acting (lease %x renewed)", self.name, self.node_id,
                         self.keeper.lease_id or 0)
            else:
                log.warning("cluster %s: %s fenced: no lease renewal in time (%s)", self.name,
                            self.node_id, self.last_error or self.keeper.state.value)
            self._fenced(not acting)
        if self._fence_timer is not None:
            self._fence_timer.cancel()
            self._fence_timer = None
        if acting:  # a timer may fire a little early: 1 ms after, acting() is surely False
            self._fence_timer = loop.call_at(self.keeper.deadline + 0.001, self._check_fencing)

    def _must_act(self, what: str) -> None:
        self._must_reach(what)
        if not self.acting():
            raise CoordinatorUnavailable(f"{what}: this node is fenced (its lease could not be "
                                         "renewed in time)")

    def _must_reach(self, what: str) -> None:
        if not self.healthy:
            raise CoordinatorUnavailable(f"{what}: etcd unreachable ({self.last_error or 'connecting'})")

    async def _txn(self, compare, success, failure, what: str):
        try:
            return await self.store.txn(compare, success, failure)
        except StoreUnavailable as exc:
            self.last_error = str(exc)
            if self._wake is not None:
                self._wake.set()
            raise CoordinatorUnavailable(f"{what}: etcd unreachable ({exc})") from None

    def _set_healthy(self, healthy: bool) -> None:
        if healthy != self.healthy:
            self.healthy = healthy
            if healthy:
                log.info("cluster %s: connected to etcd %s at revision %d", self.name,
                         getattr(self.store, "endpoint", "?"), self.revision)

    # -- what the watch says ------------------------------------------------------------------
    def _dispatch(self, changes: Changes, *, rules: bool = True) -> None:
        if self._stopping:
            return
        lost = changes.deleted_members.get(self.node_id)
        if self.register and lost is not None and lost == self.keeper.lease_id:
            log.warning("cluster %s: the registration of %s is gone from etcd (lease expired)",
                        self.name, self.node_id)
            self.keeper.lease_lost(asyncio.get_running_loop().time())
            self._check_fencing()
            if self._wake is not None:
                self._wake.set()
        if changes.members:
            self._members(self.members())
        for resource, claim in changes.owners.items():
            for prefix, callback in list(self._owners):
                if resource.startswith(prefix):
                    try:
                        callback(resource, claim)
                    except Exception:
                        log.exception("cluster owner listener %r failed", callback)
        if rules and changes.rules is not None:
            self._rules(*changes.rules)
