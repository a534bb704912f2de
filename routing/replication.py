"""The replication keys of a rule: ``kind = "replicated"``, and ``replicas`` on fragmented queues.

``replicas`` copies of each queue (the primary's included: 2 to 5; a fragmented
queue's default 1 keeps each fragment on its member only), ``nodes`` (the
replica set's candidates, default: every live member, placed by the ketama
ring), ``min_in_sync`` (copies holding a message before it is accepted, 1 to
``replicas``), ``catchup_timeout`` (seconds a backup may lag before it leaves
the in-sync set). docs/replication.md.
"""

from __future__ import annotations

from typing import Any, Callable

MAX_REPLICAS = 5
DEFAULT_REPLICAS = {"replicated": 2, "fragmented": 1}
REPLICATION_KINDS = tuple(DEFAULT_REPLICAS)


def replicas_of(rule) -> int:
    """The copies a rule keeps of each queue (its ``replicas``, else its kind's default)."""
    if rule.replicas is not None:
        return rule.replicas
    return DEFAULT_REPLICAS.get(rule.kind, 1)


def replication_problems(r: Any, kind, known: bool, bad: Callable[[str, str], None]) -> None:
    """Check a rule's replication keys (``bad(field, detail)`` for each problem)."""
    replicas = r.replicas
    if replicas is not None:
        if not isinstance(replicas, int) or isinstance(replicas, bool):
            bad("replicas", f"expected an integer, got {replicas!r}")
            replicas = None
        elif known and kind not in REPLICATION_KINDS:
            bad("replicas", f"only for kinds 'replicated' and 'fragmented', not {kind!r}")
        elif known and kind == "replicated" and not 2 <= replicas <= MAX_REPLICAS:
            bad("replicas", f"between 2 and {MAX_REPLICAS} for kind 'replicated', got {replicas}")
        elif not 1 <= replicas <= MAX_REPLICAS:
            bad("replicas", f"between 1 and {MAX_REPLICAS}, got {replicas}")
    copies = replicas if replicas is not None else DEFAULT_REPLICAS.get(kind, 1) if known else None
    nodes = r.nodes
    if not isinstance(nodes, tuple) or not all(isinstance(n, str) and n for n in nodes):
        bad("nodes", f"expected a list of node ids, got {nodes!r}")
    elif nodes:
        if known and kind != "replicated":
            bad("nodes", f"only for kind 'replicated', not {kind!r}")
        elif len(set(nodes)) != len(nodes):
            bad("nodes", "a node is listed twice")
        elif copies is not None and len(nodes) < copies:
            bad("nodes", f"{len(nodes)} nodes for {copies} copies")
    min_in_sync = r.min_in_sync
    if not isinstance(min_in_sync, int) or isinstance(min_in_sync, bool) or min_in_sync < 1:
        bad("min_in_sync", f"expected an integer of at least 1, got {min_in_sync!r}")
    elif min_in_sync != 1 and known and kind not in REPLICATION_KINDS:
        bad("min_in_sync", f"only for kinds 'replicated' and 'fragmented', not {kind!r}")
    elif copies is not None and min_in_sync > copies:
        bad("min_in_sync", f"at most replicas ({copies}), got {min_in_sync}")
    timeout = r.catchup_timeout
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        bad("catchup_timeout", f"expected seconds > 0, got {timeout!r}")
