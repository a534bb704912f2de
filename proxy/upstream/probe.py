"""Does a remote source still exist? A credit-less probe link on a session of its own."""

from __future__ import annotations

import itertools
import logging
from typing import TYPE_CHECKING

from cproton import (
    PN_RELEASED,
    pn_delivery_settle,
    pn_delivery_update,
)
from proton import Link, Terminus

if TYPE_CHECKING:
    from proxy.upstream.member import PoolMember


log = logging.getLogger("fedgate.upstream")

PROBE_TIMEOUT = 30.0  # a probe not answered by then is forgotten (another may start)
INCONCLUSIVE = object()  # a probe's answer was lost with a session that failed for another link
_probe_names = itertools.count(1)


class RemoteProbe:
    """Does a remote source still exist? Attach a link without credit, then detach.

    An attach answered with a terminus (§2.6.3) means yes; a refusal (null
    terminus then detach with an error, or, with RabbitMQ, the session ended
    with an error) means no, with the primary's condition. No credit is ever
    granted, so no message moves; an unexpected one is released.

    The probe is a receiver with the consumer's source, except for RabbitMQ's
    ``/exchange/X/KEY`` sources: a receiver there makes RabbitMQ 3.10 create
    (and keep) another subscription queue, so a sender to the same address is
    attached instead; it is refused the same way when the exchange is gone.
    """

    closed = False

    def __init__(self, member: PoolMember, address: str, source, started: float, done) -> None:
        self.member = member
        self.started = started
        self.done = done
        self.sender = address.startswith("/exchange/")
        # its own session: RabbitMQ ends the session of a refused attach, and the
        # links sharing the member's session must not pay for that
        self.session = member.conn.connection.session()
        self.session.open()
        member.side_sessions[self.session._impl] = self
        name = f"fedgate-probe-{next(_probe_names)}"
        link = self.session.sender(name) if self.sender else self.session.receiver(name)
        if self.sender:
            link.target.address = address
        else:
            if source is not None:
                link.source.copy(source)
            link.source.address = address
        link.rcv_settle_mode = Link.RCV_FIRST
        link.open()
        self.up_link, self.up_ptr, self.up_attached = link, link._impl, False
        member.register(link, self)
        member.mark_dirty()

    def _finish(self, condition) -> None:
        if self.done is not None:
            done, self.done = self.done, None
            done(condition)
        # answered: our link and its session go (the session may already be ended)
        member = self.member
        member.unregister(self.up_ptr)
        if self.up_link.state & Link.LOCAL_ACTIVE:
            self.up_link.close()
        if member.side_sessions.get(self.session._impl) is self:
            del member.side_sessions[self.session._impl]
            if self.session.state & Link.LOCAL_ACTIVE:
                self.session.close()
        member.mark_dirty()

    def on_upstream_attached(self) -> None:
        self.up_attached = True
        link = self.up_link
        terminus = link.remote_target if self.sender else link.remote_source
        if terminus.type != Terminus.UNSPECIFIED:
            self._finish(None)  # it exists
        elif link.state & Link.LOCAL_ACTIVE:
            link.close()  # refused: the detach with the primary's error follows
            self.member.mark_dirty()

    def on_upstream_detached(self, condition) -> None:
        self.up_attached = False
        self._finish(condition if condition is not None and condition.name else None)

    def inconclusive(self) -> None:
        self._finish(INCONCLUSIVE)

    def on_upstream_flow(self) -> None:
        pass

    def on_upstream_delivery(self, delivery) -> None:
        pn_delivery_update(delivery, PN_RELEASED)
        pn_delivery_settle(delivery)
        self.member.mark_dirty()
