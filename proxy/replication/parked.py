"""Client links that wait for a replicated queue's owner (``ReplicatedAddress.pending``).

A link attached while nobody knows where the queue is served is held with no
credit (``hold_link``); a link whose queue this node stopped serving (fenced,
handed back) is parked with what its producer had not had accepted (``park``,
issue #42). Once the owner is known they are routed (``release_links``) as a
new link would be, and what was held goes on through the new endpoint; those still stuck
after a while have their connection reset for the client's failover list (``shed_stuck``).
"""

from __future__ import annotations

import logging

from cproton import pn_delivery_settle, pn_delivery_settled

from proxy.amqp import engine

log = logging.getLogger("fedgate.replication")


class PendingLink(engine.ClientLinkEndpoint):
    """A client's link while the queue's owner is not known: attached, no credit, no messages.

    A drain the client asked for meanwhile (a fragment's stealer drains) is kept, and passed
    to the endpoint the link becomes (``routed``), which answers it (§2.6.7).

    A link parked when this node stopped being the queue's primary (``park``) may still have
    credit from before: a client's sender uses it, and those transfers are held here
    (``held``, with the unconfirmed ones the old primary had), then handed, in order, to the
    endpoint the link becomes (``take_over``): to the new primary through the proxy path."""

    __slots__ = ("handler", "link_ptr", "entry", "browse", "address", "drain_requested", "held")

    def __init__(self, handler, link, entry, browse: bool, held: list | None = None) -> None:
        self.handler = handler
        self.link_ptr = engine.hold(link._impl)
        self.entry = entry
        self.browse = browse
        self.address = entry.address
        self.drain_requested = False
        self.held = held  # [(payload, client delivery or None)] for a parked producer

    def on_flow(self) -> None:
        pass

    @property
    def awaits_first_credit(self) -> bool:
        """A client's sender held with no credit (proxy.transactions.coordinator's declare fence)."""
        return self.link.is_receiver and self.held is None

    def routed(self) -> None:
        """The link was routed: a drain asked for while it waited is now its endpoint's, and
        what a parked producer held goes on through it."""
        endpoint = self.handler.links.get(self.link_ptr)
        if endpoint is None or endpoint is self:
            return
        if self.held:
            held, self.held = self.held, None
            for payload, delivery in held:
                endpoint.take_over(payload, delivery)
        if self.drain_requested:
            endpoint.drain_requested = True
            endpoint.on_flow()

    def on_delivery(self, delivery) -> None:
        if self.held is None or engine.beyond_credit(self.link_ptr):
            # a transfer without credit (§2.6.7): the client is told, as everywhere else
            self.handler.refuse_beyond_credit(self.link)
            return
        payload = engine.read_transfer(self.link_ptr, delivery, self.handler.broker.max_message_size)
        if payload is False:
            self.handler.refuse_oversized(self.link)
        elif payload is not None:  # on credit given before: held for the new primary
            settled = pn_delivery_settled(delivery)
            if settled:
                pn_delivery_settle(delivery)
            self.held.append((payload, None if settled else delivery))

    def detached(self) -> None:
        self.entry.pending.discard(self)
        self.held = None


def hold_link(client, link, entry, browse: bool) -> PendingLink:
    """Open ``link`` with no credit and keep it in ``entry.pending`` (a set) until ``entry``
    knows where the queue is served."""
    pending = PendingLink(client, link, entry, browse)
    client.open_link(link, presettled=link.is_sender and link.remote_snd_settle_mode == link.SND_SETTLED,
                     address=entry.address)
    client.links[pending.link_ptr] = pending
    entry.pending.add(pending)
    return pending


def park(endpoint, entry, held: list) -> PendingLink:
    """``endpoint`` (a local queue's consumer, browser or producer) loses its queue: its client
    link stays attached and waits in ``entry.pending`` for the new owner, as a new link would.
    A consumer's unsettled deliveries are settled here (the new primary sends those messages
    again, delivery-count + 1); a producer's ``held`` transfers go on with the link, and so do
    those a durable queue's producer still held for the disk (issue #42: their deliveries were
    dropped with the old endpoint, and the clients never had an outcome)."""
    handler, link = endpoint.handler, endpoint.link
    unsettled = list(getattr(endpoint, "unsettled", None) or ())
    awaiting = getattr(endpoint, "awaiting", None)
    if awaiting:  # a durable queue's transfers still waiting for the disk: they go on too
        held = list(held) + [(message.payload, delivery) for _, delivery, message in awaiting
                             if delivery is not None]
        endpoint.queue.incoming -= len(awaiting)
        awaiting.clear()
    handler.links.pop(endpoint.link_ptr, None)
    endpoint.detached()
    for delivery in unsettled:
        pn_delivery_settle(delivery)
    browse = link.is_sender and link.remote_source.distribution_mode == link.remote_source.DIST_MODE_COPY
    pending = PendingLink(handler, link, entry, browse, held if link.is_receiver else None)
    handler.links[pending.link_ptr] = pending
    entry.pending.add(pending)
    handler.mark_dirty()
    return pending


def release_links(entry, keep=None):
    """The links ``entry`` held, each taken out of ``entry.pending``: (pending, handler, link)
    of those still attached, to be routed now (then ``pending.routed()``); those whose handler
    ``keep(handler)`` is true stay held."""
    for pending in list(entry.pending):
        if keep is not None and keep(pending.handler):
            continue
        entry.pending.discard(pending)
        handler, link = pending.handler, pending.link
        if pending.link_ptr in handler.links and not link.state & link.REMOTE_CLOSED:
            yield pending, handler, link


def shed_stuck(entry, parked: list, description: str, waited: float, fenced_only: bool,
               followed: list = ()) -> None:
    """Close (reset) the connection of each link ``entry`` parked (``clients_moved``) still stuck
    after ``waited`` s: neither served here nor attached on a node on the way to the primary.
    ``fenced_only``: only while this node knows itself cut off (``service.cut_off``).

    A client whose proxy had followed the queue home, through this node's own listener, is two
    links (docs/nemesis.md, finding 31): its own link here, a proxy on this node's own pool,
    and the proxy's link, parked with the others. ``followed`` are those proxies: one that
    followed the owner on and is not attached there is stuck too. A parked link of this node's
    own proxy connection to itself is reset at its clients: the connections of the proxies it
    carries (``silent_peers.send_home_clients_away``), not that connection alone (which the
    proxies opened again, or the gate turned away, while their clients waited)."""
    if fenced_only and not entry.service.cut_off():
        return
    why = "this node is cut off and no peer answers" if fenced_only else "no primary known"
    reason = f"{description}; {why} after {waited:g} s"
    done = set()  # connections already ended here (several of their links may be stuck)

    def end(handler) -> None:
        done.add(id(handler))
        log.warning("queue %s: %s after %.1f s: closing the connection of a link that "
                    "waited for the primary", entry.wire, why, waited)
        if entry.service.silent_peers.send_home_clients_away(handler, reason):
            return
        # a reset, not a close frame, for Container clients (AmqpProtocol.close)
        handler.output.close("amqp:connection:forced", reason, reset=True)

    for pending in parked:
        handler = pending.handler
        if id(handler) in done:
            continue
        endpoint = handler.links.get(pending.link_ptr)
        stuck = endpoint is pending or (endpoint is not None and not getattr(
            endpoint, "up_attached", True))  # no primary, nor a node on the way to it
        if stuck and getattr(handler.output, "close", None) is not None:
            end(handler)
    for proxy in followed:
        handler = proxy.handler
        if proxy.closed or proxy.up_attached or id(handler) in done or \
                entry.service.is_peer(handler) or getattr(handler.output, "close", None) is None:
            continue
        end(handler)
    entry.node.broker.run_pending()
