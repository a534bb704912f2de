"""The anonymous relay: a sender link with no target address; each message goes to its ``to``.

How this works
--------------
The node offers the ``ANONYMOUS-RELAY`` connection capability ("Anonymous
Terminus for Message Routing", OASIS AMQP 1.0 extension): a client may attach
a sender whose target has no address and put each message's destination in
its ``to`` property (§3.2.4). Qpid JMS uses it for producers without a
destination (request/reply servers), others for every send.

Each message is routed like one of an exchange's bound queues
(``Exchanges.destination``): the user's ACL first, then an exchange by its
name, or the routing rules: a local queue (journaled first when durable), a
proxied address (an internal upstream sender per primary and remote address,
shared with the exchanges), anything else refused. The client's delivery is
settled with that destination's outcome (``Fanin``, end to end). Refusals
are per message and leave the link attached:

* no ``to``: rejected, ``amqp:not-found``;
* an address the user may not send to, or a deny rule: rejected,
  ``amqp:unauthorized-access``;
* a local queue that does not exist (auto-create off): rejected,
  ``amqp:not-found``; a fragmented address: rejected, ``amqp:not-implemented``;
* a local queue at its depth limit: released (send it again later); credit
  cannot be withheld per destination on one link, so this is the backpressure;
  the same for a queue an exchange would put it in (``Exchanges.publish``);
* a local queue at its ``max_bytes`` with overflow ``reject-publish``:
  rejected, ``amqp:resource-limit-exceeded``, as a direct send to it would be
  (``Exchanges.store``, the same check for an exchange's bound queues);
* a proxied address that would open one more upstream sender than
  ``[limits] max_relay_destinations`` (default 1024) allows: rejected,
  ``amqp:resource-limit-exceeded`` (each distinct address costs a link on the
  primary; idle ones close after the pool's idle timeout).

Credit: ``[queues] credit_window``, refilled as deliveries settle (unsettled
ones count), as for an exchange; none while the node is above ``[limits]
max_memory`` (``MemoryUse.withholds``): the link is topped up again once
consumers bring the node's use down, as every queue's producers are.
"""

from __future__ import annotations

import logging

from cproton import PN_REJECTED, PN_RELEASED, pn_link_flow
from proton import Condition, Link

from proxy.amqp.message_subject import read_to
from proxy.exchanges.exchange import (
    NOT_FOUND,
    NOT_IMPLEMENTED,
    RESOURCE_LIMIT,
    UNAUTHORIZED,
    ExchangeProducer,
    Exchanges,
    Fanin,
    at_depth_limit,
)
from proxy.exchanges.subscriptions import container_of

log = logging.getLogger("fedgate.relay")

CAPABILITY = "ANONYMOUS-RELAY"


class AnonymousProducer(ExchangeProducer):
    """Client -> the anonymous relay. Our side is a proton Receiver."""

    def __init__(self, handler, link: Link, exchanges: Exchanges) -> None:
        super().__init__(handler, link, None, exchanges, exchanges.relay_stats)

    def top_up(self) -> None:
        # destinations are known per message: a full local queue releases or rejects
        # instead; the node's memory is one for all of them
        if not self.attached:
            return
        want = self.window - self.outstanding_credit - self.unsettled
        if want > 0 and not self.handler.broker.queues.memory.withholds(self):
            pn_link_flow(self.link_ptr, want)
            self.handler.mark_dirty()

    def detached(self) -> None:
        super().detached()
        self.handler.broker.queues.memory.waiting.discard(self)

    def route(self, payload: bytes, fanin: Fanin) -> None:
        exchanges = self.exchanges
        stats = self.stats
        stats.received += 1
        fanin.remaining = 1
        to = read_to(payload)
        if not to:
            fanin.done(PN_REJECTED, Condition(NOT_FOUND, "the message has no 'to' address "
                                                         "(sent to the anonymous relay)"))
            return
        handler = self.handler
        if not handler.broker.authorize(handler.identity, to, "send"):
            user = getattr(handler.identity, "user", "anonymous")
            log.warning("access denied: user %s from %s: send %r (anonymous relay)", user,
                        handler.peer, to)
            fanin.done(PN_REJECTED, Condition(UNAUTHORIZED, f"user {user!r} may not send ({to!r})"))
            return
        stats.routed += 1
        exchange = exchanges.get(to)
        if exchange is not None:
            exchanges.publish(exchange, payload, fanin, release_when_full=True,
                              origin=container_of(handler))
            return
        kind, target = exchanges.destination(to, "addresses are not served by the anonymous relay")
        if kind == "refused":
            fanin.done(PN_REJECTED, target)
        elif kind == "local":
            if at_depth_limit(target):
                fanin.done(PN_RELEASED)  # the depth limit: the client sends it again later
            else:
                exchanges.store(target, payload, fanin)  # max_bytes reject-publish: rejected
        else:
            upstream, address = target
            destinations = exchanges.destinations
            limit = exchanges.relay_limit
            if limit and len(destinations.by_key) >= limit and not destinations.has(upstream, address):
                # every new to costs an upstream link: a client must not open them without end
                fanin.done(PN_REJECTED, Condition(RESOURCE_LIMIT, (
                    f"{len(destinations.by_key)} upstream destinations are open "
                    "([limits] max_relay_destinations); idle ones close after the idle timeout")))
                return
            destinations.get(upstream, address).send(payload, fanin.done)


    def transaction_queues(self, payload: bytes) -> tuple[tuple, tuple | None]:
        """A transactional message's local queue(s) by its ``to``, or a refusal: the relay's
        proxied destinations (shared upstream senders) cannot be part of a transaction."""
        to = read_to(payload)
        if not to:
            return (), (NOT_FOUND, "the message has no 'to' address (sent to the anonymous relay)")
        handler = self.handler
        if not handler.broker.authorize(handler.identity, to, "send"):
            user = getattr(handler.identity, "user", "anonymous")
            return (), (UNAUTHORIZED, f"user {user!r} may not send ({to!r})")
        exchange = self.exchanges.get(to)
        if exchange is not None:
            return self.exchanges.transaction_queues(exchange, payload,
                                                     origin=container_of(handler))
        kind, target = self.exchanges.destination(to, "addresses are not served by the anonymous relay")
        if kind == "refused":
            return (), (target.name, target.description)
        if kind == "remote":
            return (), (NOT_IMPLEMENTED, (
                f"{to!r} is on primary {target[0].target.display}: through the anonymous relay a "
                "transaction covers this node's queues only (attach a sender to the address)"))
        return (target,), None


def attach(handler, link: Link, exchanges: Exchanges) -> AnonymousProducer:
    producer = AnonymousProducer(handler, link, exchanges)
    handler.links[producer.link_ptr] = producer
    producer.top_up()
    return producer
