"""An upstream connection's states are data: every move is one MEMBER_TRANSITIONS allows."""

from __future__ import annotations

import pytest

from proxy.upstream.member import MEMBER_TRANSITIONS, MemberState, MemberStateError, PoolMember


class _Pool:
    """Just what a PoolMember reads at construction."""


def member() -> PoolMember:
    return PoolMember(_Pool(), 0, "send")


def test_every_state_has_its_moves_written_down():
    assert set(MEMBER_TRANSITIONS) == set(MemberState)
    assert all(MEMBER_TRANSITIONS[s] <= set(MemberState) for s in MemberState)


def test_the_moves_of_a_connection_that_comes_up_drops_and_comes_back():
    m = member()
    for state in (MemberState.CONNECTING, MemberState.UP, MemberState.BACKOFF, MemberState.DOWN,
                  MemberState.CONNECTING, MemberState.UP, MemberState.DOWN):
        m._move(state)
        assert m.state is state
    assert m.describe()["state"] == "down"


@pytest.mark.parametrize("start, illegal", [
    (MemberState.DOWN, MemberState.UP),          # up without connecting
    (MemberState.DOWN, MemberState.BACKOFF),
    (MemberState.BACKOFF, MemberState.UP),       # up without connecting again
])
def test_a_move_not_written_down_is_refused(start, illegal):
    m = member()
    m.state = start
    with pytest.raises(MemberStateError):
        m._move(illegal)
    assert m.state is start


# -- one lifecycle for every link the node holds on a primary (proxy.upstream.owner) --------

from proxy.upstream.owner import UPLINK_TRANSITIONS, UplinkState, UplinkStateError, UpstreamLinkOwner  # noqa: E402


def test_every_uplink_state_has_its_moves_written_down():
    assert set(UPLINK_TRANSITIONS) == set(UplinkState)
    assert all(UPLINK_TRANSITIONS[s] <= set(UplinkState) for s in UplinkState)


def test_an_uplink_that_attaches_is_refused_reattaches_loses_its_connection_and_leaves():
    owner = UpstreamLinkOwner()
    for state in (UplinkState.WAITING, UplinkState.ATTACHING, UplinkState.ATTACHED, UplinkState.REFUSED,
                  UplinkState.ATTACHING, UplinkState.ATTACHED, UplinkState.WAITING, UplinkState.LEFT):
        owner._move(state)
        assert owner.up_state is state
        assert owner.up_attached is (state is UplinkState.ATTACHED)
        if state not in (UplinkState.ATTACHING, UplinkState.ATTACHED):
            assert owner.up_ptr is None


@pytest.mark.parametrize("start, illegal", [
    (UplinkState.LEFT, UplinkState.ATTACHING),     # attach without joining the pool
    (UplinkState.WAITING, UplinkState.ATTACHED),   # attached without an attach of ours
    (UplinkState.WAITING, UplinkState.REFUSED),    # refused without an attach of ours
    (UplinkState.ATTACHED, UplinkState.ATTACHING),  # a second link while one is attached
])
def test_an_uplink_move_not_written_down_is_refused(start, illegal):
    owner = UpstreamLinkOwner()
    owner.up_state = start
    with pytest.raises(UplinkStateError):
        owner._move(illegal)
    assert owner.up_state is start


def test_every_owner_of_an_upstream_link_uses_the_one_lifecycle():
    """Proxy links, shared subscriptions, relay destinations, remote bindings, steal links and
    the suspect sender: none re-implements an entry point the member calls (except the suspect
    sender's upstream_up, which adds to it)."""
    from fragments.steal import Stealer
    from proxy.exchanges.remote_bindings import RemoteSubscription
    from proxy.links.proxy_links import ProxyConsumer
    from proxy.links.proxy_producer import ProxyProducer
    from proxy.links.remote_destinations import RemoteDestination
    from proxy.links.shared_consumers import SharedSubscription
    from proxy.upstream.suspects import SuspectSender

    entry_points = ("on_upstream_attached", "on_upstream_detached", "upstream_down", "reattach",
                    "join_pool", "release_upstream", "detach_upstream_link", "_move")
    for cls in (ProxyConsumer, ProxyProducer, SharedSubscription, RemoteDestination, RemoteSubscription,
                Stealer, SuspectSender):
        assert issubclass(cls, UpstreamLinkOwner)
        for name in entry_points + (() if cls is SuspectSender else ("upstream_up",)):
            assert getattr(cls, name) is getattr(UpstreamLinkOwner, name), (cls.__name__, name)
