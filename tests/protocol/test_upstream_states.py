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
