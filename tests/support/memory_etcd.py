"""An etcd in memory, on the event loop's clock, for playbooks of the cluster coordinator.

How this works
--------------
``MemoryEtcd`` keeps what etcd keeps for the operations fedgate uses
(``proxy.cluster.store``): one revision counter, keys with their create/mod
revisions and lease, leases that expire ``ttl`` after their last keepalive
*as etcd handles it*, transactions applied at one revision, and the history of
events so a watch can start from an old revision (``compact`` drops history,
and a watch from before it fails as etcd's does). On a ``VirtualClockLoop``
(``tests/support/playbook.py``) leases expire in virtual time.

Each node talks to it through its own ``MemoryStore`` (a client), which adds
``latency`` seconds each way (a request is handled ``latency`` after it is
sent) and can be cut off (``partition``): its calls then wait ``timeout`` and
fail, and its watch breaks, as a blackholed gRPC channel does. ``stop`` and
``start`` model an etcd restart: every client's calls fail while it is down,
and on start every lease gets its full TTL again (etcd extends leases when a
leader takes over, since it cannot know how long the old one waited).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from dataclasses import dataclass, field

from proxy.cluster.store import KV, Compare, Delete, Event, Get, Put, StoreCompacted, StoreUnavailable, TxnResult


@dataclass
class _Lease:
    id: int
    ttl: int
    expires_at: float
    keys: set[str] = field(default_factory=set)
    timer: asyncio.TimerHandle | None = None


_CLUSTER_IDS = itertools.count(0xE7CD)


class MemoryEtcd:
    def __init__(self, *, min_ttl: int = 2) -> None:
        self.revision = 1
        self.kvs: dict[str, KV] = {}
        self.leases: dict[int, _Lease] = {}
        self.history: list[Event] = []
        self.compacted = 0
        self.watchers: list[_Watch] = []
        self.up = True
        self.min_ttl = min_ttl
        self.keepalives = 0  # handled, for tests of renewal timing
        self.expired: list[tuple[float, int]] = []  # (time, lease id)
        self._ids = itertools.count(0x1000)
        self.cluster_id = next(_CLUSTER_IDS)

    @property
    def loop(self):
        return asyncio.get_running_loop()

    # -- server side ------------------------------------------------------------------------
    def grant(self, ttl: int) -> tuple[int, int]:
        ttl = max(self.min_ttl, ttl)
        lease = _Lease(next(self._ids), ttl, self.loop.time() + ttl)
        self.leases[lease.id] = lease
        self._arm(lease)
        return lease.id, ttl

    def keepalive(self, lease_id: int) -> int:
        lease = self.leases.get(lease_id)
        if lease is None:
            return 0
        self.keepalives += 1
        lease.expires_at = self.loop.time() + lease.ttl
        self._arm(lease)
        return lease.ttl

    def revoke(self, lease_id: int) -> None:
        lease = self.leases.pop(lease_id, None)
        if lease is not None:
            if lease.timer is not None:
                lease.timer.cancel()
            self._delete_keys(sorted(lease.keys))

    def _arm(self, lease: _Lease) -> None:
        if lease.timer is not None:
            lease.timer.cancel()
        lease.timer = self.loop.call_at(lease.expires_at, self._expire, lease.id)

    def _expire(self, lease_id: int) -> None:
        lease = self.leases.get(lease_id)
        # a timer may run up to the loop's clock resolution early: that is not a renewed lease
        if lease is None or not self.up or self.loop.time() < lease.expires_at - 1e-3:
            return
        del self.leases[lease_id]
        self.expired.append((self.loop.time(), lease_id))
        self._delete_keys(sorted(lease.keys))

    def _delete_keys(self, keys: list[str]) -> None:
        keys = [k for k in keys if k in self.kvs]
        if not keys:
            return
        self.revision += 1
        events = []
        for key in keys:
            self._detach(self.kvs.pop(key))
            events.append(Event("delete", key, b"", self.revision))
        self._publish(events)

    def _detach(self, kv: KV) -> None:
        lease = self.leases.get(kv.lease)
        if lease is not None:
            lease.keys.discard(kv.key)

    def range(self, prefix: str) -> tuple[int, list[KV]]:
        return self.revision, [kv for key, kv in sorted(self.kvs.items()) if key.startswith(prefix)]

    def txn(self, compare: list[Compare], success: list, failure: list) -> TxnResult:
        ok = all(self._holds(c) for c in compare)
        branch = success if ok else failure
        for op in branch:
            if isinstance(op, Put) and op.lease and op.lease not in self.leases:
                raise StoreUnavailable("etcdserver: requested lease not found")
        writes = [op for op in branch if isinstance(op, (Put, Delete))]
        if writes:
            self.revision += 1
        gets, events = [], []
        for op in branch:
            if isinstance(op, Get):
                gets.append(self.kvs.get(op.key))
            elif isinstance(op, Put):
                old = self.kvs.get(op.key)
                if old is not None:
                    self._detach(old)
                kv = KV(op.key, op.value, old.create_revision if old else self.revision, self.revision,
                        op.lease)
                self.kvs[op.key] = kv
                if op.lease:
                    self.leases[op.lease].keys.add(op.key)
                events.append(Event("put", op.key, op.value, self.revision, op.lease))
            elif isinstance(op, Delete) and op.key in self.kvs:
                self._detach(self.kvs.pop(op.key))
                events.append(Event("delete", op.key, b"", self.revision))
        if events:
            self._publish(events)
        return TxnResult(ok, self.revision, gets)

    def _holds(self, c: Compare) -> bool:
        kv = self.kvs.get(c.key)
        if c.target == "value":
            return kv is not None and kv.value == c.value
        have = 0 if kv is None else (kv.create_revision if c.target == "create" else kv.mod_revision)
        return have == c.value

    def _publish(self, events: list[Event]) -> None:
        self.history.extend(events)
        for watch in list(self.watchers):
            watch.deliver(events)

    def compact(self) -> None:
        self.compacted = self.revision
        self.history.clear()

    # -- restarts --------------------------------------------------------------------------------
    def stop(self) -> None:
        self.up = False
        for watch in list(self.watchers):
            watch.fail(StoreUnavailable("etcd stopped"))

    def wipe(self) -> None:
        """A new etcd in its place (data lost, or a new cluster): nothing kept, a new id."""
        for lease in self.leases.values():
            if lease.timer is not None:
                lease.timer.cancel()
        self.revision, self.kvs, self.leases, self.history = 1, {}, {}, []
        self.compacted = 0
        self.cluster_id = next(_CLUSTER_IDS)

    def start(self) -> None:
        self.up = True
        now = self.loop.time()
        for lease in self.leases.values():  # a new leader: every lease gets its full TTL again
            lease.expires_at = now + lease.ttl
            self._arm(lease)

    def client(self, name: str, **options) -> "MemoryStore":
        return MemoryStore(self, name, **options)


class _Watch:
    def __init__(self, server: MemoryEtcd, client: "MemoryStore", prefix: str, on_events, on_error):
        self.server, self.client, self.prefix = server, client, prefix
        self.on_events, self.on_error = on_events, on_error
        self.alive = True

    def deliver(self, events: list[Event]) -> None:
        mine = [e for e in events if e.key.startswith(self.prefix)]
        if mine and self.alive:
            delay = self.client.latency
            self.server.loop.call_later(delay, self._hand_over, mine)

    def _hand_over(self, events) -> None:
        if self.alive and not self.client.cut and self.client.deaf is None:
            self.on_events(events)

    def fail(self, exc: Exception) -> None:
        if self.alive:
            self.alive = False
            self.server.watchers.remove(self)
            result = self.on_error(exc)
            if asyncio.iscoroutine(result):
                asyncio.ensure_future(result)

    async def cancel(self) -> None:
        if self.alive:
            self.alive = False
            self.server.watchers.remove(self)


class MemoryStore:
    """One node's client of ``MemoryEtcd``; ``latency`` each way, ``partition()`` to cut it off."""

    def __init__(self, server: MemoryEtcd, name: str, *, latency: float = 0.002,
                 timeout: float = 1.0) -> None:
        self.server = server
        self.endpoint = f"memory://{name}"
        self.latency = latency
        self.timeout = timeout
        self.cut = False
        self.deaf: int | None = None  # the session open when deafened (deafen)
        self.sessions = 0
        self.connected = False
        self.cluster_id: int | None = None
        self.calls: list[tuple[float, str]] = []  # (sent at, operation)

    def partition(self) -> None:
        self.cut = True
        for watch in [w for w in self.server.watchers if w.client is self]:
            watch.fail(StoreUnavailable("partitioned"))

    def heal(self) -> None:
        self.cut = False
        self.deaf = None

    def deafen(self) -> None:
        """A one-way partition: what this client sends on its open session still reaches etcd
        (a keepalive renews the lease, a txn is applied), no answer and no watch event comes
        back; a session opened meanwhile never completes its handshake."""
        self.deaf = self.sessions

    async def _rpc(self, what: str, handle):
        loop = asyncio.get_running_loop()
        self.calls.append((loop.time(), what))
        if not self.connected:
            raise StoreUnavailable("not connected")
        if self.deaf is not None:
            if self.deaf == self.sessions and self.server.up:
                await asyncio.sleep(self.latency)
                with contextlib.suppress(Exception):
                    handle()  # it arrived: applied, and the answer lost
            await asyncio.sleep(self.timeout)
            raise StoreUnavailable(f"{what}: deadline exceeded")
        if self.cut or not self.server.up:
            await asyncio.sleep(self.timeout)
            raise StoreUnavailable(f"{what}: deadline exceeded")
        await asyncio.sleep(self.latency)
        if self.cut or not self.server.up:
            await asyncio.sleep(self.timeout - self.latency)
            raise StoreUnavailable(f"{what}: deadline exceeded")
        result = handle()
        await asyncio.sleep(self.latency)
        return result

    async def connect(self) -> None:
        self.connected = True
        self.sessions += 1

    async def close(self) -> None:
        self.connected = False

    async def grant(self, ttl: int) -> tuple[int, int]:
        return await self._rpc("grant", lambda: self.server.grant(ttl))

    async def keepalive(self, lease_id: int) -> int:
        return await self._rpc("keepalive", lambda: self.server.keepalive(lease_id))

    async def revoke(self, lease_id: int) -> None:
        await self._rpc("revoke", lambda: self.server.revoke(lease_id))

    async def range(self, prefix: str):
        def read():
            self.cluster_id = self.server.cluster_id
            return self.server.range(prefix)
        return await self._rpc(f"range {prefix}", read)

    async def txn(self, compare, success, failure) -> TxnResult:
        return await self._rpc("txn", lambda: self.server.txn(compare, success, failure))

    async def watch(self, prefix: str, start_revision: int, on_events, on_error):
        def create():
            server = self.server
            if start_revision <= server.compacted:
                raise StoreCompacted(server.compacted)
            watch = _Watch(server, self, prefix, on_events, on_error)
            server.watchers.append(watch)
            backlog = [e for e in server.history if e.mod_revision >= start_revision]
            if backlog:
                watch.deliver(backlog)
            return watch
        return await self._rpc("watch", create)
