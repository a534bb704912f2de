"""Suspect deliveries: messages in flight when their upstream connection or session ended.

How this works
--------------
A link that sends to a primary (a proxy producer, an exchange's destination,
the anonymous relay) keeps each message unsettled until the primary's outcome
comes (§3.4). When the connection or session carrying it ends first, the
message is sent again after reconnecting: the client gets the real outcome,
duplicates are possible, loss is not. But a message the primary cannot take
(RabbitMQ 3.10 drops the connection for an ``amqp-value`` body of
``[1, null]``) would end the shared connection again at every replay, and
every other client's deliveries with it.

So a replay is a *suspect*. It carries ``failures``: how many times the
connection or session carrying it ended while it was in flight (1 when it
arrives here). The pool's ``SuspectSender`` sends suspects to the primary
*alone*: one at a time, on a connection of their own (the pool's ``alone``
member), so a bad one ends only that connection and bystanders see nothing.

When that connection or session (or the link) ends with a suspect in flight,
the failure is the message's own only if none of the pool's other
connections went down from the send until ``grace`` seconds later (a network
fault takes them all, a bad message only its own; ``grace`` covers the
heartbeat that detects a silent peer). Then ``failures`` goes up, and at the
pool's ``max_send_failures`` the message is settled ``rejected`` to its
sender, with the primary's error condition when it gave one and
``amqp:internal-error`` naming what happened otherwise; it is never sent
again. Until then it is sent again, alone.

The owner of a suspect (``owner``) sends nothing else meanwhile, so each
producer's order holds; ``cancel(owner)`` forgets the suspects of an owner
whose client went away.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
from collections import deque
from dataclasses import dataclass
from typing import Callable

from cproton import (
    PN_REJECTED,
    pn_delivery_remote_state,
    pn_delivery_settle,
    pn_delivery_settled,
    pn_link_credit,
)
from proton import Condition, Link

from proxy.amqp.engine import send_message
from proxy.upstream.member import MemberState
from proxy.upstream.owner import UpstreamLinkOwner

log = logging.getLogger("fedgate.suspects")

INTERNAL_ERROR = "amqp:internal-error"
_names = itertools.count(1)
MOVED_WAIT = 2.0  # seconds a moved owner's suspects wait for it to follow (then: tried here)


@dataclass(eq=False, slots=True)
class Suspect:
    """One message to send alone; ``done(state, upstream delivery | None, condition)`` once."""

    owner: object  # offers configure_link(link): the termini of its own upstream link
    address: str
    payload: bytes
    done: Callable | None
    failures: int = 1
    reason: str = ""  # what ended its connection, session or link the last time
    condition: Condition | None = None  # the primary's condition, when it gave one


class SuspectSender(UpstreamLinkOwner):
    """The suspects of one pool, sent one at a time on the pool's ``alone`` member."""

    sender_upstream = True

    def __init__(self, upstream, *, limit: int, grace: float) -> None:
        self.upstream = upstream
        self.limit = limit
        self.grace = grace
        self.queue: deque[Suspect] = deque()
        self.waiting: dict = {}  # owner -> its suspects, while it follows its moved address
        self.current: Suspect | None = None  # sent, no outcome yet
        self.current_delivery = None
        self.sent_at = 0  # upstream.disruptions when the current suspect was sent
        self.others_up = False  # another connection of the pool was up when it was sent
        self.verdict: asyncio.TimerHandle | None = None  # waiting to judge a failure
        self.link_owner = None  # whose termini our upstream link has (Suspect.owner)
        self.active = False  # an endpoint of the alone member
        self.sent = 0
        self.delivered = 0  # suspects that got the primary's outcome
        self.rejected = 0  # suspects rejected here at the limit

    # -- owners ---------------------------------------------------------------------
    def take(self, owner, address: str, inflight: dict, member, settled: Callable) -> int:
        """The deliveries ``owner`` had in flight on ``member`` when it went down.

        ``inflight`` maps upstream deliveries to ``(payload, token)``; each is
        sent again alone, in order, and ``settled(token, state, upstream
        delivery | None, condition)`` is called once per suspect. ``inflight``
        is emptied; the number taken is returned.
        """
        reason = member.last_error or "connection lost"
        taken = 0
        for payload, token in inflight.values():
            done = functools.partial(settled, token)
            self.queue.append(Suspect(owner, address, payload, done, 1, reason, member.last_condition))
            taken += 1
        inflight.clear()
        if taken:
            self._wake()
        return taken

    def hand_over(self, owner) -> list[Suspect]:
        """Every suspect of ``owner``, the one in flight first (what the primary here says of
        it now is ignored): its address moved to another primary (``adopt`` there)."""
        mine: list[Suspect] = []
        current = self.current
        if current is not None and current.owner is owner and current.done is not None:
            mine.append(Suspect(owner, current.address, current.payload, current.done,
                                current.failures, current.reason, current.condition))
            current.done = None
        kept = deque()
        for suspect in self.queue:
            (mine if suspect.owner is owner else kept).append(suspect)
        self.queue = kept
        mine += self.waiting.pop(owner, [])
        return mine

    def adopt(self, suspects: list[Suspect]) -> None:
        """Suspects handed over by another pool's sender (``hand_over``), sent from here."""
        if not suspects:
            return
        self.queue.extend(suspects)
        self._wake()

    def cancel(self, owner) -> list[Suspect]:
        """Forget ``owner``'s suspects (its client went away); return those not sent yet."""
        kept, dropped = deque(), []
        for suspect in self.queue:
            (dropped if suspect.owner is owner else kept).append(suspect)
        self.queue = kept
        dropped += self.waiting.pop(owner, [])
        if self.current is not None and self.current.owner is owner:
            self.current.done = None  # in flight: its outcome goes nowhere
        return dropped

    # -- sending --------------------------------------------------------------------
    def _next(self) -> None:
        if self.current is not None or self.verdict is not None:
            return
        if not self.queue:
            self._idle()
            return
        head = self.queue[0]
        if self.up_ptr is not None and self.link_owner is not head.owner:
            self.detach_upstream_link()  # the next suspect's owner has other termini
            self.link_owner = None
        if self.up_ptr is None:
            self.reattach()  # a link with the head's owner's termini (configure_link)
            return
        if not self.up_attached or pn_link_credit(self.up_ptr) <= 0:
            return
        self.queue.popleft()
        self.current = head
        self.sent_at = self.upstream.disruptions
        self.others_up = any(m.state is MemberState.UP for m in self.upstream.members)
        self.current_delivery = send_message(self.up_ptr, str(next(_names)).encode(), head.payload)
        self.sent += 1
        self.member.sent += 1
        self.member.mark_dirty()

    def _idle(self) -> None:
        """Nothing left: leave the member (it closes after its idle timeout)."""
        if self.active:
            self.active = False
            self.link_owner = None
            self.release_upstream()

    def _finish(self, suspect: Suspect, state: int, delivery, condition) -> None:
        done, suspect.done = suspect.done, None
        if done is not None:
            done(state, delivery, condition)

    # -- upstream lifecycle (proxy.upstream.owner) ----------------------------------------
    def link_name(self) -> str:
        return f"fedgate-alone-{next(_names)}"

    def wants_link(self) -> bool:
        return bool(self.queue) and self.current is None and self.verdict is None

    def configure_link(self, link: Link) -> None:
        """The termini of the next suspect's owner (a durable target stays durable: RabbitMQ
        refuses an attach whose queue arguments differ from the queue's)."""
        owner = self.queue[0].owner
        owner.configure_link(link)
        link.snd_settle_mode = Link.SND_UNSETTLED
        link.rcv_settle_mode = Link.RCV_FIRST
        self.link_owner = owner

    def upstream_up(self, member) -> None:
        super().upstream_up(member)
        if self.up_ptr is None:
            self._next()  # nothing to attach for: perhaps nothing left at all

    def link_attached(self) -> None:
        self._next()

    def on_upstream_flow(self) -> None:
        self._next()

    def on_upstream_delivery(self, delivery) -> None:
        if delivery != self.current_delivery:
            pn_delivery_settle(delivery)
            return
        state = pn_delivery_remote_state(delivery)
        if not state and not pn_delivery_settled(delivery):
            return  # no outcome yet (§3.4.1)
        suspect, self.current, self.current_delivery = self.current, None, None
        self.delivered += 1
        self._finish(suspect, state, delivery, None)
        pn_delivery_settle(delivery)
        self.member.mark_dirty()
        self._next()

    def link_lost(self) -> None:
        self.link_owner = None
        self._failed(self.member.last_error or "connection lost", self.member.last_condition)

    def link_refused(self, condition) -> None:
        """The primary detached our link: with a suspect in flight, that is a failure."""
        self.link_owner = None
        if self.current is not None:
            reason = f"link detached: {condition.name}" if condition is not None else "link detached"
            self._failed(reason, condition if condition is not None and condition.name else None)
            return
        if condition is not None and condition.name and self.queue:
            # the owner's target itself is refused (amqp:not-found ...): its suspects get the
            # condition, as a link of its own would; unless the owner's address moved (a
            # fragment served by another member now, a fenced primary): then they wait for the
            # owner to follow it (hand_over), and are tried here again if it does not
            owner = self.queue[0].owner
            mine = [s for s in self.queue if s.owner is owner]
            for suspect in mine:
                self.queue.remove(suspect)
            moved = getattr(owner, "moved", None)
            if moved is not None and moved(condition):
                self.waiting.setdefault(owner, []).extend(mine)
                asyncio.get_running_loop().call_later(MOVED_WAIT, self._back, owner)
            else:
                for suspect in mine:
                    self.rejected += 1
                    self._finish(suspect, PN_REJECTED, None, condition)
        self._next()

    def _back(self, owner) -> None:
        """The owner did not follow its address elsewhere: its suspects are tried here again."""
        mine = self.waiting.pop(owner, None)
        if mine:
            self.queue.extend(s for s in mine if s.done is not None)
            self._wake()

    def _wake(self) -> None:
        """Suspects are queued: join the pool's alone member, or send the next one."""
        if not self.active:
            self.active = True
            self.join_pool(alone=True)
        else:
            self._next()

    def _failed(self, reason: str, condition) -> None:
        suspect, self.current, self.current_delivery = self.current, None, None
        if suspect is None:
            return
        if suspect.done is None:
            return  # its owner went away: not sent again
        suspect.reason = reason
        if condition is not None:
            suspect.condition = condition
        self.queue.appendleft(suspect)  # first again, once judged
        sent_at = self.sent_at if self.others_up else None
        loop = asyncio.get_running_loop()
        self.verdict = loop.call_later(self.grace, self._judge, suspect, sent_at, loop.time())

    def _judge(self, suspect: Suspect, sent_at: int | None, failed_at: float = 0.0) -> None:
        """Its own failure only if the pool's other connections were up, stayed up, and heard
        from the primary after it failed (a heartbeat comes within ``grace``).

        ``sent_at`` is None when none was up at the send (the primary restarting,
        the network down): nothing tells the message's fault from theirs. Connections that
        hear nothing are no proof either: a one-way partition leaves them open and silent
        until their idle timeout, which may come after ``grace`` (issue #42: suspects were
        rejected to their senders for a network fault).
        """
        self.verdict = None
        heard = any(m.protocol is not None and m.protocol.heard_at > failed_at
                    for m in self.upstream.members)
        if sent_at is not None and self.upstream.disruptions == sent_at and heard \
                and suspect in self.queue:
            suspect.failures += 1
            if suspect.failures >= self.limit:
                self.queue.remove(suspect)
                self.rejected += 1
                condition = suspect.condition or Condition(
                    INTERNAL_ERROR,
                    f"the primary {self.upstream.target.display} ended the connection or session "
                    f"each time this message was in flight ({suspect.failures} times; last: "
                    f"{suspect.reason}); it is not sent again")
                log.warning("upstream %s: a message to %s ended its connection or session %d times "
                            "(%s); rejected to its sender", self.upstream.target.display,
                            suspect.address, suspect.failures, suspect.reason)
                self._finish(suspect, PN_REJECTED, None, condition)
        self._next()
        self.upstream.run_pending()

    def close(self) -> None:
        if self.verdict is not None:
            self.verdict.cancel()
            self.verdict = None

    def describe(self) -> dict:
        return {"waiting": len(self.queue) + (self.current is not None)
                + sum(len(v) for v in self.waiting.values()), "sent": self.sent,
                "delivered": self.delivered, "rejected": self.rejected}
