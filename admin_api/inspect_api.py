"""Read-only views of a running node: node, connections, links, queues (replicated
ones too), fragments, upstreams; and closing one client connection.

Everything is read straight from the node's objects in the node's own event
loop (no copies kept, no locks needed): ``node.connections`` (the asyncio
protocols), their ``ClientHandler`` (peer, identity, link endpoints) and
``node.queues``. Fragments and upstreams come from ``node.describe_fragments()``
and ``node.describe_upstreams()`` when the node has them.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from aiohttp import web

from proxy.amqp.engine import partial_transfers
from proxy.config.version import version as release
from proxy.queues.endpoints import QueueConsumer, QueueProducer

from .errors import ApiError, json_response
from .inputs import path_int
from .keys import ADMIN_URL, NODE, STARTED  # noqa: F401  (imported from here by the others)


FORCED = "amqp:connection:forced"


def describe_fragments(node) -> list[dict]:
    return list(getattr(node, "describe_fragments", lambda: [])())


UP_STATES = ("up", "open", "connected")


def upstream_summary(item: dict) -> dict[str, Any]:
    """One upstream (a pool to one primary) with ``name``, ``state``, ``reconnects``.

    Takes the node's own description as it is and adds those three keys when
    missing: name from ``primary``/``url``, state ``up`` when connected (else
    the best state of its members), reconnects summed over members.
    """
    members = item.get("members") or []
    out = dict(item)
    out.setdefault("name", item.get("primary") or item.get("url") or "?")
    if "state" not in item:
        states = [m.get("state") for m in members]
        if item.get("connected") or any(s in UP_STATES for s in states):
            out["state"] = "up"
        else:
            out["state"] = next((s for s in ("connecting", "backoff", "down") if s in states), "down")
    if "reconnects" not in item:
        out["reconnects"] = sum(int(m.get("reconnects", 0) or 0) for m in members)
    return out


def describe_upstreams(node) -> list[dict]:
    return [upstream_summary(u) for u in getattr(node, "describe_upstreams", lambda: [])()]


def _handlers(node):
    """(protocol, handler) for every open client connection."""
    for protocol in list(node.connections):
        handler = getattr(protocol, "handler", None)
        if handler is not None:
            yield protocol, handler


def _link(handler, endpoint) -> dict[str, Any]:
    link = getattr(endpoint, "link", None)
    item: dict[str, Any] = {
        "connection": handler.connection_id,
        "name": link.name if link is not None else None,
        "address": getattr(endpoint, "address", None),
    }
    if isinstance(endpoint, QueueConsumer):
        item.update(role="consumer", sent=endpoint.sent, unsettled=len(endpoint.unsettled),
                    credit=endpoint.credit, presettled=endpoint.presettled)
    elif isinstance(endpoint, QueueProducer):
        item.update(role="producer", received=endpoint.received,
                    credit=endpoint.outstanding_credit)
    else:  # e.g. proxied links: their own type, counters when they have them
        item.update(role=type(endpoint).__name__,
                    sent=getattr(endpoint, "sent", 0), received=getattr(endpoint, "received", 0))
        remote = getattr(endpoint, "remote_address", None)
        if remote is not None:
            item["remote_address"] = remote
        if link is not None:  # what the client sees: its address, its credit and unsettled
            terminus = link.remote_source if link.is_sender else link.remote_target
            if terminus.address:
                item["address"] = terminus.address
            item.update(credit=link.credit, unsettled=link.unsettled)
    return item


def _connection(protocol, handler) -> dict[str, Any]:
    identity = handler.identity
    links = list(handler.links.values())
    item = _connection_item(protocol, handler, identity, links)
    grant = getattr(identity, "token", None)
    if grant is not None:  # a token login ([oauth]): sub, expiry, the scopes granted
        item["token"] = grant.describe()
    return item


def _connection_item(protocol, handler, identity, links) -> dict[str, Any]:
    return {
        "id": handler.connection_id,
        "peer": handler.peer,
        "transport": getattr(protocol, "transport_kind", "tcp"),  # tcp | websocket
        "tls": protocol.node.tls_context is not None,
        "user": getattr(identity, "user", None),
        "mechanism": getattr(identity, "mechanism", None),
        "amqp_open": handler.server_connection is not None,
        "container_id": (handler.server_connection.remote_container or None)
        if handler.server_connection is not None else None,
        "links": len(links),
        # links proton still keeps on the connection (open or closing): a count that
        # only grows would be a leak
        "proton_links": handler.links_held(),
        "sent": sum(getattr(e, "sent", 0) for e in links),
        "received": sum(getattr(e, "received", 0) for e in links),
        # bytes written for the client and not taken yet, and for how long none of them moved:
        # over 10 s is a stuck connection (a client not reading; issue #33)
        "output_pending_bytes": protocol.output_pending(),
        "output_stalled_s": round(protocol.output_stalled_s(asyncio.get_running_loop().time()), 1),
        # open AMQP transactions (proxy.transactions): id, age_s, state, messages held, home
        "transactions": handler.transactions.describe() if handler.transactions is not None else [],
    }


def queue_info(queue) -> dict[str, Any]:
    return {
        "name": queue.name,
        "depth": queue.depth,
        "consumers": len(queue.consumers),
        "producers": len(queue.producers),
        "browsers": len(queue.browsers),
        "unacked": queue.unacked,
        "max_depth": queue.max_depth,
        "durable": queue.durable,
        "bytes": queue.bytes,
        "max_bytes": queue.max_bytes,
        "overflow": queue.overflow,
        "temporary": queue.temporary,
        "dead_letter": queue.dead_letter,
        "delivery_limit": queue.delivery_limit,
        # docs/queue-semantics.md: held until their delivery time (not in depth), waiting by
        # priority (only once a priority other than 4 was seen), consumers with a selector
        "scheduled": queue.scheduled.total,
        "by_priority": {str(p): n for p, n in (
            queue.messages.by_priority() if hasattr(queue.messages, "by_priority")
            else ({4: queue.depth} if queue.depth else {})).items()},
        "selective_consumers": len(queue.selective),
        # docs/paging.md: bodies on disk only, what is in memory, a read-ahead under way
        "paged_messages": queue.paged_count + queue.scheduled.paged,
        "paged_bytes": queue.paged_bytes,
        "memory_bytes": queue.bytes - queue.paged_bytes,
        "paging": bool(queue.paged_count or queue.scheduled.paged),
        # docs/paging-scheduled.md: scheduled messages in runs on disk, their bodies' bytes
        "scheduled_paged": queue.scheduled.paged,
        "scheduled_paged_bytes": queue.scheduled.paged_bytes,
        "reading": queue.reading,
        "stats": dict(vars(queue.stats)),
    }


def memory_info(node) -> dict[str, Any]:
    """Bytes of messages held by local queues, against [limits] max_memory (0: none), and
    with paging (docs/paging.md) the page store, its bounds and which one holds."""
    memory = node.queues.memory
    pager = getattr(node, "pager", None)
    bound = None
    if memory.ceiling and memory.resident >= memory.ceiling:
        bound = "memory"
    if pager is not None and pager.bound:
        bound = pager.bound
    return {"queued_bytes": memory.used, "max_memory": memory.limit,
            "resident_bytes": memory.resident, "paged_bytes": memory.paged,
            "publishers_blocked": bool(memory.blocked), "bound": bound,
            "incomplete_transfer_bytes": partial_transfers.total,
            "paging": pager.describe() if pager is not None else None}


def node_info(request: web.Request) -> dict[str, Any]:
    node = request.app[NODE]
    totals = node.queues.totals()
    links = sum(len(h.links) for _, h in _handlers(node))
    version = node.rules_store.current.version
    return {
        "id": node.node_id,
        "version": release(),  # the release (pyproject.toml, CHANGELOG.md)
        "url": node.url if node.address else None,
        "admin_url": request.app[ADMIN_URL]["url"],
        "uptime_s": round(time.monotonic() - request.app[STARTED], 3),
        "rules_version": version,
        "routing_table_version": node.routing.version,
        "peers": dict(node.config.peers),
        "counters": {
            "connections": len(node.connections),
            "links": links,
            "queues": len(node.queues.queues),
            "messages_in": totals.enqueued,
            "messages_out": totals.delivered,
            "messages_settled": totals.acknowledged + totals.released + totals.modified + totals.rejected,
            "fragments": len(describe_fragments(node)),
            "connections_output_stalled": len(node.output_stalled()),
            # handed to the worker that owns their first attach's queue (issue #36)
            "connections_handed_over": node.placement.handed_over,
            "upstreams": len(describe_upstreams(node)),
        },
        "memory": memory_info(node),
        # AMQP transactions: open ones node-wide, what they hold, counters since start
        "transactions": node.broker.transactions.describe(),
    }


async def get_node(request: web.Request) -> web.Response:
    return json_response(node_info(request))


async def get_connections(request: web.Request) -> web.Response:
    node = request.app[NODE]
    items = sorted((_connection(p, h) for p, h in _handlers(node)), key=lambda c: c["id"])
    return json_response({"count": len(items), "connections": items})


async def delete_connection(request: web.Request) -> web.Response:
    wanted = path_int(request, "id")
    node = request.app[NODE]
    for protocol, handler in _handlers(node):
        if handler.connection_id == wanted:
            protocol.close(FORCED, "closed by an administrator")
            return json_response({"closed": wanted, "condition": FORCED})
    raise ApiError(404, "connection_not_found", f"no open connection {wanted}", field="id")


async def get_links(request: web.Request) -> web.Response:
    node = request.app[NODE]
    items = [_link(h, e) for _, h in _handlers(node) for e in list(h.links.values())]
    items.sort(key=lambda i: (i["connection"], i["name"] or ""))
    return json_response({
        "count": len(items),
        "consumers": sum(1 for i in items if i["role"] == "consumer"),
        "producers": sum(1 for i in items if i["role"] == "producer"),
        "links": items,
    })


def queues_doc(node) -> dict[str, Any]:
    """Local queues, and the replicated queues this node knows (admin_api.replication): on
    their primary a local queue with a ``replication`` object and ``role``; elsewhere (a
    backup, or a node that proxies its clients to the primary) ``name``, ``role`` and
    ``replication`` only."""
    from .replication import queue_items

    local = [queue_info(q) for _, q in sorted(node.queues.queues.items())]
    on_local, elsewhere = queue_items(node, {i["name"] for i in local})
    for item in local:
        replication = on_local.get(item["name"])
        if replication is not None:
            item.update(role=replication["role"], replication=replication)
    items = sorted(local + elsewhere, key=lambda i: i["name"])
    return {
        "count": len(items),
        "depth": sum(i["depth"] for i in local),
        "replicated": len(on_local) + len(elsewhere),
        "totals": dict(vars(node.queues.totals())),
        "queues": items,
    }


async def get_queues(request: web.Request) -> web.Response:
    return json_response(queues_doc(request.app[NODE]))


async def get_fragments(request: web.Request) -> web.Response:
    items = describe_fragments(request.app[NODE])
    return json_response({
        "count": len(items),
        "depth": sum(int(i.get("depth", 0) or 0) for i in items),
        "steals": sum(int(i.get("stolen_in", 0) or 0) for i in items),  # messages stolen in
        "fragments": items,
    })


async def get_exchanges(request: web.Request) -> web.Response:
    node = request.app[NODE]
    described = getattr(node, "describe_exchanges", lambda: {})()
    items = described.get("exchanges", [])
    return json_response({
        "count": len(items),
        "exchanges": items,
        "sources": described.get("sources", []),
        "anonymous_relay": described.get("anonymous_relay", {}),
    })


async def get_subscriptions(request: web.Request) -> web.Response:
    """Topic subscriptions on this node's exchanges (proxy.exchanges.subscriptions)."""
    node = request.app[NODE]
    items = node.exchanges.topic_subscriptions.describe()
    return json_response({"count": len(items), "subscriptions": items})


async def delete_subscription(request: web.Request) -> web.Response:
    """Remove a subscription and what it holds; refused while a consumer is attached."""
    node = request.app[NODE]
    name = request.match_info["name"]
    subscriptions = node.exchanges.topic_subscriptions
    sub = subscriptions.by_name.get(name)
    if sub is None:
        raise ApiError(404, "subscription_not_found", f"no subscription {name!r}", field="name")
    if sub.consumers:
        raise ApiError(409, "subscription_in_use", f"subscription {name!r} has "
                                                   f"{len(sub.consumers)} consumer(s) attached",
                       field="name")
    held = sub.queue.depth + sub.queue.scheduled.total
    subscriptions.remove(sub)
    node.run_pending()
    return json_response({"deleted": name, "messages": held})


async def get_upstreams(request: web.Request) -> web.Response:
    items = describe_upstreams(request.app[NODE])
    return json_response({
        "count": len(items),
        "up": sum(1 for i in items if i["state"] in UP_STATES),
        "reconnects": sum(int(i.get("reconnects", 0) or 0) for i in items),
        "upstreams": items,
    })
