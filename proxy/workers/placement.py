"""Placement by first attach, a worker's side (issue #36).

How this works
--------------
A worker holds a new client connection's first frames back from proton
(``proxy.amqp.first_attach``; only plain TCP, not WebSocket or TLS, whose state
lives in the worker). When the first attach is read, ``where`` says where the
connection belongs:

* a local queue another worker owns: that worker (``{"to": K}``), so the
  client's messages never cross to the owner one by one;
* a fragmented queue with replicated fragments (or an adopted fragment of one):
  the worker that owns it (``ownership.replicated_fragments``);
* another fragmented queue: the supervisor's choice (``{"balance": [group, role]}``,
  ``ownership.balanced_worker``), so producers sit beside consumers;
* anything else (this worker's own queue, a proxy rule, no address): here.

``hand_over`` sends the socket, the frames read and the identity SASL
established to the supervisor, which passes them on (``proxy.workers.worker``
describes the message) and moves the connection's counts; this worker then
forgets the connection without reporting it closed. The worker that receives it
``adopt``s it: an ``AmqpProtocol`` whose proton reads the client's frames from
its ``open`` on and whose answers the client already has are dropped
(``ServerConnection.resume_handed_over``). A connection placed by a balance is
reported when it closes (``closed``), so the supervisor's counts stay true.
"""

from __future__ import annotations

import logging

from proxy.amqp.connection import Identity
from proxy.workers.ownership import BACKUP, CONSUMER, PRODUCER, SERVED, replicated_fragments

log = logging.getLogger("fedgate.placement")


class Placement:
    def __init__(self, node, protocol_class) -> None:
        self.node = node
        self.protocol_class = protocol_class  # proxy.server.AmqpProtocol
        self.handed_over = 0  # client connections handed on (admin API, /metrics)
        self._balance_of: dict = {}  # AmqpProtocol -> [group, role] it was placed by

    @property
    def active(self) -> bool:
        """Whether new client connections are held for their first attach."""
        node = self.node
        worker = node.worker
        return (worker is not None and worker.count > 1 and worker.channel is not None
                and node.tls_context is None and node.config.node.place_by_first_attach)

    def where(self, attach) -> dict | None:
        """The hand-over's head for a connection whose first attach is ``attach``
        (``first_attach.Sniffed``); None: it stays here."""
        worker = self.node.worker
        resolve = self.node.routing.resolve
        decision = resolve(attach.address)
        # a primary's replication link is a backup copy's first use: it weighs less
        weight = BACKUP if attach.replication else SERVED
        queue = replicated_fragments(resolve, decision, attach.address)
        if queue is not None:  # served by its owner alone (issue #45)
            owner = worker.owners.owner(queue, weight)
            return None if owner == worker.index else {"to": owner}
        if decision.kind == "fragmented":
            role = CONSUMER if attach.receiver else PRODUCER
            return {"to": None, "balance": [decision.remote_address or attach.address, role]}
        owner = worker.owners.owner_of_kind(decision.kind, attach.address, weight)
        return None if owner is None or owner == worker.index else {"to": owner}

    def hand_over(self, protocol: "AmqpProtocol", where: dict, fd: int, frames: bytes,
                  answered: bytes) -> bool:
        """Pass a client connection on through the supervisor; True if it went. ``frames``:
        what the client sent after its AMQP header; ``answered``: what we wrote since."""
        node = self.node
        identity = protocol.conn.identity
        head = {**where, "ip": protocol.ip, "user": identity.user, "mechanism": identity.mechanism,
                "groups": list(identity.groups), "counted": node.admission.user_of(protocol) is not None,
                "token": identity.token.to_json() if identity.token is not None else None,
                "answered": answered.hex()}
        if not node.worker.hand_over(fd, head, frames):
            return False
        log.debug("connection from %s (user %s): first attach to %r, handed on (%s)",
                  protocol.peer, identity.user, protocol.conn.first_attach.address, where)
        self.handed_over += 1
        node.admission.forget(protocol)  # the supervisor moved its counts to where it went
        return True

    def adopt(self, sock, head: dict, frames: bytes) -> None:
        """Serve a client connection another worker of this node began."""
        token = head.get("token")  # a token login's grant ([oauth]), rebuilt here
        if token is not None:
            token = self.node.oauth.from_json(token)
        identity = Identity(str(head.get("user", "anonymous")), head.get("mechanism"),
                            tuple(head.get("groups", ())), token)
        answered = bytes.fromhex(str(head.get("answered", "")))
        handed = (identity, frames, answered, bool(head.get("counted")), head.get("balance"))
        node = self.node
        node.server.adopt(sock, factory=lambda: self.protocol_class(node, handed=handed))

    def adopted(self, protocol: "AmqpProtocol", user: str | None, balance: list | None) -> None:
        """A handed-over connection's counts: its user (already counted node-wide by the
        supervisor) and its place in a fragmented queue's balance."""
        if user is not None:
            self.node.admission.count_user(protocol, user)
        if balance is not None:
            self._balance_of[protocol] = balance

    def closed(self, protocol: "AmqpProtocol") -> None:
        """A connection this worker served closed: a balance it was placed by hears so."""
        balance = self._balance_of.pop(protocol, None)
        if balance is not None:
            self.node.worker.send_balance_left(balance)
