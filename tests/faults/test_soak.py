"""Soak (opt-in: ``make soak`` or ``pytest -m soak``): hours of steady load stay flat.

producers -> node P -(proxy rule)-> n1 (fragment) ... n2 (fragment) <- consumers

P proxies ``soak.#`` to n1; n1 and n2 share the fragmented queue ``soak.#``
and the consumers on n2 steal everything from n1. First the maximum rate of
that path is measured (unthrottled producers, a numbered message set); then
it runs at half that rate for ``FEDGATE_SOAK_SECONDS`` (default 1800).
Meanwhile every node's resident memory (``VmRSS`` in /proc/PID/status) and
open file descriptors (/proc/PID/fd) are sampled. Checks:

* RSS at the end is at most 5 % above RSS after the warm-up (the first 15 %
  of the run, at least 20 s), for every node. Compared is the floor of each
  window (its lowest sample, windows of 10 % of the run): a leak raises the
  floor, while a fragment's momentary backlog only makes peaks (printed);
* open file descriptors at the end are no more than after the warm-up;
* every message is delivered exactly once (no fault is injected), bodies
  checked by the consumers (``--check-body``, ``--summary`` so that millions
  of messages do not print a line each).
"""

from __future__ import annotations

import base64
import os
import threading
import time
import zlib

import pytest
from fault_workload import MessageSet

SOAK_SECONDS = float(os.environ.get("FEDGATE_SOAK_SECONDS", "1800"))
PRODUCERS = 2
CONSUMERS = 2
CREDIT = 100
PROBE_MESSAGES = 5000  # per producer, for measuring the maximum rate
RSS_GROWTH = 0.05

pytestmark = pytest.mark.soak


def rss_kib(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


class Sampler(threading.Thread):
    """(seconds since start, {node: (rss KiB, fds)}) every ``period`` seconds."""

    def __init__(self, nodes: dict, period: float) -> None:
        super().__init__(daemon=True)
        self.nodes, self.period = nodes, period
        self.samples: list[tuple[float, dict]] = []
        self.stopped = threading.Event()
        self.started = time.monotonic()
        self.start()

    def run(self) -> None:
        while not self.stopped.is_set():
            now = time.monotonic() - self.started
            self.samples.append((now, {name: (rss_kib(node.proc.pid), open_fds(node.proc.pid))
                                       for name, node in self.nodes.items()}))
            self.stopped.wait(self.period)

    def window(self, start: float, end: float) -> list[dict]:
        return [sample for at, sample in self.samples if start <= at <= end]


def merge_seen(finals: list[dict], names: list[str], count: int) -> tuple[int, int]:
    """(lost, duplicates) from the consumers' --summary counts."""
    totals = {name: bytearray(count) for name in names}
    for final in finals:
        for name, encoded in (final.get("seen") or {}).items():
            seen = zlib.decompress(base64.b64decode(encoded))
            assert name in totals, f"unexpected producer {name!r}"
            assert not any(seen[count:]), f"{name}: sequence numbers beyond {count}"
            total = totals[name]
            for seq, n in enumerate(seen[:count]):
                if n:
                    total[seq] = min(255, total[seq] + n)
    lost = sum(total.count(0) for total in totals.values())
    duplicates = sum(n - 1 for total in totals.values() for n in total if n > 1)
    return lost, duplicates


@pytest.mark.timeout(SOAK_SECONDS + 900)
def test_soak_half_max_rate_memory_and_fds_stay_flat(start_node, clients):
    from conftest import free_port

    ports = {"n1": free_port(), "n2": free_port()}
    rule = {"name": "soak", "match": "soak.#", "kind": "fragmented", "fragments": ["n1", "n2"]}
    nodes = {name: start_node({"node": {"listen": f"127.0.0.1:{ports[name]}"},
                               "peers": {other: f"amqp://127.0.0.1:{ports[other]}"},
                               "rules": [rule]}, name=name)
             for name, other in (("n1", "n2"), ("n2", "n1"))}
    nodes["p"] = start_node({"rules": [{"name": "to-n1", "match": "soak.#", "kind": "proxy",
                                        "primary": nodes["n1"].url}]}, name="p")

    # 1. the maximum rate of the path
    probe = MessageSet(clients, send_url=nodes["p"].url, receive_url=nodes["n2"].url,
                       address="soak.probe", producers=PRODUCERS, per_producer=PROBE_MESSAGES,
                       consumers=CONSUMERS, credit=CREDIT, timeout_ms=120000, prefix="probe")
    probe.start()
    result = probe.finish(timeout=180, quiet=0.2)
    probe.stop()
    assert not result.lost and not result.corrupt, (len(result.lost), result.corrupt[:3])
    elapsed = max(reader.last_line for reader in probe.readers) - probe.started  # last delivery
    max_rate = len(probe.expected) / elapsed
    rate = max_rate / 2
    per_producer = int(rate / PRODUCERS * SOAK_SECONDS)

    # 2. half of it, for SOAK_SECONDS
    names = [f"s{i}" for i in range(PRODUCERS)]
    consumers = [clients("proton", "receive", nodes["n2"].url, address="soak.run", count=0,
                         credit=CREDIT, check_body=True, summary=True, idle_ms=15000,
                         timeout_ms=int((SOAK_SECONDS + 600) * 1000)) for _ in range(CONSUMERS)]
    sampler = Sampler(nodes, period=max(1.0, min(10.0, SOAK_SECONDS / 120)))
    started = time.monotonic()
    producers = [clients("proton", "send", nodes["p"].url, address="soak.run", count=per_producer,
                         prefix=name, rate=rate / PRODUCERS,
                         timeout_ms=int((SOAK_SECONDS + 300) * 1000)) for name in names]
    sent = [p.finish(timeout=SOAK_SECONDS + 400)[-1] for p in producers]
    load_seconds = time.monotonic() - started
    finals = [c.finish(timeout=120)[-1] for c in consumers]
    sampler.stopped.set()
    sampler.join(timeout=30)

    warm = max(20.0, 0.15 * load_seconds)
    span = max(10.0, 0.1 * load_seconds, 3 * sampler.period)
    baseline = sampler.window(warm, warm + span)
    ending = sampler.window(load_seconds - span, load_seconds)
    lost, duplicates = merge_seen(finals, names, per_producer)
    print(f"\nSOAK {load_seconds:.0f}s: max rate {max_rate:.0f} msg/s, soak rate {rate:.0f} msg/s "
          f"({PRODUCERS * per_producer} messages), lost {lost}, duplicates {duplicates}")
    growth = {}
    for name in nodes:
        rss0 = min(s[name][0] for s in baseline)
        rss1 = min(s[name][0] for s in ending)
        fd0 = max(s[name][1] for s in baseline)
        fd1 = max(s[name][1] for s in ending)
        peak = max(s[name][0] for _, s in sampler.samples)
        growth[name] = (rss0, rss1, fd0, fd1)
        print(f"  node {name}: RSS {rss0} KiB after warm-up -> {rss1} KiB at the end "
              f"({(rss1 / rss0 - 1) * 100:+.1f} %, peak {peak} KiB); open fds {fd0} -> {fd1}")
        step = max(1, len(sampler.samples) // 10)
        print("    RSS KiB over time: " + ", ".join(
            f"{at:.0f}s {sample[name][0]}" for at, sample in sampler.samples[::step]))

    for result in sent:
        assert result["error"] is None and result["accepted"] == per_producer, result
    for final in finals:
        assert final["error"] is None, final
    assert lost == 0 and duplicates == 0, (lost, duplicates)
    for name, (rss0, rss1, fd0, fd1) in growth.items():
        assert rss1 <= rss0 * (1 + RSS_GROWTH), f"{name}: RSS grew {rss0} -> {rss1} KiB"
        assert fd1 <= fd0, f"{name}: open file descriptors grew {fd0} -> {fd1}"
