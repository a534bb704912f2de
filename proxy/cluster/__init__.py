"""Cluster coordination (issue #34): who the members are, whether this node may act,
who owns what, and where the shared rules record lives.

Owns: the ``Coordinator`` interface and its two implementations, ``Member`` and
``Claim`` (``model``); the lease and fencing logic as data (``lease``, no I/O);
the cache of the cluster's keys (``view``); the etcd driver (``etcd``) over a
small store interface (``store``; ``etcd_store`` is aetcd), and the static
coordinator of a cluster without etcd (``static``). docs/cluster.md has the
design, the keys in etcd and what each failure does.

May import: ``proxy.config`` (the ``[cluster]`` section). Nothing here runs
per message: the node reads members and ``acting()`` from memory.
"""

from __future__ import annotations

import socket
from pathlib import Path

from proxy.config.settings import Config
from proxy.config.version import version as release_version

from .model import (Claim, Coordinator, CoordinatorError, CoordinatorUnavailable, DuplicateNode,
                    Member)
from .static import StaticCoordinator

__all__ = ["Claim", "Coordinator", "CoordinatorError", "CoordinatorUnavailable", "DuplicateNode",
           "Member", "StaticCoordinator", "build_coordinator", "advertised_urls"]


def fedgate_version() -> str:
    """This code's release (``proxy.config.version``: the checkout's pyproject.toml, else the
    package's metadata; an editable install's metadata keeps the version it was installed
    at, so it is read second)."""
    return release_version()


def _url(scheme: str, host: str, port: int) -> str:
    if host in ("0.0.0.0", "::", ""):
        host = socket.getfqdn()
    return f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}"


def advertised_urls(config: Config) -> tuple[str, str | None]:
    """(AMQP URL, admin URL) other nodes and clients reach this node by."""
    cluster = config.cluster
    amqp = cluster.advertise or _url("amqps" if config.tls else "amqp", *config.listen)
    admin = cluster.advertise_admin
    if admin is None and config.admin.enabled:
        admin = _url("http", *config.admin_listen)
    return amqp, admin


def build_coordinator(config: Config, *, worker_index: int = 0, worker_count: int = 1) -> Coordinator:
    """Static without ``[cluster] etcd``; else on etcd, where only worker 0 registers the node;
    with workers, each one holds a lease of its own for the replicated queues it owns (issue #45)."""
    amqp, admin = advertised_urls(config)
    common = dict(node_id=config.node.id, amqp=amqp, admin=admin, workers=worker_count,
                  version=fedgate_version())
    cluster = config.cluster
    if not cluster.enabled:
        data_dir = Path(config.node.data_dir)
        if worker_count > 1:  # each worker claims its own queues: epochs kept apart (issue #45)
            data_dir = data_dir / "workers" / str(worker_index)
        return StaticCoordinator(peers=dict(config.peers), peer_admins=dict(config.admin.cluster),
                                 data_dir=data_dir, **common)
    from .etcd import EtcdCoordinator
    from .etcd_store import AetcdStore

    def path(value: str | None) -> Path | None:
        return config.resolve_path(value) if value else None

    store = AetcdStore(list(cluster.etcd), request_timeout=min(1.0, cluster.lease_ttl / 3),
                       ca=path(cluster.ca), cert=path(cluster.cert), key=path(cluster.key),
                       user=cluster.user, password_file=path(cluster.password_file))
    return EtcdCoordinator(name=cluster.name, store=store, endpoints=list(cluster.etcd),
                           lease_ttl=cluster.lease_ttl, clock_drift=cluster.clock_drift,
                           start_timeout=cluster.start_timeout, register=worker_index == 0,
                           worker=worker_index if worker_count > 1 else None,
                           reach=dict(cluster.reach), **common)
