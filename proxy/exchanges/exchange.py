"""Local exchanges: route each message on its subject to the bound queues, local or proxied.

How this works
--------------
``[[exchanges]]`` declares an exchange; its name is an address clients send
to (it wins over ``[[rules]]`` for senders; a receiver on it is refused:
receive from a queue bound to it). ``[[bindings]]`` bind addresses of this
node to it: a binding's queue is resolved by the routing rules like a
client's address, so it is a local queue or a proxied queue on a primary.

For each message (``ExchangeProducer.on_delivery``) the node reads the
subject, decoding only the properties section (``proxy.message_subject``),
and picks the bindings: ``fanout`` all, ``direct`` those whose key equals the
subject, ``topic`` those whose key pattern (``routing.compile_pattern``:
``*`` one word, ``#`` any words, ``.`` or ``/`` between words) matches it.
A queue bound several times gets one copy. The message bytes are forwarded
as received.

* Local queue: stored at once (durable ones once journaled,
  ``proxy.durable_hold``); that destination has accepted.
* Proxied queue: sent through an internal upstream sender per (primary,
  remote address) (``proxy.links.remote_destinations``) on the shared pool; that
  destination answers with the primary's outcome.
* Fan-out once per primary: with ``upstream_fanout = {primary, address}``,
  when two or more of a message's proxied destinations are on that primary,
  the message crosses once, to ``address`` (``{subject}`` is replaced by the
  subject), instead of once per queue; the primary's own exchange routes it
  to its queues, so its bindings must mirror ours (e.g. RabbitMQ
  ``/exchange/NAME``, which routes on the subject).

A transactional transfer (§4.4.1) is routed when it arrives and held by its
transaction (``proxy.transactions``): every bound queue gets it together at
commit; a binding to a queue on a primary refuses it (``transaction_queues``).

End-to-end settlement (§3.4): the client's delivery is settled when every
destination has answered (``Fanin``): ``accepted`` when all accepted;
``rejected`` (with the first destination's error) when any rejected — the
message is invalid there or the destination is gone (``amqp:not-found``), so
a retry could not succeed; otherwise (released, modified, an upstream link
closed) ``released``: the client sends it again. The destinations that did
accept then get it again: duplicates are possible, loss is not. A message no
binding matches is accepted and dropped (counted as ``unroutable``), as
RabbitMQ does by default; a deny rule or an unknown queue (auto-create off)
as destination rejects with ``amqp:unauthorized-access`` / ``amqp:not-found``.

Credit: a sender gets ``[queues] credit_window`` credit, refilled as its
deliveries settle (unsettled ones count), never beyond the room the depth
limit leaves in the exchange's local queues (it is one of their producers),
and none while one of them is at its ``max_bytes`` (overflow
``reject-publish``) or the node is above ``[limits] max_memory``:
backpressure, nothing dropped. A message sent on credit given before a bound
queue filled to its ``max_bytes`` (``reject-publish``) is refused by that
queue as a direct send would be (``amqp:resource-limit-exceeded``), so the
client's delivery is rejected; the queues that took it keep their copy.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from cproton import (
    PN_ACCEPTED,
    PN_REJECTED,
    PN_RELEASED,
    pn_delivery_remote_state,
    pn_delivery_settle,
    pn_delivery_settled,
    pn_delivery_update,
    pn_link_credit,
    pn_link_flow,
)
from proton import Condition, Delivery

from proxy.amqp import engine
from proxy.amqp.engine import beyond_credit, read_transfer
from proxy.amqp.message_subject import read_subject
from proxy.amqp.outcomes import TRANSACTIONAL_STATE
from proxy.amqp.termini import capability_names
from proxy.exchanges.remote_bindings import RemoteSubscription
from proxy.exchanges.subscriptions import Subscriptions, container_of
from proxy.links.remote_destinations import RemoteDestinations
from proxy.queues.durable_hold import DurableHold
from proxy.upstream.target import UpstreamTarget
from routing import compile_pattern

log = logging.getLogger("fedgate.exchanges")

NOT_FOUND = "amqp:not-found"
UNAUTHORIZED = "amqp:unauthorized-access"
NOT_IMPLEMENTED = "amqp:not-implemented"
INTERNAL_ERROR = "amqp:internal-error"
RESOURCE_LIMIT = "amqp:resource-limit-exceeded"


@dataclass
class ExchangeStats:
    received: int = 0
    routed: int = 0  # copies handed to destinations
    unroutable: int = 0
    accepted: int = 0
    rejected: int = 0
    released: int = 0
    fanned_out: int = 0  # messages sent once to an upstream_fanout address


@dataclass
class Binding:
    queue: str
    key: str | None

    def __post_init__(self) -> None:
        self.pattern = compile_pattern(self.key) if self.key else None


@dataclass(eq=False)
class Exchange:
    name: str
    type: str
    bindings: list[Binding] = field(default_factory=list)
    fanout: object = None  # exchange_config.UpstreamFanout
    fanout_key: tuple | None = None
    stats: ExchangeStats = field(default_factory=ExchangeStats)

    def route(self, subject: str | None) -> list[str]:
        """The queues (addresses) a message with this subject goes to, each once, in binding order."""
        if self.type == "fanout":
            matched = [b.queue for b in self.bindings]
        else:
            key = subject or ""  # no subject: the empty routing key (RabbitMQ's too)
            if self.type == "direct":
                matched = [b.queue for b in self.bindings if b.key == key]
            else:
                matched = [b.queue for b in self.bindings if b.pattern.match(key) is not None]
        return list(dict.fromkeys(matched))


class Fanin:
    """One client delivery waiting for all its destinations (§3.4)."""

    __slots__ = ("producer", "delivery", "remaining", "rejected", "released")

    def __init__(self, producer, delivery) -> None:
        self.producer = producer
        self.delivery = delivery  # None: pre-settled by the client
        self.remaining = 0
        self.rejected: Condition | None = None
        self.released = False

    def done(self, state, condition=None) -> None:
        if state == PN_REJECTED:
            if self.rejected is None:
                self.rejected = condition or Condition(INTERNAL_ERROR, "rejected by a destination")
        elif state != PN_ACCEPTED:
            self.released = True
        self.remaining -= 1
        if self.remaining == 0:
            self.producer.settle(self)


def at_depth_limit(queue) -> bool:
    room = queue.room()
    return room is not None and room <= 0


class ExchangeProducer(engine.ClientLinkEndpoint):
    """Client -> exchange. Our side is a proton Receiver."""

    def __init__(self, handler, link, exchange: Exchange | None, exchanges: "Exchanges",
                 stats: ExchangeStats | None = None) -> None:
        self.handler = handler
        self.link_ptr = engine.hold(link._impl)
        self.exchange = exchange
        self.exchanges = exchanges
        self.address = exchange.name if exchange is not None else None
        self.stats = exchange.stats if exchange is not None else stats
        self.window = handler.broker.credit_window
        self.unsettled = 0  # client deliveries waiting for their destinations
        self.received = 0
        self.attached = True
        self.queues: set = set()  # local queues whose producers list has us

    @property
    def outstanding_credit(self) -> int:
        return pn_link_credit(self.link_ptr) if self.attached else 0

    def top_up(self) -> None:
        if not self.attached:
            return
        ptr = self.link_ptr
        want = self.window - pn_link_credit(ptr) - self.unsettled
        if want <= 0:
            return
        queues = self.exchanges.local_queues(self.exchange)
        for queue in self.queues - queues:
            if self in queue.producers:
                queue.producers.remove(self)
        for queue in queues - self.queues:
            queue.producers.append(self)
        self.queues = queues
        for queue in queues:
            want = queue.credit_within_room(want)
        if want:
            pn_link_flow(ptr, want)
            self.handler.mark_dirty()

    def on_delivery(self, delivery) -> None:
        if beyond_credit(self.link_ptr):
            self.handler.refuse_beyond_credit(self.link)
            return
        payload = read_transfer(self.link_ptr, delivery, self.handler.broker.max_message_size)
        if payload is None:
            return
        if payload is False:
            self.handler.refuse_oversized(self.link)
            return
        self.received += 1
        transactions = self.handler.transactions
        if transactions is not None and pn_delivery_remote_state(delivery) == TRANSACTIONAL_STATE:
            queues, refusal = self.transaction_queues(payload)  # §4.4.1: stored at commit
            if refusal is None:
                transactions.post(delivery, queues, payload)
            else:
                transactions.refuse_posting(delivery, *refusal)
        else:
            if pn_delivery_settled(delivery):  # pre-settled: nobody waits for the outcome
                pn_delivery_settle(delivery)
                delivery = None
            self.unsettled += 1
            self.route(payload, Fanin(self, delivery))
        if pn_link_credit(self.link_ptr) <= self.window // 2:
            self.top_up()

    def route(self, payload: bytes, fanin: Fanin) -> None:
        self.exchanges.publish(self.exchange, payload, fanin, origin=container_of(self.handler))

    def transaction_queues(self, payload: bytes) -> tuple[tuple, tuple | None]:
        return self.exchanges.transaction_queues(self.exchange, payload,
                                                 origin=container_of(self.handler))

    def settle(self, fanin: Fanin) -> None:
        """Every destination answered: the client gets the combined outcome."""
        self.unsettled -= 1
        stats = self.stats
        delivery = fanin.delivery
        if fanin.rejected is not None:
            stats.rejected += 1
            state = PN_REJECTED
        elif fanin.released:
            stats.released += 1
            state = PN_RELEASED
        else:
            stats.accepted += 1
            state = PN_ACCEPTED
        if delivery is not None and self.attached:
            if state == PN_REJECTED:
                wrapped = Delivery.wrap(delivery)
                wrapped.local.condition = fanin.rejected
                wrapped.update(state)  # carries the condition (§3.4.3)
            else:
                pn_delivery_update(delivery, state)
            pn_delivery_settle(delivery)
            self.handler.mark_dirty()
        self.top_up()

    def on_flow(self) -> None:
        pass

    def detached(self) -> None:
        self.attached = False
        for queue in self.queues:
            if self in queue.producers:
                queue.producers.remove(self)
        self.queues = set()


class Exchanges:
    """The node's exchanges and bindings (config ``[[exchanges]]``/``[[bindings]]``)."""

    def __init__(self, config, broker, upstreams, queue_options, *, relay_limit: int = 0) -> None:
        self.broker = broker
        self.upstreams = upstreams
        self.queue_options = queue_options
        self.destinations = RemoteDestinations()
        self.hold = DurableHold(broker)
        self.exchanges: dict[str, Exchange] = {}
        self.relay_stats = ExchangeStats()  # the anonymous relay (proxy.anonymous_relay)
        self.relay_limit = relay_limit  # [limits] max_relay_destinations; 0 = none
        self.subscriptions: list[RemoteSubscription] = []  # remote sources ([[bindings]] source)
        # receivers attached to an exchange (topic subscriptions, docs/exchanges.md)
        self.topic_subscriptions = Subscriptions(broker, self)
        # an address's kind by the routing rules alone (with workers: before ownership makes a
        # local address another worker owns a proxy decision; set by the node)
        self.kind_of = lambda address: broker.resolve(address).kind
        self._sources = []
        for decl in config.exchanges if config is not None else ():
            exchange = Exchange(decl.name, decl.type, fanout=decl.upstream_fanout)
            if decl.upstream_fanout is not None:
                exchange.fanout_key = UpstreamTarget.from_url(decl.upstream_fanout.url).key
            self.exchanges[decl.name] = exchange
        for binding in config.bindings if config is not None else ():
            if binding.exchange is not None:
                self.exchanges[binding.exchange].bindings.append(Binding(binding.queue, binding.key))
            else:
                self._sources.append(binding)

    # -- node lifecycle -----------------------------------------------------------
    def start(self) -> None:
        """Declare bound local queues; attach the remote sources (needs the running loop)."""
        for exchange in self.exchanges.values():
            for binding in exchange.bindings:
                if self.broker.resolve(binding.queue).kind == "local":
                    self.broker.queues.declare(binding.queue, **self.queue_options(binding.queue))
        for binding in self._sources:
            if self.broker.resolve(binding.queue).kind != "local":
                continue  # with workers: the queue's owner runs its source (proxy.workers)
            queue = self.broker.queues.declare(binding.queue, **self.queue_options(binding.queue))
            source = binding.source
            upstream = self.upstreams.for_url(source.url, source.upstream)
            self.subscriptions.append(RemoteSubscription(self.broker, queue, source, upstream, self.hold))
        self.topic_subscriptions.load()
        self.broker.run_pending()

    def close(self) -> None:
        for subscription in self.subscriptions:
            subscription.close()
        self.destinations.close()

    def describe(self) -> dict:
        return {
            "exchanges": [{"name": e.name, "type": e.type, "bindings": len(e.bindings),
                           **vars(e.stats)} for e in self.exchanges.values()],
            "subscriptions": self.topic_subscriptions.describe(),
            "sources": [s.describe() for s in self.subscriptions],
            "anonymous_relay": vars(self.relay_stats),
        }

    # -- attach --------------------------------------------------------------------
    def get(self, address: str | None) -> Exchange | None:
        return self.exchanges.get(address) if address else None

    def topic_for(self, terminus) -> Exchange | None:
        """The exchange a link's terminus names: one of that name, or a JMS topic (the ``topic``
        capability on a local address: made now); None: not an exchange. With workers, a local
        address another worker owns is local too (``kind_of``: routing before ownership)."""
        exchange = self.get(terminus.address)
        if exchange is None and "topic" in capability_names(terminus) \
                and self.kind_of(terminus.address) == "local":
            exchange = self.declare_topic(terminus.address)
        return exchange

    def declare_topic(self, name: str) -> Exchange:
        """An exchange made at run time for a topic address (a JMS topic: the ``topic``
        capability on a local address): fanout, no bindings; subscriptions only."""
        exchange = self.exchanges.get(name)
        if exchange is None:
            exchange = self.exchanges[name] = Exchange(name, "fanout")
            log.info("exchange %s made for a topic", name)
        return exchange

    def attach_producer(self, handler, link, exchange: Exchange) -> ExchangeProducer:
        producer = ExchangeProducer(handler, link, exchange, self)
        handler.links[producer.link_ptr] = producer
        producer.top_up()
        return producer

    def local_queues(self, exchange: Exchange) -> set:
        queues = set(self.topic_subscriptions.queues(exchange.name))
        for binding in exchange.bindings:
            if self.broker.resolve(binding.queue).kind == "local":
                queue = self.broker.queues.get(binding.queue)
                if queue is not None:
                    queues.add(queue)
        return queues

    # -- routing ---------------------------------------------------------------------
    def publish(self, exchange: Exchange, payload: bytes, fanin: Fanin, *,
                release_when_full: bool = False, origin: str | None = None) -> None:
        """Route to the bindings; ``release_when_full``: a local queue at its depth limit
        answers released (the anonymous relay, whose credit is not bound to the exchange's
        queues; an exchange's own senders get credit within their room); ``origin``: the
        publisher's container id (no-local subscriptions)."""
        stats = exchange.stats
        subject, addresses = self._route(exchange, payload)
        subscribed = self.topic_subscriptions.route(exchange.name, payload, origin)
        elsewhere = self.topic_subscriptions.route_elsewhere(exchange.name, payload, origin)
        if not addresses and (subscribed or elsewhere):
            stats.unroutable -= 1  # a subscription takes it
        if not addresses and not subscribed and not elsewhere:
            fanin.remaining = 1
            fanin.done(PN_ACCEPTED)  # RabbitMQ's default: accepted and dropped
            return
        local, remote, refused = subscribed, [], []  # other workers' subscriptions: below
        for address in addresses:
            kind, target = self.destination(address, "queues cannot be bound to an exchange")
            (local if kind == "local" else remote if kind == "remote" else refused).append(target)
        remote = self._fan_out_once(exchange, subject, remote) + elsewhere
        fanin.remaining = len(local) + len(remote) + len(refused)
        stats.routed += fanin.remaining
        for condition in refused:
            fanin.done(PN_REJECTED, condition)
        for queue in local:
            if release_when_full and at_depth_limit(queue):
                fanin.done(PN_RELEASED)
            else:
                self.store(queue, payload, fanin)
        for upstream, address in remote:
            self.destinations.get(upstream, address).send(payload, fanin.done)

    @staticmethod
    def _route(exchange: Exchange, payload: bytes) -> tuple:
        """(subject, the addresses bound for it), counted in the exchange's stats."""
        stats = exchange.stats
        stats.received += 1
        subject = None if exchange.type == "fanout" else read_subject(payload)
        addresses = exchange.route(subject)
        if not addresses:
            stats.unroutable += 1
        return subject, addresses

    def transaction_queues(self, exchange: Exchange, payload: bytes,
                           origin: str | None = None) -> tuple[tuple, tuple | None]:
        """A transactional message's local queues (all bound queues, stored together at commit),
        or a refusal (condition, description): a destination on a primary cannot be part of a
        transaction on this node."""
        stats = exchange.stats
        _, addresses = self._route(exchange, payload)
        queues = list(self.topic_subscriptions.route(exchange.name, payload, origin))
        if self.topic_subscriptions.route_elsewhere(exchange.name, payload, origin):
            return (), (NOT_IMPLEMENTED, (
                f"exchange {exchange.name!r} routes this message to a subscription on another "
                "worker of this node: a transaction through an exchange covers this worker's "
                "queues only"))
        for address in addresses:
            kind, target = self.destination(address, "queues cannot be bound to an exchange")
            if kind == "refused":
                return (), (target.name, f"exchange {exchange.name!r}: {target.description}")
            if kind == "remote":
                return (), (NOT_IMPLEMENTED, (
                    f"exchange {exchange.name!r} routes this message to {address!r} on primary "
                    f"{target[0].target.display}: a transaction through an exchange covers this "
                    "node's queues only"))
            if target.max_bytes and target.refuses(len(payload)):
                return (), (RESOURCE_LIMIT, f"queue {target.name!r} is full (max_bytes "
                                            f"{target.max_bytes})")
            queues.append(target)
        stats.routed += len(queues)
        return tuple(queues), None

    def destination(self, address: str, unsupported: str):
        """Where a message for ``address`` goes: ("local", queue), ("remote", (upstream,
        remote address)) or ("refused", Condition); ``unsupported`` ends the reason
        given for address kinds that cannot be reached this way."""
        broker = self.broker
        decision = broker.resolve(address)
        if decision.kind == "local":
            queue = broker.queues.lookup_or_create(address)
            if queue is None:
                return "refused", Condition(NOT_FOUND, f"no queue {address!r} (auto-create is off)")
            return "local", queue
        if decision.kind == "proxy":
            return "remote", (broker.upstreams.for_decision(decision), decision.remote_address)
        if decision.kind == "deny":
            return "refused", Condition(UNAUTHORIZED, f"address {address!r} denied")
        return "refused", Condition(NOT_IMPLEMENTED, f"{decision.kind} {unsupported}")

    def store(self, queue, payload: bytes, fanin: Fanin) -> None:
        """Into a local queue (journaled first when durable); ``fanin`` learns the outcome.

        A queue at its ``max_bytes`` with overflow ``reject-publish`` refuses the message
        as it would a client's direct send: rejected, ``amqp:resource-limit-exceeded``
        (sent on credit given before the queue filled); never accepted and dropped."""
        if queue.max_bytes and queue.refuses(len(payload)):
            fanin.done(PN_REJECTED, Condition(RESOURCE_LIMIT, (
                f"queue {queue.name!r} is full (max_bytes {queue.max_bytes})")))
            return
        self.hold.put(queue, payload, lambda error: fanin.done(
            PN_ACCEPTED if error is None else PN_REJECTED,
            None if error is None else Condition(INTERNAL_ERROR, error)))

    def _fan_out_once(self, exchange: Exchange, subject, remote: list) -> list:
        """Several destinations on the fan-out primary: one transfer to its address instead."""
        if exchange.fanout is None or len(remote) < 2:
            return remote
        on_primary = [item for item in remote if item[0].target.key == exchange.fanout_key]
        if len(on_primary) < 2:
            return remote
        exchange.stats.fanned_out += 1
        others = [item for item in remote if item[0].target.key != exchange.fanout_key]
        return others + [(on_primary[0][0], exchange.fanout.expand(subject))]
