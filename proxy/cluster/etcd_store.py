"""``Store`` on a real etcd, through aetcd (asyncio, gRPC).

How this works
--------------
One aetcd ``Client`` (one gRPC channel) to one endpoint at a time. ``connect``
closes the current channel and opens one to the *next* endpoint of
``[cluster] etcd``: the coordinator calls it again after any failure, so a dead
member (or one cut off from its peers) is left for the next one. Every call is
bounded by ``request_timeout``; every aetcd or gRPC error becomes
``StoreUnavailable`` (``StoreCompacted`` for a watch that asked for compacted
revisions).

TLS (``https://`` endpoints, or ``ca``/``cert``/``key``) opens a secure channel;
aetcd 1.0's own ``connect`` only opens plain ones, so ``_Client.connect`` takes
the same steps on a TLS channel (stubs, watcher, login). ``user`` and
``password_file`` log in with etcd's Authenticate call on each new channel.

aetcd has no background keepalive: ``keepalive`` sends one ``LeaseKeepAlive``
per call, and the coordinator's renewal task decides when.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from urllib.parse import urlsplit

import aetcd
import grpc
from aetcd import rpc

from .store import KV, Compare, Delete, Event, Get, Put, StoreCompacted, StoreUnavailable, TxnResult

log = logging.getLogger("fedgate.cluster.etcd")

CHANNEL_OPTIONS = {
    "grpc.initial_reconnect_backoff_ms": 100,
    "grpc.min_reconnect_backoff_ms": 100,
    "grpc.max_reconnect_backoff_ms": 1000,
    # a silent (blackholed) connection is found by HTTP/2 pings even while only a watch is open
    # (issue #42); etcd refuses pings more often than every 5 s (--grpc-keepalive-min-time).
    # Whether this node may act is the lease's clock's to say (LeaseKeeper), never the socket's.
    "grpc.keepalive_time_ms": 5000,
    "grpc.keepalive_timeout_ms": 2000,
    "grpc.keepalive_permit_without_calls": 1,
    "grpc.http2.max_pings_without_data": 0,
}


class _Client(aetcd.Client):
    """aetcd's client, with a TLS channel when ``credentials`` are given."""

    def __init__(self, *args, credentials: grpc.ChannelCredentials | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._credentials = credentials

    async def connect(self) -> None:
        if self._credentials is None:
            return await super().connect()
        if self._connected.is_set():
            return
        # the same steps as aetcd's own connect, on a TLS channel
        self.channel = grpc.aio.secure_channel(f"{self._host}:{self._port}", self._credentials,
                                               options=list(self._options.items()))
        if self._username is not None:
            self.auth_stub = rpc.AuthStub(self.channel)
            reply = await self.auth_stub.Authenticate(
                rpc.AuthenticateRequest(name=self._username, password=self._password),
                timeout=self._timeout)
            self.metadata = (("token", reply.token),)
        self.kvstub = rpc.KVStub(self.channel)
        self.clusterstub = rpc.ClusterStub(self.channel)
        self.leasestub = rpc.LeaseStub(self.channel)
        self.maintenancestub = rpc.MaintenanceStub(self.channel)
        self._watcher = aetcd.Watcher(rpc.WatchStub(self.channel), timeout=self._timeout,
                                      metadata=self.metadata)
        self._connected.set()


class _Watching:
    def __init__(self, watch, task: asyncio.Task) -> None:
        self.watch = watch
        self.task = task

    async def cancel(self) -> None:
        self.task.cancel()
        try:
            await asyncio.wait_for(self.watch.cancel(), 1.0)
        except (aetcd.ClientError, asyncio.TimeoutError, grpc.RpcError, RuntimeError):
            pass  # the channel is being closed anyway
        await asyncio.gather(self.task, return_exceptions=True)


def _unavailable(exc: BaseException, endpoint: str) -> StoreUnavailable:
    if isinstance(exc, grpc.aio.AioRpcError):  # its str() is a multi-line dump
        text = f"{exc.details()} ({exc.code().name})"
    else:
        text = str(exc).strip() or type(exc).__name__
    return StoreUnavailable(f"{endpoint}: {text.splitlines()[0][:300]}")


class AetcdStore:
    def __init__(self, endpoints: list[str], *, request_timeout: float = 1.0,
                 ca: Path | None = None, cert: Path | None = None, key: Path | None = None,
                 user: str | None = None, password_file: Path | None = None) -> None:
        if not endpoints:
            raise ValueError("no etcd endpoints")
        self.endpoints = list(endpoints)
        self.request_timeout = request_timeout
        self.ca, self.cert, self.key = ca, cert, key
        self.user, self.password_file = user, password_file
        self.index = -1
        self.client: _Client | None = None
        self.endpoint = self.endpoints[0]
        self.cluster_id: int | None = None

    # -- connection ------------------------------------------------------------------------
    def _credentials(self, scheme: str) -> grpc.ChannelCredentials | None:
        if scheme != "https" and self.ca is None:
            return None
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca.read_bytes() if self.ca else None,
            private_key=self.key.read_bytes() if self.key else None,
            certificate_chain=self.cert.read_bytes() if self.cert else None)

    async def connect(self) -> None:
        await self.close()
        self.index = (self.index + 1) % len(self.endpoints)
        self.endpoint = self.endpoints[self.index]
        parts = urlsplit(self.endpoint)
        password = None
        if self.user is not None:
            try:
                password = self.password_file.read_text().strip()
            except OSError as exc:
                raise StoreUnavailable(f"etcd password file {self.password_file}: {exc}") from None
        try:
            client = _Client(parts.hostname, parts.port or 2379, username=self.user, password=password,
                             timeout=self.request_timeout, options=CHANNEL_OPTIONS,
                             credentials=self._credentials(parts.scheme))
            await asyncio.wait_for(client.connect(), self.request_timeout * 2)
        except (aetcd.ClientError, grpc.RpcError, OSError, asyncio.TimeoutError) as exc:
            raise _unavailable(exc, self.endpoint) from None
        self.client = client

    async def close(self) -> None:
        client, self.client = self.client, None
        if client is not None:
            try:
                await asyncio.wait_for(client.close(), 2.0)
            except (aetcd.ClientError, grpc.RpcError, asyncio.TimeoutError, RuntimeError) as exc:
                log.debug("closing the etcd channel: %r", exc)

    def _live(self) -> _Client:
        if self.client is None:
            raise StoreUnavailable("not connected to etcd")
        return self.client

    async def _call(self, coro):
        try:
            return await asyncio.wait_for(coro, self.request_timeout + 0.5)
        except (aetcd.ClientError, grpc.RpcError, asyncio.TimeoutError, OSError) as exc:
            raise _unavailable(exc, self.endpoint) from None
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the caller itself is cancelled
            # grpc.aio cancels the calls in flight on a channel that is closed: a reconnect
            # (``connect`` closes the old channel) under a call. The caller is told the store
            # is unavailable, as for any other failure, and tries again; a CancelledError
            # escaped every ``except Exception`` on its way and left, e.g., a primary's
            # in-sync write neither done nor failed, and its backups never in sync again
            # (docs/nemesis.md, finding 25)
            raise StoreUnavailable(f"{self.endpoint}: the call was cancelled (its channel "
                                   "closed under it)") from None

    # -- leases ------------------------------------------------------------------------------
    async def grant(self, ttl: int) -> tuple[int, int]:
        lease = await self._call(self._live().lease(ttl))
        return lease.id, lease.ttl

    async def keepalive(self, lease_id: int) -> int:
        try:
            reply = await self._call(self._live().refresh_lease(lease_id))
        except StoreUnavailable as exc:
            if "lease not found" in str(exc):
                return 0
            raise
        return reply.TTL if reply is not None else 0

    async def revoke(self, lease_id: int) -> None:
        try:
            await self._call(self._live().revoke_lease(lease_id))
        except StoreUnavailable as exc:
            if "lease not found" not in str(exc):
                raise

    # -- keys -----------------------------------------------------------------------------------
    async def range(self, prefix: str) -> tuple[int, list[KV]]:
        result = await self._call(self._live().get_prefix(prefix.encode()))
        self.cluster_id = result.header.cluster_id
        kvs = [KV(kv.key.decode(), bytes(kv.value), kv.create_revision, kv.mod_revision, kv.lease)
               for kv in result.kvs]
        return result.header.revision, kvs

    async def txn(self, compare: list[Compare], success: list, failure: list) -> TxnResult:
        client = self._live()
        t = client.transactions
        checks = []
        for item in compare:
            target = {"create": t.create, "mod": t.mod, "value": t.value}[item.target](item.key.encode())
            checks.append(target == item.value)
        succeeded, responses = await self._call(
            client.transaction(compare=checks, success=self._ops(client, success),
                               failure=self._ops(client, failure)))
        branch = success if succeeded else failure
        gets: list[KV | None] = []
        revision = 0
        for op, response in zip(branch, responses):
            if isinstance(op, Get):
                if response:
                    value, got = response[0]
                    gets.append(KV(got.key.decode(), bytes(value), got.create_revision,
                                   got.mod_revision, got.lease))
                    revision = max(revision, got.header.revision)
                else:
                    gets.append(None)
            elif isinstance(op, Put):
                revision = max(revision, response.response_put.header.revision)
            elif isinstance(op, Delete):
                revision = max(revision, response.response_delete_range.header.revision)
        return TxnResult(succeeded, revision, gets)

    @staticmethod
    def _ops(client, ops: list) -> list:
        t = client.transactions
        out = []
        for op in ops:
            if isinstance(op, Put):
                out.append(t.put(op.key.encode(), op.value, lease=op.lease or None))
            elif isinstance(op, Get):
                out.append(t.get(op.key.encode()))
            elif isinstance(op, Delete):
                out.append(t.delete(op.key.encode()))
            else:
                raise TypeError(f"not a transaction operation: {op!r}")
        return out

    # -- watch ------------------------------------------------------------------------------------
    async def watch(self, prefix: str, start_revision: int, on_events, on_error) -> _Watching:
        client = self._live()
        try:
            watch = await asyncio.wait_for(
                client.watch_prefix(prefix.encode(), start_revision=start_revision),
                self.request_timeout * 2)
        except aetcd.RevisionCompactedError as exc:
            raise StoreCompacted(exc.compacted_revision) from None
        except (aetcd.ClientError, grpc.RpcError, asyncio.TimeoutError) as exc:
            raise _unavailable(exc, self.endpoint) from None
        endpoint = self.endpoint

        async def pump() -> None:
            try:
                async for event in watch:
                    kv = event.kv
                    kind = "put" if event.kind == "PUT" else "delete"
                    on_events([Event(kind, kv.key.decode(), bytes(kv.value), kv.mod_revision,
                                     kv.lease)])
            except aetcd.RevisionCompactedError as exc:
                await _report(on_error, StoreCompacted(exc.compacted_revision))
                return
            except (aetcd.ClientError, grpc.RpcError) as exc:
                await _report(on_error, _unavailable(exc, endpoint))
                return
            await _report(on_error, StoreUnavailable(f"{endpoint}: the watch ended"))

        return _Watching(watch, asyncio.get_running_loop().create_task(pump()))


async def _report(on_error, exc: Exception) -> None:
    result = on_error(exc)
    if asyncio.iscoroutine(result):
        await result
