"""The ``$cbs`` node: a token login renews its token in band (docs/oauth.md, issue #47).

How this works
--------------
The put-token exchange that Azure's SDKs and rhea-promise speak: the client
attaches a sender and a receiver on ``$cbs`` and sends a request whose
application-properties say ``operation = "put-token"``, ``type = "jwt"`` and
``name`` (the resource; logged, not checked: the token's ``aud`` is), with the
token as an AMQP string body. The node answers on the client's receiver with
``status-code`` and ``status-description`` (correlation-id = the request's
message-id, to = its reply-to), and accepts the request either way:

* 202 ``Accepted``: the token is valid and for the connection's user; the
  connection now expires with it and has its grants (``renew_token``); links
  the new grants do not allow are detached with ``amqp:unauthorized-access``;
* 400: not a put-token request, a type other than ``jwt`` (no SAS tokens), no
  string body;
* 401: the token is refused (the reason logged and counted, as at SASL);
* 403: the connection did not log in with a token, or the token is another
  user's (a connection's identity never changes).

The node routes ``$cbs`` to these endpoints through the broker's extension
point (``kind_handlers``, decision kind ``cbs``); ``with_cbs`` wraps the
resolver, so only nodes with ``[oauth]`` have a ``$cbs``.
"""

from __future__ import annotations

import itertools
import logging

from cproton import PN_ACCEPTED, pn_delivery_settle, pn_delivery_update, pn_link_credit, pn_link_flow
from proton import Link, Message, int32

from proxy.amqp import engine
from proxy.auth.oauth import CBS_ADDRESS, TokenRefused

log = logging.getLogger("fedgate.oauth")

CBS_KIND = "cbs"
UNAUTHORIZED = "amqp:unauthorized-access"
REQUEST_CREDIT = 8
MAX_REQUEST = 32 * 1024  # a token (at most 16 KiB) and the request's properties


def with_cbs(resolve):
    """``resolve`` with ``$cbs`` routed to the ``cbs`` extension (``CbsNode``)."""
    from routing.decision import Decision

    decision = Decision(CBS_KIND, None, CBS_ADDRESS, reason="the $cbs node: token renewal")

    def resolve_cbs(address):
        return decision if address == CBS_ADDRESS else resolve(address)

    return resolve_cbs


class CbsNode:
    """The ``cbs`` kind's handler: ``attach`` answers a client's link on ``$cbs``."""

    selective = False
    browsable = False

    def __init__(self, validator) -> None:
        self.validator = validator
        self.renewed = 0

    def attach(self, handler, link: Link, decision) -> None:
        if link.is_sender:
            CbsReplies(handler, link)
        else:
            CbsRequests(self, handler, link)

    # -- put-token -----------------------------------------------------------------------
    def put_token(self, handler, request: Message) -> tuple[int, str]:
        props = request.properties
        if not isinstance(props, dict):  # application-properties of another type: not a request
            return 400, "application-properties must be a map"
        if props.get("operation") != "put-token":
            return 400, "operation must be put-token"
        if props.get("type") != "jwt":
            return 400, "type must be jwt"
        token = request.body
        if isinstance(token, (bytes, memoryview)):
            token = bytes(token).decode("ascii", "replace")
        if not isinstance(token, str) or not token:
            return 400, "the body must be the token, a string"
        connection = handler.server_connection
        identity = connection.identity if connection is not None else None
        if identity is None or identity.token is None:
            return 403, "this connection did not log in with a token"
        try:
            grant = self.validator.check(token, f"$cbs put-token from {handler.peer}")
        except TokenRefused:
            return 401, "token refused"
        if grant.subject != identity.user:
            self.validator.refuse("wrong_user", f"{grant.subject!r} on {identity.user!r}'s connection",
                                  f"$cbs put-token from {handler.peer}")
            return 403, "the token is another user's"
        connection.renew_token(grant)
        self.renewed += 1
        log.info("connection %s (%s, user %s): token renewed on $cbs (name %r), expires at %d",
                 handler.connection_id, handler.peer, identity.user, props.get("name"), grant.expires_at)
        detach_outside(handler, connection.identity)
        return 202, "Accepted"


def detach_outside(handler, identity, why: str = "the renewed token does not allow") -> int:
    """Detach the links ``identity``'s grants no longer allow; how many."""
    detached = 0
    for ptr, endpoint in list(handler.links.items()):
        if isinstance(endpoint, (CbsRequests, CbsReplies)):
            continue
        link = engine.transient(Link, ptr)
        terminus = link.remote_source if link.is_sender else link.remote_target
        address = terminus.address
        if not address or terminus.dynamic or terminus.type == terminus.COORDINATOR:
            continue  # temporary queues stay; the anonymous relay checks each message
        direction = "receive" if link.is_sender else "send"
        if handler.broker.authorize(identity, address, direction):
            continue
        log.warning("connection %s (%s, user %s): link to %r detached: %s %s", handler.connection_id,
                    handler.peer, getattr(identity, "user", "anonymous"), address, why, direction)
        handler.close_link(link, UNAUTHORIZED, f"{why} {direction} ({address!r})")
        detached += 1
    return detached


class CbsRequests(engine.ClientLinkEndpoint):
    """The client's sender on ``$cbs``: put-token requests. Our side is a receiver."""

    __slots__ = ("node", "handler", "link_ptr")
    address = CBS_ADDRESS

    def __init__(self, node: CbsNode, handler, link: Link) -> None:
        self.node = node
        self.handler = handler
        self.link_ptr = engine.hold(link._impl)
        link.source.copy(link.remote_source)
        link.target.copy(link.remote_target)
        link.open()
        handler.links[self.link_ptr] = self
        pn_link_flow(self.link_ptr, REQUEST_CREDIT)
        handler.mark_dirty()

    def on_delivery(self, delivery) -> None:
        handler = self.handler
        payload = self.read_whole(delivery, MAX_REQUEST)
        if payload is None:
            return
        request = Message()
        try:
            request.decode(payload)
        except Exception as exc:  # proton raises several kinds for what a peer can send
            status, description = 400, f"undecodable request: {type(exc).__name__}"
        else:
            status, description = self.node.put_token(handler, request)
        pn_delivery_update(delivery, PN_ACCEPTED)
        pn_delivery_settle(delivery)
        answer = {"status-code": int32(status), "status-description": description}
        try:
            reply = Message(correlation_id=request.id, address=request.reply_to, properties=answer).encode()
        except Exception:  # a message-id or reply-to of a type proton will not write back
            reply = Message(properties=answer).encode()
        for endpoint in list(handler.links.values()):
            if isinstance(endpoint, CbsReplies):
                endpoint.send(reply)
                break
        else:
            log.info("connection %s: $cbs answer %d dropped: no receiver on $cbs", handler.connection_id,
                     status)
        if pn_link_credit(self.link_ptr) <= REQUEST_CREDIT // 2:
            pn_link_flow(self.link_ptr, REQUEST_CREDIT - pn_link_credit(self.link_ptr))
        handler.mark_dirty()

    def on_flow(self) -> None:
        pass

    def detached(self) -> None:
        pass


class CbsReplies(engine.ClientLinkEndpoint):
    """The client's receiver on ``$cbs``: the answers, sent settled. Our side is a sender."""

    __slots__ = ("handler", "link_ptr", "pending", "tags", "drain_requested")
    address = CBS_ADDRESS
    MAX_PENDING = 16  # answers waiting for credit; older ones are dropped

    def __init__(self, handler, link: Link) -> None:
        self.handler = handler
        self.pending: list[bytes] = []
        self.tags = itertools.count()
        self.drain_requested = False
        self.link_ptr = engine.hold(link._impl)
        link.source.copy(link.remote_source)
        link.target.copy(link.remote_target)
        link.snd_settle_mode = Link.SND_SETTLED
        link.open()
        handler.links[self.link_ptr] = self
        handler.mark_dirty()

    def send(self, payload: bytes) -> None:
        self.pending = self.pending[-(self.MAX_PENDING - 1):] + [payload]
        self.on_flow()

    def on_flow(self) -> None:
        while self.pending and pn_link_credit(self.link_ptr) > 0:
            delivery = engine.send_message(self.link_ptr, str(next(self.tags)).encode(),
                                           self.pending.pop(0))
            pn_delivery_settle(delivery)
        if self.drain_requested:
            from proxy.amqp.drain import answer_drain

            self.drain_requested = False
            answer_drain(self.link_ptr)
        self.handler.mark_dirty()

    def detached(self) -> None:
        self.pending = []
