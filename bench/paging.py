#!/usr/bin/env python3
"""Queues larger than memory (issue #44, docs/paging.md): fill a queue with no consumer,
then drain it, with a memory budget (paging) against no budget (everything in memory).

Run from the repo root (after ``bash .ci/install/c-clients.sh``):

    .venv/bin/python bench/paging.py [--messages 2000000] [--body-bytes 1024]
                                     [--budget-mb 256] [--rounds 1]
                                     [--artemis] [--artemis-heap-mb 1024]

Two nodes, started once each with fresh data dirs, measured in alternating order per round:

* ``memory``: no ``[limits] max_memory``: the backlog is held in memory;
* ``paging``: ``[limits] max_memory`` = the budget: bodies beyond it go to the page store.

One run = the quiet C sender sends N messages to an address nobody receives from (the
fill), then the quiet C receiver takes all N (the drain). Each phase: msgs/s = N / elapsed,
and the node's CPU µs per message (utime + stime from ``/proc``). The node's RSS is sampled
every 100 ms; its peak above the RSS before the run is reported, and, from the node's admin
API at the end of the fill, what it held in memory and on disk.

``--artemis`` adds a third side-by-side mode, ``artemis``: ActiveMQ Artemis (the suite's
install, ``.tools/artemis``) as a private instance made for the run in the bench's temporary
folder (``artemis create``, its own free AMQP port: the suite's shared broker is not
touched), JVM heap 1 GB (``--artemis-heap-mb``), the instance's default JVM flags, NIO
journal. Its address-settings for ``bench-<round>`` page beyond ``max-size-bytes`` = the budget
(``address-full-policy`` PAGE); the queues ``bench-<round>`` are ANYCAST queues declared in
``broker.xml``. The same C sender and receiver, the JVM's CPU µs per message and RSS; "after
fill" is the size of its ``data/paging`` folder (what it wrote to page files).

Summary: per mode the medians, and the ratios paging / memory of the fill and drain rates
(goals: fill >= 0.7, drain >= 0.5), and the paging node's peak RSS against budget + 150 MB
(per phase too, and a sample a second in the results). The nodes run this checkout's code.

``--index`` measures only the index's bytes per waiting paged message, in this process
with tracemalloc: a real queue, pager and page store (the I/O on the loop) filled from
100,000 to 300,000 messages, with runs (docs/paging.md, "Runs") and message by message;
and a backup's copy (a ``ReplicaImage`` given a primary's batches), in runs (docs/paging.md,
"A backup's copy in runs") and entry by entry.

Results go to ``bench/results/paging.json`` (``--output -`` for none).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as h  # noqa: E402
from paging_index import (copy_index_bytes, index_bytes, priority_at_runs,  # noqa: E402
                          priority_drain, queue_index_bytes)
from paging_promote import both as promotion  # noqa: E402

sys.path.insert(0, str(h.REPO_ROOT))

MODES = ("memory", "paging", "artemis")  # artemis: with --artemis or --modes
GOALS = {"fill_ratio": 0.7, "drain_ratio": 0.5, "rss_over_budget_mb": 150}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class Node:
    host = "127.0.0.1"

    def __init__(self, mode: str, workdir: Path, args) -> None:
        self.mode = mode
        self.args = args
        self.dir = workdir / mode
        self.dir.mkdir(parents=True)
        self.admin_port = h.free_port()
        lines = ["[admin]", f'listen = "127.0.0.1:{self.admin_port}"',
                 'tokens = [{token = "bench-token-0123456789", role = "read"}]']
        if mode == "paging":
            lines += ["[limits]", f"max_memory = {args.budget_mb * 1024 * 1024}",
                      "min_free_disk = 0"]
        self.config = self.dir / "node.toml"
        self.config.write_text("\n".join(lines) + "\n")
        self.data_dir = self.dir / "data"
        self.proc: subprocess.Popen | None = None
        self.port = 0

    def start(self) -> None:
        self.port = h.free_port(self.host)
        # this checkout's code, not the one the venv's console script was installed from
        env = {**os.environ, "PYTHONPATH": str(h.REPO_ROOT)}
        self.proc = h.start_fedgate_node(self.port, self.data_dir, host=self.host,
                                         extra_args=["--config", str(self.config)],
                                         log_path=self.dir / "node.log", admin=None, env=env)
        log(f"{self.mode}: node pid {self.proc.pid} on {self.host}:{self.port}")

    def memory(self) -> dict:
        request = urllib.request.Request(f"http://127.0.0.1:{self.admin_port}/api/v1/node",
                                         headers={"Authorization": "Bearer bench-token-0123456789"})
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())["memory"]

    def stop(self) -> None:
        h.stop_process(self.proc)
        self.proc = None


ARTEMIS_VERSION = os.environ.get("ARTEMIS_VERSION", "2.40.0")
ARTEMIS_HOME = h.REPO_ROOT / ".tools" / "artemis" / f"apache-artemis-{ARTEMIS_VERSION}"


def dir_bytes(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                pass
    return total


class ArtemisNode:
    """A private Artemis instance, made in ``workdir/artemis`` with ``artemis create``:
    AMQP on a free loopback port, paging beyond the budget for ``bench-<round>``."""

    host = "127.0.0.1"
    mode = "artemis"

    def __init__(self, workdir: Path, args) -> None:
        self.args = args
        self.dir = workdir / "artemis"
        self.proc: subprocess.Popen | None = None
        self.port = 0

    def create(self) -> None:
        exe = ARTEMIS_HOME / "bin" / "artemis"
        if not exe.exists():
            raise h.BenchError(f"{exe} missing: bash .ci/install/artemis.sh installs it")
        out = subprocess.run([str(exe), "create", str(self.dir), "--user", "fedgate",
                              "--password", "fedgate", "--role", "amq", "--allow-anonymous",
                              "--silent", "--no-web", "--no-autotune", "--nio",
                              "--host", self.host, "--name", "fedgate-bench",
                              "--java-memory", f"{self.args.artemis_heap_mb}M",
                              "--no-hornetq-acceptor", "--no-mqtt-acceptor",
                              "--no-stomp-acceptor"],
                             capture_output=True, text=True, timeout=300,
                             stdin=subprocess.DEVNULL)
        if out.returncode != 0:
            raise h.BenchError(f"artemis create failed: {out.stdout[-2000:]}{out.stderr[-2000:]}")
        self.port = h.free_port(self.host)
        xml_path = self.dir / "etc" / "broker.xml"
        xml = xml_path.read_text()
        budget = self.args.budget_mb * 1024 * 1024

        def sub1(pattern: str, repl: str, text: str) -> str:
            new, n = re.subn(pattern, lambda m: repl, text, count=1, flags=re.S)
            if n != 1:
                raise h.BenchError(f"broker.xml: {pattern!r} not found")
            return new

        xml = sub1(r"<acceptors>.*?</acceptors>", f"""<acceptors>
         <acceptor name="amqp">tcp://{self.host}:{self.port}?protocols=AMQP;useEpoll=true;tcpSendBufferSize=1048576;tcpReceiveBufferSize=1048576;amqpCredits=1000;amqpLowCredits=300;amqpMinLargeMessageSize=102400;amqpDuplicateDetection=false</acceptor>
      </acceptors>""", xml)
        # a 2-core shared machine can stall the broker: log, never halt; no disk blocking
        xml = sub1(r"<critical-analyzer-policy>HALT</critical-analyzer-policy>",
                   "<critical-analyzer-policy>LOG</critical-analyzer-policy>", xml)
        xml = sub1(r"<max-disk-usage>90</max-disk-usage>", "<max-disk-usage>100</max-disk-usage>", xml)
        names = [f"bench-{r}" for r in range(1, self.args.rounds + 1)]
        # one setting per address: Artemis' wildcards match whole words ("a.#"), not "bench-#"
        settings = "".join(f"""<address-setting match="{name}">
            <address-full-policy>PAGE</address-full-policy>
            <max-size-bytes>{budget}</max-size-bytes>
            <page-size-bytes>10M</page-size-bytes>
         </address-setting>
         """ for name in names)
        xml = sub1(r'(<address-setting match="#">)', settings + '<address-setting match="#">', xml)
        queues = "".join(f"""
         <address name="{name}"><anycast><queue name="{name}"/></anycast></address>"""
                         for name in names)
        xml = sub1(r"<addresses>", "<addresses>" + queues, xml)
        xml_path.write_text(xml)

    def start(self) -> None:
        self.create()
        self.proc = subprocess.Popen([str(self.dir / "bin" / "artemis"), "run"],
                                     stdin=subprocess.DEVNULL,
                                     stdout=open(self.dir / "console.log", "ab"),
                                     stderr=subprocess.STDOUT, start_new_session=True,
                                     cwd=str(self.dir))
        h.wait_for_port(self.host, self.port, timeout=180, proc=self.proc)
        log(f"artemis: broker pid {self.proc.pid} on {self.host}:{self.port}")

    def memory(self) -> dict:
        return {"paged_bytes": dir_bytes(self.dir / "data" / "paging")}

    def stop(self) -> None:
        h.stop_process(self.proc, timeout=30)
        self.proc = None


class RssPeak:
    """The node's RSS every 100 ms: its peak, per phase, and a sample a second."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = rss_mb(pid)
        self.phase = "fill"
        self.peaks: dict[str, float] = {}
        self.samples: list = []  # (seconds since start, phase, MB), one a second
        self._started = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        last = -1
        while not self._stop.wait(0.1):
            now = rss_mb(self.pid)
            self.peak = max(self.peak, now)
            self.peaks[self.phase] = max(self.peaks.get(self.phase, 0.0), now)
            second = int(time.monotonic() - self._started)
            if second != last:
                last = second
                self.samples.append((second, self.phase, round(now, 1)))

    def stop(self) -> float:
        self._stop.set()
        self._thread.join(5)
        return self.peak


def phase(node: Node, cmd: list[str], n: int, args) -> dict:
    meter = h.CpuMeter(node.proc.pid, tree=True).start()
    result = h.run_concurrently([cmd], timeout=args.timeout)
    cpu = meter.stop()
    row = {"ok": result.ok, "elapsed_s": round(result.elapsed, 3),
           "msgs_per_s": round(n / result.elapsed, 1) if result.ok and result.elapsed else None,
           "cpu_us_per_msg": round(cpu * 1e6 / n, 2) if result.ok else None}
    if not result.ok:
        row["error"] = result.describe_failure()
    return row


def run_one(node: Node, tag: str, n: int, args) -> dict:
    address = f"bench-{tag}"
    before = rss_mb(node.proc.pid)
    watch = RssPeak(node.proc.pid)
    fill = phase(node, h.sender_cmd(node.host, node.port, address, n, args.body_bytes), n, args)
    held = node.memory()
    watch.phase = "drain"
    drain = phase(node, h.receiver_cmd(node.host, node.port, address, n, args.credit), n, args)
    peak = watch.stop()
    return {"mode": node.mode, "messages": n, "fill": fill, "drain": drain,
            "rss_before_mb": round(before, 1), "rss_peak_mb": round(peak, 1),
            "rss_peak_fill_mb": round(watch.peaks.get("fill", 0.0), 1),
            "rss_peak_drain_mb": round(watch.peaks.get("drain", 0.0), 1),
            "rss_after_drain_mb": round(rss_mb(node.proc.pid), 1),
            "rss_samples": watch.samples,
            "rss_growth_mb": round(peak - before, 1),
            "after_fill": {k: held.get(k) for k in ("queued_bytes", "resident_bytes",
                                                    "paged_bytes", "bound")}}


def fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=2_000_000)
    parser.add_argument("--body-bytes", type=int, default=1024)
    parser.add_argument("--budget-mb", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--credit", type=int, default=1000)
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--modes", nargs="+", default=["memory", "paging"], choices=MODES)
    parser.add_argument("--artemis", action="store_true",
                        help="add the artemis mode (a private Artemis instance, paging)")
    parser.add_argument("--artemis-heap-mb", type=int, default=1024)
    parser.add_argument("--output", default=str(h.REPO_ROOT / "bench" / "results" / "paging.json"))
    parser.add_argument("--index", action="store_true",
                        help="only the index's bytes per paged message, in this process")
    args = parser.parse_args()
    if args.index:
        print(json.dumps({"per_message_objects": round(index_bytes(), 1),
                          "queue_message_by_message": queue_index_bytes(False),
                          "queue_with_runs": queue_index_bytes(True),
                          "priority_queue_message_by_message": queue_index_bytes(
                              False, priorities=True),
                          "priority_queue_runs_per_level": queue_index_bytes(
                              True, priorities=True),
                          "priority_at_a_queue_with_runs": priority_at_runs(),
                          "priority_queue_drain_message_by_message": priority_drain(False),
                          "priority_queue_drain_runs_per_level": priority_drain(True),
                          "backup_copy_entry_by_entry": copy_index_bytes(False),
                          "backup_copy_in_runs": copy_index_bytes(True),
                          "durable_backup_copy_in_runs": copy_index_bytes(True, True),
                          "promotion_of_a_paged_copy": promotion()},
                         indent=1))
        return 0
    if args.artemis and "artemis" not in args.modes:
        args.modes.append("artemis")
    h.require_c_clients()
    workdir = Path(tempfile.mkdtemp(prefix="fedgate-paging-bench-"))
    nodes = [ArtemisNode(workdir, args) if mode == "artemis" else Node(mode, workdir, args)
             for mode in args.modes]
    rows = []
    try:
        for node in nodes:
            node.start()
        for rnd in range(1, args.rounds + 1):
            order = nodes if rnd % 2 else list(reversed(nodes))
            print(f"\nround {rnd}: {args.messages:,} messages of {args.body_bytes} bytes, "
                  f"budget {args.budget_mb} MB", flush=True)
            for node in order:
                row = run_one(node, str(rnd), args.messages, args)
                row["round"] = rnd
                rows.append(row)
                print(f"  {node.mode:<7} fill {fmt(row['fill']['msgs_per_s'], ',.0f'):>9} msgs/s "
                      f"{fmt(row['fill']['cpu_us_per_msg'], '.1f'):>6} µs/msg | drain "
                      f"{fmt(row['drain']['msgs_per_s'], ',.0f'):>9} msgs/s "
                      f"{fmt(row['drain']['cpu_us_per_msg'], '.1f'):>6} µs/msg | RSS peak "
                      f"{row['rss_peak_mb']:,.0f} MB (+{row['rss_growth_mb']:,.0f}) | after fill "
                      f"{row['after_fill']}", flush=True)
    finally:
        for node in nodes:
            node.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    summary: dict = {}
    for mode in args.modes:
        good = [r for r in rows if r["mode"] == mode and r["fill"]["ok"] and r["drain"]["ok"]]
        summary[mode] = {
            "fill_msgs_per_s": h.median([r["fill"]["msgs_per_s"] for r in good]),
            "fill_cpu_us_per_msg": h.median([r["fill"]["cpu_us_per_msg"] for r in good]),
            "drain_msgs_per_s": h.median([r["drain"]["msgs_per_s"] for r in good]),
            "drain_cpu_us_per_msg": h.median([r["drain"]["cpu_us_per_msg"] for r in good]),
            "rss_peak_mb": max((r["rss_peak_mb"] for r in good), default=None),
        }
    if all(summary.get(m, {}).get("fill_msgs_per_s") for m in MODES):
        summary["fill_ratio"] = round(summary["paging"]["fill_msgs_per_s"]
                                      / summary["memory"]["fill_msgs_per_s"], 3)
        summary["drain_ratio"] = round(summary["paging"]["drain_msgs_per_s"]
                                       / summary["memory"]["drain_msgs_per_s"], 3)
    if all(summary.get(m, {}).get("fill_msgs_per_s") for m in ("paging", "artemis")):
        summary["artemis_vs_paging"] = {  # > 1: Artemis faster (rates) or costlier (CPU, RSS)
            key: round(summary["artemis"][key] / summary["paging"][key], 3)
            for key in ("fill_msgs_per_s", "fill_cpu_us_per_msg", "drain_msgs_per_s",
                        "drain_cpu_us_per_msg", "rss_peak_mb")}
    if summary.get("paging", {}).get("rss_peak_mb") is not None:
        summary["paging_rss_over_budget_mb"] = round(
            summary["paging"]["rss_peak_mb"] - args.budget_mb, 1)
    summary["index_bytes_per_message"] = round(index_bytes(), 1)
    print("\nsummary:", json.dumps(summary, indent=1))
    if args.output != "-":
        out = Path(args.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"date": _dt.datetime.now().isoformat(timespec="seconds"),
                                   "machine": h.machine_info(),
                                   "args": {**vars(args), "output": h.rel(out)},
                                   "goals": GOALS, "summary": summary, "runs": rows}, indent=1))
        log(f"results: {h.rel(out)}")
    return 0 if all(r["fill"]["ok"] and r["drain"]["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
