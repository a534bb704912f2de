"""Topic subscriptions: a receiver attached to an exchange subscribes to it (docs/exchanges.md).

A subscription is a local queue (named ``<exchange>::<subscription>``) that gets every
message published to its exchange that its selector selects (the selector is applied
as the message is routed, so a subscription never collects what it does not select).
Its kind comes from the receiver's source, as Qpid JMS sends it:

* **non-durable** (source durability none, expiry not ``never``), not shared: made at
  attach, gone at detach (JMS ``createConsumer(topic)``);
* **durable** (durability ``unsettled-state`` or expiry ``never``): named
  ``<container-id>:<link name>`` (JMS ``createDurableSubscriber``: the client id and the
  subscription name). It keeps collecting while detached; a detach with ``closed = true``
  removes it (JMS ``unsubscribe``). One consumer at a time (another:
  ``amqp:resource-locked``). Recorded in ``<data_dir>/subscriptions.json``: it survives a
  restart, its durable messages in the journal;
* **shared** (capability ``shared``; JMS 2.0 ``createSharedConsumer`` /
  ``createSharedDurableConsumer``): named ``<container-id or "global">:<link name up to
  "|">`` (``global`` capability: no client id); its consumers compete. A non-durable
  shared one goes with its last consumer.

A **no-local** filter (``apache.org:no-local-filter:list``, JMS ``createConsumer(topic,
selector, true)`` and ``createDurableSubscriber(topic, name, selector, true)``) keeps out of the
subscription what a connection with the subscriber's container id publishes (Artemis does the
same: Qpid JMS's container id is the client id, else one of its own per connection).

A receiver with no source address whose link name is a durable subscription's (Qpid JMS
looks a subscription up that way before ``unsubscribe``) is answered with that
subscription's source; none: ``amqp:not-found``. A subscription whose selector or
exchange changed, attached again while nobody consumes it, starts again empty (JMS).
On a node with workers, each subscription lives on one worker and every worker routes to
all of them (``proxy.exchanges.across_workers``).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from proton import Described, Terminus, symbol

from proxy import selectors
from proxy.amqp.termini import (NO_LOCAL_FILTER, SELECTOR_FILTER, capability_names, filters,
                                is_no_local, is_selector, set_capabilities)
from proxy.exchanges.across_workers import AcrossWorkers, identity
from proxy.queues import durable as journal_queues

log = logging.getLogger("fedgate.exchanges")

NOT_FOUND = "amqp:not-found"
NOT_IMPLEMENTED = "amqp:not-implemented"
INVALID_FIELD = "amqp:invalid-field"
RESOURCE_LOCKED = "amqp:resource-locked"
FORWARDED = object()  # subscribe / find: the link went on to the worker that hosts it


class SubscriptionRefused(Exception):
    def __init__(self, condition: str, description: str) -> None:
        super().__init__(description)
        self.condition = condition
        self.description = description


@dataclass(eq=False)
class Subscription:
    name: str
    exchange: str
    queue: object  # LocalQueue
    selector: object = None  # proxy.selectors.Selector, or None: every message
    durable: bool = False
    shared: bool = False
    global_: bool = False
    consumers: set = field(default_factory=set)
    # no-local: the container id whose publications it does not collect; None: it takes all
    no_local: str | None = None

    @property
    def selector_text(self) -> str | None:
        return self.selector.text if self.selector is not None else None

    def record(self) -> dict:
        return {"name": self.name, "exchange": self.exchange, "selector": self.selector_text,
                "shared": self.shared, "global": self.global_, "no_local": self.no_local}

    def describe(self) -> dict:
        queue = self.queue
        return {**self.record(), "durable": self.durable, "queue": queue.name,
                "consumers": len(self.consumers), "depth": queue.depth,
                "scheduled": queue.scheduled.total, "unacked": queue.unacked,
                "enqueued": queue.stats.enqueued}


def container_of(handler) -> str:
    """The container id of a client handler's connection ("" before its open)."""
    connection = handler.server_connection
    return (connection.remote_container or "") if connection is not None else ""


def _filters(source):
    """(selector or None, whether no-local) from a subscriber's source."""
    found = filters(source)
    no_local = any(is_no_local(descriptor) for descriptor, _ in found.values())
    others = sorted(name for name, (descriptor, _) in found.items()
                    if not is_selector(descriptor) and not is_no_local(descriptor))
    if others:
        raise SubscriptionRefused(NOT_IMPLEMENTED,
                                  f"filters are not supported on a subscription ({', '.join(others)})")
    return _selector([value for descriptor, value in found.values() if is_selector(descriptor)]), \
        no_local


def _selector(texts):
    if not texts:
        return None
    if len(texts) > 1 or not isinstance(texts[0], str):
        raise SubscriptionRefused(INVALID_FIELD, "one selector filter, a string")
    try:
        selector = selectors.parse(texts[0])
    except selectors.SelectorError as exc:
        raise SubscriptionRefused(INVALID_FIELD, f"selector {texts[0]!r}: {exc}") from None
    return None if selector.selects_all else selector


class Subscriptions:
    """Every subscription of this node's exchanges, by name."""

    def __init__(self, broker, exchanges) -> None:
        self.broker = broker
        self.exchanges = exchanges
        self.by_name: dict[str, Subscription] = {}
        self.by_exchange: dict[str, list[Subscription]] = {}
        self.path: Path | None = None  # <data_dir>/subscriptions.json (durable ones)
        self.workers: AcrossWorkers | None = None  # a node with workers (across_workers)
        self._temporary = itertools.count(1)

    # -- lifecycle ---------------------------------------------------------------------
    def configure(self, path: Path | None, *, worker=None) -> None:
        """``worker``: this process's ``WorkerContext`` on a node with workers > 1."""
        self.path = path
        self.workers = AcrossWorkers(self, worker) if worker is not None else None

    def load(self) -> None:
        """Durable subscriptions recorded before a restart: made again, collecting at once."""
        if self.path is None or not self.path.is_file():
            return
        try:
            records = json.loads(self.path.read_text())
        except (OSError, ValueError) as exc:
            log.error("subscriptions: %s unreadable (%s): none restored", self.path, exc)
            return
        for record in records:
            exchange = self.exchanges.get(record["exchange"]) or self.exchanges.declare_topic(
                record["exchange"])
            selector = selectors.parse(record["selector"]) if record.get("selector") else None
            self._make(record["name"], exchange, selector, durable=True,
                       shared=record.get("shared", False), global_=record.get("global", False),
                       no_local=record.get("no_local"), restored=True)
        log.info("subscriptions: %d durable ones restored", len(records))

    def _save(self) -> None:
        if self.path is None:
            return
        records = [s.record() for s in self.by_name.values() if s.durable]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(records, indent=1))
        os.replace(tmp, self.path)

    # -- routing -----------------------------------------------------------------------
    def route_elsewhere(self, exchange_name: str, payload: bytes, origin: str | None) -> list:
        """[(upstream, queue address)]: the other workers' subscriptions that take it."""
        return self.workers.route(exchange_name, payload, origin) if self.workers else []

    def route(self, exchange_name: str, payload: bytes, origin: str | None = None) -> list:
        """The subscription queues of ``exchange_name`` that take this message; ``origin``: the
        container id of the connection that published it (no-local)."""
        subs = self.by_exchange.get(exchange_name)
        if not subs:
            return []
        return [s.queue for s in subs if (s.no_local is None or s.no_local != origin)
                and (s.selector is None or s.selector.matches(payload))]

    def queues(self, exchange_name: str) -> list:
        return [s.queue for s in self.by_exchange.get(exchange_name, ())]

    # -- attach ------------------------------------------------------------------------
    def subscribe(self, handler, link, exchange):
        """The subscription a receiver on ``exchange`` consumes from (made if new), or
        FORWARDED: another worker hosts it, and the link went on there."""
        source = link.remote_source
        capabilities = capability_names(source)
        shared = "shared" in capabilities
        global_ = "global" in capabilities
        durable = (source.durability != Terminus.NONDURABLE
                   or source.expiry_policy == Terminus.EXPIRE_NEVER)
        selector, no_local = _filters(source)
        container, link_name = identity(handler, link)
        no_local = container if no_local else None
        workers = self.workers
        if shared:
            name = f"{'global' if global_ else container}:{link_name.split('|')[0]}"
        elif durable:
            name = f"{container}:{link_name}"
        else:  # lives where its consumer is
            here = f"w{workers.index}." if workers is not None else ""
            name = f"{container}:{link_name}:{here}{next(self._temporary)}"
        if workers is not None and (shared or durable):
            host = workers.host(name)
            if host != workers.index:
                workers.forward(handler, link, host, exchange.name, (container, link_name))
                return FORWARDED
        sub = self.by_name.get(name)
        if sub is not None and (sub.exchange != exchange.name
                                or sub.selector_text != (selector.text if selector else None)
                                or sub.durable != durable or sub.no_local != no_local):
            if sub.consumers:
                raise SubscriptionRefused(RESOURCE_LOCKED, f"subscription {name!r} is in use with "
                                                           "another topic or selector")
            self.remove(sub)  # JMS: a changed durable subscription starts again
            sub = None
        if sub is None:
            sub = self._make(name, exchange, selector, durable=durable, shared=shared,
                             global_=global_, no_local=no_local)
        elif sub.consumers and not sub.shared:
            raise SubscriptionRefused(RESOURCE_LOCKED, f"subscription {name!r} has a consumer "
                                                       "already")
        return sub

    def find(self, handler, link) -> Subscription | None:
        """A lookup by link name (a source with no address): a durable or shared one; FORWARDED:
        another worker has it, and the link went on there."""
        container, name = identity(handler, link)
        base = name.split("|")[0]
        candidates = (f"{container}:{name}", f"{container}:{base}", f"global:{base}")
        for candidate in candidates:
            sub = self.by_name.get(candidate)
            if sub is not None and (sub.durable or sub.shared):
                return sub
        elsewhere = self.workers.worker_of(candidates) if self.workers is not None else None
        if elsewhere is not None:
            self.workers.forward(handler, link, elsewhere, None, (container, name))
            return FORWARDED
        return None

    def answer_source(self, link, sub: Subscription) -> None:
        """Our attach's source for a subscription: its exchange, kind and selector."""
        source = link.source
        source.type = Terminus.SOURCE  # a lookup's source was null: ours is not
        source.address = sub.exchange
        if sub.durable:
            source.durability = Terminus.DELIVERIES
            source.expiry_policy = Terminus.EXPIRE_NEVER
        set_capabilities(source, ("topic",) + (("shared",) if sub.shared else ())
                         + (("global",) if sub.global_ else ()))
        applied = {}
        if sub.selector is not None:
            applied[symbol("jms-selector")] = _described_selector(sub.selector.text)
        if sub.no_local is not None:
            applied[symbol("no-local")] = Described(symbol(NO_LOCAL_FILTER), [])
        if applied:
            source.filter.clear()
            source.filter.put_dict(applied)

    def consumer_attached(self, sub: Subscription, consumer) -> None:
        sub.consumers.add(consumer)

    def consumer_detached(self, sub: Subscription, consumer, *, closed: bool) -> None:
        sub.consumers.discard(consumer)
        if sub.consumers:
            return
        if not sub.durable or closed:  # JMS unsubscribe: a detach with closed = true
            self.remove(sub)

    def _make(self, name: str, exchange, selector, *, durable: bool, shared: bool,
              global_: bool, no_local: str | None = None, restored: bool = False) -> Subscription:
        broker = self.broker
        queue_name = f"{exchange.name}::{name}"
        options = broker.queues.defaults(queue_name)
        options["durable"] = durable and broker.journal is not None
        queue = broker.queues.get(queue_name)
        if queue is not None and not restored:  # left by an earlier one: a new one starts empty
            journal_queues.purged(broker.journal, queue)  # nothing read
            queue.purge()
        queue = queue or broker.queues.declare(queue_name, **options)
        queue.durable = options["durable"]
        sub = Subscription(name, exchange.name, queue, selector, durable, shared, global_,
                           no_local=no_local)
        self.by_name[name] = sub
        self.by_exchange.setdefault(exchange.name, []).append(sub)
        if durable:
            self._save()
        if self.workers is not None:
            self.workers.claim(queue_name)
            self.workers.announce("+", sub)
        log.info("subscription %s on %s made (%s%s%s)", name, exchange.name,
                 "durable" if durable else "non-durable", ", shared" if shared else "",
                 f", selector {selector.text!r}" if selector else "")
        return sub

    def remove(self, sub: Subscription) -> None:
        self.by_name.pop(sub.name, None)
        subs = self.by_exchange.get(sub.exchange, [])
        if sub in subs:
            subs.remove(sub)
        queue = self.broker.queues.delete(sub.queue.name)
        if queue is not None:
            journal_queues.purged(self.broker.journal, queue)  # nothing read
            queue.purge()
        if sub.durable:
            self._save()
        if self.workers is not None:
            self.workers.announce("-", sub)
        log.info("subscription %s on %s removed", sub.name, sub.exchange)

    def delete(self, name: str) -> Subscription | None:
        """The admin API's delete: refused (None) while a consumer is attached."""
        sub = self.by_name.get(name)
        if sub is None or sub.consumers:
            return None
        self.remove(sub)
        return sub

    def describe(self) -> list[dict]:
        return [s.describe() for s in self.by_name.values()]


def _described_selector(text: str):
    return Described(symbol(SELECTOR_FILTER), text)
