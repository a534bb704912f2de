"""A numbered message set run across a fault: producers, consumers, the count.

How this works
--------------
``MessageSet`` starts consumers (tests/clients/proton_client.py ``receive
--check-body``: a message whose body or id does not match its sequence number
fails the consumer loudly) and then producers (``send --rate``: the stream
lasts a few seconds, so a fault can land in the middle of it). A thread per
consumer reads its JSON lines as they come, so the test can wait for "some
delivered" before injecting a fault, and for "every id seen" after it.
Consumers have no count (with competing consumers and duplicates nobody
knows how many each gets): once every id has been seen and the producers are
done, the run waits a short quiet period for late duplicates and stops them.

``Result`` has what a report needs: lost ids, duplicates, corrupt messages,
producer outcomes and how long the slowest client took.
"""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass, field


class LineReader(threading.Thread):
    """Collects a client's JSON lines until its stdout closes."""

    def __init__(self, client) -> None:
        super().__init__(daemon=True)
        self.client = client
        self.lines: list[dict] = []
        self.last_line = time.monotonic()
        self.closed = False
        self.start()

    def run(self) -> None:
        while True:
            try:
                line = self.client.readline(timeout=3600)
            except (EOFError, TimeoutError, ValueError, OSError):
                break
            self.lines.append(line)
            self.last_line = time.monotonic()
        self.closed = True

    def ids(self) -> list[str]:
        return [line["id"] for line in list(self.lines) if "id" in line]


@dataclass
class Result:
    expected: set
    received: list = field(default_factory=list)
    corrupt: list = field(default_factory=list)
    producers: list = field(default_factory=list)  # each producer's final JSON line
    accepted_ids: set = field(default_factory=set)  # with report_accepted
    producer_seconds: float = 0.0  # slowest producer, start to exit
    consumer_errors: list = field(default_factory=list)

    @property
    def counts(self) -> collections.Counter:
        return collections.Counter(self.received)

    @property
    def lost(self) -> set:
        return self.expected - set(self.received)

    @property
    def duplicates(self) -> int:
        return len(self.received) - len(set(self.received))

    @property
    def unexpected(self) -> set:
        return set(self.received) - self.expected


class MessageSet:
    """``producers`` x ``per_producer`` numbered messages, ``consumers`` competing receivers."""

    def __init__(self, clients, *, send_url: str, receive_url: str, address: str,
                 producers: int = 4, per_producer: int = 1500, consumers: int = 2,
                 credit: int = 50, rate: float = 0, timeout_ms: int = 30000,
                 durable: bool = False, report_accepted: bool = False, prefix: str = "p") -> None:
        self.clients = clients
        self.send_url, self.receive_url, self.address = send_url, receive_url, address
        self.n_producers, self.per_producer = producers, per_producer
        self.n_consumers, self.credit = consumers, credit
        self.rate, self.timeout_ms = rate, timeout_ms
        self.durable, self.report_accepted = durable, report_accepted
        self.names = [f"{prefix}{i}" for i in range(producers)]
        self.expected = {f"{name}-{seq}" for name in self.names for seq in range(per_producer)}
        self.consumers: list = []
        self.readers: list[LineReader] = []
        self.producers: list = []
        self.producer_readers: list[LineReader] = []

    # -- running ------------------------------------------------------------------
    def start_consumers(self) -> None:
        for _ in range(self.n_consumers):
            self.add_consumer(self.receive_url)

    def add_consumer(self, url: str) -> None:
        # no count and no idle close: stopped by finish(); the deadline is a backstop
        consumer = self.clients("proton", "receive", url, address=self.address, count=0,
                                credit=self.credit, check_body=True, timeout_ms=300000)
        self.consumers.append(consumer)
        self.readers.append(LineReader(consumer))

    def start_producers(self) -> None:
        self.started = time.monotonic()
        for name in self.names:
            producer = self.clients("proton", "send", self.send_url, address=self.address,
                                    count=self.per_producer, prefix=name, rate=self.rate or None,
                                    durable=self.durable, report_accepted=self.report_accepted,
                                    timeout_ms=self.timeout_ms)
            self.producers.append(producer)
            self.producer_readers.append(LineReader(producer))

    def start(self) -> "MessageSet":
        self.start_consumers()
        self.start_producers()
        return self

    def received(self) -> int:
        return sum(len(reader.ids()) for reader in self.readers)

    def distinct(self) -> set:
        return {i for reader in self.readers for i in reader.ids()}

    def corrupt(self) -> list:
        return [line for reader in self.readers for line in list(reader.lines) if "bad_body" in line]

    def wait_received(self, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.received() < count:
            if self.corrupt():
                raise AssertionError(f"corrupt message: {self.corrupt()[:3]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"only {self.received()} of {count} received in {timeout}s")
            time.sleep(0.02)

    def accepted_ids(self) -> set:
        return {line["accepted_id"] for reader in self.producer_readers
                for line in list(reader.lines) if "accepted_id" in line}

    def wait_producers(self, timeout: float) -> list[dict]:
        """Each producer's final line; the time the slowest one took is kept."""
        deadline = time.monotonic() + timeout
        finals = []
        for producer, reader in zip(self.producers, self.producer_readers):
            producer.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            reader.join(timeout=max(0.1, deadline - time.monotonic()))
            finals.append(next((line for line in reversed(reader.lines) if "sent" in line),
                               {"error": {"condition": "no-result", "exit": producer.proc.returncode}}))
        self.producer_seconds = time.monotonic() - self.started
        return finals

    def finish(self, timeout: float, quiet: float = 1.0, want: set | None = None) -> Result:
        """Producers' results; consumers stopped once ``want`` (default: every id) was seen
        and nothing came for ``quiet`` seconds, or at ``timeout``."""
        deadline = time.monotonic() + timeout
        try:
            finals = self.wait_producers(timeout)
        except Exception:
            finals = [{"error": {"condition": "producer did not finish in time"}}]
        want = self.expected if want is None else want
        while time.monotonic() < deadline and not self.corrupt():
            if want <= self.distinct():
                last = max(reader.last_line for reader in self.readers)
                if time.monotonic() - last >= quiet:
                    break
            if all(reader.closed for reader in self.readers):
                break
            time.sleep(0.05)
        errors = []
        for consumer, reader in zip(self.consumers, self.readers):
            if consumer.proc.poll() is not None:  # ended by itself: an error (or a corrupt message)
                errors.append({"exit": consumer.proc.returncode, "last": reader.lines[-1:]})
            consumer.kill()
            reader.join(timeout=5)
        result = Result(expected=self.expected, producers=finals,
                        producer_seconds=getattr(self, "producer_seconds", 0.0),
                        consumer_errors=errors, corrupt=self.corrupt(),
                        accepted_ids=self.accepted_ids())
        result.received = [i for reader in self.readers for i in reader.ids()]
        return result

    def stop(self) -> None:
        for client in self.consumers + self.producers:
            client.kill()
