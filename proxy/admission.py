"""Which client connections a node (or one worker of it) lets in, and counts.

How this works
--------------
``Admission`` holds the node's connection limits (``[limits]``): connections in
all and per source address (``admit``, before TLS or SASL), TLS handshakes
under way (``begin_handshake``), connections per user (``admit_user``, once SASL
has said who), and how long a failed SASL exchange's outcome waits
(``sasl_failed``: password guessing from one address gets slow), and the
node's own ``gates`` (a node that cannot serve anyone well now, e.g. fenced and
hearing none of its peers, turns clients away before the AMQP open, so their
failover lists take them elsewhere). Each connection is remembered by its
protocol object until ``release``.

In a worker (``proxy.workers``) the supervisor applies the node-wide limits
when it accepts: a worker only remembers what to tell the supervisor when the
connection closes (``c<ip>``, ``v<user>``), reports each user it admits
(``u<user>``) and refuses a user the supervisor said is at the limit. A
connection handed to another worker (``proxy.workers.placement``) is
``forget``-ten here without a word (the supervisor moved its counts) and
``count_user``-ed there.
"""

from __future__ import annotations

import logging
from typing import Callable

log = logging.getLogger("fedgate.node")  # these lines are the node's (tests and operators grep them)

# a failed SASL exchange's outcome waits FAILURE_DELAY * 2**(failures from that address
# in the last FAILURE_MEMORY seconds - 1), at most FAILURE_DELAY_MAX: password guessing
# from one address gets slow (with max_connections_per_ip, a bounded number at a time)
FAILURE_DELAY = 0.1
FAILURE_DELAY_MAX = 2.0
FAILURE_MEMORY = 60.0
FAILURE_ADDRESSES = 10_000  # addresses remembered at most (the oldest go first)


class Admission:
    def __init__(self, limits, worker, connections: Callable[[], int], *,
                 closed: Callable[[object], None] = lambda protocol: None) -> None:
        self.limits = limits  # proxy.config.settings.LimitsSection
        self.worker = worker  # proxy.workers.worker.WorkerContext, or None: a single process
        self.connections = connections  # how many client connections the node serves now
        self.closed = closed  # told of each connection released in a worker (placement)
        self.handshaking = 0  # TLS handshakes under way (admitted, not yet AMQP connections)
        self._ip_of: dict = {}  # protocol -> its source address, for the per-IP limit
        self._user_of: dict = {}  # protocol -> its user, for the per-user limit
        self.per_ip: dict[str, int] = {}
        self.per_user: dict[str, int] = {}
        self.sasl_failures: dict[str, tuple[int, float]] = {}  # ip -> (failures, last), oldest first
        # conditions of the node's own that turn new clients away: each a function giving the
        # reason, or None (proxy.replication.silence: fenced, and a peer answers nothing)
        self.gates: list[Callable[[], str | None]] = []

    def admit(self, protocol) -> str | None:
        """None to accept a new connection, else the reason to refuse it."""
        if self.worker is not None and self.worker.channel is not None:
            # the supervisor admitted it (node-wide counts); we tell it when it closes
            self._ip_of[protocol] = protocol.ip
            return None
        for gate in self.gates:  # before any AMQP byte: the client's failover list goes on
            closed = gate()
            if closed is not None:
                return closed
        limits = self.limits
        if limits.max_connections and self.connections() + self.handshaking >= limits.max_connections:
            return f"connection limit {limits.max_connections} reached"
        ip = protocol.ip
        count = self.per_ip.get(ip, 0)
        if limits.max_connections_per_ip and count >= limits.max_connections_per_ip:
            return f"{count} connections from {ip} (max_connections_per_ip)"
        self.per_ip[ip] = count + 1
        self._ip_of[protocol] = ip
        return None

    def begin_handshake(self) -> str | None:
        """A TLS connection accepted: None to start its handshake, else why not."""
        limit = self.limits.max_pending_handshakes
        if limit and self.handshaking >= limit:
            return f"{self.handshaking} TLS handshakes under way (max_pending_handshakes)"
        self.handshaking += 1
        return None

    def end_handshake(self) -> None:
        """A TLS handshake begun is over: done, failed or timed out."""
        self.handshaking = max(0, self.handshaking - 1)

    def admit_user(self, protocol, identity) -> str | None:
        """Called when SASL succeeds: None to go on, else why the user is refused."""
        limit = self.limits.max_connections_per_user
        log.info("connection from %s authenticated: user %s (%s)", protocol.peer, identity.user,
                 identity.mechanism)
        if identity.mechanism in (None, "ANONYMOUS"):
            return None  # anonymous clients are bounded per source IP
        user = identity.user
        count = self.per_user.get(user, 0)
        if limit and self.worker is not None and user in self.worker.full_users:
            log.warning("connection from %s refused: user %s already has %d connections on this "
                        "node (max_connections_per_user)", protocol.peer, user, limit)
            return f"user {user!r} already has {limit} connections (max_connections_per_user)"
        if limit and count >= limit:
            log.warning("connection from %s refused: user %s already has %d connections "
                        "(max_connections_per_user)", protocol.peer, user, count)
            return f"user {user!r} already has {count} connections (max_connections_per_user)"
        self.per_user[user] = count + 1
        self._user_of[protocol] = user
        if self.worker is not None:
            self.worker.send(b"u", user)
        return None

    def sasl_failed(self, ip: str, now: float) -> float:
        """A SASL exchange from ``ip`` failed: how long its outcome waits (seconds)."""
        count, last = self.sasl_failures.pop(ip, (0, now))
        count = 1 if now - last > FAILURE_MEMORY else count + 1
        self.sasl_failures[ip] = (count, now)  # re-inserted: the dict stays oldest first
        if len(self.sasl_failures) > FAILURE_ADDRESSES:
            del self.sasl_failures[next(iter(self.sasl_failures))]
        return min(FAILURE_DELAY_MAX, FAILURE_DELAY * 2 ** min(count - 1, 16))

    def release(self, protocol) -> None:
        """A connection is gone: forget it in the per-IP and per-user counts."""
        worker = self.worker
        if worker is not None and worker.channel is not None:
            ip = self._ip_of.pop(protocol, None)
            if ip is not None:
                worker.send(b"c", ip)
            user = self._user_of.get(protocol)
            if user is not None:
                worker.send(b"v", user)
            self.closed(protocol)
        self.forget(protocol)

    def forget(self, protocol) -> None:
        """Drop a connection from this worker's per-IP and per-user counts, telling nobody
        (``release``; a connection handed to another worker, ``proxy.workers.placement``)."""
        for owner, counts in ((self._ip_of, self.per_ip), (self._user_of, self.per_user)):
            key = owner.pop(protocol, None)
            if key is not None:
                left = counts.get(key, 1) - 1
                if left > 0:
                    counts[key] = left
                else:
                    counts.pop(key, None)

    def user_of(self, protocol) -> str | None:
        """The user a connection counts for against ``max_connections_per_user``."""
        return self._user_of.get(protocol)

    def count_user(self, protocol, user: str) -> None:
        """Count a connection the supervisor already counted node-wide (a hand-over)."""
        self.per_user[user] = self.per_user.get(user, 0) + 1
        self._user_of[protocol] = user
