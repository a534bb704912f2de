#!/usr/bin/env python3
"""Local-queue throughput: a fedgate node vs RabbitMQ 3.10, same C clients.

Run from the repo root (after .ci/install/rabbitmq.sh and .ci/install/c-clients.sh):

    .venv/bin/python bench/local_queue.py [--rounds 3] [--messages 200000]

Each round runs every target once (order alternates between rounds); a run is
one quiet C receiver and one C sender of N messages started together against
the target, timed until both exit. Reported per run: msgs/s = N / elapsed and
the broker process's CPU time delta / N (µs per message). The summary (medians,
fedgate/rabbitmq ratio) is printed and written to bench/results/local_queue.json.
See bench/README.md.
"""

from __future__ import annotations

import argparse
import os
import datetime as _dt
import json
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as h  # noqa: E402
from charts import save_bars  # noqa: E402

TARGETS = ("fedgate", "rabbitmq")
# Goals for the fedgate node (bench/README.md).
GOAL_RATIO = 3.0
GOAL_CPU_US = 30.0


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class Target:
    name = ""
    host = "127.0.0.1"
    port = 0
    pid = 0

    def address(self, tag: str) -> str:
        raise NotImplementedError

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def alive(self) -> bool:
        return True

    def describe(self) -> dict:
        return {"host": self.host, "port": self.port}


class FedgateTarget(Target):
    name = "fedgate"

    def __init__(self, args):
        self.args = args
        self.proc: subprocess.Popen | None = None
        self.tmp: str | None = None
        self.log_path: Path | None = None

    def address(self, tag: str) -> str:
        return f"bench-{tag}"

    def start(self) -> None:
        exe = Path(self.args.fedgate_bin) if self.args.fedgate_bin else h.fedgate_bin()
        self.tmp = tempfile.mkdtemp(prefix="fedgate-bench-")
        self.port = h.free_port(self.host)
        self.log_path = Path(self.tmp) / "node.log"
        t0 = time.monotonic()
        self.proc = h.start_fedgate_node(self.port, Path(self.tmp) / "data", host=self.host,
                                         log_path=self.log_path, exe=exe,
                                         extra_args=shlex.split(self.args.node_args),
                                         ready_timeout=self.args.node_start_timeout)
        self.pid = self.proc.pid
        log(f"fedgate node pid {self.pid} on {self.host}:{self.port} "
            f"(ready in {time.monotonic() - t0:.1f}s): {' '.join(self.proc.args[1:])}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except (OSError, AttributeError):
            return ""

    def stop(self) -> None:
        try:
            rc = h.stop_process(self.proc)
            if self.proc is not None:
                log(f"fedgate node stopped (rc={rc})")
        finally:
            self.proc = None
            if self.tmp and not self.args.keep_data:
                shutil.rmtree(self.tmp, ignore_errors=True)
            elif self.tmp:
                log(f"fedgate data and log kept in {self.tmp}")


class RabbitTarget(Target):
    name = "rabbitmq"

    def __init__(self, args):
        self.host, self.port = args.rabbitmq_host, args.rabbitmq_port

    def address(self, tag: str) -> str:
        return f"/queue/bench-{tag}"

    def _locate(self, wait: float) -> None:
        """(Re)find beam.smp; waits up to ``wait`` s for the port (tests on the
        same machine may be restarting the broker)."""
        try:
            h.wait_for_port(self.host, self.port, timeout=wait, interval=0.5)
        except h.BenchError:
            raise h.BenchError(f"RabbitMQ not reachable on {self.host}:{self.port}: "
                               "run bash .ci/install/rabbitmq.sh") from None
        pid = h.rabbitmq_pid(self.port)
        if pid != self.pid:
            if self.pid:
                log(f"rabbitmq was restarted: beam.smp pid {self.pid} -> {pid}")
            else:
                log(f"rabbitmq beam.smp pid {pid} on {self.host}:{self.port}")
            self.pid = pid

    def start(self) -> None:
        self._locate(wait=30.0)
        self._purge_stale()

    def alive(self) -> bool:
        try:
            self._locate(wait=60.0)
            return True
        except h.BenchError as e:
            log(str(e))
            return False

    def stop(self) -> None:
        self._purge_stale()

    def _purge_stale(self) -> None:
        """Empty bench-* queues left non-empty (by an aborted run, or by RabbitMQ
        3.10 requeueing a few accepted messages when the receiver detaches
        right after its last accept; see bench/README.md)."""
        ctl = shutil.which("rabbitmqctl")
        if not ctl:
            return
        try:
            out = subprocess.run([ctl, "-n", "rabbit@localhost", "-q", "list_queues",
                                  "name", "messages"], capture_output=True, text=True,
                                 timeout=60).stdout
        except (subprocess.TimeoutExpired, OSError):
            return
        for line in out.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0].startswith("bench-") and parts[1].isdigit() \
                    and int(parts[1]) > 0:
                log(f"purging stale queue {parts[0]} ({parts[1]} messages)")
                try:
                    subprocess.run([ctl, "-n", "rabbit@localhost", "-q", "purge_queue",
                                    parts[0]], capture_output=True, timeout=60)
                except (subprocess.TimeoutExpired, OSError):
                    pass


def run_one(target: Target, tag: str, n: int, args) -> dict:
    address = target.address(tag)
    meter = h.CpuMeter(target.pid, tree=True).start()
    res = h.run_client_pair(target.host, target.port, address, n, timeout=args.timeout,
                            body_bytes=args.body_bytes, credit_window=args.credit)
    try:
        cpu = meter.stop()
    except (OSError, ValueError):  # broker process vanished during the run
        cpu = 0.0
        res.runs.append(h.ClientRun(cmd=["broker"], returncode=-1,
                                    output=f"process {target.pid} gone during run", elapsed=0))
    row = {
        "target": target.name,
        "address": address,
        "messages": n,
        "ok": res.ok,
        "elapsed_s": round(res.elapsed, 4),
        "msgs_per_s": round(n / res.elapsed, 1) if res.ok and res.elapsed > 0 else None,
        "broker_cpu_s": round(cpu, 3),
        "cpu_us_per_msg": round(cpu * 1e6 / n, 2) if res.ok else None,
        "clients_cpu_us_per_msg": round(res.clients_cpu * 1e6 / n, 2) if res.ok else None,
    }
    if not res.ok:
        row["error"] = res.describe_failure()
    return row


def fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def print_round(rnd: int, rows: list[dict]) -> None:
    print(f"\nround {rnd}")
    print(f"  {'target':<10} {'msgs/s':>10} {'elapsed s':>10} {'broker CPU s':>13} "
          f"{'µs/msg':>8} {'clients µs/msg':>15}")
    for r in rows:
        print(f"  {r['target']:<10} {fmt(r['msgs_per_s'], ',.0f'):>10} "
              f"{r['elapsed_s']:>10.2f} {r['broker_cpu_s']:>13.2f} "
              f"{fmt(r['cpu_us_per_msg'], '.1f'):>8} "
              f"{fmt(r['clients_cpu_us_per_msg'], '.1f'):>15}"
              + (f"  FAILED: {r['error']}" if not r["ok"] else ""))
    sys.stdout.flush()


def summarize(rows: list[dict], names: list[str]) -> dict:
    per = {}
    for name in names:
        good = [r for r in rows if r["target"] == name and r["ok"]]
        per[name] = {
            "runs_ok": len(good),
            "runs_failed": sum(1 for r in rows if r["target"] == name and not r["ok"]),
            "median_msgs_per_s": h.median([r["msgs_per_s"] for r in good]),
            "median_cpu_us_per_msg": h.median([r["cpu_us_per_msg"] for r in good]),
            "median_clients_cpu_us_per_msg": h.median([r["clients_cpu_us_per_msg"] for r in good]),
        }
    out = {"targets": per}
    f, r = per.get("fedgate", {}), per.get("rabbitmq", {})
    if f.get("median_msgs_per_s") and r.get("median_msgs_per_s"):
        out["ratio_fedgate_to_rabbitmq"] = round(f["median_msgs_per_s"] / r["median_msgs_per_s"], 3)
    if "fedgate" in per:
        ratio = out.get("ratio_fedgate_to_rabbitmq")
        cpu = f.get("median_cpu_us_per_msg")
        out["goals"] = {
            "ratio_min": GOAL_RATIO,
            "fedgate_cpu_us_per_msg_max": GOAL_CPU_US,
            "ratio_met": None if ratio is None else ratio >= GOAL_RATIO,
            "cpu_met": None if cpu is None else cpu <= GOAL_CPU_US,
        }
    return out


def print_summary(summary: dict) -> None:
    print("\nsummary (medians over successful rounds)")
    print(f"  {'target':<10} {'msgs/s':>10} {'µs/msg':>8} {'clients µs/msg':>15} {'ok/failed':>10}")
    for name, s in summary["targets"].items():
        print(f"  {name:<10} {fmt(s['median_msgs_per_s'], ',.0f'):>10} "
              f"{fmt(s['median_cpu_us_per_msg'], '.1f'):>8} "
              f"{fmt(s['median_clients_cpu_us_per_msg'], '.1f'):>15} "
              f"{str(s['runs_ok']) + '/' + str(s['runs_failed']):>10}")
    if "ratio_fedgate_to_rabbitmq" in summary:
        print(f"  ratio fedgate/rabbitmq: {summary['ratio_fedgate_to_rabbitmq']:.2f}x")
    g = summary.get("goals")
    if g:
        def word(v):
            return "n/a" if v is None else ("met" if v else "NOT met")
        print(f"  goal ratio >= {g['ratio_min']:g}: {word(g['ratio_met'])}; "
              f"goal fedgate CPU <= {g['fedgate_cpu_us_per_msg_max']:g} µs/msg: "
              f"{word(g['cpu_met'])}")
    sys.stdout.flush()


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--messages", "-n", type=int, default=200_000)
    p.add_argument("--targets", default=",".join(TARGETS),
                   help="comma-separated subset of: " + ", ".join(TARGETS))
    p.add_argument("--timeout", type=float, default=300.0,
                   help="bound for one run (receiver+sender), seconds")
    p.add_argument("--warmup", type=int, default=5000,
                   help="messages of an unrecorded warm-up run per target (0: none)")
    p.add_argument("--body-bytes", type=int, default=h.DEFAULT_BODY_BYTES)
    p.add_argument("--credit", type=int, default=h.DEFAULT_CREDIT_WINDOW,
                   help="receiver credit window")
    p.add_argument("--rabbitmq-host", default="127.0.0.1")
    p.add_argument("--rabbitmq-port", type=int, default=int(os.environ.get("RABBITMQ_PORT", "5682")))
    p.add_argument("--fedgate-bin", default=None,
                   help="fedgate executable (default: .venv/bin/fedgate)")
    p.add_argument("--node-args", default="",
                   help="extra arguments for 'fedgate serve' (one string, shell-split)")
    p.add_argument("--node-start-timeout", type=float, default=30.0)
    p.add_argument("--keep-data", action="store_true",
                   help="keep the node's temp data dir and log")
    p.add_argument("--output", default=str(Path("bench") / "results" / "local_queue.json"),
                   help="JSON summary path, relative to the repo root unless absolute "
                        "('-' to skip)")
    p.add_argument("--enforce-goals", action="store_true",
                   help="exit 3 if the fedgate goals (ratio, CPU/msg) are not met")
    a = p.parse_args(argv)
    a.targets = [t.strip() for t in a.targets.split(",") if t.strip()]
    bad = [t for t in a.targets if t not in TARGETS]
    if bad or not a.targets:
        p.error(f"unknown target(s) {bad}; choose from {TARGETS}")
    if a.rounds < 1 or a.messages < 1:
        p.error("--rounds and --messages must be >= 1")
    return a


def main(argv=None) -> int:
    args = parse_args(argv)
    h.require_c_clients()
    classes = {"fedgate": FedgateTarget, "rabbitmq": RabbitTarget}
    targets = [classes[name](args) for name in args.targets]
    rows: list[dict] = []
    started: list[Target] = []
    t_start = time.monotonic()
    try:
        for t in targets:
            t.start()
            started.append(t)
        if args.warmup > 0:
            for t in targets:
                r = run_one(t, "warmup", args.warmup, args)
                log(f"warm-up {t.name}: "
                    + (f"{r['msgs_per_s']:,.0f} msgs/s" if r["ok"] else f"FAILED: {r['error']}"))
        for rnd in range(1, args.rounds + 1):
            order = targets if rnd % 2 else list(reversed(targets))
            round_rows = []
            for t in order:
                if not t.alive():
                    row = {"target": t.name, "address": t.address(str(rnd)),
                           "messages": args.messages, "ok": False, "elapsed_s": 0.0,
                           "msgs_per_s": None, "broker_cpu_s": 0.0, "cpu_us_per_msg": None,
                           "clients_cpu_us_per_msg": None, "error": "broker process gone"}
                else:
                    row = run_one(t, str(rnd), args.messages, args)
                if not row["ok"] and isinstance(t, FedgateTarget) and t.log_tail():
                    log("fedgate node log (tail):\n" + t.log_tail())
                row["round"] = rnd
                round_rows.append(row)
            rows.extend(round_rows)
            print_round(rnd, round_rows)
    finally:
        for t in reversed(started):
            try:
                t.stop()
            except Exception as e:  # keep stopping the others
                log(f"stopping {t.name}: {e}")

    summary = summarize(rows, args.targets)
    print_summary(summary)
    result = {
        "benchmark": "local_queue",
        "date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "params": {
            "rounds": args.rounds, "messages": args.messages, "warmup": args.warmup,
            "body_bytes": args.body_bytes, "credit_window": args.credit,
            "clients": "quiet C send/receive from libqpid-proton11-dev-examples "
                       "(.ci/install/c-clients.sh), 1 sender + 1 receiver",
            "addresses": {t.name: t.address("<round>") for t in targets},
            "cpu": "utime+stime delta of the broker process tree (/proc/PID/stat), "
                   "rabbitmq: beam.smp",
        },
        "machine": h.machine_info(),
        "duration_s": round(time.monotonic() - t_start, 1),
        **summary,
        "runs": rows,
    }
    if args.output != "-":
        out = Path(args.output)
        if not out.is_absolute():
            out = h.REPO_ROOT / out
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
        log(f"wrote {h.rel(out)}")
        targets_summary = result.get("targets", {})
        names = list(targets_summary)
        chart = save_bars(out.with_suffix(".png"), "local queue: medians over rounds", names,
                          {"msg/s": [targets_summary[n].get("median_msgs_per_s") for n in names]},
                          "msg/s")
        if chart:
            log(f"wrote {h.rel(chart)}")

    if any(not r["ok"] for r in rows):
        return 1
    g = summary.get("goals") or {}
    if args.enforce_goals and not (g.get("ratio_met") and g.get("cpu_met")):
        return 3
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except h.BenchError as e:
        log(f"error: {e}")
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
