"""The few etcd operations the coordinator uses, as one small interface.

``EtcdCoordinator`` (``proxy.cluster.etcd``) talks to a ``Store``:
``proxy.cluster.etcd_store.AetcdStore`` is the real one (aetcd over gRPC);
the playbooks use an in-memory one on a virtual clock
(``tests/support/memory_etcd.py``) with the same semantics: revisions,
leases that expire, transactions, watches, partitions. Keys are ``str``,
values ``bytes``; every error that means "etcd did not answer" is
``StoreUnavailable``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol


class StoreUnavailable(Exception):
    """etcd did not answer (no connection, timeout, no leader, auth failure)."""


class StoreCompacted(StoreUnavailable):
    """A watch asked for revisions etcd has compacted away: read everything again."""

    def __init__(self, compacted_revision: int) -> None:
        super().__init__(f"revision compacted below {compacted_revision}")
        self.compacted_revision = compacted_revision


@dataclass(frozen=True)
class KV:
    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int = 0


@dataclass(frozen=True)
class Event:
    kind: str  # "put" | "delete"
    key: str
    value: bytes  # b"" for a delete
    mod_revision: int
    lease: int = 0


# transaction parts: comparisons and operations, as plain data
@dataclass(frozen=True)
class Compare:
    key: str
    target: str  # "create" | "mod" | "value"
    value: int | bytes  # create/mod: a revision (0: the key is absent); value: bytes


@dataclass(frozen=True)
class Put:
    key: str
    value: bytes
    lease: int = 0


@dataclass(frozen=True)
class Get:
    key: str


@dataclass(frozen=True)
class Delete:
    key: str


@dataclass(frozen=True)
class TxnResult:
    succeeded: bool
    revision: int  # the store's revision after the transaction
    gets: list[KV | None]  # one per Get of the branch taken, in order


class Watching(Protocol):
    async def cancel(self) -> None: ...


class Store(Protocol):
    endpoint: str  # the endpoint in use, for status
    cluster_id: int | None  # the etcd cluster that answered the last read (None: none yet)

    async def connect(self) -> None: ...
    async def close(self) -> None: ...
    async def grant(self, ttl: int) -> tuple[int, int]: ...  # (lease id, granted ttl)
    async def keepalive(self, lease_id: int) -> int: ...  # remaining ttl; <= 0: gone
    async def revoke(self, lease_id: int) -> None: ...
    async def range(self, prefix: str) -> tuple[int, list[KV]]: ...  # (revision, kvs)
    async def txn(self, compare: list[Compare], success: list, failure: list) -> TxnResult: ...

    async def watch(self, prefix: str, start_revision: int,
                    on_events: Callable[[list[Event]], None],
                    on_error: Callable[[Exception], Awaitable[None] | None]) -> Watching: ...
