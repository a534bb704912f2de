#!/usr/bin/env python3
"""A replicated queue with a paged backlog, a backup catching up from scratch (issue #44,
docs/paging.md, docs/replication.md).

Run from the repo root (after ``bash .ci/install/c-clients.sh``):

    .venv/bin/python bench/paging_catchup.py [--messages 5000000] [--body-bytes 1024]
                                             [--budget-mb 256]

Two fedgate nodes of a static cluster (``[peers]``, no etcd), each with ``[limits]
max_memory`` = the budget, and one replicated rule: ``rep.*``, ``replicas = 2``, ``nodes =
["primary", "backup"]`` (the first serves; ``min_in_sync = 1``, the default: the primary
accepts alone while its backup is away). The nodes run this checkout's code.

1. **Fill**: only the primary runs. The quiet C sender sends N messages to ``rep.catchup``
   (nobody receives): msgs/s, the primary's CPU µs per message, and from its admin API
   what it holds in memory and on disk at the end.
2. **Catch-up**: the backup is started with an empty data dir. Measured from its start
   (the process launched) until the primary's admin API lists it in the queue's
   ``in_sync`` set (polled every 0.25 s): the time to catch up, also from its listener
   being open; the backups' ``catchup_left`` once a second; both nodes' CPU seconds.
3. **Drain**: the quiet C receiver takes N messages from the primary (it exits 0 only when
   it got all N), then the queue's depth on the primary and the copy's depth on the
   backup are read until both are 0 (bounded): nothing lost, nothing left over.

Both nodes' RSS is sampled every 100 ms throughout: the peak per phase, and a sample a
second (with ``catchup_left``) in the results. Results go to
``bench/results/paging_catchup.json`` (``--output -`` for none). See bench/README.md,
"Queues larger than memory".
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
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as h  # noqa: E402
from paging import rss_mb  # noqa: E402

TOKEN = "bench-token-0123456789"
ADDRESS = "rep.catchup"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class Node:
    host = "127.0.0.1"

    def __init__(self, name: str, peer: str, workdir: Path, ports: dict, args) -> None:
        self.name = name
        self.dir = workdir / name
        self.dir.mkdir(parents=True)
        self.port = ports[name]
        self.admin_port = h.free_port()
        lines = ["[node]", f'id = "{name}"', "",
                 "[admin]", f'listen = "127.0.0.1:{self.admin_port}"',
                 f'tokens = [{{token = "{TOKEN}", role = "read"}}]', "",
                 "[limits]", f"max_memory = {args.budget_mb * 1024 * 1024}", "min_free_disk = 0", "",
                 "[[rules]]", 'name = "rep"', 'match = "rep.*"', 'kind = "replicated"',
                 "replicas = 2", 'nodes = ["primary", "backup"]', "",
                 "[peers]", f'{peer} = "amqp://127.0.0.1:{ports[peer]}"', ""]
        self.config = self.dir / "node.toml"
        self.config.write_text("\n".join(lines))
        self.proc: subprocess.Popen | None = None

    def start(self) -> float:
        """Start the node; the seconds until its listener accepted."""
        env = {**os.environ, "PYTHONPATH": str(h.REPO_ROOT)}
        t0 = time.monotonic()
        self.proc = h.start_fedgate_node(self.port, self.dir / "data", host=self.host,
                                         extra_args=["--config", str(self.config)],
                                         log_path=self.dir / "node.log", admin=None, env=env,
                                         ready_timeout=60.0)
        log(f"{self.name}: pid {self.proc.pid} on {self.host}:{self.port}")
        return time.monotonic() - t0

    def get(self, path: str, timeout: float = 10.0) -> dict:
        request = urllib.request.Request(f"http://127.0.0.1:{self.admin_port}{path}",
                                         headers={"Authorization": f"Bearer {TOKEN}"})
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())

    def replication(self) -> dict:
        for item in self.get("/api/v1/queues")["queues"]:
            if item.get("name") == ADDRESS:
                return item.get("replication") or {}
        return {}

    def memory(self) -> dict:
        memory = self.get("/api/v1/node")["memory"]
        paging = memory.get("paging") or {}
        return {**{k: memory.get(k) for k in ("queued_bytes", "resident_bytes", "paged_bytes", "bound")},
                **{k: paging.get(k) for k in ("backups_paged_bytes", "disk_bytes", "live_bytes",
                                              "paged_out", "read_back")}}

    def stop(self) -> None:
        h.stop_process(self.proc, timeout=30)
        self.proc = None


class Watch:
    """Both nodes' RSS every 100 ms: peaks per phase, a sample a second (plus a note)."""

    def __init__(self, nodes: list[Node]) -> None:
        self.nodes = nodes
        self.phase = "fill"
        self.note = None  # a callable giving a small value to keep with each second's sample
        self.peaks: dict[str, dict[str, float]] = {}
        self.samples: list = []
        self._t0 = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        last = -1
        while not self._stop.wait(0.1):
            now = {n.name: round(rss_mb(n.proc.pid), 1) if n.proc else 0.0 for n in self.nodes}
            peaks = self.peaks.setdefault(self.phase, {})
            for name, value in now.items():
                peaks[name] = max(peaks.get(name, 0.0), value)
            second = int(time.monotonic() - self._t0)
            if second != last:
                last = second
                sample = {"t": second, "phase": self.phase, **now}
                note = self.note
                if note is not None:
                    try:
                        sample.update(note())
                    except (OSError, ValueError, KeyError):
                        pass
                self.samples.append(sample)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def wait_for(predicate, timeout: float, what: str, interval: float = 0.25):
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = predicate()
        except (OSError, ValueError):
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise h.BenchError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=5_000_000)
    parser.add_argument("--body-bytes", type=int, default=1024)
    parser.add_argument("--budget-mb", type=int, default=256)
    parser.add_argument("--credit", type=int, default=1000)
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--output", default=str(h.REPO_ROOT / "bench" / "results" / "paging_catchup.json"))
    args = parser.parse_args()
    h.require_c_clients()
    n = args.messages
    workdir = Path(tempfile.mkdtemp(prefix="fedgate-catchup-bench-"))
    ports = {"primary": h.free_port(), "backup": h.free_port()}
    primary = Node("primary", "backup", workdir, ports, args)
    backup = Node("backup", "primary", workdir, ports, args)
    result: dict = {"messages": n, "body_bytes": args.body_bytes, "budget_mb": args.budget_mb}
    watch = None
    ok = False
    try:
        primary.start()
        watch = Watch([primary, backup])
        print(f"{n:,} messages of {args.body_bytes} bytes to {ADDRESS}, budget {args.budget_mb} MB "
              "on each node", flush=True)

        # 1. fill, the backup away
        meter = h.CpuMeter(primary.proc.pid).start()
        run = h.run_concurrently([h.sender_cmd(primary.host, primary.port, ADDRESS, n,
                                               args.body_bytes)], timeout=args.timeout)
        cpu = meter.stop()
        if not run.ok:
            raise h.BenchError(f"fill: {run.describe_failure()}")
        result["fill"] = {"elapsed_s": round(run.elapsed, 2), "msgs_per_s": round(n / run.elapsed, 1),
                          "cpu_us_per_msg": round(cpu * 1e6 / n, 2),
                          "primary_memory": primary.memory(),
                          "depth": primary.replication().get("depth")}
        print(f"  fill   {n / run.elapsed:>9,.0f} msgs/s {cpu * 1e6 / n:6.1f} µs/msg | primary "
              f"RSS peak {watch.peaks['fill']['primary']:,.0f} MB | {result['fill']['primary_memory']}"
              f" depth {result['fill']['depth']}", flush=True)

        # 2. the backup starts from scratch; until the primary lists it in sync
        watch.phase = "catchup"

        def catchup_note() -> dict:
            backups = primary.replication().get("backups") or []
            return {"catchup_left": next((b.get("catchup_left") for b in backups
                                          if b.get("node") == "backup"), None),
                    "backup_state": next((b.get("state") for b in backups
                                          if b.get("node") == "backup"), None)}
        cpu_p = h.tree_cpu_seconds(primary.proc.pid)
        t0 = time.monotonic()
        listening = backup.start()
        cpu_b = h.CpuMeter(backup.proc.pid).start()
        watch.note = catchup_note
        wait_for(lambda: "backup" in (primary.replication().get("in_sync") or []),
                 args.timeout, "the backup in sync")
        synced = time.monotonic() - t0
        watch.note = None
        cpu_b = cpu_b.stop()
        cpu_p = h.tree_cpu_seconds(primary.proc.pid) - cpu_p
        time.sleep(0.3)  # a few more samples after it
        copy = backup.replication()
        result["catchup"] = {
            "seconds_from_start": round(synced, 2), "backup_listening_s": round(listening, 2),
            "seconds_from_listening": round(synced - listening, 2),
            "msgs_per_s": round(n / (synced - listening), 1),
            "primary_cpu_s": round(cpu_p, 2), "backup_cpu_s": round(cpu_b, 2),
            "primary_cpu_us_per_msg": round(cpu_p * 1e6 / n, 2),
            "backup_cpu_us_per_msg": round(cpu_b * 1e6 / n, 2),
            "primary_rss_peak_mb": watch.peaks["catchup"]["primary"],
            "backup_rss_peak_mb": watch.peaks["catchup"]["backup"],
            "backup_copy": {k: (copy.get("copy") or {}).get(k) for k in ("depth",)} | {
                "role": copy.get("role")},
            "backup_memory": backup.memory(), "primary_memory": primary.memory()}
        c = result["catchup"]
        print(f"  catch-up {c['seconds_from_start']:.1f} s from the backup's start "
              f"({c['seconds_from_listening']:.1f} s from its listener, {c['msgs_per_s']:,.0f} msgs/s) "
              f"| RSS peak primary {c['primary_rss_peak_mb']:,.0f} MB, backup "
              f"{c['backup_rss_peak_mb']:,.0f} MB | CPU primary {c['primary_cpu_s']:.1f} s, backup "
              f"{c['backup_cpu_s']:.1f} s | backup copy {c['backup_copy']} {c['backup_memory']}",
              flush=True)

        # 3. drain from the primary; both copies empty after
        watch.phase = "drain"

        def drain_note() -> dict:  # events waiting for the backup (dequeues): the primary's RSS
            backups = primary.replication().get("backups") or []
            return {"lag_messages": next((b.get("lag_messages") for b in backups
                                          if b.get("node") == "backup"), None)}
        watch.note = drain_note
        meter = h.CpuMeter(primary.proc.pid).start()
        meter_b = h.CpuMeter(backup.proc.pid).start()
        run = h.run_concurrently([h.receiver_cmd(primary.host, primary.port, ADDRESS, n,
                                                 args.credit)], timeout=args.timeout)
        cpu, cpu_b = meter.stop(), meter_b.stop()
        drain = {"ok": run.ok, "elapsed_s": round(run.elapsed, 2),
                 "msgs_per_s": round(n / run.elapsed, 1) if run.ok else None,
                 "cpu_us_per_msg": round(cpu * 1e6 / n, 2),
                 "backup_cpu_us_per_msg": round(cpu_b * 1e6 / n, 2)}
        if not run.ok:
            drain["error"] = run.describe_failure()
        try:
            wait_for(lambda: primary.replication().get("depth") == 0
                     and (backup.replication().get("copy") or {}).get("depth") == 0, 60.0,
                     "both copies empty")
            drain["empty_after"] = True
        except h.BenchError:
            drain["empty_after"] = False
        drain["primary_depth_after"] = primary.replication().get("depth")
        drain["backup_depth_after"] = (backup.replication().get("copy") or {}).get("depth")
        result["drain"] = drain
        print(f"  drain  {fmt(drain['msgs_per_s'])} msgs/s {drain['cpu_us_per_msg']:6.1f} µs/msg | "
              f"received all {n:,}: {run.ok} | depth after: primary {drain['primary_depth_after']}, "
              f"backup {drain['backup_depth_after']}", flush=True)
        ok = run.ok and drain["empty_after"]
    finally:
        if watch is not None:
            watch.stop()
            result["rss_peaks_mb"] = watch.peaks
            result["rss_samples"] = watch.samples
        logs = {node.name: node.dir / "node.log" for node in (primary, backup)}
        for node in (backup, primary):
            node.stop()
        result["log_warnings"] = {
            name: [line for line in path.read_text(errors="replace").splitlines()
                   if " WARNING " in line or " ERROR " in line][-20:]
            for name, path in logs.items() if path.exists()}
        shutil.rmtree(workdir, ignore_errors=True)
    print("\nsummary:", json.dumps({k: v for k, v in result.items()
                                    if k not in ("rss_samples", "log_warnings")}, indent=1))
    if args.output != "-":
        out = Path(args.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"date": _dt.datetime.now().isoformat(timespec="seconds"),
                                   "machine": h.machine_info(),
                                   "args": {**vars(args), "output": h.rel(out)},
                                   "ok": ok, **result}, indent=1))
        log(f"results: {h.rel(out)}")
    return 0 if ok else 1


def fmt(value) -> str:
    return "-" if value is None else f"{value:>9,.0f}"


if __name__ == "__main__":
    sys.exit(main())
