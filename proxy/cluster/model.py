"""What the cluster coordination hands out: members, claims, errors, the interface.

``Coordinator`` is the one interface the node and the layers above use; two
classes give it: ``StaticCoordinator`` (``proxy.cluster.static``: no etcd, the
``[peers]`` table, today's behaviour) and ``EtcdCoordinator``
(``proxy.cluster.etcd``). docs/cluster.md describes both.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Protocol

from proxy.config.compat import MEMBER_FORMAT


@dataclass(frozen=True)
class Member:
    """A live node of the cluster, as its registration says."""

    id: str
    amqp: str  # how clients and other nodes reach it
    admin: str | None  # its admin API, when known
    workers: int  # its worker processes
    version: str  # fedgate's version on it
    lease_age_s: float | None  # seconds since it registered its current lease (None: static)
    draining: bool = False  # it is leaving: its fragments of "*" queues are being emptied
    # what it announced (docs/upgrades.md); None: nothing (0.5.0, or a static peer)
    features: tuple[str, ...] | None = None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Claim:
    """``owner`` holds ``resource`` at ``epoch``; epochs of one resource only go up."""

    resource: str
    owner: str
    epoch: int

    def to_dict(self) -> dict:
        return asdict(self)


class CoordinatorError(Exception):
    """Something the cluster coordination cannot do; the message says what and why."""


class CoordinatorUnavailable(CoordinatorError):
    """etcd cannot be reached, or this node is fenced: no ownership change, no rule change."""


class DuplicateNode(CoordinatorError):
    """Another live node registered this node's id."""


class Coordinator(Protocol):
    kind: str  # "etcd" | "static"
    healthy: bool  # etcd reachable (static: always)
    revision: int  # the last etcd revision this node has seen (static: 0)
    endpoints: list[str]

    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    def members(self) -> list[Member]: ...
    def on_members(self, callback: Callable[[list[Member]], None]) -> None: ...
    def acting(self) -> bool: ...
    def on_fenced(self, callback: Callable[[bool], None]) -> None: ...
    async def claim(self, resource: str, *, only_if_owner_gone: bool = True,
                    require_state: dict[str, bytes | None] | None = None,
                    put_state: dict[str, bytes] | None = None,
                    epoch_at_least: int = 0) -> Claim | None: ...
    async def release(self, claim: Claim) -> None: ...
    def current_owner(self, resource: str) -> Claim | None: ...
    def on_owner(self, resource_prefix: str,
                 callback: Callable[[str, Claim | None], None]) -> None: ...
    async def put_state(self, key: str, value: bytes, *, if_owner: Claim | None = None) -> None: ...
    async def swap_state(self, key: str, expected: bytes | None, value: bytes) -> bool: ...
    async def get_state(self, prefix: str) -> dict[str, bytes]: ...
    def describe(self) -> dict: ...


def member_value(member: Member, *, registered_at: float) -> bytes:
    """A member's registration as stored in etcd (``lease_age_s`` is derived, not stored)."""
    body = member.to_dict()
    del body["lease_age_s"]
    body["registered_at"] = registered_at
    body["format"] = MEMBER_FORMAT  # 0.5.0's record has none; it ignores keys it does not know
    body["features"] = sorted(member.features or ())
    return json.dumps(body, sort_keys=True).encode()


def parse_member(value: bytes, *, now: float) -> Member | None:
    """A registration read from etcd; None when it is not one (logged by the caller)."""
    try:
        body = json.loads(value)
        registered_at = float(body["registered_at"])
        return Member(id=str(body["id"]), amqp=str(body["amqp"]), admin=body.get("admin"),
                      workers=int(body.get("workers", 1)), version=str(body.get("version", "")),
                      lease_age_s=round(max(0.0, now - registered_at), 3),
                      draining=bool(body.get("draining", False)),
                      features=_features(body.get("features")))
    except (ValueError, KeyError, TypeError):
        return None


def _features(value) -> tuple[str, ...] | None:
    if not isinstance(value, list):
        return None  # 0.5.0's record: no features announced
    return tuple(sorted(str(item) for item in value))


def claim_value(claim: Claim) -> bytes:
    return json.dumps(claim.to_dict(), sort_keys=True).encode()


def parse_claim(value: bytes) -> Claim | None:
    try:
        body = json.loads(value)
        return Claim(str(body["resource"]), str(body["owner"]), int(body["epoch"]))
    except (ValueError, KeyError, TypeError):
        return None


class Listeners:
    """Callbacks of one kind; one that raises is logged and the others still run."""

    def __init__(self, log) -> None:
        self.log = log
        self.callbacks: list[Callable] = []

    def add(self, callback: Callable) -> None:
        self.callbacks.append(callback)

    def __call__(self, *args) -> None:
        for callback in list(self.callbacks):
            try:
                callback(*args)
            except Exception:
                self.log.exception("cluster listener %r failed", callback)
