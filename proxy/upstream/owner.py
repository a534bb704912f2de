"""One lifecycle for every link the node holds on a primary (``proxy.upstream``).

How this works
--------------
A proxy link, a shared subscription, a fragment stealer, a remote binding, an
exchange destination and the pool's suspect sender each own one link on a pool
member. They share one state machine, written as data in
``UPLINK_TRANSITIONS`` (as h11's ``_state.py`` does), and differ only in hooks:

    LEFT --join_pool--> WAITING --member up--> ATTACHING --primary's attach--> ATTACHED
                          ^  ^                     |                              |
                          |  +-- connection lost --+------------------------------+
                          |                        |                              |
                          +--- reattach ------ REFUSED <-- primary's detach ------+
    any state --release_upstream--> LEFT

The member (``proxy.upstream.member``) calls the four entry points:
``upstream_up(member)`` when its connection is up (the owner attaches if
``wants_link()``), ``on_upstream_attached()``, ``on_upstream_detached(condition)``
(the primary refused or ended our link, §2.6.6: ``REFUSED``) and
``upstream_down()`` (the connection is gone and the link with it: ``WAITING``;
unsettled deliveries died with it, §3.4.6, and the primary redelivers them).
Owners implement ``link_name()``, ``configure_link(link)`` and the hooks
``link_attached()``, ``link_lost()``, ``link_refused(condition)``; they never
create, register or forget links themselves. ``reattach()`` attaches again
after a refusal (retry timers, hold-offs) when the member is up.

``up_ptr`` and ``up_attached`` are kept by the moves for the hot path (one
attribute read per message, no property call).
"""

from __future__ import annotations

import enum

from cproton import pn_link_close
from proton import Condition, Link

from proxy.amqp import engine


# a queue declare the primary does not answer is asked again, this many times in all, then
# the client's link is refused (amqp:internal-error)
DECLARE_TRIES = 3


class UplinkState(enum.StrEnum):
    """Where an owner's upstream link is; ``describe`` shows the value."""

    LEFT = "left"  # not an owner on the pool (not yet joined, or released)
    WAITING = "waiting"  # an owner, no link: the member is not up (connecting, backing off)
    ATTACHING = "attaching"  # our attach is out, the primary's answer has not come
    ATTACHED = "attached"  # the primary answered with its terminus: credit and messages move
    REFUSED = "refused"  # the primary detached our link; the owner's hook decides what next


UPLINK_TRANSITIONS: dict[UplinkState, frozenset[UplinkState]] = {
    UplinkState.LEFT: frozenset({UplinkState.WAITING, UplinkState.LEFT}),
    UplinkState.WAITING: frozenset({UplinkState.ATTACHING, UplinkState.WAITING, UplinkState.LEFT}),
    UplinkState.ATTACHING: frozenset({UplinkState.ATTACHED, UplinkState.REFUSED, UplinkState.WAITING,
                                      UplinkState.LEFT}),
    UplinkState.ATTACHED: frozenset({UplinkState.REFUSED, UplinkState.WAITING, UplinkState.LEFT}),
    UplinkState.REFUSED: frozenset({UplinkState.ATTACHING, UplinkState.WAITING, UplinkState.LEFT}),
}


class UplinkStateError(RuntimeError):
    """An upstream link was asked to make a move ``UPLINK_TRANSITIONS`` does not allow."""


class UpstreamLinkOwner:
    """Owns one link on a pool member; subclasses give the hooks (see the module note).

    Owners set ``self.upstream`` (the pool) and call ``join_pool()``; ``closed``
    is the owner's own "my client is gone" flag: a closed owner attaches nothing.
    """

    member = None
    sender_upstream = False  # our upstream link sends to the primary (picks the pool side)
    up_state = UplinkState.LEFT
    up_ptr = None  # our link on the member (held: engine.hold), None while there is none
    up_attached = False  # up_state is ATTACHED (kept by _move for the hot path)
    closed = False
    # RabbitMQ 4: the rule's upstream.declare (routing.QueueDeclare) for our /queues/ remote,
    # declared through the management node before the first attach (proxy.upstream.management)
    declare = None
    remote_address = ""
    _declaring = False
    _unanswered = 0  # declares in a row the primary did not answer (DECLARE_TRIES)

    # -- hooks (the owner's) ---------------------------------------------------------
    def link_name(self) -> str:
        raise NotImplementedError

    def configure_link(self, link: Link) -> None:
        """Termini and settle modes of our upstream link (the suspect sender copies them)."""
        raise NotImplementedError

    def wants_link(self) -> bool:
        """Whether to attach now that the member is up (an owner holding off says no)."""
        return True

    def link_attached(self) -> None:
        pass

    def link_lost(self) -> None:
        """The connection (or the shared session) went with our link."""

    def link_refused(self, condition) -> None:
        """The primary detached our link, with ``condition`` (None: no error given)."""

    # -- moves -----------------------------------------------------------------------
    def _move(self, state: UplinkState) -> None:
        if state not in UPLINK_TRANSITIONS[self.up_state]:
            raise UplinkStateError(f"{type(self).__name__}: {self.up_state} -> {state}")
        self.up_state = state
        self.up_attached = state is UplinkState.ATTACHED
        if state is not UplinkState.ATTACHING and state is not UplinkState.ATTACHED:
            self.up_ptr = None

    @property
    def up_link(self) -> Link | None:
        """A transient wrapper of the upstream link (rare calls; the hot path uses ``up_ptr``)."""
        return engine.transient(Link, self.up_ptr) if self.up_ptr is not None else None

    def join_pool(self, *, alone: bool = False) -> None:
        """Become an owner on a member of the pool (``alone``: the suspects' member)."""
        self._move(UplinkState.WAITING)
        self.member = self.upstream.add_alone(self) if alone else self.upstream.add(self)

    # -- entry points (the member's) --------------------------------------------------
    def upstream_up(self, member) -> None:
        self.member = member
        state = self.up_state
        if self.closed or (state is not UplinkState.WAITING and state is not UplinkState.REFUSED):
            return
        if not self.wants_link():
            return
        if self.declare is not None and self.remote_address not in self.upstream.declared:
            if not self._declaring:  # WAITING until the primary answers
                self._declaring = True
                self.upstream.declare_queue(member, self.remote_address, self.declare,
                                            self._queue_declared)
            return
        link = member.new_link(self.link_name(), sender=self.sender_upstream)
        self.configure_link(link)
        self._move(UplinkState.ATTACHING)
        self.up_ptr = engine.hold(link._impl)
        member.register(link, self)
        member.open_link(self.up_ptr)

    def on_upstream_attached(self) -> None:
        self._move(UplinkState.ATTACHED)
        self.link_attached()

    def on_upstream_detached(self, condition) -> None:
        self._move(UplinkState.REFUSED)
        self.link_refused(condition)

    def _queue_declared(self, status: int, description: str) -> None:
        from proxy.upstream.management import NO_ANSWER, OK, refusal

        self._declaring = False
        if self.closed or self.up_state is UplinkState.LEFT:
            return
        if status == NO_ANSWER:
            self._unanswered += 1
            if self._unanswered < DECLARE_TRIES:
                if self.member is not None and self.member.is_up:
                    self.upstream_up(self.member)  # ask again
                return
            status, description = 500, f"{description}, {DECLARE_TRIES} times"
        self._unanswered = 0
        if status < 0:
            return  # the connection was lost: asked again when it is back
        if status in OK:
            self.reattach()
            return
        self.link_refused(Condition(refusal(status), f"declaring {self.remote_address} on the "
                                                     f"primary: {status} {description}".strip()))

    def upstream_down(self) -> None:
        self._declaring = False  # a declare under way went with the connection
        if self.up_state is UplinkState.LEFT:
            return
        self._move(UplinkState.WAITING)
        self.link_lost()

    def reattach(self) -> None:
        """Attach again (after a refusal or a detach of our own) if the member is up."""
        member = self.member
        if member is not None and member.is_up and self.up_ptr is None:
            self.upstream_up(member)

    # -- the owner's own ends ----------------------------------------------------------
    def detach_upstream_link(self) -> None:
        """Detach our link (if any) but stay an owner on the member."""
        if self.up_ptr is not None:
            self.member.unregister(self.up_ptr)
            if not self.member.drop_unopened(self.up_ptr):
                pn_link_close(self.up_ptr)  # freed when the primary's detach comes (PoolMember)
            self.member.mark_dirty()
        if self.up_state is not UplinkState.LEFT:
            self._move(UplinkState.WAITING)

    def release_upstream(self) -> None:
        """Detach our link and leave the pool."""
        if self.up_state is UplinkState.LEFT:
            return
        self.detach_upstream_link()
        self._move(UplinkState.LEFT)
        self.upstream.remove(self, self.member)
