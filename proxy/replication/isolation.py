"""A node that reaches etcd but none of its peers: it knows it, and sends its clients away.

A node cut off from its peers, not from etcd, is not fenced: it keeps its leases, its
queues' primaries elsewhere keep theirs, and nothing in etcd changes. Its clients whose links
it proxies to those primaries wait for outcomes that never come, for as long as the cut
lasts (the nemesis: 6-15 s for a 6 s cut, docs/nemesis.md finding 17), while every other node
could serve them. ``IsolationWatch`` looks every ``LOOK`` seconds at what each peer owes this
node (``silence.owes``: transfers without an outcome, attaches, an open) and when it was last
heard (``ReplicationService.peer_activity``: reads on the connections the peer opened here,
bytes on this node's connections to it). A peer that owes an answer and was not heard for
``relay_limit`` makes it *ping* every other live member not heard meanwhile (``ping``: a
connection to its AMQP listener and a protocol header; any answer, a refusal or a close
counts, a blackhole does not): a peer that answers is heard. When no other live member (two
at least) was heard for ``lease_ttl``, one of them owing an answer, this node is the one cut
off: it is ``isolated`` (``SilentPeers.isolated_from``): the clients it proxies
to them are sent to their failover lists and new ones are turned away before the AMQP open,
until a peer is heard again or two leases have passed.

Who may decide what: only a node that acts (etcd answers; a fenced node has ``SilentPeers``
for this) and sees two or more other live members. One peer silent, the others heard: that
peer is paused or cut off, and etcd moves its queues (nothing to do here). Every peer silent
while etcd still counts them alive for a lease: it is this node. A node with one peer cannot
tell which side is cut off and does nothing. Two peers paused at once (a double fault) look
the same as this node cut off when both leases outlive the lease of silence by a moment:
its clients then reconnect elsewhere, which costs a resend, never a message.
"""

from __future__ import annotations

import asyncio
import logging
from urllib.parse import urlsplit

from .silence import owes

log = logging.getLogger("fedgate.replication")

LOOK = 0.5  # seconds between looks
OWING_AT_LEAST = 0.5  # a peer must owe an answer this long (one look) to count as silent
HEADER = b"AMQP\x03\x01\x00\x00"  # the SASL layer's protocol header: every listener answers it


class _Ping(asyncio.Protocol):
    def __init__(self, answered: asyncio.Future) -> None:
        self.answered = answered

    def connection_made(self, transport) -> None:
        transport.write(HEADER)

    def _heard(self) -> None:
        if not self.answered.done():
            self.answered.set_result(True)

    def data_received(self, data: bytes) -> None:
        self._heard()

    def eof_received(self):
        self._heard()

    def connection_lost(self, exc) -> None:
        self._heard()  # closed by the peer (after a timeout the answer is already False)


async def ping(network, host: str, port: int, timeout: float) -> bool:
    """Whether the peer's listener answers within ``timeout``: bytes, a close or a refusal (the
    way to it works); a connect or an answer that never comes (a blackhole) is False."""
    loop = asyncio.get_running_loop()
    answered = loop.create_future()
    deadline = loop.time() + timeout
    try:
        transport, _ = await asyncio.wait_for(
            network.connect(lambda: _Ping(answered), host, port), timeout)
    except asyncio.TimeoutError:
        return False
    except OSError:
        return True
    try:
        return await asyncio.wait_for(answered, max(0.0, deadline - loop.time()))
    except asyncio.TimeoutError:  # (wait_for cancelled the future: a late answer is ignored)
        return False
    finally:
        transport.abort()


class IsolationWatch:
    def __init__(self, service) -> None:
        self.service = service
        self.timer: asyncio.TimerHandle | None = None
        self.owing_since: dict[str, float] = {}  # peer -> since when it owes an answer
        self.tokens: dict[str, tuple] = {}  # peer -> its activity at the last change
        self.heard_at: dict[str, float] = {}  # peer -> loop time its activity last changed
        self.isolations = 0  # times this node found itself cut off from every peer
        self.pinging: set[str] = set()  # peers asked (ping) and not answered yet
        self.unreached: set[str] = set()  # peers owing an answer that did not answer a ping
        self.published: tuple = ()  # what this node's registration says of them
        self.publishing = False

    def start(self) -> None:
        if self.timer is None and self.service.automatic:
            self.timer = asyncio.get_running_loop().call_later(LOOK, self._look)

    def stop(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.timer = None

    def _look(self) -> None:
        self.timer = asyncio.get_running_loop().call_later(LOOK, self._look)
        service = self.service
        now = asyncio.get_running_loop().time()
        for peer, token in service.peer_activity().items():
            if self.tokens.get(peer) != token:
                self.tokens[peer], self.heard_at[peer] = token, now
                self.unreached.discard(peer)
        if not service.coordinator.acting() or service.silent_peers.isolated:
            self.owing_since.clear()
            return
        self._publish()
        if self._named_by_all():
            return
        others = [n for n in service.members() if n != service.node_id]
        owing = self._owing()
        for peer in list(self.owing_since):
            if peer not in owing:
                del self.owing_since[peer]
        for peer in owing:
            self.owing_since.setdefault(peer, now)
        if len(others) < 2:
            return
        lease, relay = service.lease_ttl(), service.relay_limit()
        suspect = [p for p in others if now - self.owing_since.get(p, now) >= OWING_AT_LEAST
                   and now - self.heard_at.get(p, 0.0) >= OWING_AT_LEAST]
        if not suspect:
            return
        for peer in others:  # heard of late, or asked now
            if now - self.heard_at.get(peer, 0.0) >= OWING_AT_LEAST and peer not in self.pinging:
                self._ping(peer, relay)
        if any(now - self.heard_at.get(peer, 0.0) < lease for peer in others):
            return
        self.isolations += 1
        log.warning("no peer (%s) answered for %.1f s, while etcd counts them alive: this node "
                    "is cut off from its peers; its clients go to their failover lists",
                    ", ".join(sorted(others)), lease)
        self.owing_since.clear()
        service.silent_peers.isolated_from(now - lease)

    def _publish(self) -> None:
        """The peers this node cannot reach, in its registration, when they change."""
        unreached = tuple(sorted(self.unreached))
        if unreached == self.published or self.publishing:
            return
        self.publishing = True

        async def put() -> None:
            try:
                await self.service.coordinator.set_unreachable(unreached)
                self.published = unreached
                if unreached:
                    log.warning("peers this node cannot reach: %s", ", ".join(unreached))
            except Exception as exc:  # etcd unreachable: again at the next look
                log.info("unreachable peers not published: %s", exc)
            finally:
                self.publishing = False

        self.service.spawn(put())

    def _named_by_all(self) -> bool:
        """Every other live member (two at least, reaching each other) names this node among
        the peers it cannot reach: this node is the one cut off, whatever it sees itself. Its
        primaries stand aside and its clients go elsewhere (docs/replication.md, 5b)."""
        service = self.service
        members = [m for m in service.coordinator.members() if m.id != service.node_id]
        if len(members) < 2 or not all(service.node_id in m.unreachable for m in members):
            return False
        ids = {m.id for m in members}
        if any(set(m.unreachable) & ids for m in members):
            return False  # they cannot reach each other either: no side is the cut one
        self.isolations += 1
        log.warning("every other member (%s) says it cannot reach this node: it is the one cut "
                    "off; its primaries stand aside and its clients go elsewhere",
                    ", ".join(sorted(ids)))
        self.owing_since.clear()
        lease = service.lease_ttl()
        service.silent_peers.isolated_from(asyncio.get_running_loop().time() - lease)
        for entry in list(service.entries.values()):
            if entry.primary is not None and not entry.primary.fenced:
                entry.stand_aside("every other member says it cannot reach this node")
        return True

    def _ping(self, peer: str, timeout: float) -> None:
        url = self.service.url_of(peer)
        if not url:
            return
        parts = urlsplit(url)
        self.pinging.add(peer)

        async def ask() -> None:
            try:
                if await ping(self.service.node.broker.upstreams.network, parts.hostname,
                              parts.port or 5672, timeout):
                    self.heard_at[peer] = asyncio.get_running_loop().time()
                    self.unreached.discard(peer)
                elif peer in self.owing_since:  # it owes us an answer, and answers nothing
                    self.unreached.add(peer)
            finally:
                self.pinging.discard(peer)

        self.service.spawn(ask())

    def _owing(self) -> set[str]:
        """Peers that owe this node an answer now."""
        service = self.service
        by_address = service.peers_by_address()
        out = set()
        for pool in service.node.broker.upstreams.pools.values():
            peer = by_address.get((pool.target.host, pool.target.port))
            if peer is not None and any(m.protocol is not None and owes(m)
                                        for m in [*pool.members, pool.alone]):
                out.add(peer)
        return out
