"""The lease and fencing logic as data (``proxy.cluster.lease.LeaseKeeper``): no loop, no I/O.

Every time below is a reading of the monotonic clock the driver would pass in.
With ttl 3 s, clock_drift 0.1 and margin 0.2 s, a renewal sent at t lets the
node act until t + 2.5 s.
"""

from __future__ import annotations

import random

import pytest

from proxy.cluster.lease import (LEASE_TRANSITIONS, Backoff, LeaseKeeper, LeaseState,
                                 LeaseStateError)


def keeper(ttl=3.0) -> LeaseKeeper:
    k = LeaseKeeper(ttl=ttl, clock_drift=0.1, margin=0.2)
    k.granted(7, ttl, sent_at=0.0, now=0.01)
    return k


def test_window_is_measured_from_the_grant_request():
    k = keeper()
    assert k.window == pytest.approx(2.5)
    assert k.acting(2.49) and not k.acting(2.5)
    assert k.state is LeaseState.ACTING  # the state moves only when told (tick) ...
    assert k.tick(2.5) and k.state is LeaseState.FENCED  # ... acting() never waits for it


def test_renewals_every_third_of_the_ttl_and_the_deadline_moves_with_each_success():
    k = keeper()
    assert not k.renewal_due(0.99) and k.renewal_due(1.0)
    sent = k.renewal_sent(1.0)
    assert not k.renewal_due(1.5)  # one in flight at a time
    k.renewal_answered(sent_at=sent, ttl=3, now=1.05)
    assert k.deadline == pytest.approx(3.5)
    assert k.next_renewal_at == pytest.approx(2.0)
    assert k.next_wakeup(1.05) == pytest.approx(2.0)


def test_a_slow_answer_buys_only_what_was_left_when_it_was_sent():
    k = keeper()
    sent = k.renewal_sent(1.0)
    k.renewal_answered(sent_at=sent, ttl=3, now=2.9)  # 1.9 s on the way
    assert k.deadline == pytest.approx(3.5)  # not 2.9 + 2.5
    assert k.acting(3.4) and not k.acting(3.5)


def test_a_stall_past_the_deadline_fences_at_once_and_a_late_answer_does_not_unfence():
    k = keeper()
    sent = k.renewal_sent(1.0)
    # the event loop stalls 9 s; the answer to the renewal sent before it comes after it
    assert not k.acting(10.0)
    k.renewal_answered(sent_at=sent, ttl=3, now=10.0)
    assert not k.acting(10.0) and k.state is LeaseState.FENCED
    assert k.renewal_due(10.0)
    sent = k.renewal_sent(10.0)  # etcd still had the lease (its leader restarted, say): act again
    k.renewal_answered(sent_at=sent, ttl=3, now=10.01)
    assert k.acting(10.01) and k.state is LeaseState.ACTING
    assert [s for _, s in k.history] == [LeaseState.ACTING, LeaseState.FENCED, LeaseState.ACTING]


def test_etcd_saying_the_lease_is_gone_means_register_again():
    k = keeper()
    sent = k.renewal_sent(1.0)
    k.renewal_answered(sent_at=sent, ttl=0, now=1.01)
    assert k.state is LeaseState.EXPIRED and k.lease_id is None
    assert not k.acting(1.01) and k.needs_lease() and not k.renewal_due(5.0)
    k.granted(8, 3, sent_at=2.0, now=2.01)
    assert k.acting(2.01) and k.lease_id == 8 and k.registrations == 2


def test_failed_renewals_retry_quickly_while_the_lease_may_live_then_back_off():
    k = keeper()
    now, delays = 1.0, []
    for _ in range(8):
        sent = k.renewal_sent(now)
        k.renewal_failed(sent_at=sent, now=now + 0.01)
        delays.append(round(k.next_renewal_at - (now + 0.01), 3))
        now = k.next_renewal_at
    assert delays[:4] == [0.3] * 4  # the lease (granted at 0) may live until 3.0
    assert delays[-1] == 2.0 and delays == sorted(delays)
    assert k.state is LeaseState.FENCED and k.presumed_expired(now)


def test_every_move_is_written_down():
    k = LeaseKeeper(ttl=3)
    assert LeaseState.EXPIRED not in LEASE_TRANSITIONS[LeaseState.UNREGISTERED]
    with pytest.raises(LeaseStateError):
        k._move(LeaseState.EXPIRED, 0.0)  # no lease yet: nothing to expire
    k.stop(0.0)
    with pytest.raises(LeaseStateError):
        k.granted(1, 3, sent_at=0.0, now=0.0)


def test_backoff_doubles_to_its_cap_with_jitter():
    b = Backoff(first=0.1, cap=2.0, jitter=0.2, rng=random.Random(1))
    delays = [b.next_delay() for _ in range(8)]
    assert 0.08 <= delays[0] <= 0.12 and all(1.6 <= d <= 2.4 for d in delays[5:])
    b.reset()
    assert b.next_delay() <= 0.12
