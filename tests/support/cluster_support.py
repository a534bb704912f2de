"""Nodes of a cluster on etcd, and what a user checks of them (admin API, open frame).

``etcd_node`` starts a ``fedgate serve`` whose ``[cluster]`` points at the given etcd
endpoints under a cluster name of the test's own; the helpers read what
``GET /api/v1/cluster`` and ``fedgate status`` show: the members, the coordinator
(healthy, acting), and the open frame's ``failover-server-list``. Every wait is bounded.
"""

from __future__ import annotations

import time

from admin_client import TOKENS, http, wait_for
from proton import symbol
from proton.utils import BlockingConnection

LEASE_TTL = 3


def etcd_node(start_node, name: str, etcd: list[str], cluster_name: str, *, rules=None,
              lease_ttl: float = LEASE_TTL, cluster: dict | None = None, **sections):
    config = {"admin": {"tokens": TOKENS},
              "cluster": {"name": cluster_name, "etcd": list(etcd), "lease_ttl": lease_ttl,
                          "start_timeout": 20.0, **(cluster or {})},
              **sections}
    if rules is not None:
        config["rules"] = rules
    return start_node(config, name)


def cluster_view(node, timeout: float = 2.0) -> dict:
    status, body = http("GET", node.admin_url + "/api/v1/cluster", timeout=timeout)
    assert status == 200, body
    return body


def member_ids(node) -> list[str]:
    return [m["id"] for m in cluster_view(node)["members"]]


def coordinator(node) -> dict:
    return cluster_view(node)["coordinator"]


def wait_members(node, ids, timeout: float) -> float:
    """Seconds until ``node`` lists exactly ``ids`` as members."""
    started = time.monotonic()
    wait_for(lambda: member_ids(node) == sorted(ids), timeout=timeout, interval=0.02,
             what=f"{node.config_path.stem} to list members {sorted(ids)}")
    return time.monotonic() - started


def failover_list(url: str) -> list[str]:
    """``host:port`` of every entry of the open frame's failover-server-list."""
    conn = BlockingConnection(url, timeout=10)
    try:
        properties = conn.conn.remote_properties or {}
    finally:
        conn.close()
    return [f"{s[symbol('network-host')]}:{s[symbol('port')]}"
            for s in properties.get(symbol("failover-server-list"), [])]


def rules_etag(node) -> tuple[int, str]:
    status, body = http("GET", node.admin_url + "/api/v1/rules", timeout=2.0)
    assert status == 200, body
    return body["version"], body["digest"]


def etag_of(node) -> str:
    import urllib.request

    from admin_client import ADMIN_TOKEN

    request = urllib.request.Request(node.admin_url + "/api/v1/rules",
                                     headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    with urllib.request.urlopen(request, timeout=2.0) as response:
        return response.headers["ETag"]
