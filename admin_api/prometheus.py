"""The node's numbers in the Prometheus text exposition format (version 0.0.4).

Everything is read at scrape time from the node's live objects; the only
state kept for metrics is the delivery-latency histogram that the broker
fills (``proxy.metrics.Histogram``). Names start with ``fedgate_``;
``_total`` are counters, the rest gauges, plus one histogram.
"""

from __future__ import annotations

from collections.abc import Iterable

from proxy.queues.endpoints import QueueConsumer, QueueProducer

from .inspect_api import UP_STATES, describe_fragments, describe_upstreams
from .replication import ROLES, described

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _escape(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: dict[str, object]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items()) + "}"


def _number(value: float) -> str:
    if value == float("inf"):
        return "+Inf"
    if isinstance(value, float) and not value.is_integer():
        return repr(value)
    return str(int(value))


class Exposition:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_text: str,
               samples: Iterable[tuple[dict, float]]) -> None:
        self.lines.append(f"# HELP {name} {help_text}")
        self.lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            self.lines.append(f"{name}{_labels(labels)} {_number(value)}")

    def histogram(self, name: str, help_text: str, snapshot) -> None:
        self.lines.append(f"# HELP {name} {help_text}")
        self.lines.append(f"# TYPE {name} histogram")
        for bound, count in zip(snapshot.bounds, snapshot.cumulative):
            self.lines.append(f'{name}_bucket{{le="{bound:g}"}} {count}')
        self.lines.append(f'{name}_bucket{{le="+Inf"}} {snapshot.count}')
        self.lines.append(f"{name}_sum {snapshot.total!r}")
        self.lines.append(f"{name}_count {snapshot.count}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def replication(out: Exposition, items: list[dict]) -> None:
    """Replicated queues as this node sees them (admin_api.replication)."""
    items = sorted(items, key=lambda i: i["address"])
    primaries = [i for i in items if i.get("role") == "primary"]
    backups = [(i["address"], b) for i in primaries for b in i.get("backups") or []]
    out.family("fedgate_replication_role", "gauge",
               "This node's role for a replicated queue: 1 for the role it has, 0 for the others.",
               [({"queue": i["address"], "role": role}, 1 if i.get("role") == role else 0)
                for i in items for role in (*ROLES, *([i.get("role")] if i.get("role") not in ROLES
                                                       else []))])
    out.family("fedgate_replication_epoch", "gauge",
               "Epoch of the replicated queue's primary as this node knows it.",
               [({"queue": i["address"]}, i["epoch"]) for i in items if i.get("epoch") is not None])
    out.family("fedgate_replication_in_sync_backups", "gauge",
               "Backups in the in-sync set of a replicated queue (on its primary).",
               [({"queue": i["address"]}, len(i.get("in_sync") or [])) for i in primaries])
    out.family("fedgate_replication_backups", "gauge",
               "Backups of a replicated queue by state (on its primary).",
               [({"queue": q, "backup": b["node"], "state": b["state"]}, 1) for q, b in backups])
    out.family("fedgate_replication_backup_lag_messages", "gauge",
               "Replication events a backup has not acknowledged yet (on the primary).",
               [({"queue": q, "backup": b["node"]}, b.get("lag_messages") or 0) for q, b in backups])
    out.family("fedgate_replication_backup_lag_seconds", "gauge",
               "How long the oldest event a backup has not acknowledged has waited (on the primary).",
               [({"queue": q, "backup": b["node"]}, round((b.get("lag_ms") or 0) / 1000, 4))
                for q, b in backups])
    out.family("fedgate_replication_waiting_acceptance", "gauge",
               "Producers' messages the primary holds and has not accepted yet: waiting for the "
               "in-sync backups.",
               [({"queue": i["address"]}, i.get("waiting_acceptance") or 0) for i in primaries])
    out.family("fedgate_replication_copy_depth", "gauge",
               "Messages in this node's backup copy of a replicated queue.",
               [({"queue": i["address"]}, (i.get("copy") or {}).get("depth") or 0)
                for i in items if i.get("copy") is not None])
    out.family("fedgate_replication_failovers_total", "counter",
               "Times the replicated queue's primary changed, as this node saw it.",
               [({"queue": i["address"]}, i.get("failovers") or 0) for i in items])


def paging(out: Exposition, node, queues: list) -> None:
    """Bodies on disk (docs/paging.md): per queue and for the node, and the page store."""
    out.family("fedgate_queue_paged_bytes", "gauge", "Bytes of a queue's bodies on disk only.",
               [({"queue": name}, q.paged_bytes) for name, q in queues if q.paged_bytes])
    out.family("fedgate_queue_paged_messages", "gauge", "Messages of a queue whose body is on "
               "disk only (scheduled ones in runs included).",
               [({"queue": name}, q.paged_count + q.scheduled.paged) for name, q in queues
                if q.paged_count or q.scheduled.paged])
    memory = node.queues.memory
    out.family("fedgate_resident_bytes", "gauge", "Payload bytes of local queues in memory "
               "(the paging budget is [limits] max_memory).", [({}, memory.resident)])
    pager = getattr(node, "pager", None)
    if pager is None:
        return
    store = pager.store
    out.family("fedgate_paged_bytes", "gauge", "Payload bytes on disk only.", [({}, memory.paged)])
    out.family("fedgate_page_store_bytes", "gauge", "Bytes of the page store's segment files "
               "([limits] max_disk).", [({}, store.disk_bytes)])
    if pager.free_disk is not None:
        out.family("fedgate_page_store_free_bytes", "gauge", "Free space of the page store's "
                   "file system ([limits] min_free_disk).", [({}, pager.free_disk)])
    out.family("fedgate_paged_out_total", "counter", "Messages whose body was written to disk.",
               [({}, pager.paged_out)])
    out.family("fedgate_read_back_total", "counter", "Paged messages read back into memory.",
               [({}, pager.read_back)])
    out.family("fedgate_paging_bound", "gauge", "1 while a disk bound stops producers at the "
               "memory budget (disk, free-disk, error).",
               [({"bound": b}, int(pager.bound == b)) for b in ("disk", "free-disk", "error")])


def render(node) -> str:
    out = Exposition()
    handlers = [p.handler for p in list(node.connections) if getattr(p, "handler", None)]
    endpoints = [e for h in handlers for e in h.links.values()]
    totals = node.queues.totals()
    local = {"kind": "local"}

    out.family("fedgate_connections", "gauge", "Open client connections.",
               [({}, len(node.connections))])
    websocket = sum(1 for p in list(node.connections) if getattr(p, "transport_kind", "tcp") == "websocket")
    out.family("fedgate_connections_by_transport", "gauge",
               "Open client connections by transport (AMQP on TCP, AMQP over WebSocket).",
               [({"transport": "tcp"}, len(node.connections) - websocket),
                ({"transport": "websocket"}, websocket)])
    stalled = node.output_stalled()
    out.family("fedgate_connections_output_stalled", "gauge",
               "Client connections whose output has waited over 10 s without moving (stuck).",
               [({}, len(stalled))])
    out.family("fedgate_connections_output_stalled_max_seconds", "gauge",
               "The longest time a client connection's output has waited without moving.",
               [({}, round(max((s for _, s in stalled), default=0.0), 1))])
    out.family("fedgate_connections_handed_over_total", "counter",
               "Client connections handed to another worker after their first attach (placement).",
               [({}, node.placement.handed_over)])
    oauth = getattr(node, "oauth", None)
    if oauth is not None:  # [oauth]: refused tokens by reason (SASL and admin API), JWKS fetches
        from proxy.auth.oauth.validate import REASONS

        out.family("fedgate_oauth_refused_total", "counter",
                   "Tokens refused (SASL logins and admin API), by reason (docs/oauth.md).",
                   [({"reason": r}, oauth.refused.get(r, 0)) for r in REASONS])
        out.family("fedgate_oauth_jwks_fetches_total", "counter",
                   "Fetches of the JWKS document by result (rate_limited: a refetch not started).",
                   [({"result": r}, oauth.keys.fetches.get(r, 0)) for r in ("ok", "failed", "rate_limited")])
    out.family("fedgate_links", "gauge", "Attached client links by role.", [
        ({"role": "consumer"}, sum(1 for e in endpoints if isinstance(e, QueueConsumer))),
        ({"role": "producer"}, sum(1 for e in endpoints if isinstance(e, QueueProducer))),
    ])
    out.family("fedgate_messages_in_total", "counter",
               "Messages received from clients, by address kind.", [(local, totals.enqueued)])
    out.family("fedgate_messages_out_total", "counter",
               "Messages sent to clients, by address kind.", [(local, totals.delivered)])
    out.family("fedgate_messages_settled_total", "counter",
               "Deliveries to clients settled, by address kind and outcome.", [
                   ({**local, "outcome": "accepted"}, totals.acknowledged),
                   ({**local, "outcome": "released"}, totals.released),
                   ({**local, "outcome": "modified"}, totals.modified),
                   ({**local, "outcome": "rejected"}, totals.rejected),
               ])
    out.family("fedgate_messages_dead_lettered_total", "counter",
               "Messages moved to a dead-letter queue (rejected, expired, overflow, delivery limit).",
               [({}, totals.dead_lettered)])
    out.family("fedgate_messages_expired_total", "counter",
               "Messages past their ttl taken out of local queues.", [({}, totals.expired)])
    queues = sorted(node.queues.queues.items())
    out.family("fedgate_queues", "gauge", "Local queues.", [({}, len(queues))])
    out.family("fedgate_queue_depth", "gauge", "Messages stored in a local queue.",
               [({"queue": name}, q.depth) for name, q in queues])
    out.family("fedgate_queue_scheduled", "gauge",
               "Messages held until their delivery time (x-opt-delivery-time), not in the depth.",
               [({"queue": name}, q.scheduled.total) for name, q in queues])
    out.family("fedgate_queue_depth_by_priority", "gauge",
               "Messages waiting in a local queue, by priority (queues that saw one other than 4).",
               [({"queue": name, "priority": str(p)}, n) for name, q in queues
                if hasattr(q.messages, "by_priority") for p, n in q.messages.by_priority().items()])
    out.family("fedgate_messages_delivery_limited_total", "counter",
               "Messages whose deliveries failed delivery_limit times (dead-lettered or dropped).",
               [({}, totals.delivery_limited)])
    out.family("fedgate_queue_unacked", "gauge", "Messages delivered and not yet settled.",
               [({"queue": name}, q.unacked) for name, q in queues])
    out.family("fedgate_queue_consumers", "gauge", "Consumers attached to a local queue.",
               [({"queue": name}, len(q.consumers)) for name, q in queues])
    out.family("fedgate_queue_bytes", "gauge", "Payload bytes a local queue holds (waiting or unsettled).",
               [({"queue": name}, q.bytes) for name, q in queues])
    out.family("fedgate_queued_bytes", "gauge", "Payload bytes all local queues hold ([limits] max_memory).",
               [({}, node.queues.memory.used)])
    paging(out, node, queues)
    out.family("fedgate_messages_dropped_total", "counter",
               "Messages dropped from a queue's head by overflow drop-head.", [({}, totals.dropped)])

    transactions = node.broker.transactions
    messages_held, bytes_held = transactions.held()
    out.family("fedgate_transactions_open", "gauge", "AMQP transactions declared and not yet "
               "discharged (every client connection).", [({}, transactions.open)])
    out.family("fedgate_transaction_messages_held", "gauge",
               "Messages held by open transactions (posted, settled, or forwarded in them).",
               [({}, messages_held)])
    out.family("fedgate_transaction_bytes_held", "gauge",
               "Bytes of messages posted in open transactions (they count towards max_memory).",
               [({}, bytes_held)])
    stats = transactions.stats
    out.family("fedgate_transactions_total", "counter", "Transactions by how they ended.", [
        ({"outcome": "committed"}, stats.committed),
        ({"outcome": "rolled_back"}, stats.rolled_back),
        ({"outcome": "timed_out"}, stats.timed_out),
        ({"outcome": "unknown"}, stats.unknown),
    ])
    out.family("fedgate_transaction_declares_refused_total", "counter",
               "Declares refused (max_transactions_per_connection, distributed transactions).",
               [({}, stats.refused)])

    fragments = describe_fragments(node)
    out.family("fedgate_steals_total", "counter",
               "Messages stolen between fragments of fragmented queues.",
               [({}, sum(int(f.get("stolen_in", 0) or 0) for f in fragments))])
    out.family("fedgate_fragment_depth", "gauge", "Messages in a fragment.", [
        ({"queue": f.get("address", "?"), "fragment": f.get("local") or "-"},
         int(f.get("depth", 0) or 0)) for f in fragments
    ])
    upstreams = describe_upstreams(node)
    out.family("fedgate_upstream_up", "gauge", "1 when the upstream connection is up.", [
        ({"upstream": u["name"]}, 1 if u["state"] in UP_STATES else 0) for u in upstreams
    ])
    out.family("fedgate_upstream_reconnects_total", "counter", "Reconnects to an upstream.", [
        ({"upstream": u["name"]}, int(u["reconnects"] or 0)) for u in upstreams
    ])
    replication(out, described(node))
    out.family("fedgate_rules_version", "gauge", "Version of the routing rules this node serves.",
               [({}, node.rules_store.current.version)])
    out.histogram("fedgate_delivery_latency_seconds",
                  "Seconds from enqueue to accepted settlement (local queues).",
                  node.broker.delivery_latency.snapshot())
    return out.text()
