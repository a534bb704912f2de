"""One fragmented shared queue, as this node sees it.

How this works
--------------
A rule of kind ``fragmented`` names the members; every address it matches is
one logical queue with one fragment per member. On a node that is a member,
the fragment is an ordinary local queue (``proxy.queues.local``) and:

* **Enqueue.** Producers on this node enqueue locally. A producer on a node
  without a fragment (or whose fragment is draining) goes to one member chosen
  by consistent hashing (uhashring's ketama ring) of its identity
  ``container-id/link-name``: one producer, one fragment, so its messages keep
  their order for any one consumer (seed: "same producer to same consumer
  preserves order").
* **Consume and steal.** Local consumers are served from the local fragment
  first. After each dispatch (``after_dispatch``) the group checks: no local
  backlog, local consumers still hold credit -> steal the credit they lack
  from one peer (``Stealer.request``: a drain, so no credit stays parked).
  The victim is the peer with the largest reported backlog (the flow frame's
  ``available``), else round-robin. A peer that had nothing is skipped until
  a retry timer (50 ms doubling to 1 s) fires, and only while consumers are
  waiting: an idle group does nothing at all. A stealer whose link the peer
  refused is made again at that timer (the peer may serve it by then: a
  backup that takes a dead member's fragment, fragments.replicas).
* **Serving peers.** A link marked ``fedgate:fragment`` is another node's
  stealer: it is a *peer consumer* of the local fragment, served only when no
  local consumer can take the message, and never re-steals.
* **Fragment-less nodes** consume from the nearest member: the rule's
  ``prefer`` order, else the ring.
* **Draining.** A member listed in ``draining`` takes no new producers; its
  backlog is stolen by the others; once empty it reports itself removed.
* **Workers** (``[node] workers``, ``proxy.workers``): on a member node, the
  node's fragment is one fragment per worker (members ``<node>/w<K>``, the
  *siblings*), reached over the workers' Unix sockets: producers enqueue on
  their own worker's fragment, consumers steal from the other workers' as from
  peer nodes, then from the other nodes. Nothing is forwarded, so the queue
  scales with the workers (order holds per producer, as for any fragmented
  queue). Other nodes still see one member: their stealer lands on any worker
  and is served from that worker's fragment and, when it is empty, from the
  siblings: the worker steals from its siblings for that stealer too (never
  from other nodes: no request travels further than one node), and keeps the
  stealer's drain open (``holds_drain``, §2.6.7) until those answers are in.
  A sibling's stealer (a trusted connection of this node) is served from the
  worker's own fragment only.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import dataclass

from cproton import pn_link_offered
from uhashring import HashRing

from proxy.broker.handler import LinkRefused
from proxy.queues.local import StoredMessage
from routing.replication import replicas_of

from .capability import FRAGMENT, is_marked
from .replicas import FragmentReplicas
from .selective import SelectiveSteals, taker
from .steal import Stealer

MOVED_RETRY = 0.5  # seconds before a forwarded link whose fragment moved looks for it again
log = logging.getLogger("fedgate.fragments")

RETRY_FIRST = 0.05
RETRY_CAP = 1.0
_ANY = StoredMessage(b"")  # for picking a consumer without exclusions


@dataclass
class FragmentStats:
    steal_attempts: int = 0
    steal_misses: int = 0
    stolen_in: int = 0
    returned: int = 0  # stolen messages given back home (consumers gone)
    held: int = 0  # stolen messages that waited here for local credit
    passed_on: int = 0  # messages stolen from a sibling worker for another node's stealer
    forwarded: int = 0  # producers sent on to another member


class FragmentGroup:
    def __init__(self, service, address: str, decision) -> None:
        self.service = service
        self.node = service.node
        self.address = address
        self.stats = FragmentStats()
        self.stealers: dict[str, Stealer] = {}
        self.queue = None
        self.replicas: FragmentReplicas | None = None  # rule replicas > 1
        self.tried: set[str] = set()
        self.held: deque = deque()  # stolen messages waiting for local credit, oldest first
        self.selective = SelectiveSteals(self)  # for local consumers with selectors
        # producers forwarded while this node's own fragment was served elsewhere: home again
        # when it is handed back (serve_own; docs/nemesis.md, finding 22)
        self.away_producers: set = set()
        self._rr = 0
        self._retry: asyncio.TimerHandle | None = None
        self._retry_delay = RETRY_FIRST
        self.update(decision)

    # -- membership -----------------------------------------------------------------
    def update(self, decision) -> None:
        rule = decision.rule
        self.rule = decision.rule
        self.remote_address = decision.remote_address or self.address
        node_id = self.node.node_id
        peer_url = self.node.routing.current.peer_url
        # a peer with no URL is not a live member of a cluster on etcd: no fragment there now
        # (with replicas, its fragment lives on: a backup serves it, fragments.replicas)
        live = {m.key for m in rule.fragments
                if m.peer is None or m.peer == node_id or peer_url(m.peer) is not None}
        self.members = {m.key: m for m in rule.fragments
                        if m.key in live or replicas_of(rule) > 1}
        self.draining = set(rule.draining)
        self.local_key = node_id if node_id in self.members else None
        self.siblings = self._worker_fragments(rule)  # key -> the worker's socket URL
        if self.siblings:  # the node's fragment is one per worker; the other members stay
            others = {key: member for key, member in self.members.items() if key != node_id}
            self.members = {**dict.fromkeys(self.siblings), **others}
            self.draining = (set(self.siblings) if node_id in self.draining else set()) | \
                (self.draining - {node_id})
            self.local_key = f"{node_id}/w{self.node.worker.index}"
        active = [key for key in self.members if key not in self.draining and key in live]
        self.ring = HashRing(nodes=active)
        if replicas_of(rule) > 1:  # fragments kept on backups (fragments.replicas)
            if self.replicas is None:
                self.replicas = FragmentReplicas(self)
                self.replicas.start()
            else:
                self.replicas.update(rule)
        elif self.local_key and self.queue is None:
            queue = self.node.queues.lookup_or_create(self.address) or \
                self.node.queues.declare(self.address)
            queue.after_dispatch = self.after_dispatch
            queue.holds_drain = self.holds_drain
            self.queue = queue
        for key in list(self.stealers):
            if key not in self.members:
                self.stealers.pop(key).close()
        self.selective.update(self.members)

    @property
    def draining_here(self) -> bool:
        return self.local_key is not None and self.local_key in self.draining

    @property
    def removed(self) -> bool:
        """A draining local fragment that has handed out everything."""
        queue = self.queue
        return self.draining_here and queue is not None and not queue.messages and not queue.unacked

    def _worker_fragments(self, rule) -> dict[str, str]:
        """On a member node with workers: one fragment per worker (module note); empty
        otherwise, and with replicated fragments, whose queue one worker serves alone with
        the node's one fragment (proxy.workers.ownership)."""
        worker = self.node.worker
        if worker is None or worker.count < 2 or replicas_of(rule) > 1 or \
                self.node.node_id not in [m.key for m in rule.fragments]:
            return {}
        return {f"{self.node.node_id}/w{k}": worker.url(k) for k in range(worker.count)}

    def target(self, key: str) -> tuple[str, str, bool]:
        """(URL, address, is a fedgate peer) of a member."""
        if key in self.siblings:  # another worker's fragment of this node
            return self.siblings[key], self.address, True
        if self.replicas is not None and (moved := self.replicas.location(key)) is not None:
            return moved[0], moved[1], True  # a backup serves it since its member died
        member = self.members[key]
        if member.peer is not None:
            url = self.node.routing.current.peer_url(member.peer)
            return url, member.address or self.address, True
        return member.url, member.address or self.remote_address, False

    def upstream_for(self, key: str):
        url, _, _ = self.target(key)
        return self.node.upstreams.for_url(url, self.rule.upstream)

    # -- attaches -------------------------------------------------------------------
    def attach(self, client, link) -> None:
        terminus = link.remote_source if link.is_sender else link.remote_target
        marked = is_marked(terminus)
        if self.replicas is not None and self.replicas.claiming():
            self.replicas.wait(client, link)  # this node's fragment is being claimed: a moment
            return
        if link.is_sender:
            self._attach_consumer(client, link, marked)
        else:
            self._attach_producer(client, link, marked)

    def _attach_consumer(self, client, link, marked: bool) -> None:
        if self.queue is not None:
            client.attach_queue_consumer(link, self.queue, standby=marked)
            return
        if marked:
            raise LinkRefused("amqp:not-found", f"no fragment of {self.address!r} on this node")
        key = self._elsewhere(self._nearest(self._identity(client, link)), client, link)
        url, address, _ = self.target(key)
        if url is None and self._wait_for_location(client, link):
            return
        endpoint = client.attach_proxy_consumer(link, self.upstream_for(key), address)
        self._follow(endpoint, lambda: self._nearest(self._identity(client, link)))

    def _attach_producer(self, client, link, marked: bool) -> None:
        if self.queue is not None and (marked or not self.draining_here):
            client.attach_queue_producer(link, self.queue)
            return
        if marked and self.replicas is not None:  # sent here for this fragment, never further
            raise LinkRefused("amqp:resource-limit-exceeded", f"{self.address!r}: this node's "
                              "fragment is served by another member now")
        key = self._elsewhere(self.ring.get_node(self._identity(client, link)), client, link)
        if key is None or key == self.local_key:
            raise LinkRefused("amqp:resource-limit-exceeded", f"no fragment of {self.address!r} accepts messages")
        url, address, peer = self.target(key)
        if url is None and self._wait_for_location(client, link):
            return
        self.stats.forwarded += 1
        endpoint = client.attach_proxy_producer(link, self.upstream_for(key), address,
                                                capabilities=(FRAGMENT,) if peer else ())
        self._follow(endpoint, lambda: self.ring.get_node(self._identity(client, link)))
        if self.queue is None and self.replicas is not None and self.replicas.own is not None:
            self.away_producers.add(endpoint)

    def _follow(self, endpoint, choose) -> None:
        """A link forwarded to another member's fragment follows it when it moves: that member
        refuses or ends it because its fragment is served elsewhere now (it died and came back,
        or lost it: a backup serves it), and the link goes on where the fragment is, or at
        another member; the client's link stays (issue #42: it was ended with the member's
        condition, and the client never attached it again)."""
        if self.replicas is None:
            return

        def moved(condition) -> bool:
            description = (condition.description or "") if condition is not None else ""
            name = condition.name if condition is not None else ""
            if "served by another member" not in description and "(it moved)" not in description \
                    and name not in ("amqp:link:detach-forced", "fedgate:stale-epoch"):
                return False
            asyncio.get_running_loop().call_later(MOVED_RETRY, follow)
            return True

        producer = endpoint.sender_upstream

        def follow() -> None:
            if endpoint.closed:
                return
            if producer and self.queue is not None and not self.draining_here:  # served here again
                self.away_producers.add(endpoint)
                self._bring_home()
                return
            key = self._elsewhere(choose(), endpoint.handler, endpoint.link)
            url, address, _ = self.target(key) if key is not None and key != self.local_key \
                else (None, None, None)
            if url is None:  # nowhere known yet: look again
                asyncio.get_running_loop().call_later(MOVED_RETRY, follow)
                return
            endpoint.remote_address = endpoint.address = address
            endpoint.rehome(self.upstream_for(key))
            if producer and self.replicas.own is not None:
                # sent away while this node's own fragment is served elsewhere: it comes home
                # with the fragment (_bring_home), as a producer forwarded at its attach does
                # (docs/nemesis.md, finding 22: one brought home once, refused when the
                # fragment moved again, stayed away and waited out a later fault of the
                # member it went to)
                self.away_producers.add(endpoint)
            self.node.broker.run_pending()

        endpoint.moved = moved

    def _wait_for_location(self, client, link) -> bool:
        """A member whose fragment is served nobody knows where yet (it died, its backup has
        not claimed it): the link waits, as while this node's own fragment is claimed (issue
        #42: it was refused with an internal error). False: nothing to wait for."""
        if self.replicas is None:
            return False
        self.replicas.wait(client, link)
        return True

    def _elsewhere(self, key, client, link):
        """``key``, unless it is this node, which does not serve its fragment now (replicas):
        then another member, by the ring of the others."""
        if key != self.local_key or self.replicas is None:
            return key
        others = [k for k in self.members if k != key and k not in self.draining]
        return HashRing(nodes=others).get_node(self._identity(client, link)) if others else None

    @staticmethod
    def _identity(client, link) -> str:
        container = client.server_connection.remote_container
        return f"{container}/{link.name}"

    def _nearest(self, identity: str) -> str:
        for key in self.rule.prefer:
            if key in self.members and key not in self.draining:
                return key
        return self.ring.get_node(identity)

    # -- stealing -----------------------------------------------------------------
    def after_dispatch(self, queue) -> None:
        if queue.standby_consumers:  # what our drain answers will report as available
            depth = len(queue.messages)
            backlog = None  # other nodes' stealers are served from the siblings too
            for consumer in queue.standby_consumers:
                if self._from_other_node(consumer):
                    if backlog is None:
                        backlog = depth + sum(self.stealers[key].available or 0
                                              for key in self.siblings if key in self.stealers)
                    pn_link_offered(consumer.link_ptr, backlog)
                elif consumer.selector is not None:  # what it selects (fragments.selective)
                    pn_link_offered(consumer.link_ptr, len(consumer.matched))
                else:
                    pn_link_offered(consumer.link_ptr, depth)
        self.evaluate()

    # -- other nodes' stealers on a node with workers (module note) --------------------
    def _from_other_node(self, consumer) -> bool:
        """A standby consumer that is another node's stealer, not a sibling worker's."""
        return bool(self.siblings) and not consumer.handler.trusted

    def _peer_stealers(self) -> list:
        queue = self.queue
        if not self.siblings or queue is None or not queue.standby_consumers:
            return []
        # (with a selector: served from this worker's fragment only)
        return [c for c in queue.standby_consumers if not c.handler.trusted and c.selector is None]

    def _from_sibling(self, message) -> bool:
        return message.origin is not None and message.origin[0].member_key in self.siblings

    def holds_drain(self, consumer) -> bool:
        """Keep another node's drain open while the siblings may still have messages for it
        (§2.6.7: the drained answer says there is nothing more to send)."""
        if not self._from_other_node(consumer):
            return False
        if consumer.selector is not None:
            return self.selective.holds_drain(consumer)
        if self.held:  # delivered in order: only a sibling's message at the head is for it
            return self._from_sibling(self.held[0])
        for key in self.siblings:
            stealer = self.stealers.get(key)
            if stealer is not None and stealer.ready and (
                    stealer.requested or key not in self.tried):
                return True
        return False

    def consumer_with_credit(self, message=_ANY):
        """Who takes a stolen message now: a local consumer first; a message from a sibling
        may also go to another node's stealer. None: nobody has credit."""
        queue = self.queue
        if queue is None:
            return None
        if queue.consumers:  # with selectors: one that may have it (fragments.selective)
            consumer = taker(queue, message) if queue.selective else queue._pick(_ANY)
            if consumer is not None:
                return consumer
        if self.siblings and self._from_sibling(message):
            if message.origin[0].selector is not None or queue.selective:
                consumer = self.selective.for_peer(message)
                if consumer is not None:
                    self.stats.passed_on += 1
                    return consumer
            for consumer in self._peer_stealers():
                if consumer.credit > 0:
                    self.stats.passed_on += 1
                    return consumer
        return None

    def deliver_held(self) -> None:
        held = self.held
        while held:
            consumer = self.consumer_with_credit(held[0])
            if consumer is None:
                return
            consumer.deliver(held.popleft())
        if held and self.queue.selective:  # later ones may be for other consumers
            self.selective.deliver_held()

    def drop_held(self, stealer) -> None:
        """The link to a stealer's home is gone: home takes its messages back itself."""
        if self.held:
            self.held = deque(m for m in self.held if m.origin[0] is not stealer)

    def return_held(self, *, keep_siblings: bool = False) -> None:
        """No local consumer is left: held stolen messages go back home (those from
        siblings stay while other nodes' stealers may take them)."""
        kept = deque()
        while self.held:
            message = self.held.popleft()
            if keep_siblings and self._from_sibling(message):
                kept.append(message)
                continue
            stealer, home_delivery = message.origin
            stealer.settle_at_home(home_delivery, None, None)
            self.stats.returned += 1
        self.held = kept

    def evaluate(self) -> None:
        queue = self.queue
        if queue is None:
            return
        peers = self._peer_stealers()
        self.selective.evaluate()
        if not queue.consumers:
            self.return_held(keep_siblings=bool(peers) or self.selective.peers_wait())
            if not peers:
                return
        self.deliver_held()
        if self.held and (not queue.selective or self.selective.plain_held()):
            return  # still no credit for what we already have: steal nothing more
        if queue.messages:  # local backlog: serve it, no stealing (no flip-flop)
            # a peer that had nothing stays skipped until the retry timer: clearing it
            # here sent a drain that came back empty each time the local backlog ran out,
            # which with a producer and a consumer on each side is after nearly every
            # message (measured: 2 workers, 2 pairs, 0.69x one worker)
            return
        credit = queue.local_credit() if not queue.selective else \
            sum(c.credit for c in queue.consumers if c.selector is None)  # the plain ones'
        self._ensure_stealers()
        for stealer in self.stealers.values():
            if not stealer.drains:
                stealer.top_up(credit)
        outstanding = sum(s.outstanding for s in self.stealers.values())
        want_local = credit - outstanding
        # other nodes' stealers: what they lack may come from the siblings only
        want_all = want_local + sum(c.credit for c in peers)
        if want_all <= 0:
            return
        victim = self._pick_victim(siblings_only=want_local <= 0)
        if victim is None:
            self._schedule_retry()
            return
        self.tried.add(victim.member_key)
        victim.request(want_all if victim.member_key in self.siblings else want_local)

    def _ensure_stealers(self) -> None:
        for key in self.members:
            if key != self.local_key and key not in self.stealers:
                url, address, peer = self.target(key)
                if url is None:
                    continue  # not a live member, and nobody serves its fragment now
                self.stealers[key] = Stealer(self, key, self.node.upstreams.for_url(url, self.rule.upstream),
                                             address, mark=peer)

    def _pick_victim(self, *, siblings_only: bool = False) -> Stealer | None:
        candidates = [s for s in self.stealers.values() if s.drains
                      and s.ready and not s.requested and s.member_key not in self.tried
                      and (not siblings_only or s.member_key in self.siblings)]
        if not candidates:
            return None
        with_backlog = [s for s in candidates if s.available]
        if with_backlog:
            return max(with_backlog, key=lambda s: s.available)
        self._rr = (self._rr + 1) % len(candidates)
        return candidates[self._rr]

    def steal_finished(self, stealer: Stealer, received: int) -> None:
        if received:
            self._retry_delay = RETRY_FIRST
            if stealer.selector is None:
                self.tried.clear()
            else:
                self.selective.finished(stealer, received)
        else:
            self.stats.steal_misses += 1
        self.evaluate()
        if self.queue is not None and (self._peer_stealers() or self.selective.peers_wait()):
            # a drain held open for another node may be answered now (holds_drain)
            self.node.broker.dirty_queues.add(self.queue)

    def _schedule_retry(self) -> None:
        if self._retry is not None:
            return
        delay = self._retry_delay
        self._retry_delay = min(RETRY_CAP, delay * 2)
        self._retry = asyncio.get_running_loop().call_later(delay, self._on_retry)

    def _on_retry(self) -> None:
        self._retry = None
        self.tried.clear()
        self.selective.tried.clear()
        self._forget_refused()
        self.evaluate()
        self.node.broker.run_pending()

    def _forget_refused(self) -> None:
        """Stealers whose link a peer refused are made again (``_ensure_stealers``), to where
        ``target`` says now. A backup that took a dead member's fragment refuses its name
        (not-found) until it has made the queue, and the owner watch may tell this node
        before: kept refused, such a stealer would never take from it."""
        for key, stealer in list(self.stealers.items()):
            if stealer.refused:
                self.stealers.pop(key).close()
        self.selective.forget(refused=True)

    def close(self) -> None:
        if self._retry is not None:
            self._retry.cancel()
        self.return_held()
        for stealer in self.stealers.values():
            stealer.close()
        self.stealers.clear()
        self.selective.forget()

    # -- fragments kept on backups (fragments.replicas) -----------------------------------
    def serve_own(self, queue) -> None:
        """This node is its own fragment's primary (again): the group's local queue."""
        copy_after = queue.after_dispatch

        def after_dispatch(q) -> None:
            if copy_after is not None:
                copy_after(q)
            self.after_dispatch(q)

        queue.after_dispatch = after_dispatch
        queue.holds_drain = self.holds_drain
        self.queue = queue
        self.replicas.go_on()
        self._bring_home()
        self.evaluate()

    def _bring_home(self) -> None:
        """Producers forwarded to another member's fragment while this node's own was served
        elsewhere go on into it now, through this node's own listener, marked for its fragment
        (as replicated queues' proxies follow their owner home). They stayed where they were
        sent, and a later cut of that member stopped them while their own node served its
        fragment (docs/nemesis.md, finding 22)."""
        away, self.away_producers = self.away_producers, set()
        url = self.replicas.service.url_of(self.node.node_id)
        if url is None or self.draining_here:
            return
        pool = self.node.upstreams.for_url(url, self.rule.upstream)
        for endpoint in away:
            if endpoint.closed:
                continue
            endpoint.remote_address = endpoint.address = self.address
            endpoint.capabilities = (FRAGMENT,)
            endpoint.rehome(pool)
        self.node.broker.run_pending()

    def lose_own(self) -> None:
        """Another member holds this node's fragment now: serve none until it is back."""
        self.return_held()
        self.queue = None

    def fragment_moved(self, key: str) -> None:
        """Member ``key``'s fragment is served elsewhere now: steal from there."""
        stealer = self.stealers.pop(key, None)
        if stealer is not None:
            stealer.close()
        self.selective.forget(key)
        self.tried.discard(key)
        self.evaluate()
        self.node.broker.run_pending()

    # -- inspection -------------------------------------------------------------------
    def describe(self) -> dict:
        queue = self.queue
        stats = queue.stats if queue is not None else None
        stolen_out = queue.delivered_to_standby if queue is not None else 0
        return {
            "address": self.address,
            "rule": self.rule.name,
            "members": list(self.members),
            "local": self.local_key,
            "draining": sorted(self.draining),
            "removed": self.removed,
            "depth": queue.depth if queue is not None else 0,
            "unacked": queue.unacked if queue is not None else 0,  # delivered, not yet settled
            "enqueued": stats.enqueued if stats else 0,
            "served_locally": (stats.delivered - stolen_out) if stats else 0,
            "stolen_out": stolen_out,
            "stolen_in": self.stats.stolen_in,
            "returned_home": self.stats.returned,
            "held_for_credit": self.stats.held,
            "passed_to_other_nodes": self.stats.passed_on,
            "steal_attempts": self.stats.steal_attempts,
            "steal_misses": self.stats.steal_misses,
            "forwarded_producers": self.stats.forwarded,
            "peers": [s.describe() for s in self.stealers.values()] + self.selective.describe(),
            # replicas > 1: where each member's fragment is served now (home, or a backup)
            "served": self.replicas.describe() if self.replicas is not None else None,
        }
