"""A fenced node's upstream connections to peers that answer nothing: its clients go elsewhere.

A node in a one-way partition (what it sends arrives, nothing comes back) fences itself: etcd
does not answer. Its clients whose links are proxied to a primary on another node wait for
outcomes that never come, until the upstream connection's idle timeout (two heartbeats) and
the heal: the nemesis measured 14 s for a 6 s cut, 21-34 s for two (docs/nemesis.md, finding
15). The node's own trouble is known to it (fenced), so while fenced it looks at its upstream
connections to peers at the fence and then every ``relay_limit`` (half a lease): one that
owed answers (transfers without an outcome, attaches or its own open unanswered) at a look
and heard nothing at all by the next (a live peer sends at least its outcomes) is silent, and the connections of the clients
proxied through that peer's pools are ended (``amqp:connection:forced``, a reset), so their
failover lists take them to a node that hears. Links of other fedgate nodes through here are
left alone (those nodes find the primary themselves).

A node cut off only from etcd hears its peers: nothing changes for it. A peer that is alive
and slow for a whole relay limit with work owed (a primary waiting a lease for a silent
backup) costs this fenced node's clients a reconnect and a resend, never a message.

While a peer stays silent, new client connections are refused before the AMQP open (the
admission ``gates``): python-qpid-proton's Container goes back to the first URL of its list
after a connection that was opened, which is this node for its own clients, so a reset alone
brings them back here; a refused connect moves it on to the next URL. In a node with workers
the supervisor admits connections, and the gate is not asked.

States: ``idle`` (acting) -> ``watching`` (fenced: a look every ``relay_limit``; a peer pool
owing answers at one look and unheard at the next becomes ``silent``, and with it every peer
pool unheard since the fence: their clients are sent away (with those proxied through the
node's own listener and those whose links wait here for an owner: findings 22 and 32), new
clients turned away, until they are heard again) -> ``idle`` (acting again: every note
dropped).
"""

from __future__ import annotations

import asyncio
import logging
from urllib.parse import urlsplit

log = logging.getLogger("fedgate.replication")


def owes(member) -> bool:
    """Whether the peer owes this upstream connection an answer: an open, an attach, or an
    outcome of a transfer it was sent."""
    if member.state.value == "connecting":
        return True
    if member.attaching:
        return True
    return any(getattr(e, "inflight", None) or getattr(e, "txn_inflight", None)
               for e in member.endpoints)


class SilentPeers:
    """While fenced: ends the client connections proxied to peers that answer nothing, and
    turns new clients away while such a peer stays silent."""

    def __init__(self, service) -> None:
        self.service = service
        self.timer: asyncio.TimerHandle | None = None
        self.owed: dict = {}  # pool member -> (its protocol, heard_at) when it owed an answer
        self.silent: dict = {}  # pool -> loop time it was found silent
        self.fenced_at = 0.0
        self.isolated_at: float | None = None  # a primary here stood aside (isolated_from)
        self.heard_when_isolated: dict = {}
        self.resets = 0  # client connections ended
        self.turned_away = 0  # new client connections refused meanwhile
        admission = getattr(service.node, "admission", None)
        if admission is not None:
            admission.gates.append(self.gate)

    def gate(self) -> str | None:
        """Why a new client connection is refused now, or None. Fenced, and a peer answering
        nothing: the client's links would go through that peer, or wait for an owner this
        node cannot learn. Refused before the AMQP open, a client library's failover list goes
        on to its next URL (python-qpid-proton starts again at the first URL after a
        connection that was opened, so a node that opens and then ends it keeps it)."""
        if self.timer is None or not self.silent:
            return None
        self.turned_away += 1
        pool = next(iter(self.silent))
        return (f"this node is {self._cut()} and {pool.target.display} answers nothing: "
                f"the client's failover list goes on")

    @property
    def isolated(self) -> bool:
        """A primary here stood aside: this node hears none of its peers (nor they it)."""
        return self.isolated_at is not None

    def isolated_from(self, since: float) -> None:
        """A primary here found itself cut off from every peer, silent since ``since``
        (docs/replication.md, 5b): the peers unheard since then are silent at once, their
        clients sent away, new clients turned away, until a peer is heard again (at most two
        leases: then as before)."""
        loop = asyncio.get_running_loop()
        self.isolated_at = loop.time()
        self.heard_when_isolated = self.service.peer_activity()
        if self.timer is None:
            self.owed, self.silent = {}, {}
            self.fenced_at = since
            self._next()
        for pool in self._peer_pools():
            if pool not in self.silent and not self._heard_since(pool, since):
                self.silent[pool] = self.isolated_at
                self._send_clients_away(pool)

    def serving_again(self) -> None:
        """A primary that stood aside here claimed again (no backup did): clients are let in."""
        if self.isolated_at is None:
            return
        self.isolated_at, self.silent = None, {}
        if self.service.coordinator.acting():
            self.stop()

    def _cut(self) -> str:
        return "cut off from its peers" if self.isolated_at is not None else "cut off from etcd"

    def _isolation_over(self, now: float) -> bool:
        if self.isolated_at is None:
            return True
        if now - self.isolated_at > 2 * self.service.lease_ttl() or \
                self.service.peer_activity() != self.heard_when_isolated:
            log.warning("this node hears its peers again, or stood aside long enough: clients "
                        "are let in again")
            self.isolated_at = None
            self.silent = {}
            return True
        return False

    def fenced(self) -> None:
        if self.timer is None:
            self.owed, self.silent = {}, {}
            self.fenced_at = asyncio.get_running_loop().time()
            self._look()  # what is owed now; silent if still owed, unheard, at the next look

    def acting(self) -> None:
        """Etcd answers again: the watch ends, unless this node stood aside (isolated)."""
        if self.isolated_at is not None:
            return
        self.stop()

    def stop(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.timer, self.owed, self.silent, self.isolated_at = None, {}, {}, None

    def _next(self) -> None:
        loop = asyncio.get_running_loop()
        self.timer = loop.call_later(self.service.relay_limit(), self._look)

    def _peer_pools(self) -> list:
        peers = self.service.peers_by_address()
        pools = self.service.node.broker.upstreams.pools.values()
        return [p for p in pools if (p.target.host, p.target.port) in peers]

    def _look(self) -> None:
        service = self.service
        now = asyncio.get_running_loop().time()
        if service.coordinator.acting() and self._isolation_over(now):
            self.stop()
            return
        owed = {}
        for pool in self._peer_pools():
            members = [*pool.members, pool.alone]
            since = self.silent.get(pool)
            if since is not None:
                if self._heard_since(pool, since):
                    del self.silent[pool]  # it answers again
                    log.warning("upstream %s answers again", pool.target.display)
                else:
                    self._send_clients_away(pool)  # any that came meanwhile
                continue
            for member in members:
                protocol = member.protocol
                if protocol is None or not owes(member):
                    continue
                before = self.owed.get(member)
                if before is not None and before == (protocol, protocol.heard_at):
                    self.silent[pool] = now  # owed at the last look, and not a byte since
                    self._send_clients_away(pool)
                    break
                owed[member] = (protocol, protocol.heard_at)
        self.owed = owed
        if self.silent:
            # a peer silent for a relay limit while this node hears no etcd either: the
            # silence is most likely this node's (a one-way partition). Peers unheard since the
            # fence owe nothing yet only because nothing was asked of them (consumers wait for
            # messages): their clients go too, not one relay limit later each
            for pool in self._peer_pools():
                if pool not in self.silent and not self._heard_since(pool, self.fenced_at):
                    self.silent[pool] = now
                    self._send_clients_away(pool)
            # clients proxied home through this node's own listener (a fragment's producers
            # brought home, proxies that followed their queue here): the gate turns the
            # proxy's own connection away too, so nothing of theirs goes anywhere
            # (docs/nemesis.md, finding 22)
            for pool in self._own_pools():
                self._send_clients_away(pool, "this node's own listener turns its proxies away")
            self._send_waiting_away()
        self._next()

    def _send_waiting_away(self) -> None:
        """Clients with a link held here for an owner this node cannot learn while cut off (a
        replicated queue's or a fragment's: ``pending``) go too, for the gate's own reason: a
        fragment's producer that came between the reset of its node's clients and the gate
        closing was held for its home's claim, on no pool sent away, and waited for the heal
        (docs/nemesis.md, finding 32). Links of other fedgate nodes stay (they find the owner
        themselves); a link of this node's own proxy connection sends its clients away."""
        service = self.service
        holders = [*service.entries.values(), *(make() for make in service.fragment_listeners.values())]
        handlers = {}
        for holder in holders:
            for pending in getattr(holder, "pending", None) or ():
                handler = pending.handler
                if not service.is_peer(handler) and getattr(handler.output, "close", None) is not None:
                    handlers[id(handler)] = handler
        why = f"this node is {self._cut()} and can learn no owner for a link that waits here"
        for handler in handlers.values():
            if self.send_home_clients_away(handler, why):
                continue
            self.resets += 1
            handler.output.close("amqp:connection:forced", why, reset=True)
        if handlers:
            log.warning("%s: %d client connections sent to their failover lists", why, len(handlers))
        service.node.broker.run_pending()

    def _own_pools(self) -> list:
        url = self.service.known.get(self.service.node_id)
        if not url:
            return []
        parts = urlsplit(url)
        pools = self.service.node.broker.upstreams.pools.values()
        return [p for p in pools if (p.target.host, p.target.port) == (parts.hostname, parts.port)]

    @staticmethod
    def _heard_since(pool, since: float) -> bool:
        return any(m.protocol is not None and m.protocol.heard_at > since
                   for m in [*pool.members, pool.alone])

    def send_home_clients_away(self, handler, description: str) -> int:
        """``handler`` serves this node's own proxy connection to itself (a member of an
        ``_own_pools`` pool) and one of its links waited for a primary too long
        (``parked.shed_stuck``): the clients whose links that connection carries one hop on
        (a fragment's producers brought home, proxies that followed their queue here) are sent
        to their failover lists. Resetting that connection reached none of them: their proxies
        connected again, or were turned away by the gate, and the clients waited for the next
        look (a relay limit: docs/nemesis.md, finding 31). Returns the client connections
        ended (0: ``handler`` is not this node's own proxy connection, or carries none)."""
        connection = handler.server_connection
        container = connection.remote_container if connection is not None else ""
        if not container.startswith(f"{self.service.node_id}-up-"):
            return 0
        members = [m for pool in self._own_pools() for m in [*pool.members, pool.alone]
                   if m.conn is not None and m.conn.connection.container == container]
        ended = self._end_clients(members, description)
        if ended:
            log.warning("this node's own proxy connection %s: %s: %d client connections sent "
                        "to their failover lists", container, description, ended)
        self.service.node.broker.run_pending()
        return ended

    def _end_clients(self, members, description: str) -> int:
        """Reset the client connections (never other fedgate nodes') whose proxy links
        ``members`` carry."""
        handlers = {}
        for member in members:
            for endpoint in member.endpoints:
                handler = getattr(endpoint, "handler", None)
                if handler is not None and not self.service.is_peer(handler):
                    handlers[id(handler)] = handler
        ended = 0
        for handler in handlers.values():
            close = getattr(handler.output, "close", None)
            if close is None:
                continue
            ended += 1
            self.resets += 1
            # a reset, not a close frame, for Container clients (AmqpProtocol.close)
            close("amqp:connection:forced", description, reset=True)
        return ended

    def _send_clients_away(self, pool, why: str = "") -> None:
        service = self.service
        waited = service.relay_limit()
        why = why or f"{pool.target.display} answered nothing for {waited:g} s"
        ended = self._end_clients([*pool.members, pool.alone], f"this node is {self._cut()} and {why}")
        if ended:
            log.warning("upstream %s: %s while this node is cut off: %d client connections sent "
                        "to their failover lists", pool.target.display, why, ended)
        service.node.broker.run_pending()
