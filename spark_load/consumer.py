"""A consumer task: receive from every address, record each message, accept it.

How this works
--------------
The consumer attaches one receiver per address on its own connection and
keeps ``credit`` messages of credit outstanding (topped up at half, §2.6.7).
For each complete delivery it records one row (the message's run id,
producer, sequence, attempts, resend, send time, the receive time, the
header's delivery-count and the node that served it: the connection's
remote container id, which a fedgate node sets to its node id) and then
accepts and settles it (§3.4; with ``at-most-once`` the gateway sends
pre-settled and nothing is acknowledged). The row is written before the
acceptance, so a message whose acceptance is lost in a broken connection is
recorded and, when the gateway delivers it again, shows up as a duplicate:
never as a loss.

It stops when the coordinator says so (see ``spark_load.coordination``). A
broken connection is reconnected the same explicit, bounded, counted way as
a producer's; a refused attach fails the task.
"""

from __future__ import annotations

import time

from proton import Event, Message

from .amqp_client import AmqpConnection, ConnectionLost
from .records import Row


class Consumer:
    def __init__(self, settings, index: int, attempts: tuple[int, int], coordinator) -> None:
        self.settings = settings
        self.index = index
        self.attempts = attempts
        self.coordinator = coordinator
        self.name = f"c{index}"
        self.conn: AmqpConnection | None = None
        self.links: list = []
        self.rows: list[tuple] = []
        self.received = 0
        self.seen = SeenSet()
        self.by_node: dict[str, int] = {}
        self.reconnects = 0
        self.errors: list[str] = []
        self.last_message = time.monotonic()
        self.message = Message()

    def snapshot(self) -> dict:
        return {"role": "consumer", "received": self.received, "distinct": len(self.seen),
                "reconnects": self.reconnects, "by_node": dict(self.by_node),
                "idle_ms": (time.monotonic() - self.last_message) * 1000}

    def run(self):
        started_ns = time.time_ns()
        try:
            self._connect(0)
            self.last_message = time.monotonic()
            self.coordinator.start()  # the start barrier runs in its thread: keep receiving meanwhile
            while not self.coordinator.stopped.is_set():
                try:
                    self.conn.pump(0.05)
                except ConnectionLost as exc:
                    self._reconnect(exc)
                if self.rows:
                    yield from self.rows
                    self.rows.clear()
            self.coordinator.wait(0)
            self.conn.close()
            yield Row.task(self.name, self.attempts, self.conn.remote_container, {
                "role": "consumer", "gateway": self.conn.url, "received": self.received,
                "distinct": len(self.seen), "by_node": self.by_node, "reconnects": self.reconnects,
                "errors": self.errors, "started_ns": started_ns, "finished_ns": time.time_ns(),
                "sync_rounds": self.coordinator.rounds})
        finally:
            if self.conn is not None:
                self.conn.close()

    # -- events ----------------------------------------------------------------
    def on_event(self, event) -> None:
        kind = event.type
        if kind == Event.DELIVERY:
            self._on_message(event.delivery)
        elif kind in (Event.LINK_REMOTE_CLOSE, Event.LINK_REMOTE_DETACH):
            self.conn.check_link(event.link)

    def _on_message(self, delivery) -> None:
        if not delivery.readable or delivery.partial:
            return
        link = delivery.link
        if delivery.aborted:  # §2.6.14: the sender gave it up; nothing to record
            link.advance()
            delivery.settle()
            return
        data = link.recv(delivery.pending)
        link.advance()
        now = time.time_ns()
        message = self.message
        message.decode(data)
        props = message.properties or {}
        node = self.conn.remote_container
        self.rows.append(Row.recv(self.name, self.index, props, link.source.address, len(message.body or b""),
                                  node, self.received, message.delivery_count, now))
        self.received += 1
        self.by_node[node] = self.by_node.get(node, 0) + 1
        if props.get("run_id") == self.settings.run_id:
            self.seen.add(props.get("producer"), props.get("seq"))
        self.last_message = time.monotonic()
        if not delivery.settled:  # settled by the peer: pre-settled (at-most-once)
            delivery.update(delivery.ACCEPTED)
        delivery.settle()
        if link.credit < self.settings.credit // 2:
            link.flow(self.settings.credit - link.credit)

    # -- connections -------------------------------------------------------------
    def _connect(self, failover: int) -> None:
        settings = self.settings
        url = settings.gateway_for("consumer", self.index, failover)
        self.conn = AmqpConnection(url, f"fedgate-load-{settings.run_id}-{self.name}", self.on_event,
                                   ca=settings.tls_ca)
        self.links = [self.conn.receiver(address, f"{settings.run_id}-{self.name}-{i}",
                                         presettled=settings.presettled)
                      for i, address in enumerate(settings.addresses)]
        for link in self.links:
            link.flow(settings.credit)
        self.conn.wait_attached(self.links, timeout=10.0)

    def _reconnect(self, error: Exception) -> None:
        settings = self.settings
        self.errors.append(str(error))
        self.conn.close(timeout=0)
        deadline = time.monotonic() + settings.reconnect_window_s
        delay = 0.05
        while True:
            if self.reconnects >= settings.max_reconnects:
                raise ConnectionError(f"{self.name}: gave up after {self.reconnects} reconnects: "
                                      + "; ".join(self.errors[-3:]))
            self.reconnects += 1
            try:
                self._connect(self.reconnects)
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


class SeenSet:
    """Which (producer, seq) this consumer has had: one bit per sequence number per producer."""

    def __init__(self) -> None:
        self.bits: dict[int, bytearray] = {}
        self.count = 0

    def add(self, producer, seq) -> None:
        if not isinstance(producer, int) or not isinstance(seq, int) or seq < 0:
            return
        bits = self.bits.setdefault(producer, bytearray())
        byte, bit = divmod(seq, 8)
        if byte >= len(bits):
            bits.extend(bytes(max(byte + 1 - len(bits), len(bits))))
        if not bits[byte] & (1 << bit):
            bits[byte] |= 1 << bit
            self.count += 1

    def __len__(self) -> int:
        return self.count
