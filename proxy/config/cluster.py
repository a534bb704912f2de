"""``[cluster]``: where the cluster's shared state lives (issue #34).

Without ``etcd`` the cluster is static, as before: ``[peers]`` lists the other
nodes and rules are gossiped between admin APIs (``[admin] cluster``). With
``etcd`` the nodes register in etcd under ``/fedgate/<name>/`` and take members,
rules and ownership from there (``proxy.cluster``, docs/cluster.md);
``[peers]`` becomes optional.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from proxy.config.errors import ConfigError

_NAME = re.compile(r"[A-Za-z0-9_.-]+")


@dataclass(frozen=True)
class ClusterSection:
    # the key prefix in etcd: /fedgate/<name>/
    name: str = "fedgate"
    # etcd client URLs (http:// or https://); empty: a static cluster (no etcd)
    etcd: tuple[str, ...] = ()
    # seconds; etcd leases count whole seconds (and grant at least their minimum, ~2 s)
    lease_ttl: float = 3.0
    # TLS to etcd: CA to verify the servers; client certificate and key (mutual TLS)
    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    # etcd authentication: user name and a file holding the password
    user: str | None = None
    password_file: str | None = None
    # how other nodes and clients reach this node (default: from [node] listen / [admin] listen)
    advertise: str | None = None
    advertise_admin: str | None = None
    # how this node reaches other nodes, by id, where that is not their advertised URL (a NAT,
    # a proxy in between; the fault tests put a Toxiproxy per pair of nodes): node id -> URL
    reach: dict[str, str] = field(default_factory=dict)
    # the clock-rate allowance: the node acts for at most ttl * (1 - clock_drift) - margin
    # after it sent its last successful renewal (docs/cluster.md, "Fencing")
    clock_drift: float = 0.1
    # seconds a node waits for etcd at start before it gives up
    start_timeout: float = 10.0
    # seconds a node stopping (SIGTERM) waits for its fragments of "*" queues to be stolen empty
    drain_timeout: float = 5.0

    @property
    def enabled(self) -> bool:
        return bool(self.etcd)

    def check(self, key: str) -> None:
        if not _NAME.fullmatch(self.name):
            raise ConfigError(f"{key}.name", "letters, digits, '_', '.', '-'")
        for index, url in enumerate(self.etcd):
            _check_url(url, f"{key}.etcd[{index}]", ("http", "https"))
        if not math.isfinite(self.lease_ttl) or self.lease_ttl != int(self.lease_ttl) \
                or not 1 <= self.lease_ttl <= 600:
            raise ConfigError(f"{key}.lease_ttl",
                              "whole seconds between 1 and 600 (etcd leases count seconds)")
        if not 0.0 <= self.clock_drift <= 0.5:
            raise ConfigError(f"{key}.clock_drift", "between 0 and 0.5")
        if self.start_timeout <= 0 or self.drain_timeout < 0:
            raise ConfigError(f"{key}.start_timeout", "start_timeout > 0, drain_timeout >= 0")
        if (self.cert is None) != (self.key is None):
            raise ConfigError(f"{key}.{'key' if self.key is None else 'cert'}",
                              "cert and key go together (a client certificate for etcd)")
        if (self.user is None) != (self.password_file is None):
            raise ConfigError(f"{key}.{'password_file' if self.password_file is None else 'user'}",
                              "user and password_file go together (etcd authentication)")
        if not self.etcd:
            for name in ("ca", "cert", "key", "user", "password_file"):
                if getattr(self, name) is not None:
                    raise ConfigError(f"{key}.{name}", "only with etcd (a static cluster has no etcd)")
        if self.advertise is not None:
            _check_url(self.advertise, f"{key}.advertise", ("amqp", "amqps"))
        if self.advertise_admin is not None:
            _check_url(self.advertise_admin, f"{key}.advertise_admin", ("http", "https"))
        for node, url in self.reach.items():
            _check_url(url, f"{key}.reach.{node}", ("amqp", "amqps"))

    @property
    def tls(self) -> bool:
        return any(url.startswith("https://") for url in self.etcd) or self.ca is not None


def _check_url(url, key: str, schemes: tuple[str, ...]) -> None:
    if not isinstance(url, str) or "://" not in url:
        raise ConfigError(key, f"expected a {'/'.join(s + '://' for s in schemes)} URL, got {url!r}")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as exc:
        raise ConfigError(key, f"invalid URL {url!r}: {exc}") from None
    if parts.scheme not in schemes or not parts.hostname:
        raise ConfigError(key, f"expected a {'/'.join(s + '://' for s in schemes)} URL, got {url!r}")
