"""Exchanges and bindings declared at run time (the admin API, docs/operations.md): applied on
top of the configuration's.

How this works
--------------
``apply(exchanges, declared, bindings)`` makes the node's exchanges what the configuration
declares plus ``declared`` (``ExchangeDecl``) and ``bindings`` (``BindingDecl``, exchange
bindings), replacing the previous run-time set, in place:

* an exchange the configuration declares keeps its type and its configured bindings; run-time
  bindings may be added to it;
* a run-time exchange that is new is made; one whose type changed is changed in place (its
  producers route by the new type from the next message);
* a run-time exchange no longer declared is taken away: its producers' links are detached
  with ``amqp:resource-deleted`` (their unsettled messages are settled as usual), and a new
  sender to its name is routed by the rules like any address;
* the local queues of new bindings are declared (as at start);
* a binding from a remote ``source`` (``[[bindings]] source``) that is new attaches its
  upstream receiver (``RemoteSubscription``) where its queue is local (with workers: on the
  queue's owner), as at start; one no longer declared is closed: its upstream link detached,
  what it had received and stored stays in the queue, what it had not is the primary's
  again (released with its link).
"""

from __future__ import annotations

import logging

from proxy.exchanges.exchange import Binding, Exchange, ExchangeProducer
from proxy.exchanges.remote_bindings import RemoteSubscription
from proxy.upstream.target import UpstreamTarget

log = logging.getLogger("fedgate.exchanges")

RESOURCE_DELETED = "amqp:resource-deleted"


def _configured(exchanges) -> dict:
    """{name: [Binding]} of the configuration, taken once (before the first apply)."""
    found = getattr(exchanges, "configured", None)
    if found is None:
        found = exchanges.configured = {
            name: list(exchange.bindings) for name, exchange in exchanges.exchanges.items()}
    return found


def apply(exchanges, declared: tuple, bindings: tuple) -> dict:
    """Make the run-time set ``declared`` + ``bindings``; what changed, by name."""
    configured = _configured(exchanges)
    wanted = {decl.name: decl for decl in declared if decl.name not in configured}
    changed = {"added": [], "removed": [], "changed": []}
    for name in [n for n in exchanges.exchanges if n not in configured and n not in wanted]:
        if getattr(exchanges.exchanges[name], "runtime", False):
            _remove(exchanges, name)
            changed["removed"].append(name)
    for name, decl in wanted.items():
        exchange = exchanges.exchanges.get(name)
        if exchange is None:
            exchange = exchanges.exchanges[name] = Exchange(name, decl.type)
            changed["added"].append(name)
        elif exchange.type != decl.type:
            exchange.type = decl.type
            changed["changed"].append(name)
        exchange.runtime = True
        exchange.fanout = decl.upstream_fanout
        exchange.fanout_key = UpstreamTarget.from_url(decl.upstream_fanout.url).key \
            if decl.upstream_fanout is not None else None
    _apply_sources(exchanges, [b for b in bindings if b.source is not None], changed)
    by_exchange: dict[str, list[Binding]] = {}
    for binding in bindings:
        if binding.exchange is None:
            continue  # a remote source: above
        by_exchange.setdefault(binding.exchange, []).append(Binding(binding.queue, binding.key))
    broker = exchanges.broker
    for name, exchange in exchanges.exchanges.items():
        if name not in configured and name not in wanted:
            continue  # a topic's exchange (declare_topic): not ours
        new = configured.get(name, []) + by_exchange.get(name, [])
        if [(b.queue, b.key) for b in new] != [(b.queue, b.key) for b in exchange.bindings]:
            exchange.bindings = new
            if name not in changed["added"]:
                changed["changed"].append(name)
        for binding in new:
            if broker.resolve(binding.queue).kind == "local":
                broker.queues.declare(binding.queue, **exchanges.queue_options(binding.queue))
    if any(changed.values()):
        log.info("exchanges declared at run time: %s", ", ".join(
            f"{what} {', '.join(names)}" for what, names in changed.items() if names))
    broker.run_pending()
    return changed


def source_key(binding) -> tuple:
    source = binding.source
    return (binding.queue, source.url, source.address, source.window, repr(source.upstream))


def _apply_sources(exchanges, bindings: list, changed: dict) -> None:
    """The run-time remote sources: new ones attached, removed ones closed."""
    running = getattr(exchanges, "runtime_sources", None)
    if running is None:
        running = exchanges.runtime_sources = {}
    wanted = {source_key(b): b for b in bindings}
    for key in [k for k in running if k not in wanted]:
        subscription = running.pop(key)
        subscription.close()
        if subscription in exchanges.subscriptions:
            exchanges.subscriptions.remove(subscription)
        changed["removed"].append(f"{key[0]} <- {key[2]}")
    broker = exchanges.broker
    for key, binding in wanted.items():
        if key in running or broker.resolve(binding.queue).kind != "local":
            continue  # running, or with workers: the queue's owner runs it
        queue = broker.queues.declare(binding.queue, **exchanges.queue_options(binding.queue))
        source = binding.source
        upstream = exchanges.upstreams.for_url(source.url, source.upstream)
        subscription = RemoteSubscription(broker, queue, source, upstream, exchanges.hold)
        exchanges.subscriptions.append(subscription)
        running[key] = subscription
        changed["added"].append(f"{binding.queue} <- {source.address}")


def _remove(exchanges, name: str) -> None:
    exchange = exchanges.exchanges.pop(name)
    exchange.bindings = []
    for handler in list(exchanges.broker.handlers.values()):
        for endpoint in list(handler.links.values()):
            if isinstance(endpoint, ExchangeProducer) and endpoint.exchange is exchange:
                handler.close_link(endpoint.link, RESOURCE_DELETED,
                                   f"exchange {name!r} deleted by an operator")
