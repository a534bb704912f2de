"""A producer task: numbered messages to the gateway, at-least-once.

How this works
--------------
The producer walks its plan (``(due_s, address, size)`` items: generated at a
fixed rate, or a slice of a replayed trace) and sends each item when it is
due, when the link has credit and fewer than ``max_in_flight`` sends are
unsettled. Every message carries, as application properties (AMQP §3.2.5),
``run_id``, ``producer``, ``seq``, ``attempt`` (``TaskContext.attemptNumber()``),
``attempt_id`` (``LAUNCH-taskAttemptId()``: one value per task attempt, also
across application attempts and re-runs with the same run id), ``resend`` and
``sent_ns`` (wall clock of the first send); its message-id is
``run_id:producer:seq``.

At-least-once (the default) sends unsettled and waits for the outcome
(§3.4): ``accepted`` and ``rejected`` are final and recorded; ``released`` and
``modified`` mean the gateway did not keep it, so it is sent again.

Reconnecting is explicit, bounded and counted, never silent: when the
connection breaks, every send whose outcome is unknown is queued again with
``resend`` + 1 and the same message-id, the producer connects to the next
gateway (failover) within ``reconnect_window_s`` and at most
``max_reconnects`` times per task, and the report shows the reconnects and
resends. A copy that had in fact arrived before the break is then a
duplicate, which the verification attributes to the resend. A refused link
(``amqp:not-found``, ``amqp:unauthorized-access`` ...) or an exhausted budget
fails the task, and so the Spark job.

At-most-once sends pre-settled (§2.7.5, snd-settle-mode settled): nothing
is resent, and a message in flight when a connection breaks may be lost.
"""

from __future__ import annotations

import time
from collections import deque

from proton import Delivery, Event, Message

from .amqp_client import AmqpConnection, ConnectionLost, LinkRefused
from .records import Row

START_TIMEOUT_S = 600.0  # the start barrier: all tasks scheduled, connected and attached
FINAL = {Delivery.ACCEPTED: "accepted", Delivery.REJECTED: "rejected"}
AGAIN = {Delivery.RELEASED: "released", Delivery.MODIFIED: "modified"}


def generated_plan(settings, index: int):
    """``messages`` items (or endless, for a duration) at ``rate`` per second."""
    address = settings.addresses[index % len(settings.addresses)]
    k = 0
    while settings.duration_s is not None or k < settings.messages:
        yield (k / settings.rate if settings.rate else 0.0), address, settings.body_size
        k += 1


def trace_plan(settings, rows):
    """Trace rows ``(t_offset_ms, address, size)``, already sorted, replayed at ``speed``."""
    for t_offset_ms, address, size in rows:
        yield t_offset_ms / 1000.0 / settings.speed, address, int(size)


class Producer:
    def __init__(self, settings, index: int, attempts: tuple[int, int], plan, coordinator) -> None:
        self.settings = settings
        self.index = index
        self.attempt_id, self.attempt = attempts
        self.plan = iter(plan)
        self.coordinator = coordinator
        self.name = f"p{index}"
        self.conn: AmqpConnection | None = None
        self.links: dict[str, object] = {}
        self.inflight: dict[str, tuple] = {}   # delivery tag -> (seq, address, size, sent_ns, resend)
        self.again: deque = deque()             # (seq, address, size, sent_ns, resend) to send first
        self.rows: list[tuple] = []
        self.next_item = None
        self.seq = 0
        self.tags = 0
        self.sent = 0          # sends made, resends included
        self.expected = 0      # messages that should arrive (accepted, or pre-settled)
        self.resent = 0
        self.reconnects = 0
        self.failovers = 0
        self.errors: list[str] = []
        self.done = False
        self.blocked = False   # something is due but the link has no credit / the window is full
        self.done_at = 0.0
        self.last_progress = 0.0
        self.started_ns = 0
        self.body_cache: dict[int, bytes] = {}

    # -- state for the coordinator thread ---------------------------------------
    def snapshot(self) -> dict:
        return {"role": "producer", "done": self.done, "sent": self.sent,
                "expected": self.expected, "resent": self.resent, "reconnects": self.reconnects,
                "done_for_ms": (time.monotonic() - self.done_at) * 1000 if self.done else 0}

    # -- the task ------------------------------------------------------------
    def run(self):
        """Generator of record rows; the Spark task iterates it."""
        settings = self.settings
        try:
            self._connect(0)
            self.coordinator.start()
            self.coordinator.wait_started(START_TIMEOUT_S)  # everyone attached: start together
            self.started_ns = time.time_ns()
            start = time.monotonic()
            self.last_progress = start
            deadline = start + settings.duration_s if settings.duration_s is not None else None
            while True:
                now = time.monotonic()
                if self.coordinator.error is not None:
                    raise RuntimeError(f"barrier sync failed: {self.coordinator.error!r}")
                if deadline is not None and now >= deadline:
                    self.plan = iter(())
                    self.next_item = None
                wait = self._send_due(now - start)
                if self.next_item is None and not self.inflight and not self.again:
                    break
                if (self.inflight or self.blocked) and now - self.last_progress > settings.stall_timeout_s:
                    why = f"{len(self.inflight)} sends without an outcome" if self.inflight \
                        else "no credit from the gateway"
                    raise TimeoutError(f"{self.name}: stalled for {settings.stall_timeout_s:.0f}s: {why}")
                try:
                    self.conn.pump(min(wait, 0.05))
                except ConnectionLost as exc:
                    self._reconnect(exc)
                if self.rows:
                    yield from self.rows
                    self.rows.clear()
            self.done_at = time.monotonic()
            self.done = True
            self.conn.close()
            self.coordinator.wait(settings.drain_timeout_s + settings.idle_ms / 1000 + 60)
            yield Row.task(self.name, (self.attempt_id, self.attempt), self._node(), {
                "role": "producer", "gateway": self.conn.url, "sent": self.sent,
                "expected": self.expected, "resent": self.resent, "reconnects": self.reconnects,
                "errors": self.errors, "started_ns": self.started_ns, "finished_ns": time.time_ns(),
                "sync_rounds": self.coordinator.rounds})
        finally:
            if self.conn is not None:
                self.conn.close()

    def _node(self) -> str | None:
        return self.conn.remote_container if self.conn is not None else None

    # -- sending -------------------------------------------------------------
    def _take_next(self):
        if self.next_item is None:
            self.next_item = next(self.plan, None)
        return self.next_item

    def _send_due(self, elapsed: float) -> float:
        """Send what is due and allowed; return how long until the next item is due."""
        settings = self.settings
        self.blocked = True  # until proven otherwise: something is due but cannot go
        while len(self.inflight) < settings.max_in_flight:
            if self.again:
                seq, address, size, sent_ns, resend = self.again[0]
                if not self._send(seq, address, size, sent_ns, resend):
                    break
                self.again.popleft()
                self.resent += 1
                continue
            item = self._take_next()
            if item is None:
                self.blocked = False
                break
            due, address, size = item
            if due > elapsed:
                self.blocked = False
                return due - elapsed
            if not self._send(self.seq, address, size, time.time_ns(), 0):
                break
            self.seq += 1
            self.next_item = None
        return 0.05

    def _link(self, address: str):
        link = self.links.get(address)
        if link is None:
            link = self.conn.sender(address, f"{self.settings.run_id}-{self.name}-{len(self.links)}",
                                    presettled=self.settings.presettled)
            self.links[address] = link
        return link

    def _send(self, seq: int, address: str, size: int, sent_ns: int, resend: int) -> bool:
        link = self._link(address)
        if link.credit <= 0:
            return False
        settings = self.settings
        body = self.body_cache.get(size)
        if body is None:
            body = self.body_cache.setdefault(size, b"x" * size)
        message = Message(id=f"{settings.run_id}:{self.index}:{seq}", body=body, durable=settings.durable,
                          properties={"run_id": settings.run_id, "producer": self.index, "seq": seq,
                                      "attempt_id": self.attempt_id, "attempt": self.attempt,
                                      "resend": resend, "sent_ns": sent_ns})
        self.tags += 1
        self.last_progress = time.monotonic()
        tag = str(self.tags)
        delivery = link.delivery(tag)
        link.send(message.encode())
        link.advance()
        self.sent += 1
        if settings.presettled:
            delivery.settle()
            self.expected += 1
            self.rows.append(self._row(seq, resend, address, size, sent_ns, "presettled"))
        else:
            self.inflight[tag] = (seq, address, size, sent_ns, resend)
        return True

    # -- events ----------------------------------------------------------------
    def on_event(self, event) -> None:
        kind = event.type
        if kind == Event.DELIVERY:
            self._on_outcome(event.delivery)
        elif kind in (Event.LINK_REMOTE_CLOSE, Event.LINK_REMOTE_DETACH):
            self.conn.check_link(event.link)

    def _on_outcome(self, delivery) -> None:
        state = delivery.remote_state
        if state not in FINAL and state not in AGAIN:
            return
        item = self.inflight.pop(delivery.tag, None)
        delivery.settle()
        if item is None:
            return
        self.last_progress = time.monotonic()
        seq, address, size, sent_ns, resend = item
        if state in AGAIN:  # not kept by the gateway: send it again
            self.again.append((seq, address, size, sent_ns, resend + 1))
            return
        if state == Delivery.ACCEPTED:
            self.expected += 1
        self.rows.append(self._row(seq, resend, address, size, sent_ns, FINAL[state]))

    def _row(self, seq, resend, address, size, sent_ns, outcome) -> tuple:
        return Row.sent(self.name, self.settings.run_id, self.index, seq, (self.attempt_id, self.attempt),
                        resend, address, size, self._node(), sent_ns, time.time_ns(), outcome)

    # -- connections -----------------------------------------------------------
    def _connect(self, failover: int) -> None:
        settings = self.settings
        url = settings.gateway_for("producer", self.index, failover)
        self.conn = AmqpConnection(url, f"fedgate-load-{settings.run_id}-{self.name}", self.on_event,
                                   ca=settings.tls_ca)
        self.links = {}
        first_address = settings.addresses[self.index % len(settings.addresses)]
        self.conn.wait_attached([self._link(first_address)], timeout=10.0)

    def _reconnect(self, error: Exception) -> None:
        """Connect again (next gateway first) and queue every unknown outcome for resending."""
        settings = self.settings
        self.errors.append(str(error))
        self.conn.close(timeout=0)
        unknown = sorted(self.inflight.values())
        self.inflight.clear()
        for seq, address, size, sent_ns, resend in unknown:
            self.again.append((seq, address, size, sent_ns, resend + 1))
        deadline = time.monotonic() + settings.reconnect_window_s
        delay = 0.05
        while True:
            if self.reconnects >= settings.max_reconnects:
                raise ConnectionError(f"{self.name}: gave up after {self.reconnects} reconnects: "
                                      + "; ".join(self.errors[-3:]))
            self.reconnects += 1
            self.failovers += 1
            try:
                self._connect(self.failovers)
                self.last_progress = time.monotonic()
                return
            except (OSError, ConnectionLost) as exc:
                self.errors.append(str(exc))
                if self.conn is not None:
                    self.conn.close(timeout=0)
            if time.monotonic() + delay > deadline:
                raise ConnectionError(f"{self.name}: no gateway reachable within "
                                      f"{settings.reconnect_window_s:.0f}s: " + "; ".join(self.errors[-3:]))
            time.sleep(delay)
            delay = min(delay * 2, 1.0)


__all__ = ["Producer", "generated_plan", "trace_plan", "LinkRefused"]
