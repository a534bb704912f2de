"""The node's lease as data: when to renew, and whether the node may act (sans-I/O).

How this works
--------------
``LeaseKeeper`` makes no calls and reads no clock: the driver
(``proxy.cluster.etcd``) tells it what happened and when (``now`` is the event
loop's monotonic time) and asks it what to do next. It never trusts a reply
for longer than the reply can vouch for:

* A renewal (etcd ``LeaseKeepAlive``) that succeeds proves the lease was alive
  when etcd handled it, which is *after* the request was sent. etcd expires a
  lease ``ttl`` after the last renewal it handled, on its own clock. So the
  node may act until::

      deadline = sent_at(last successful renewal) + ttl * (1 - clock_drift) - margin

  measured from when the request was **sent**, never from when the answer came
  (an answer that took 2 s to arrive buys 2 s less). ``clock_drift`` (0.1)
  allows for this node's clock running slower than etcd's, as Kubernetes'
  leader election does with its renew deadline against its lease duration;
  ``margin`` covers the time between checking ``acting`` and the act itself.
* ``acting(now)`` is computed from ``now`` on every call: an event loop that
  stalled past the deadline finds itself fenced the moment it looks, before
  any timer or callback has run. A late answer to a renewal sent before the
  stall does not restore it either: its deadline is already past.
* Renewals go out every ``ttl / 3`` (etcd's own clients do the same); a failed
  one is retried every ``ttl / 10`` while the lease may still be alive in etcd,
  then with a doubling backoff up to ``RETRY_CAP``.
* An answer with ``ttl <= 0`` (etcd: lease not found), or the node's own
  registration vanishing from the watch, means the lease is gone: ``EXPIRED``.
  The node must register again under a new lease and claim again, which
  raises every epoch it held (``proxy.cluster.etcd``).

States and their moves (``LEASE_TRANSITIONS``; a move not written down
raises ``LeaseStateError``)::

    UNREGISTERED --granted--> ACTING --deadline passed--> FENCED
                                ^  '------ lease gone -----.  |
                                '--- renewal in time ---- EXPIRED <-'
    (EXPIRED --granted--> ACTING: a new lease; any state --stop--> STOPPED)
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass, field


class LeaseState(str, enum.Enum):
    UNREGISTERED = "unregistered"  # no lease yet
    ACTING = "acting"  # a renewal sent less than the safe window ago succeeded
    FENCED = "fenced"  # the safe window passed: the lease may be gone, the node must not act
    EXPIRED = "expired"  # etcd says the lease is gone: register again (new lease, new epochs)
    STOPPED = "stopped"  # revoked at stop


LEASE_TRANSITIONS: dict[LeaseState, frozenset[LeaseState]] = {
    LeaseState.UNREGISTERED: frozenset({LeaseState.ACTING, LeaseState.FENCED, LeaseState.STOPPED}),
    LeaseState.ACTING: frozenset({LeaseState.FENCED, LeaseState.EXPIRED, LeaseState.STOPPED}),
    LeaseState.FENCED: frozenset({LeaseState.ACTING, LeaseState.EXPIRED, LeaseState.STOPPED}),
    LeaseState.EXPIRED: frozenset({LeaseState.ACTING, LeaseState.FENCED, LeaseState.STOPPED}),
    LeaseState.STOPPED: frozenset(),
}

MARGIN = 0.2  # seconds: between checking acting() and the act itself
RETRY_CAP = 2.0  # seconds between renewal attempts once the lease is surely gone
EARLY = 1e-6  # seconds a timer may fire before its time and still count as on time


class LeaseStateError(RuntimeError):
    """A move ``LEASE_TRANSITIONS`` does not allow."""


@dataclass
class LeaseKeeper:
    ttl: float  # seconds, as granted by etcd
    clock_drift: float = 0.1
    margin: float = MARGIN
    state: LeaseState = LeaseState.UNREGISTERED
    lease_id: int | None = None
    registrations: int = 0  # leases granted so far (2 and more: the node registered again)
    granted_at: float | None = None  # when the grant of the current lease was sent
    last_ok_sent: float | None = None  # when the newest successful renewal (or the grant) was sent
    last_ok_received: float | None = None
    in_flight: float | None = None  # when the pending renewal was sent
    next_renewal_at: float | None = None
    failures: int = 0  # renewals failed in a row
    history: list[tuple[float, LeaseState]] = field(default_factory=list)  # (now, state) per move

    # -- inputs -------------------------------------------------------------------------
    def granted(self, lease_id: int, ttl: float, *, sent_at: float, now: float) -> None:
        """A new lease (and the registration under it) is in place; the grant was sent at
        ``sent_at``."""
        self.lease_id = lease_id
        self.ttl = float(ttl)
        self.registrations += 1
        self.granted_at = sent_at
        self.last_ok_sent = sent_at
        self.last_ok_received = now
        self.in_flight = None
        self.failures = 0
        self.next_renewal_at = sent_at + self.renew_interval
        self._move(LeaseState.ACTING if now < self.deadline else LeaseState.FENCED, now)

    def renewal_sent(self, now: float) -> float:
        if self.in_flight is not None:
            raise LeaseStateError("a renewal is already in flight")
        self.in_flight = now
        return now

    def renewal_answered(self, *, sent_at: float, ttl: float, now: float) -> None:
        """etcd answered the renewal sent at ``sent_at`` with the lease's ``ttl``
        (0 or less: the lease is gone)."""
        self.in_flight = None
        if self.state in (LeaseState.STOPPED, LeaseState.EXPIRED, LeaseState.UNREGISTERED):
            return  # an answer for a lease we no longer hold
        if ttl <= 0:
            self.lease_lost(now)
            return
        self.ttl = float(ttl)
        self.failures = 0
        if self.last_ok_sent is None or sent_at > self.last_ok_sent:
            self.last_ok_sent = sent_at
        self.last_ok_received = now
        self.next_renewal_at = sent_at + self.renew_interval
        if now < self.deadline:
            if self.state is LeaseState.FENCED:
                self._move(LeaseState.ACTING, now)
        else:
            self.tick(now)

    def renewal_failed(self, *, sent_at: float, now: float) -> None:
        """The renewal sent at ``sent_at`` got no answer (error, timeout, no connection)."""
        self.in_flight = None
        self.failures += 1
        self.next_renewal_at = now + self.retry_delay(now)
        self.tick(now)

    def lease_lost(self, now: float) -> None:
        """etcd says the lease is gone (keepalive TTL <= 0, or our registration deleted)."""
        if self.state in (LeaseState.ACTING, LeaseState.FENCED):
            self._move(LeaseState.EXPIRED, now)
        self.lease_id = None
        self.in_flight = None
        self.next_renewal_at = None

    def stop(self, now: float) -> None:
        if self.state is not LeaseState.STOPPED:
            self._move(LeaseState.STOPPED, now)
        self.next_renewal_at = None

    def tick(self, now: float) -> bool:
        """Fence when the safe window has passed; True when the state changed."""
        if self.state is LeaseState.ACTING and now >= self.deadline:
            self._move(LeaseState.FENCED, now)
            return True
        return False

    # -- outputs --------------------------------------------------------------------------
    @property
    def renew_interval(self) -> float:
        return self.ttl / 3

    @property
    def window(self) -> float:
        """How long after sending a renewal that succeeds the node may act on it."""
        return max(0.0, self.ttl * (1 - self.clock_drift) - self.margin)

    @property
    def deadline(self) -> float:
        if self.last_ok_sent is None:
            return float("-inf")
        return self.last_ok_sent + self.window

    def acting(self, now: float) -> bool:
        return self.state is LeaseState.ACTING and now < self.deadline

    def needs_lease(self) -> bool:
        return self.state in (LeaseState.UNREGISTERED, LeaseState.EXPIRED)

    def renewal_due(self, now: float) -> bool:
        # asyncio runs a timer up to its clock resolution early: that is "due" too
        return (self.state in (LeaseState.ACTING, LeaseState.FENCED) and self.in_flight is None
                and self.next_renewal_at is not None and now >= self.next_renewal_at - EARLY)

    def next_wakeup(self, now: float) -> float | None:
        """When the driver must look again: the next renewal, or the deadline (now: register)."""
        if self.needs_lease():
            return now
        times = []
        if self.next_renewal_at is not None and self.in_flight is None:
            times.append(self.next_renewal_at)
        if self.state is LeaseState.ACTING and self.deadline > now:  # past: tick() it, no wake
            times.append(self.deadline)
        return max(now, min(times)) if times else None

    def retry_delay(self, now: float) -> float:
        quick = max(0.05, self.ttl / 10)
        if self.last_ok_sent is not None and now < self.last_ok_sent + self.ttl:
            return quick  # the lease may still be alive in etcd: try to keep it
        return min(RETRY_CAP, quick * 2 ** min(self.failures, 10))

    def presumed_expired(self, now: float) -> bool:
        """No renewal for longer than etcd could keep the lease, even on a slow clock."""
        if self.lease_id is None or self.last_ok_received is None:
            return True
        return now > self.last_ok_received + self.ttl * (1 + self.clock_drift) + self.margin

    def lease_age(self, now: float) -> float | None:
        return None if self.granted_at is None or self.lease_id is None else now - self.granted_at

    def describe(self, now: float) -> dict:
        return {
            "state": self.state.value,
            "acting": self.acting(now),
            "lease_id": self.lease_id,
            "ttl": self.ttl,
            "registrations": self.registrations,
            "renewed_s_ago": None if self.last_ok_received is None
            else round(now - self.last_ok_received, 3),
            "acts_for_s": round(max(0.0, self.deadline - now), 3) if self.acting(now) else 0.0,
            "renewal_failures": self.failures,
            "presumed_expired": self.presumed_expired(now),
        }

    def _move(self, new: LeaseState, now: float) -> None:
        if new is self.state:
            return
        if new not in LEASE_TRANSITIONS[self.state]:
            raise LeaseStateError(f"lease: {self.state.value} -> {new.value} is not a move")
        self.state = new
        self.history.append((now, new))
        del self.history[:-32]


@dataclass
class Backoff:
    """Reconnect delays: ``first`` doubling to ``cap``, each with +-``jitter`` (a fraction)."""

    first: float = 0.1
    cap: float = 2.0
    jitter: float = 0.2
    rng: random.Random = field(default_factory=random.Random)
    attempts: int = 0

    def next_delay(self) -> float:
        delay = min(self.cap, self.first * 2 ** min(self.attempts, 16))
        self.attempts += 1
        return delay * (1 + self.jitter * (2 * self.rng.random() - 1))

    def reset(self) -> None:
        self.attempts = 0
