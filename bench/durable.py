#!/usr/bin/env python3
"""Durable vs non-durable local-queue throughput, and journal recovery time.

Run from the repo root (after ``bash .ci/install/c-clients-durable.sh``, which
also runs ``.ci/install/c-clients.sh``):

    .venv/bin/python bench/durable.py [--rounds 3] [--messages 200000]
                                      [--recovery-messages 1000000]

Throughput. Nodes are started once each (fresh temp data dirs, ``--config``
written here) and measured in alternating order per round, one quiet C
receiver + one C sender of N messages per run, as in ``bench/local_queue.py``:

* ``memory``: ``[queues] durable = false``, the stock quiet sender;
* ``durable``: ``[queues] durable = true``, ``[journal] fsync = true``, and
  ``.build/bench/send-durable`` (the same sender with the header's durable
  field set: every message is journaled, fsynced, and its dequeue journaled);
* ``durable-nofsync``: the same with ``[journal] fsync = false`` (safe against
  a process crash only), for orientation.

Reported per run: msgs/s = N / elapsed, node CPU µs per message; summary:
medians and the durable / memory ratio (goal: >= 0.5).

Recovery. ``--recovery-messages`` durable messages (an AMQP message with a
durable header and a 100-byte body, ~130 bytes) are written with the journal
API directly (fsync on), then timed: a fresh ``Journal.open()`` (read, check,
rebuild the live set), and a node start on that data dir until its port
accepts connections (recovery + refilling the queue + listening).

Results go to ``bench/results/durable.json`` (``--output -`` for none).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as h  # noqa: E402
from charts import save_bars  # noqa: E402

sys.path.insert(0, str(h.REPO_ROOT))

SEND_DURABLE_BIN = h.BUILD_DIR / "send-durable"
MODES = ("memory", "durable", "durable-nofsync")
GOAL_RATIO = 0.5


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def node_config(mode: str) -> str:
    durable = mode != "memory"
    lines = ["[queues]", f"durable = {'true' if durable else 'false'}"]
    if durable:
        lines += ["[journal]", f"fsync = {'false' if mode == 'durable-nofsync' else 'true'}"]
    return "\n".join(lines) + "\n"


class NodeTarget:
    host = "127.0.0.1"

    def __init__(self, mode: str, workdir: Path, args) -> None:
        self.mode = mode
        self.args = args
        self.dir = workdir / mode
        self.dir.mkdir(parents=True)
        self.config = self.dir / "node.toml"
        self.config.write_text(node_config(mode))
        self.data_dir = self.dir / "data"
        self.log_path = self.dir / "node.log"
        self.port = 0
        self.proc: subprocess.Popen | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def start(self) -> None:
        self.port = h.free_port(self.host)
        self.proc = h.start_fedgate_node(self.port, self.data_dir, host=self.host,
                                         extra_args=["--config", str(self.config)],
                                         log_path=self.log_path,
                                         ready_timeout=self.args.node_start_timeout)
        log(f"{self.mode}: node pid {self.proc.pid} on {self.host}:{self.port}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def sender(self, address: str, n: int) -> list[str]:
        cmd = h.sender_cmd(self.host, self.port, address, n, self.args.body_bytes)
        if self.mode != "memory":
            cmd[0] = str(SEND_DURABLE_BIN)
        return cmd

    def journal_files(self) -> list[str]:
        directory = self.data_dir / "journal"
        return sorted(p.name for p in directory.glob("*.seg")) if directory.is_dir() else []

    def stop(self) -> None:
        h.stop_process(self.proc)
        self.proc = None


def run_one(target: NodeTarget, tag: str, n: int, args) -> dict:
    address = f"bench-{tag}"
    meter = h.CpuMeter(target.pid, tree=True).start()
    res = h.run_concurrently([
        h.receiver_cmd(target.host, target.port, address, n, args.credit),
        target.sender(address, n),
    ], timeout=args.timeout)
    cpu = meter.stop()
    row = {
        "mode": target.mode,
        "messages": n,
        "ok": res.ok,
        "elapsed_s": round(res.elapsed, 4),
        "msgs_per_s": round(n / res.elapsed, 1) if res.ok and res.elapsed > 0 else None,
        "node_cpu_s": round(cpu, 3),
        "cpu_us_per_msg": round(cpu * 1e6 / n, 2) if res.ok else None,
    }
    if not res.ok:
        row["error"] = res.describe_failure()
    return row


def throughput(args, workdir: Path) -> tuple[list[dict], dict]:
    targets = [NodeTarget(mode, workdir, args) for mode in args.modes]
    rows: list[dict] = []
    started = []
    try:
        for target in targets:
            target.start()
            started.append(target)
        if args.warmup:
            for target in targets:
                r = run_one(target, "warmup", args.warmup, args)
                log(f"warm-up {target.mode}: "
                    + (f"{r['msgs_per_s']:,.0f} msgs/s" if r["ok"] else f"FAILED {r['error']}"))
        for rnd in range(1, args.rounds + 1):
            order = targets if rnd % 2 else list(reversed(targets))
            print(f"\nround {rnd}")
            for target in order:
                if not target.alive():
                    row = {"mode": target.mode, "messages": args.messages, "ok": False,
                           "msgs_per_s": None, "cpu_us_per_msg": None, "elapsed_s": 0.0,
                           "node_cpu_s": 0.0, "error": "node process gone"}
                else:
                    row = run_one(target, str(rnd), args.messages, args)
                row["round"] = rnd
                rows.append(row)
                print(f"  {row['mode']:<16} {fmt(row['msgs_per_s'], ',.0f'):>10} msgs/s "
                      f"{fmt(row['cpu_us_per_msg'], '.1f'):>7} µs/msg"
                      + ("" if row["ok"] else f"  FAILED: {row['error']}"), flush=True)
        journals = {t.mode: t.journal_files() for t in targets if t.mode != "memory"}
    finally:
        for target in reversed(started):
            target.stop()
    summary = {}
    for mode in args.modes:
        good = [r for r in rows if r["mode"] == mode and r["ok"]]
        summary[mode] = {
            "runs_ok": len(good),
            "median_msgs_per_s": h.median([r["msgs_per_s"] for r in good]),
            "median_cpu_us_per_msg": h.median([r["cpu_us_per_msg"] for r in good]),
        }
    summary["journal_segments_left"] = journals
    return rows, summary


def fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def recovery(args, workdir: Path) -> dict:
    from proton import Message

    from proxy.journal.journal import Journal

    data_dir = workdir / "recovery" / "data"
    directory = data_dir / "journal"
    payload = bytes(Message(body=b"x" * 100, durable=True).encode())
    n = args.recovery_messages
    journal = Journal(directory, fsync=True)
    journal.open()
    t0 = time.monotonic()
    for _ in range(n):
        journal.enqueue("bench-recovery", payload)
    journal.close()
    write_s = time.monotonic() - t0
    size = sum(p.stat().st_size for p in directory.glob("*.seg"))
    log(f"recovery: {n:,} messages journaled in {write_s:.1f}s ({size / 1e6:.0f} MB)")

    fresh = Journal(directory, fsync=True)
    t0 = time.monotonic()
    recovered = fresh.open()
    open_s = time.monotonic() - t0
    fresh.close()
    count = recovered.messages
    del recovered
    if count != n:
        raise h.BenchError(f"recovered {count} of {n} messages")
    log(f"recovery: Journal.open() {open_s:.2f}s")

    config = workdir / "recovery" / "node.toml"
    config.write_text(node_config("durable"))
    port = h.free_port()
    t0 = time.monotonic()
    proc = h.start_fedgate_node(port, data_dir, extra_args=["--config", str(config)],
                                log_path=workdir / "recovery" / "node.log",
                                ready_timeout=args.node_start_timeout)
    node_s = time.monotonic() - t0
    try:
        rss_kb = _rss_kb(proc.pid)
    finally:
        h.stop_process(proc)
    log(f"recovery: node start until listening {node_s:.2f}s (RSS {rss_kb / 1024:.0f} MB)")
    return {
        "messages": n,
        "payload_bytes": len(payload),
        "journal_bytes": size,
        "write_s": round(write_s, 2),
        "write_msgs_per_s": round(n / write_s),
        "journal_open_s": round(open_s, 2),
        "journal_open_msgs_per_s": round(n / open_s),
        "node_start_s": round(node_s, 2),
        "node_rss_mb": round(rss_kb / 1024),
    }


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--messages", "-n", type=int, default=200_000)
    p.add_argument("--modes", default=",".join(MODES), help="subset of: " + ", ".join(MODES))
    p.add_argument("--warmup", type=int, default=5000)
    p.add_argument("--body-bytes", type=int, default=h.DEFAULT_BODY_BYTES)
    p.add_argument("--credit", type=int, default=h.DEFAULT_CREDIT_WINDOW)
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--node-start-timeout", type=float, default=120.0)
    p.add_argument("--recovery-messages", type=int, default=1_000_000,
                   help="0 skips the recovery measurement")
    p.add_argument("--keep-data", action="store_true")
    p.add_argument("--output", default=str(Path("bench") / "results" / "durable.json"))
    a = p.parse_args(argv)
    a.modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    if not a.modes or any(m not in MODES for m in a.modes):
        p.error(f"--modes: choose from {MODES}")
    return a


def main(argv=None) -> int:
    args = parse_args(argv)
    h.require_c_clients()
    if any(m != "memory" for m in args.modes) and not os.access(SEND_DURABLE_BIN, os.X_OK):
        raise h.BenchError(f"{h.rel(SEND_DURABLE_BIN)} missing: "
                           "run bash .ci/install/c-clients-durable.sh")
    workdir = Path(tempfile.mkdtemp(prefix="fedgate-durable-bench-"))
    t_start = time.monotonic()
    try:
        rows, summary = throughput(args, workdir)
        rec = recovery(args, workdir) if args.recovery_messages else None
    finally:
        if args.keep_data:
            log(f"data and logs kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    base = summary.get("memory", {}).get("median_msgs_per_s")
    dur = summary.get("durable", {}).get("median_msgs_per_s")
    ratio = round(dur / base, 3) if base and dur else None
    print("\nsummary (medians)")
    for mode in args.modes:
        s = summary[mode]
        print(f"  {mode:<16} {fmt(s['median_msgs_per_s'], ',.0f'):>10} msgs/s "
              f"{fmt(s['median_cpu_us_per_msg'], '.1f'):>7} µs/msg  ({s['runs_ok']} ok)")
    if ratio is not None:
        print(f"  durable / memory: {ratio:.2f}x (goal >= {GOAL_RATIO}: "
              f"{'met' if ratio >= GOAL_RATIO else 'NOT met'})")
    if rec:
        print(f"  recovery of {rec['messages']:,} messages: Journal.open {rec['journal_open_s']}s, "
              f"node start until listening {rec['node_start_s']}s "
              f"(written at {rec['write_msgs_per_s']:,} msgs/s with fsync)")
    result = {
        "benchmark": "durable",
        "date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "params": {"rounds": args.rounds, "messages": args.messages, "warmup": args.warmup,
                   "body_bytes": args.body_bytes, "credit_window": args.credit,
                   "clients": "quiet C receive + send / send-durable (.ci/install/"
                              "c-clients-durable.sh), 1 sender + 1 receiver"},
        "machine": h.machine_info(),
        "duration_s": round(time.monotonic() - t_start, 1),
        "throughput": summary,
        "ratio_durable_to_memory": ratio,
        "goal_ratio_min": GOAL_RATIO,
        "recovery": rec,
        "runs": rows,
    }
    if args.output != "-":
        out = Path(args.output)
        if not out.is_absolute():
            out = h.REPO_ROOT / out
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
        chart = save_bars(out.with_suffix(".png"), "durable queues: msg/s by mode and round",
                          [f"round {r}" for r in range(1, args.rounds + 1)],
                          {mode: [next((x["msgs_per_s"] for x in rows if x["mode"] == mode
                                        and x["round"] == r), None) for r in range(1, args.rounds + 1)]
                           for mode in args.modes}, "msg/s")
        log(f"wrote {h.rel(out)}" + (f" and {h.rel(chart)}" if chart else ""))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except h.BenchError as e:
        log(f"error: {e}")
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
