"""One client connection's AMQP events: sessions, attaches routed to their endpoints, flow, deliveries.

How this works
--------------
``ClientHandler`` is one per client connection. It receives proton events
(``on_event``) and keeps, per link, an endpoint object: ``QueueProducer`` /
``QueueConsumer`` / ``QueueBrowser`` (``proxy.queues``), a proxy link
(``proxy.links``) or what a package above the node attaches (fragments).
An attach is checked (ACL, routing decision, termini) and refused with an
AMQP error condition (``LinkRefused``) or routed to the endpoint that serves
it; a coordinator target (§4.2) goes to ``broker.transactions``, which keeps
the connection's transactions in ``transactions``. Its links are kept in a ``LinkTable`` that is also a view of the node's
table of every link (the shared event pump routes by link pointer).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from cproton import (
    PN_LOCAL_ACTIVE,
    PN_REMOTE_CLOSED,
    pn_delivery_link,
    pn_delivery_settle,
    pn_link_close,
    pn_link_free,
    pn_link_get_drain,
    pn_link_head,
    pn_link_is_sender,
    pn_link_next,
    pn_link_session,
    pn_link_state,
    pn_session_close,
    pn_session_free,
    pn_session_head,
    pn_session_next,
    pn_session_open,
    pn_session_state,
)
from proton import Condition, Link, Session, Terminus

from proxy.amqp import engine
from proxy.amqp.engine import session_outgoing_bytes
from proxy.amqp.termini import capability_names, filter_names, filters, is_selector
from proxy.broker import relay as anonymous_relay
from proxy.broker.filters import LinkRefused, selector_of
from proxy.broker.link_table import LinkTable
from proxy.exchanges.subscriptions import FORWARDED, SubscriptionRefused
from proxy.links.proxy_links import ProxyConsumer
from proxy.links.proxy_producer import ProxyProducer
from proxy.links.shared_consumers import attach_shared_consumer
from proxy.queues.browsers import QueueBrowser
from proxy.queues.endpoints import DEAD_LETTER_COPY, QueueConsumer, QueueProducer
from proxy.queues.local import LocalQueue

if TYPE_CHECKING:
    from proxy.broker.broker import Broker

log = logging.getLogger("fedgate.broker")

UNAUTHORIZED = "amqp:unauthorized-access"
NOT_FOUND = "amqp:not-found"
NOT_IMPLEMENTED = "amqp:not-implemented"
INVALID_FIELD = "amqp:invalid-field"
RESOURCE_LIMIT = "amqp:resource-limit-exceeded"
MESSAGE_SIZE_EXCEEDED = "amqp:link:message-size-exceeded"
TRANSFER_LIMIT_EXCEEDED = "amqp:link:transfer-limit-exceeded"
# the target capability of a link by which a primary pushes a replicated queue's copy
REPLICATION = "fedgate:replication"

class ClientHandler:
    """Proton events of one client connection -> broker operations."""

    # one per connection: slots keep an idle connection small (10,000 of them)
    __slots__ = ("broker", "connection_id", "peer", "max_links", "server_connection",
                 "links", "writable", "output", "refused_links", "blocked", "temporary_queues",
                 "trusted", "transactions")

    def __init__(self, broker: Broker, *, peer: str = "", max_links: int = 0, output=None,
                 trusted: bool = False) -> None:
        self.broker = broker
        # another worker of this node (proxy.workers): the ACL was applied where the client is
        self.trusted = trusted
        self.connection_id = next(broker.connection_ids)
        self.peer = peer
        self.max_links = max_links
        self.server_connection = None  # the ServerConnection, set on_amqp_start
        self.links = LinkTable(broker.client_events.links)  # link pointer -> endpoint
        self.writable = True
        self.output = output  # what writes our bytes: an object with flush() (the socket's protocol)
        # links we refused whose detach the client has not answered yet: proton keeps them
        # (their handles stay in use, §2.6.4), so they count against max_links
        self.refused_links = 0
        self.blocked: set | None = None  # endpoints stopped by a full session (can_send)
        self.temporary_queues = 0  # made by this connection and not deleted yet
        # its transactions (proxy.transactions.coordinator), from its first coordinator link
        self.transactions = None

    # -- plumbing -------------------------------------------------------------
    def on_amqp_start(self, server_connection) -> None:
        self.server_connection = server_connection
        self.broker.handlers[self.connection_id] = self

    @property
    def event_pump(self) -> engine.SharedEventPump:
        return self.broker.client_events

    def on_event(self, event_type: int, event) -> None:
        method = _CLIENT_EVENTS.get(event_type)
        if method is not None:
            method(self, event)

    def mark_dirty(self) -> None:
        self.broker.dirty_handlers.add(self)

    def flush(self) -> None:
        if self.output is not None:
            self.output.flush()

    def links_held(self) -> int:
        """Links proton keeps on this connection (admin API; see engine.links_held)."""
        server = self.server_connection
        return engine.links_held(server.connection_ptr) if server is not None else 0

    @property
    def identity(self):
        return self.server_connection.identity if self.server_connection else None

    # -- connection and sessions -------------------------------------------
    def _on_connection_open(self, event) -> None:
        self.server_connection.answer_open()

    def _on_connection_close(self, event) -> None:
        # close is the client's last frame (§2.4.3): nothing it had can be settled any more,
        # so it goes back to the queues now, not once our answer has reached a client that
        # may not be reading (its output blocked behind a large message)
        self.release_all()
        self.server_connection.close_connection()

    def _on_session_open(self, event) -> None:
        # raw calls: a wrapped session keeps a Python dict in proton's record for
        # its whole life, and most connections are one idle session (§2.5.1)
        session = engine.pn_event_session(event)
        limit = self.server_connection.settings.max_sessions
        open_sessions = held = 0
        if limit:
            # every session proton keeps counts: a refused one stays until the client ends it
            other = pn_session_head(self.server_connection.connection_ptr, 0)
            while other:
                held += 1
                if pn_session_state(other) & PN_LOCAL_ACTIVE:
                    open_sessions += 1
                other = pn_session_next(other, 0)
        if limit and held > 2 * limit:
            self.server_connection.close(RESOURCE_LIMIT, f"more than {limit} sessions refused and "
                                         "not ended by the client")
            self.mark_dirty()
            return
        pn_session_open(session)
        if limit and open_sessions >= limit:
            wrapped = engine.transient(Session, session)
            wrapped.condition = Condition(RESOURCE_LIMIT, f"at most {limit} sessions per connection")
            wrapped.close()

    def _on_session_close(self, event) -> None:
        """The client ended a session: its links end with it (§2.7.8), then it is freed."""
        session = engine.pn_event_session(event)
        # a session may end without detaching its links first: their endpoints
        # are released here, or queues would keep feeding links nobody reads
        for ptr in [ptr for ptr in self.links if pn_link_session(ptr) == session]:
            self.links.pop(ptr).detached()
        if self.refused_links:  # links we closed that the client never detached go with it
            link = pn_link_head(self.server_connection.connection_ptr, 0)
            while link:
                state = pn_link_state(link)
                if (pn_link_session(link) == session and not state & PN_LOCAL_ACTIVE
                        and not state & PN_REMOTE_CLOSED):
                    self.refused_links = max(0, self.refused_links - 1)
                link = pn_link_next(link, 0)
        pn_session_close(session)
        pn_session_free(session)  # with its links, once proton has written the end
        self.mark_dirty()

    def _on_transport_closed(self, event) -> None:
        self.release_all()

    def release_all(self) -> None:
        """The connection is gone: every link's state goes back to the broker."""
        if engine.partial_transfers.sizes or engine.late_links:  # incomplete transfers end too
            for ptr in self.links:
                engine.forget_link(ptr)
        endpoints = list(self.links.values())
        self.links.clear()
        for endpoint in endpoints:
            endpoint.detached()
        if self.transactions is not None:  # what is still open is rolled back
            self.transactions.connection_closed()
        self.broker.handlers.pop(self.connection_id, None)
        self.broker.dirty_handlers.discard(self)
        self.blocked = None

    # -- links ------------------------------------------------------------------
    def _on_link_open(self, event) -> None:
        link = engine.transient(Link, engine.pn_event_link(event))
        if self.max_links and len(self.links) + self.refused_links >= self.max_links:
            if self.refused_links >= self.max_links:
                # refusing more would keep more: the client does not answer its refusals
                self.server_connection.close(RESOURCE_LIMIT, f"{self.refused_links} refused links "
                                             "not detached by the client")
                self.mark_dirty()
                return
            self.refuse_link(link, RESOURCE_LIMIT, f"at most {self.max_links} links per connection")
            return
        try:
            if link.is_sender:
                self._attach_consumer(link)
            else:
                self._attach_producer(link)
        except LinkRefused as refused:
            self.refuse_link(link, refused.condition, refused.description)
        except UnicodeDecodeError:  # proton's string getters decode what the peer sent
            self.refuse_link(link, INVALID_FIELD, "link address is not valid UTF-8")

    def check_access(self, address: str | None, direction: str) -> None:
        """The authorize hook ([[acl]]); address None is a dynamic node. Denials are logged."""
        if self.trusted:
            return
        identity = self.identity
        if self.broker.authorize(identity, address, direction):
            return
        user = getattr(identity, "user", "anonymous")
        what = "a dynamic node" if address is None else repr(address)
        log.warning("access denied: user %s from %s: %s %s", user, self.peer, direction, what)
        raise LinkRefused(UNAUTHORIZED, f"user {user!r} may not {direction} ({what})")

    def _resolve(self, address: str | None, direction: str):
        """Authorize and route an attach; returns the routing decision."""
        if not address:
            raise LinkRefused(INVALID_FIELD, f"{direction} link needs an address")
        self.check_access(address, direction)
        decision = self.broker.resolve(address)
        if decision.kind == "deny":
            raise LinkRefused(UNAUTHORIZED, f"address {address!r} denied: {decision.reason}")
        if decision.kind not in ("local", "proxy") and decision.kind not in self.broker.kind_handlers:
            raise LinkRefused(NOT_IMPLEMENTED, f"{decision.kind} addresses are not served yet: {decision.reason}")
        if decision.kind == "proxy" and decision.primary_url is None:  # a cluster on etcd
            raise LinkRefused(NOT_FOUND, f"peer {decision.primary!r} of {decision.reason} is not a "
                                         "live member of the cluster")
        return decision

    def _temporary_queue(self) -> LocalQueue:
        limit = self.broker.max_temporary_queues
        if limit and self.temporary_queues >= limit:
            raise LinkRefused(RESOURCE_LIMIT, f"{self.temporary_queues} temporary queues on this "
                                              f"connection (max_temp_queues_per_connection {limit})")
        self.temporary_queues += 1
        return self.broker.queues.create_temporary(self.broker.temp_prefix, creator=self)

    def _local_queue(self, address: str) -> LocalQueue:
        for check in self.broker.address_checks:  # names a package above reserves (replication)
            reason = check(address)
            if reason:
                raise LinkRefused(NOT_FOUND, reason)
        queue = self.broker.queues.lookup_or_create(address)
        if queue is None:
            raise LinkRefused(NOT_FOUND, f"no queue {address!r} (auto-create is off)")
        return queue

    def _attach_consumer(self, link: Link) -> None:
        remote = link.remote_source
        if remote.dynamic:
            self.check_access(None, "receive")
            selector_of(remote, "temporary queue")
            queue = self._temporary_queue()
            self.attach_queue_consumer(link, queue, owns_queue=True)
            return
        exchanges = self.broker.exchanges
        if not remote.address:  # a subscription looked up by link name (JMS unsubscribe)
            self._attach_subscriber(link, None)
            return
        exchange = exchanges.topic_for(remote)  # an exchange, or a JMS topic
        if exchange is not None:  # a topic subscription (proxy.exchanges.subscriptions)
            self.check_access(remote.address, "receive")
            self._attach_subscriber(link, exchange)
            return
        decision = self._resolve(remote.address, "receive")
        extension = self.broker.kind_handlers.get(decision.kind)
        if decision.kind == "proxy":  # the primary answers for filters and browsing
            upstream = self.broker.upstreams.for_decision(decision)
            self.attach_proxy_consumer(link, upstream, decision.remote_address, rule=decision.rule)
            return
        selector = selector_of(remote, f"{decision.kind} queue")
        if selector is not None and extension is not None and not getattr(extension, "selective",
                                                                          False):
            raise LinkRefused(NOT_IMPLEMENTED, f"{remote.address!r} is a {decision.kind} queue: "
                                               "it applies no selectors")
        if remote.distribution_mode == Terminus.DIST_MODE_COPY and not getattr(extension, "browsable",
                                                                               False):
            if extension is not None:
                raise LinkRefused(NOT_IMPLEMENTED, f"{remote.address!r} is a {decision.kind} "
                                                   "queue: it cannot be browsed (distribution-mode copy)")
            self.attach_queue_browser(link, self._local_queue(remote.address))
        elif extension is not None:
            extension.attach(self, link, decision)
        else:
            self.attach_queue_consumer(link, self._local_queue(remote.address))

    def _attach_producer(self, link: Link) -> None:
        remote = link.remote_target
        if remote.type == Terminus.COORDINATOR:  # §4.2: a transaction controller's link
            self.broker.transactions.attach(self, link)
            return
        if REPLICATION in capability_names(remote):  # a primary pushes a copy (proxy.replication)
            replication = self.broker.kind_handlers.get("replicated")
            if replication is None:
                raise LinkRefused(NOT_IMPLEMENTED, "this node keeps no replicated queues")
            self.check_access(remote.address, "send")
            replication.attach_replication(self, link)
            return
        if remote.dynamic:
            self.check_access(None, "send")
            queue = self._temporary_queue()
            self.attach_queue_producer(link, queue)
            return
        exchanges = self.broker.exchanges
        if not remote.address:  # each message says where (its to)
            self._open_client_link(link, False)
            anonymous_relay.attach(self, link, exchanges)
            return
        exchange = exchanges.topic_for(remote)  # an exchange, or a JMS topic's publisher
        if exchange is not None:  # an exchange's name wins over [[rules]] (proxy.exchanges)
            self.check_access(remote.address, "send")
            self._open_client_link(link, False)
            exchanges.attach_producer(self, link, exchange)
            return
        decision = self._resolve(remote.address, "send")
        extension = self.broker.kind_handlers.get(decision.kind)
        if extension is not None:
            extension.attach(self, link, decision)
        elif decision.kind == "proxy":
            upstream = self.broker.upstreams.for_decision(decision)
            self.attach_proxy_producer(link, upstream, decision.remote_address, rule=decision.rule)
        else:
            self.attach_queue_producer(link, self._local_queue(remote.address))

    def _attach_subscriber(self, link: Link, exchange) -> None:
        """A receiver on an exchange: the subscription's queue (made if new); ``exchange``
        None: a lookup by link name (a source with no address)."""
        subscriptions = self.broker.exchanges.topic_subscriptions
        if exchange is None:
            sub = subscriptions.find(self, link)
            if sub is None:
                raise LinkRefused(NOT_FOUND, f"no subscription {link.name!r}")
            if sub is not FORWARDED and sub.consumers and not sub.shared:  # JMS: no unsubscribe while it is consumed
                raise LinkRefused("amqp:resource-locked", f"subscription {sub.name!r} has a "
                                                          "consumer")
        else:
            try:
                sub = subscriptions.subscribe(self, link, exchange)
            except SubscriptionRefused as exc:
                raise LinkRefused(exc.condition, exc.description) from None
        if sub is not FORWARDED:  # else another worker hosts it: the link went on there
            self.attach_queue_consumer(link, sub.queue, subscription=(subscriptions, sub))

    # -- endpoint builders (also used by packages serving other kinds) -----------
    def attach_queue_consumer(self, link: Link, queue: LocalQueue, *, owns_queue: bool = False,
                              standby: bool = False, subscription=None) -> "QueueConsumer":
        """``subscription``: (Subscriptions, Subscription) for a topic subscriber, whose
        selector was applied as messages were routed (proxy.exchanges.subscriptions)."""
        presettled = link.remote_snd_settle_mode == Link.SND_SETTLED
        if subscription is None:
            selector = selector_of(link.remote_source, "queue")
            self._open_client_link(link, presettled, address=queue.name)
        else:
            selector = None
            subscriptions, sub = subscription
            self._open_client_link(link, presettled, address=None,
                                   answer=lambda: subscriptions.answer_source(link, sub))
        consumer = QueueConsumer(self, link, queue, presettled=presettled, owns_queue=owns_queue)
        consumer.selector = selector
        if subscription is not None:
            consumer.subscription = subscription
            subscriptions.consumer_attached(sub, consumer)
        self.links[consumer.link_ptr] = consumer
        queue.add_consumer(consumer, standby=standby)
        self.broker.dirty_queues.add(queue)
        return consumer

    def attach_queue_browser(self, link: Link, queue: LocalQueue) -> QueueBrowser:
        presettled = link.remote_snd_settle_mode == Link.SND_SETTLED
        selector = selector_of(link.remote_source, "queue")
        self._open_client_link(link, presettled, address=queue.name)
        browser = QueueBrowser(self, link, queue, presettled=presettled)
        browser.selector = selector
        self.links[browser.link_ptr] = browser
        queue.browsers.append(browser)
        self.broker.dirty_queues.add(queue)
        return browser

    def attach_queue_producer(self, link: Link, queue: LocalQueue) -> "QueueProducer":
        self._open_client_link(link, False, address=queue.name)
        # another worker's dead-lettered copies do not expire again (Broker.dead_letter)
        expiry = not (self.trusted and DEAD_LETTER_COPY in capability_names(link.remote_target))
        producer = QueueProducer(self, link, queue, self.broker.credit_window, expiry=expiry)
        self.links[producer.link_ptr] = producer
        queue.producers.append(producer)
        producer.top_up()
        return producer

    def attach_proxy_consumer(self, link: Link, upstream, remote_address: str,
                              capabilities: tuple[str, ...] = (), rule=None) -> ProxyConsumer:
        presettled = link.remote_snd_settle_mode == Link.SND_SETTLED
        self._open_client_link(link, presettled)
        recheck = rule.upstream.recheck_interval if rule is not None else 0.0
        remote = link.remote_source
        private = remote.distribution_mode == Terminus.DIST_MODE_COPY or filter_names(remote)
        if rule is not None and rule.mirror_auto_delete and not private:
            # one upstream consumer, shared (a browser or a filter needs a link of its own)
            endpoint = attach_shared_consumer(self, link, upstream, remote_address,
                                              presettled=presettled, recheck_interval=recheck)
        else:
            endpoint = ProxyConsumer(self, link, upstream, remote_address, presettled=presettled,
                                     capabilities=capabilities, recheck_interval=recheck,
                                     check_source=bool(private), rule=rule)
        self.links[endpoint.link_ptr] = endpoint
        return endpoint

    def attach_proxy_producer(self, link: Link, upstream, remote_address: str,
                              capabilities: tuple[str, ...] = (), rule=None,
                              properties: dict | None = None) -> ProxyProducer:
        self._open_client_link(link, False)
        endpoint = ProxyProducer(self, link, upstream, remote_address, capabilities=capabilities,
                                 rule=rule, properties=properties)
        self.links[endpoint.link_ptr] = endpoint
        return endpoint

    def open_link(self, link: Link, *, presettled: bool = False, address: str | None = None) -> None:
        """Answer an attach that a package above the node serves with an endpoint of its own."""
        self._open_client_link(link, presettled, address)

    def _open_client_link(self, link: Link, presettled: bool, address: str | None = None,
                          answer=None) -> None:
        """Answer the client's attach with matching termini (§2.6.3); ``answer()`` may change
        them before the attach goes out."""
        link.source.copy(link.remote_source)
        link.target.copy(link.remote_target)
        if address is not None:
            (link.source if link.is_sender else link.target).address = address
        if answer is not None:
            answer()
        if link.is_sender:
            link.snd_settle_mode = Link.SND_SETTLED if presettled else Link.SND_UNSETTLED
        else:
            link.snd_settle_mode = link.remote_snd_settle_mode
        link.rcv_settle_mode = Link.RCV_FIRST
        link.open()
        self.mark_dirty()

    def refuse_link(self, link: Link, condition: str, description: str) -> None:
        """Refuse an attach: answer with a null terminus, then detach with the error (§2.6.3)."""
        try:
            name = link.name
        except UnicodeDecodeError:
            name = "<not UTF-8>"
        log.info("connection %s (%s, user %s): link %r refused: %s %s", self.connection_id,
                 self.peer, getattr(self.identity, "user", "?"), name, condition, description)
        if link.is_sender:
            link.source.type = Terminus.UNSPECIFIED
            link.target.copy(link.remote_target)
        else:
            link.target.type = Terminus.UNSPECIFIED
            link.source.copy(link.remote_source)
        link.open()
        link.condition = Condition(condition, description)
        link.close()
        if not link.state & Link.REMOTE_CLOSED:
            self.refused_links += 1  # until the client's detach comes (_on_link_close)
        self.mark_dirty()

    def refuse_oversized(self, link: Link) -> None:
        """A transfer over ``[limits] max_message_size``: detach the sender's link."""
        limit = self.broker.max_message_size
        self.close_link(link, MESSAGE_SIZE_EXCEEDED, f"message larger than {limit} bytes")

    def refuse_beyond_credit(self, link: Link) -> None:
        """Transfers beyond the credit granted (§2.6.7): detach the sender's link, so nothing
        it sends can be buffered past what the node offered to take (none of them is accepted)."""
        self.close_link(link, TRANSFER_LIMIT_EXCEEDED, "transfer beyond the link credit granted")

    def close_link(self, link: Link, condition: str, description: str,
                   info: dict | None = None) -> None:
        endpoint = self.links.pop(link._impl, None)
        if endpoint is not None:
            endpoint.detached()
        link.condition = Condition(condition, description, info)
        link.close()
        if not link.state & Link.REMOTE_CLOSED:
            self.refused_links += 1  # until the client's detach comes (_on_link_close)
        self.mark_dirty()

    def _on_link_close(self, event) -> None:
        ptr = engine.pn_event_link(event)
        if engine.partial_transfers.sizes or engine.late_links:
            engine.forget_link(ptr)
        endpoint = self.links.pop(ptr, None)
        if endpoint is not None:
            if getattr(endpoint, "subscription", None) is not None:  # closed: JMS unsubscribe
                endpoint.remote_closed = engine.pn_event_type(event) == engine.PN_LINK_REMOTE_CLOSE
            endpoint.detached()
        elif self.refused_links and not pn_link_state(ptr) & PN_LOCAL_ACTIVE:
            self.refused_links -= 1  # a refusal answered: proton lets the link go
        if pn_link_state(ptr) & PN_LOCAL_ACTIVE:
            pn_link_close(ptr)
        pn_link_free(ptr)  # both ends closed: proton drops it once our detach is written
        self.mark_dirty()

    def _on_link_flow(self, event) -> None:
        ptr = engine.pn_event_link(event)
        endpoint = self.links.get(ptr)
        if endpoint is not None:
            if pn_link_get_drain(ptr) and pn_link_is_sender(ptr):
                endpoint.drain_requested = True  # answered once by the endpoint (§2.6.7)
            endpoint.on_flow()

    def _on_delivery(self, event) -> None:
        delivery = engine.pn_event_delivery(event)
        endpoint = self.links.get(pn_delivery_link(delivery))
        if endpoint is not None:
            endpoint.on_delivery(delivery)
        else:
            pn_delivery_settle(delivery)

    # -- write-side backpressure -------------------------------------------
    # A slow reader must not make the node buffer what the queue would hold: a
    # consumer sends only while its socket takes bytes (``writable``, cleared by
    # the socket's pause_writing) and its session holds less than
    # ``broker.max_output_buffer`` bytes not yet written out (proton keeps what
    # the client's session window, §2.5.6, does not let it send yet).
    def can_send(self, endpoint) -> bool:
        """Whether ``endpoint`` (a sending link with ``session_ptr``) may hand over one more delivery."""
        if not self.writable:
            return False
        if session_outgoing_bytes(endpoint.session_ptr) < self.broker.max_output_buffer:
            return True
        if self.blocked is None:
            self.blocked = set()
        self.blocked.add(endpoint)
        return False

    def output_drained(self) -> bool:
        """After a write: whether a blocked session has room again (then ``resume``)."""
        blocked = self.blocked
        if not blocked or not self.writable:
            return False
        limit = self.broker.max_output_buffer
        for endpoint in blocked:
            if session_outgoing_bytes(endpoint.session_ptr) < limit:
                self.blocked = None  # each re-checks on its next send
                return True
        return False

    def pause(self) -> None:
        self.writable = False

    def resume(self) -> None:
        """Output has room again: every sending link goes on (each re-checks ``can_send``)."""
        if not self.writable:
            return
        self.blocked = None
        for endpoint in list(self.links.values()):
            endpoint.on_flow()


# proton event type -> ClientHandler method (one table for all connections)
_CLIENT_EVENTS = {
    engine.PN_DELIVERY: ClientHandler._on_delivery,
    engine.PN_LINK_FLOW: ClientHandler._on_link_flow,
    engine.PN_LINK_REMOTE_OPEN: ClientHandler._on_link_open,
    engine.PN_LINK_REMOTE_CLOSE: ClientHandler._on_link_close,
    engine.PN_LINK_REMOTE_DETACH: ClientHandler._on_link_close,
    engine.PN_SESSION_REMOTE_OPEN: ClientHandler._on_session_open,
    engine.PN_SESSION_REMOTE_CLOSE: ClientHandler._on_session_close,
    engine.PN_CONNECTION_REMOTE_OPEN: ClientHandler._on_connection_open,
    engine.PN_CONNECTION_REMOTE_CLOSE: ClientHandler._on_connection_close,
    engine.PN_TRANSPORT_CLOSED: ClientHandler._on_transport_closed,
}

