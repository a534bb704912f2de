#!/usr/bin/env python3
"""A paced proton client that times each message: send -> acceptance, send -> delivery.

    .venv/bin/python bench/latency_probe.py --send-url amqp://127.0.0.1:5682 \
        --receive-url amqp://127.0.0.1:5682 --address /queue/lat --count 5000 --rate 1000

One process, two connections (a sender's and a receiver's, as separate clients would
have), receiver attached first. Message ``i`` is sent at ``start + i / rate`` (the timer
wakes every millisecond and sends what is due), with a body of ``--body-bytes`` and its
sequence number in an application property. The times are the process's
``time.perf_counter()`` taken when the message is handed to proton (send), when its
``accepted`` arrives, and when it is received: both ends in one process, one clock.
Prints one JSON line: ``{"times": [[send, accepted, received], ...], "errors": [...]}``
(null where a time never came). Used by ``bench/proxy.py --latency`` and by
``bench/replication.py`` (``--wall-clock --keep-going`` for its failover runs).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time


def probe_main(argv: list[str]) -> int:
    from proton import Message
    from proton.handlers import MessagingHandler
    from proton.reactor import Container

    parser = argparse.ArgumentParser()
    parser.add_argument("--send-url", required=True)
    parser.add_argument("--receive-url", required=True)
    parser.add_argument("--address", required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--rate", type=float, required=True)
    parser.add_argument("--body-bytes", type=int, default=100)
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--credit", type=int, default=1000, help="the receiver's window")
    parser.add_argument("--wall-clock", action="store_true",
                        help="time.time() stamps, to compare with other processes' (failover)")
    parser.add_argument("--keep-going", action="store_true",
                        help="record a link or transport error and go on (a failover's)")
    args = parser.parse_args(argv)
    clock = time.time if args.wall_clock else time.perf_counter
    credit = args.credit
    body = b"x" * args.body_bytes

    class Probe(MessagingHandler):
        def __init__(self) -> None:
            super().__init__(prefetch=0, auto_accept=False, auto_settle=True)
            self.times = [[None, None, None] for _ in range(args.count)]
            self.sent = self.received = 0
            self.errors: list[str] = []
            self.tags: dict = {}
            self.started = None

        def on_start(self, event):
            receive = event.container.connect(args.receive_url, reconnect=False)
            send = event.container.connect(args.send_url, reconnect=False)
            self.receiver = event.container.create_receiver(receive, args.address)
            self.receiver.flow(credit)
            self.sender = event.container.create_sender(send, args.address)
            self.deadline = event.container.schedule(args.timeout, Stop(self))
            event.container.schedule(0.001, self)

        def on_timer_task(self, event):
            now = clock()
            if self.started is None:  # pace from the moment both links are up
                if not (self.sender.state & self.sender.REMOTE_ACTIVE
                        and self.receiver.state & self.receiver.REMOTE_ACTIVE
                        and self.sender.credit):
                    event.container.schedule(0.001, self)
                    return
                self.started = now
            due = min(args.count, int((now - self.started) * args.rate) + 1)
            while self.sender.credit and self.sent < due:
                seq = self.sent
                delivery = self.sender.send(Message(body=body, properties={"seq": seq}))
                self.tags[delivery.tag] = seq
                self.times[seq][0] = clock()
                self.sent += 1
            if self.sent < args.count:
                # wake for the next message due (at most 1 ms away)
                wait = (self.sent / args.rate) - (clock() - self.started)
                event.container.schedule(max(0.0, min(0.001, wait)), self)

        def on_accepted(self, event):
            seq = self.tags.pop(event.delivery.tag, None)
            if seq is not None and self.times[seq][1] is None:
                self.times[seq][1] = clock()

        def on_message(self, event):
            now = clock()
            seq = (event.message.properties or {}).get("seq")
            if isinstance(seq, int) and 0 <= seq < args.count and self.times[seq][2] is None:
                self.times[seq][2] = now
                self.received += 1
            self.accept(event.delivery)
            if self.receiver.credit < credit // 2:
                self.receiver.flow(credit - self.receiver.credit)
            if self.received >= args.count:
                self.stop()

        def on_link_error(self, event):
            self.errors.append(f"link: {event.link.remote_condition}")
            if not args.keep_going:
                self.stop()

        def on_transport_error(self, event):
            self.errors.append(f"transport: {event.transport.condition}")
            if not args.keep_going:
                self.stop()

        def stop(self) -> None:
            self.deadline.cancel()  # else the reactor runs until it fires
            for connection in {self.sender.connection, self.receiver.connection}:
                connection.close()

    class Stop:
        def __init__(self, probe) -> None:
            self.probe = probe

        def on_timer_task(self, event):
            self.probe.errors.append("timeout")
            self.probe.stop()

    probe = Probe()
    Container(probe).run()
    print(json.dumps({"times": probe.times, "errors": probe.errors}))
    return 0


def start_probe(send_url: str, receive_url: str, address: str, count: int, rate: float,
                timeout: float, *options: str) -> subprocess.Popen:
    """The probe in a process of its own, started; ``options``: more of its flags."""
    return subprocess.Popen([sys.executable, __file__, "--send-url", send_url, "--receive-url",
                             receive_url, "--address", address, "--count", str(count), "--rate",
                             str(rate), "--timeout", str(timeout), *options],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def run_probe(send_url: str, receive_url: str, address: str, count: int, rate: float,
              body_bytes: int = 100) -> dict:
    """Run the probe in a process of its own; its parsed JSON, or an error in ``errors``."""
    timeout = count / rate + 30
    proc = start_probe(send_url, receive_url, address, count, rate, timeout,
                       "--body-bytes", str(body_bytes))
    try:
        out, err = proc.communicate(timeout=timeout + 30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        return {"times": [], "errors": [f"probe did not finish: {err[-500:]}"]}
    if proc.returncode != 0 or not out.strip():
        return {"times": [], "errors": [f"probe failed ({proc.returncode}): {err[-1000:]}"]}
    return json.loads(out.strip().splitlines()[-1])


def percentile(values: list[float], p: float) -> float | None:
    """Nearest-rank percentile of ``values`` (``p`` in 0..1); None when empty."""
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p * (len(values) - 1))))]


def latencies(result: dict, skip: int) -> dict:
    """ms from send to acceptance and to delivery, the first ``skip`` messages left out."""
    times = result["times"][skip:]
    return {"accept_ms": [(a - s) * 1e3 for s, a, _ in times if s and a],
            "deliver_ms": [(r - s) * 1e3 for s, _, r in times if s and r]}


def summary(values: list[float]) -> dict:
    return {"p50": _r(percentile(values, 0.5)), "p99": _r(percentile(values, 0.99)),
            "max": _r(max(values) if values else None), "n": len(values)}


def _r(value):
    return None if value is None else round(value, 3)


if __name__ == "__main__":
    sys.exit(probe_main(sys.argv[1:]))
