"""What every owner of a link on an upstream pool member shares (``proxy.upstream``).

A proxy link, a fragment stealer, a remote binding, an exchange destination and
the pool's suspect sender each own one link on a pool member. The member routes
the link's events to its owner by link pointer (``on_upstream_attached``,
``on_upstream_flow``, ``on_upstream_delivery``, ``on_upstream_detached``) and
tells it when the connection comes and goes (``upstream_up(member)``,
``upstream_down()``).
"""

from __future__ import annotations

from cproton import pn_link_close
from proton import Link

from proxy.amqp import engine


class UpstreamLinkOwner:
    """Owns one link on a pool member: a proxy link, a stealer, a binding, a destination.

    ``new_upstream_link`` creates the link on a member, the owner sets its
    termini, ``attach_upstream_link`` opens and registers it (the member then
    routes the link's events to the owner); ``forget_upstream_link`` drops it
    when the connection is gone and ``release_upstream`` detaches it and leaves
    the pool. Owners set ``self.upstream`` (the pool) before using these.
    """

    member = None
    sender_upstream = False  # our upstream link sends to the primary (picks the pool side)
    up_ptr = None  # our link on the member (held: engine.hold), None while there is none
    up_attached = False

    @property
    def up_link(self) -> Link | None:
        """A transient wrapper of the upstream link (rare calls; the hot path uses ``up_ptr``)."""
        return engine.transient(Link, self.up_ptr) if self.up_ptr is not None else None

    def new_upstream_link(self, member, name: str, *, sender: bool) -> Link:
        self.member = member
        return member.new_link(name, sender=sender)

    def attach_upstream_link(self, link: Link) -> None:
        """Register the configured link and attach it (paced by the member)."""
        self.up_ptr, self.up_attached = engine.hold(link._impl), False
        self.member.register(link, self)
        self.member.open_link(self.up_ptr)

    def forget_upstream_link(self) -> None:
        self.up_ptr = None
        self.up_attached = False

    def detach_upstream_link(self) -> None:
        """Detach our link (if any) but stay an owner on the member."""
        if self.up_ptr is not None:
            self.member.unregister(self.up_ptr)
            if not self.member.drop_unopened(self.up_ptr):
                pn_link_close(self.up_ptr)  # freed when the primary's detach comes (PoolMember)
            self.member.mark_dirty()
        self.forget_upstream_link()

    def release_upstream(self) -> None:
        """Detach our link and leave the pool."""
        self.detach_upstream_link()
        self.upstream.remove(self, self.member)
