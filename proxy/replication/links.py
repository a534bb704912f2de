"""The replication links: the primary's sender to each backup, and the backup's end of it.

How this works
--------------
The primary runs the replicating browser (docs/replication.md): for each
backup it holds one sender link (``ReplicationPusher``, an upstream link owner
on the node's pool to that backup's AMQP URL) whose target is the queue's
address with the capability ``fedgate:replication`` and whose link properties
say the primary's id and epoch. Batches (``proxy.replication.events``) go as
unsettled transfers on the backup's credit; the backup's ``accepted`` on a
batch is its acknowledgement.

On the backup the attach reaches the client handler like any link and is
handed to ``ReplicaSink`` (a receiver endpoint in the handler's table): it
checks the epoch (a lower one than this copy has followed is refused with
``fedgate:stale-epoch``), starts a fresh catch-up, applies each batch to the
copy, and settles it once applied (and, for a durable queue, once its journal
records are on disk). Its credit is ``SINK_CREDIT`` batches.
"""

from __future__ import annotations

import itertools
import logging
from collections import deque

from cproton import (
    PN_ACCEPTED,
    pn_delivery_settle,
    pn_delivery_update,
    pn_link_credit,
    pn_link_flow,
)
from proton import Condition, Data, Link, symbol, ulong

from proxy.amqp import engine
from proxy.config import compat
from proxy.config.version import version as release_version
from proxy.amqp.outcomes import outcome_of
from proxy.amqp.termini import capability_names, set_capabilities
from proxy.upstream.owner import UpstreamLinkOwner

from . import events

log = logging.getLogger("fedgate.replication")

REPLICATION = "fedgate:replication"  # the target capability of a replication link
EPOCH = "fedgate:epoch"
PRIMARY = "fedgate:primary"
RESOURCE = "fedgate:resource"
VERSION = "fedgate:version"  # the node's release (docs/upgrades.md); 0.5.0 sends none
FEATURES = "fedgate:features"  # what it has (``compat.FEATURES``), a list of symbols
STALE_EPOCH = "fedgate:stale-epoch"
LAGGING = "fedgate:replica-lagging"
SINK_CREDIT = 32  # batches a backup lets be on the way

_names = itertools.count(1)


def is_replication(terminus) -> bool:
    return REPLICATION in capability_names(terminus)


def link_properties(link: Link) -> tuple[str | None, int, str | None]:
    """(primary id, epoch, resource) from a replication link's properties (§2.7.3 attach
    ``properties``)."""
    props = link.remote_properties or {}
    try:
        resource = props.get(symbol(RESOURCE))
        return (str(props.get(symbol(PRIMARY))), int(props.get(symbol(EPOCH), 0)),
                str(resource) if resource is not None else None)
    except (TypeError, ValueError):
        return None, 0, None


def announcement() -> dict:
    """What a node says of itself on a replication link: its release and its features."""
    return {symbol(VERSION): release_version(),
            symbol(FEATURES): [symbol(name) for name in sorted(compat.FEATURES)]}


def announce(link: Link, properties: dict | None = None) -> None:
    """Our attach's properties: ``properties`` and the announcement (a backup's answer too)."""
    data = Data(engine._lib.pn_link_properties(link._impl))
    data.clear()
    data.put_object({**(properties or {}), **announcement()})


def peer_announcement(link: Link) -> tuple[str, frozenset]:
    """The peer's (version, features) from its attach; none announced: 0.5.0's."""
    props = link.remote_properties or {}
    announced = props.get(symbol(FEATURES))
    peer_version = props.get(symbol(VERSION))
    features = compat.features_of(announced if isinstance(announced, (list, tuple)) else None)
    return (str(peer_version) if peer_version is not None else compat.PREVIOUS), features


class ReplicationPusher(UpstreamLinkOwner):
    """The primary's link to one backup (module note); ``copy`` is the primary's glue."""

    sender_upstream = True

    def __init__(self, copy, backup: str, upstream) -> None:
        self.copy = copy
        self.backup = backup
        self.upstream = upstream
        self.remote_address = copy.address
        self.tags = itertools.count(1)
        self.batches: dict = {}  # our delivery -> batch number
        self.attached_once = False
        # the backup's release and what this link uses (its attach's answer; docs/upgrades.md)
        self.peer_version = compat.PREVIOUS
        self.features = compat.BASELINE
        self.batch_version = events.VERSION
        self.join_pool()

    def link_name(self) -> str:
        return f"fedgate-replicate-{next(_names)}-{self.copy.address}"

    def configure_link(self, link: Link) -> None:
        link.target.address = self.copy.address
        set_capabilities(link.target, (REPLICATION,))
        link.source.address = self.copy.address
        link.snd_settle_mode = Link.SND_UNSETTLED
        link.rcv_settle_mode = Link.RCV_FIRST
        announce(link, {symbol(PRIMARY): self.copy.node_id, symbol(EPOCH): ulong(self.copy.epoch),
                        symbol(RESOURCE): self.copy.resource})

    def link_attached(self) -> None:
        self.attached_once = True
        self.peer_version, theirs = peer_announcement(self.up_link)
        self.features = compat.negotiate(compat.FEATURES, theirs)
        self.batch_version = compat.batch_version(self.features)
        self.batches.clear()
        self.copy.backup_attached(self)

    def link_lost(self) -> None:
        self.batches.clear()
        self.copy.backup_lost(self, "its link was lost")

    def link_refused(self, condition) -> None:
        self.batches.clear()
        name = condition.name if condition is not None else ""
        self.copy.backup_lost(self, f"it detached the link: {name} "
                                    f"{condition.description if condition is not None else ''}".strip(),
                              stale=name == STALE_EPOCH)

    @property
    def credit(self) -> int:
        return pn_link_credit(self.up_ptr) if self.up_attached else 0

    def send(self, number: int, items: list) -> None:
        payload = events.encode(self.copy.epoch, number, items, self.batch_version)
        delivery = engine.send_message(self.up_ptr, str(next(self.tags)).encode(), payload)
        self.batches[delivery] = number
        self.member.mark_dirty()

    def on_upstream_delivery(self, delivery) -> None:
        state = outcome_of(delivery)
        if state is None:
            return
        number = self.batches.pop(delivery, None)
        pn_delivery_settle(delivery)
        if number is None:
            return
        if state == PN_ACCEPTED:
            self.copy.backup_acked(self, number)
        else:
            self.copy.backup_lost(self, f"it refused batch {number} ({state})")

    def on_upstream_flow(self) -> None:
        self.copy.flush_backup(self)

    def drop(self) -> None:
        """Stop replicating to this backup (lagging, left the replica set, fenced)."""
        self.closed = True
        self.batches.clear()
        self.release_upstream()


class ReplicaSink(engine.ClientLinkEndpoint):
    """A backup's end of a replication link: our receiver in a client handler's table."""

    __slots__ = ("handler", "link_ptr", "backup", "primary", "epoch", "attached", "address",
                 "received", "order")

    def __init__(self, handler, link: Link, backup, primary: str, epoch: int) -> None:
        self.handler = handler
        self.link_ptr = engine.hold(link._impl)
        self.backup = backup  # proxy.replication.copies.BackupCopy
        self.primary = primary
        self.epoch = epoch
        self.attached = True
        self.address = backup.address
        self.received = 0
        # [delivery, done] of batches received, in order: acknowledged in order only (an
        # acknowledgement covers every earlier batch), each once applied and on disk
        self.order: deque = deque()

    def grant(self) -> None:
        missing = SINK_CREDIT - pn_link_credit(self.link_ptr) - len(self.order)
        if missing > 0:
            pn_link_flow(self.link_ptr, missing)
            self.handler.mark_dirty()

    def on_delivery(self, delivery) -> None:
        payload = engine.read_transfer(self.link_ptr, delivery, 0)
        if payload is None or payload is False:
            return
        self.received += 1
        try:
            batch = events.decode(payload)
        except events.BatchError as exc:
            self.fail("amqp:decode-error", str(exc))
            return
        item = [delivery, False]
        self.order.append(item)
        self.backup.apply(self, batch, item)

    def settle(self, item: list) -> None:
        """The batch is applied (and on disk): acknowledged, after every earlier one."""
        item[1] = True
        if not self.attached:
            return
        order = self.order
        while order and order[0][1]:
            delivery = order.popleft()[0]
            pn_delivery_update(delivery, PN_ACCEPTED)
            pn_delivery_settle(delivery)
        self.handler.mark_dirty()
        if pn_link_credit(self.link_ptr) <= SINK_CREDIT // 2:
            self.grant()

    def fail(self, condition: str, description: str) -> None:
        if self.attached:
            self.handler.close_link(self.link, condition, description)

    def on_flow(self) -> None:
        pass

    def detached(self) -> None:
        self.attached = False
        link = engine.transient(Link, self.link_ptr)
        condition = link.remote_condition if link.state & Link.REMOTE_CLOSED else None
        self.backup.sink_gone(self, dropped=condition is not None and condition.name == LAGGING)


def refuse_condition(description: str) -> Condition:
    return Condition(STALE_EPOCH, description)
