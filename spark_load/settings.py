"""What one load run does: the settings every task receives (pickled, plain data only)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

SETTLE_MODES = ("at-least-once", "at-most-once")


@dataclass(frozen=True)
class LoadSettings:
    gateways: tuple[str, ...]
    addresses: tuple[str, ...] = ("work",)
    producers: int = 2
    consumers: int = 2
    messages: int = 1000          # per producer; ignored with duration_s or a trace
    duration_s: float | None = None
    rate: float = 0.0             # messages/s per producer; 0 = as fast as credit allows
    body_size: int = 100
    settle: str = "at-least-once"
    credit: int = 200             # consumer credit window
    max_in_flight: int = 1000     # producer: unsettled sends at most
    durable: bool = False         # set the AMQP header's durable flag
    idle_ms: int = 2000           # stop once producers are done and consumers got nothing this long
    drain_timeout_s: float = 60.0  # hard bound on the wait after the producers are done
    stall_timeout_s: float = 30.0  # a producer with unsettled sends and no outcome this long fails
    max_reconnects: int = 20      # per task, whole run
    reconnect_window_s: float = 30.0  # per outage
    sync_interval_s: float = 0.05  # pause between allGather rounds (a round itself takes ~1 s in Spark)
    speed: float = 1.0            # trace replay: time offsets are divided by this
    tls_ca: str | None = None
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    progress: tuple[str, int] | None = None  # driver (host, port) for UDP progress lines
    launch: str = ""              # set per run_load call: tells task attempts of re-runs apart

    @property
    def partitions(self) -> int:
        return self.producers + self.consumers

    @property
    def presettled(self) -> bool:
        return self.settle == "at-most-once"

    def role_of(self, partition: int) -> tuple[str, int]:
        """Partitions 0..P-1 are producers, P..P+C-1 consumers."""
        if partition < self.producers:
            return "producer", partition
        return "consumer", partition - self.producers

    def gateway_for(self, role: str, index: int, failover: int = 0) -> str:
        """Producers and consumers are spread over the gateways; failover moves to the next."""
        return self.gateways[(index + failover) % len(self.gateways)]

    def validate(self) -> None:
        def bad(what: str) -> None:
            raise ValueError(what)

        if not self.gateways:
            bad("at least one gateway URL is needed")
        for url in self.gateways:
            if not (url.startswith("amqp://") or url.startswith("amqps://")):
                bad(f"gateway {url!r} is not an amqp:// or amqps:// URL")
        if not self.addresses or any(not a for a in self.addresses):
            bad("at least one non-empty address is needed")
        if self.producers < 1 or self.consumers < 1:
            bad("producers and consumers must each be at least 1")
        if self.duration_s is None and self.messages < 1:
            bad("messages per producer must be at least 1 (or give a duration)")
        if self.duration_s is not None and self.duration_s <= 0:
            bad("duration must be positive")
        if self.rate < 0 or self.body_size < 0 or self.credit < 1 or self.max_in_flight < 1:
            bad("rate and body size must be >= 0, credit and max in-flight >= 1")
        if self.settle not in SETTLE_MODES:
            bad(f"settle must be one of {', '.join(SETTLE_MODES)}")
        if self.speed <= 0:
            bad("speed must be positive")
        if not self.run_id or ":" in self.run_id:
            bad("run id must be non-empty and must not contain ':'")
