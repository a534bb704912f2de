"""Declaring a queue on a RabbitMQ 4 primary through its management node.

How this works
--------------
RabbitMQ 4 serves an "HTTP over AMQP" management node at ``/management``: a
client attaches a pair of links with the same name and the link property
``paired = true`` (a sender whose target is ``/management`` and a receiver
whose source is ``/management``, both pre-settled), sends a request whose
``subject`` is the HTTP method, ``to`` the resource path (``/queues/NAME``,
percent-encoded), ``reply-to`` ``$me`` and body an ``amqp-value`` map, and gets
a reply whose ``subject`` is the HTTP status code and ``correlation-id`` the
request's ``message-id``.

``ManagementRequest`` makes one such request on a session of its own (like
``proxy.upstream.probe.RemoteProbe``: a refusal there must not end the
member's shared session) and calls ``done(status, description)`` once: the
status code as a number (``0`` if the links were refused or the session
ended, ``NO_ANSWER`` if nothing came back within ``ANSWER_TIMEOUT``;
``description`` then says why). A proxy rule with ``upstream.declare``
sends ``PUT /queues/NAME`` with ``{durable, auto_delete: false, exclusive:
false, arguments: {x-queue-type, ...}}`` before its first attach to that
queue: 200 (it exists, equivalent) and 201 (made) let the attach go on; 409
(it exists with other arguments) and others refuse the client's link
(``proxy.upstream.owner``).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import uuid
from urllib.parse import quote

from cproton import pn_delivery_settle
from proton import Link, Message, PropertyDict, symbol

from proxy.amqp import engine

MANAGEMENT = "/management"
_names = itertools.count(1)
log = logging.getLogger("fedgate.upstream")

# A request not answered in this long is given up (its links and session closed) and
# reported as NO_ANSWER: the owner asks again (proxy.upstream.owner), so a lost request or
# reply never leaves a client's link waiting for ever.
ANSWER_TIMEOUT = 10.0
NO_ANSWER = -2


def queue_path(remote_address: str) -> str | None:
    """``/queues/NAME`` with NAME percent-encoded as RabbitMQ wants; None for other addresses."""
    if not remote_address.startswith("/queues/"):
        return None
    return "/queues/" + quote(remote_address[len("/queues/"):], safe="")


OK = (200, 201, 204)
CONDITIONS = {401: "amqp:unauthorized-access", 403: "amqp:unauthorized-access",
              404: "amqp:not-found", 409: "amqp:precondition-failed"}


def refusal(status: int) -> str:
    """The AMQP condition a client's link gets when the declare was answered ``status``."""
    if status == 0:
        return "amqp:not-implemented"  # no management node (RabbitMQ before 4.0, other brokers)
    return CONDITIONS.get(status, "amqp:internal-error")


def declare_body(spec) -> dict:
    """The body of ``PUT /queues/NAME`` for a rule's ``upstream.declare``."""
    arguments = {"x-queue-type": spec.type, **dict(spec.arguments)}
    return {"durable": spec.durable, "auto_delete": False, "exclusive": False, "arguments": arguments}


class ManagementRequest:
    """One request to RabbitMQ 4's management node (see the module note)."""

    closed = False

    def __init__(self, member, method: str, path: str, body, done) -> None:
        self.member = member
        self.done = done
        self.message_id = str(uuid.uuid4())
        self.method, self.path = method, path
        self.request = Message(id=self.message_id, address=path, subject=method, reply_to="$me",
                               body=body).encode()
        self.sent = False
        self.session = member.conn.connection.session()
        self.session.open()
        member.side_sessions[self.session._impl] = self
        name = f"fedgate-management-{next(_names)}"
        self.sender = self.session.sender(name)
        self.receiver = self.session.receiver(name)
        for link in (self.sender, self.receiver):
            link.snd_settle_mode = Link.SND_SETTLED
            link.rcv_settle_mode = Link.RCV_FIRST
            link.properties = PropertyDict({symbol("paired"): True})
        self.sender.source.address = MANAGEMENT
        self.sender.target.address = MANAGEMENT
        self.receiver.source.address = MANAGEMENT
        self.receiver.target.address = MANAGEMENT
        # the member routes our links' events to us (on_upstream_*); no owner state here
        self.up_attached = False
        member.register(self.sender, self)
        member.register(self.receiver, self)
        self.sender.open()
        self.receiver.open()
        self.receiver.flow(1)
        self.timer = asyncio.get_running_loop().call_later(ANSWER_TIMEOUT, self._no_answer)
        member.mark_dirty()

    def _no_answer(self) -> None:
        self.timer = None
        sender, receiver = self.sender, self.receiver
        state = (f"request {'sent' if self.sent else 'not sent'}, sender remote "
                 f"{'open' if sender.state & Link.REMOTE_ACTIVE else 'not open'} with credit "
                 f"{sender.credit}, receiver remote "
                 f"{'open' if receiver.state & Link.REMOTE_ACTIVE else 'not open'}")
        log.warning("management request %s %s: no answer in %.0f s (%s)", self.method, self.path,
                    ANSWER_TIMEOUT, state)
        self._finish(NO_ANSWER, f"no answer in {ANSWER_TIMEOUT:.0f} s ({state})")

    def _finish(self, status: int, description: str) -> None:
        if self.done is None:
            return
        done, self.done = self.done, None
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        member = self.member
        for link in (self.sender, self.receiver):
            member.unregister(link._impl)
            if link.state & Link.LOCAL_ACTIVE:
                link.close()
        if member.side_sessions.get(self.session._impl) is self:
            del member.side_sessions[self.session._impl]
            if self.session.state & Link.LOCAL_ACTIVE:
                self.session.close()
        member.mark_dirty()
        done(status, description)

    # -- the member's calls (as for any link owner) ---------------------------------
    def on_upstream_attached(self) -> None:
        self._send()

    def on_upstream_flow(self) -> None:
        self._send()

    def _send(self) -> None:
        sender = self.sender
        if self.sent or not (sender.state & Link.REMOTE_ACTIVE) or sender.credit <= 0:
            return
        if sender.remote_target is None or sender.remote_target.address != MANAGEMENT:
            return
        self.sent = True
        delivery = engine.send_message(sender._impl, b"1", self.request)
        pn_delivery_settle(delivery)  # pre-settled (§3.4: settle mode settled)
        self.member.mark_dirty()

    def on_upstream_detached(self, condition) -> None:
        name = condition.name if condition is not None and condition.name else "amqp:link:detach-forced"
        text = condition.description if condition is not None and condition.description else ""
        self._finish(0, f"the management node refused the request links: {name} {text}".strip())

    def on_upstream_delivery(self, delivery) -> None:
        link = self.receiver._impl
        payload = engine.read_transfer(link, delivery)
        if payload is None:
            return  # more frames to come
        pn_delivery_settle(delivery)
        reply = Message()
        try:
            reply.decode(payload)
        except Exception as exc:  # a reply we cannot read is an answer too
            self._finish(0, f"unreadable management reply: {exc}")
            return
        if str(reply.correlation_id) != self.message_id:
            return  # not ours (cannot happen on a pair of our own)
        try:
            status = int(str(reply.subject))
        except ValueError:
            self._finish(0, f"management reply without a status: {reply.subject!r}")
            return
        body = reply.body
        self._finish(status, body if isinstance(body, str) else "")

    def abandon(self) -> None:
        """The member's connection is gone, and our links with it: status -1 (ask again)."""
        if self.done is not None:
            done, self.done = self.done, None
            if self.timer is not None:
                self.timer.cancel()
                self.timer = None
            done(-1, "the connection to the primary was lost")
