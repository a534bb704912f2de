"""Delivery outcomes (§3.4) read from one delivery and given to another.

A proxy link relays outcomes both ways: the client's to the primary's
delivery, the primary's to the client's. These helpers work on proton's raw
delivery pointers (the hot path) and fall back to proton's wrappers only for
outcomes that carry fields (``modified``, ``rejected``).
"""

from __future__ import annotations

from cproton import (
    PN_ACCEPTED,
    PN_MODIFIED,
    PN_RECEIVED,
    PN_REJECTED,
    PN_RELEASED,
    pn_delivery_remote_state,
    pn_delivery_settle,
    pn_delivery_settled,
    pn_delivery_update,
)
from proton import Delivery

TERMINAL = (PN_ACCEPTED, PN_REJECTED, PN_RELEASED, PN_MODIFIED)
# the delivery state of transactional work (§4.5.5): proton reports it by its code; what it
# carries is read by proxy.transactions
TRANSACTIONAL_STATE = 0x34


def copy_outcome(source, target, state: int | None = None) -> int:
    """Apply the remote outcome of delivery ``source`` as the local state of ``target``.

    ``state``: ``source``'s remote state if the caller has read it already.
    """
    if state is None:
        state = pn_delivery_remote_state(source)
    if state in (PN_MODIFIED, PN_REJECTED):
        remote = Delivery.wrap(source).remote
        wrapped = Delivery.wrap(target)
        local = wrapped.local
        if state == PN_MODIFIED:
            local.failed = remote.failed
            local.undeliverable = remote.undeliverable
            if remote.annotations:
                local.annotations = remote.annotations
        elif remote.condition is not None:
            local.condition = remote.condition
        # Delivery.update writes the condition and annotations into the disposition;
        # a bare pn_delivery_update would send the outcome without them
        wrapped.update(state)
    elif state:
        pn_delivery_update(target, state)
    return state


def outcome_of(delivery) -> int | None:
    """The peer's outcome for a delivery we sent, or None while there is none yet.

    0 means settled without a state (the source's default outcome applies).
    """
    state = pn_delivery_remote_state(delivery)
    if state == PN_RECEIVED or (not state and not pn_delivery_settled(delivery)):
        return None
    return state


def relay_outcome(state: int, source, target, modified_unsupported: str | None = None) -> None:
    """Give ``target`` the outcome ``state`` that ``source`` got, then settle ``target``.

    ``modified_unsupported``: why ``target``'s peer cannot take ``modified``
    (``proxy.upstream.primaries``); it gets ``released`` instead (§3.4.4).
    """
    if (state == PN_MODIFIED and modified_unsupported is not None) or state == TRANSACTIONAL_STATE:
        # a transactional outcome with no transaction to take it (proxy.transactions): back
        pn_delivery_update(target, PN_RELEASED)
    elif state in TERMINAL:
        copy_outcome(source, target, state)
    else:
        pn_delivery_update(target, PN_ACCEPTED)  # settled with no outcome: accepted
    pn_delivery_settle(target)
