#!/usr/bin/env python3
"""Proxy benchmark: RabbitMQ directly vs through a fedgate proxy node; 10,000 idle clients.

Run from the repo root (``make bench-proxy`` installs RabbitMQ and the C clients first):

    .venv/bin/python bench/proxy.py [--rounds 3] [--messages 50000] [--idle 10000]
                                    [--skip-throughput] [--skip-idle]

1. Throughput. Targets: ``rabbitmq`` (C sender and receiver on RabbitMQ,
   address ``/queue/bench-px-<round>-direct``) and ``proxy`` (the same clients on
   a fedgate node whose rule ``rq.* -> /queue/{1}`` proxies to the same
   RabbitMQ, address ``rq.bench-px-<round>-proxy``). Each round runs both (order
   alternates); msgs/s = N / wall time; the node's CPU time per message (both
   directions cross it) and RabbitMQ's. Reported: medians, proxy/direct ratio.
   Two CPU layouts, each with its own rounds and ratio:
   - ``shared``: every process on every CPU. On a 2-CPU machine RabbitMQ alone
     saturates both, so each µs the proxy spends is taken from the broker, and a
     broker that falls behind builds a backlog that costs it more per message.
   - ``split``: RabbitMQ pinned to the first half of the CPUs, the node and the
     clients to the other half (``sched_setaffinity``), as when the proxy runs
     on its own host in front of the broker, the way it is deployed. Run after
     the shared rounds; RabbitMQ's affinity is restored at the end.
2. Idle connections. A fresh node proxies ``idle.*`` to RabbitMQ; one process
   (``bench/idle_clients.py``, proton engine objects in one asyncio loop) opens
   ``--idle`` connections with one receiver link each to ``idle.bench-px-idle``.
   Reported: node RSS delta / connections (baseline taken after one warm-up
   client, so imports and the upstream connection are not counted), the node's
   upstream TCP connections to RabbitMQ (from /proc), and its idle CPU.

Targets (bench/README.md): ratio >= 0.9, <= 30 µs node CPU per message,
<= 30 KB RSS per idle connection, <= 4 upstream connections. The summary is
printed and written to bench/results/proxy.json (``--output -`` for none).
Exit status: 0 ok; 1 a run failed; 2 setup failed; 3 with --enforce-goals when
a target is missed.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as h  # noqa: E402

GOAL_RATIO = 0.9
GOAL_CPU_US = 30.0
GOAL_RSS_KB = 30.0
GOAL_UPSTREAMS = 4
RABBIT_HOST, RABBIT_PORT = "127.0.0.1", 5672
CPUS = len(os.sched_getaffinity(0))  # all of them, also while the split layout pins this process
ADMIN_TOKEN = "bench-read-token-0123456789"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise h.BenchError(f"no VmRSS for pid {pid}")


def established_to(pid: int, port: int) -> int:
    """TCP connections of process ``pid`` established to remote ``port``."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    parts = line.split()
                    if parts[3] == "01" and int(parts[2].rsplit(":", 1)[1], 16) == port \
                            and parts[9] in inodes:
                        count += 1
        except FileNotFoundError:
            continue
    return count


class ProxyNode:
    """A fedgate node with one proxy rule to RabbitMQ, in a temp dir."""

    def __init__(self, args, rule_match: str, name: str, mirror: bool = False) -> None:
        self.args = args
        self.tmp = tempfile.mkdtemp(prefix=f"fedgate-bench-{name}-")
        self.port = h.free_port()
        self.admin = f"127.0.0.1:{h.free_port()}"
        config = Path(self.tmp) / "node.toml"
        config.write_text(
            f'[node]\nid = "bench-{name}"\n'
            f'[admin]\ntokens = [{{ token = "{ADMIN_TOKEN}", role = "read" }}]\n'
            f'[limits]\nmax_links_per_connection = 16\n'
            f'[[rules]]\nname = "px"\nmatch = "{rule_match}"\nkind = "proxy"\n'
            f'mirror_auto_delete = {"true" if mirror else "false"}\n'
            f'primary = "amqp://{RABBIT_HOST}:{RABBIT_PORT}"\nremote = "/queue/{{1}}"\n')
        self.log_path = Path(self.tmp) / "node.log"
        self.proc = h.start_fedgate_node(self.port, Path(self.tmp) / "data", log_path=self.log_path,
                                         extra_args=["--config", str(config)], admin=self.admin,
                                         ready_timeout=args.node_start_timeout)
        self.pid = self.proc.pid
        log(f"fedgate node pid {self.pid} on 127.0.0.1:{self.port} ({name})")

    def _members(self) -> list[dict]:
        import urllib.request

        request = urllib.request.Request(f"http://{self.admin}/api/v1/upstreams",
                                         headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        with urllib.request.urlopen(request, timeout=10) as response:
            body = json.loads(response.read())
        return [m for pool in body.get("upstreams", []) for m in pool.get("members", [])
                if m.get("state") == "up"]

    def upstream_links(self) -> int:
        """Links the node holds on its upstream connections (admin API)."""
        return sum(m.get("links", 0) for m in self._members())

    def upstream_attaching(self) -> int:
        """Upstream attaches not answered yet, or waiting their turn (admin API)."""
        members = self._members()
        return sum(m.get("attaching", 0) for m in members) if members else 1

    def stop(self) -> None:
        h.stop_process(self.proc)
        if self.args.keep_data:
            log(f"node data and log kept in {self.tmp}")
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)


def delete_rabbit_queues(names) -> None:
    ctl = shutil.which("rabbitmqctl")
    if not ctl:
        return
    env = dict(os.environ, ERL_EPMD_ADDRESS="127.0.0.1")
    for name in names:
        try:
            subprocess.run([ctl, "-n", "rabbit@localhost", "-q", "delete_queue", name],
                           capture_output=True, timeout=60, env=env)
        except (subprocess.TimeoutExpired, OSError):
            pass


# ---------------------------------------------------------------- throughput
def run_target(target: str, node: ProxyNode, rabbit_pid: int, tag: str, args) -> dict:
    n = args.messages
    if target == "proxy":
        host, port, address = "127.0.0.1", node.port, f"rq.bench-px-{tag}-proxy"
    else:
        host, port, address = RABBIT_HOST, RABBIT_PORT, f"/queue/bench-px-{tag}-direct"
    node_meter = h.CpuMeter(node.pid, tree=False).start()
    rabbit_meter = h.CpuMeter(rabbit_pid, tree=False).start()
    res = h.run_client_pair(host, port, address, n, timeout=args.timeout,
                            body_bytes=args.body_bytes, credit_window=args.credit)
    node_cpu, rabbit_cpu = node_meter.stop(), rabbit_meter.stop()
    clients_cpu = res.clients_cpu
    row = {
        "target": target, "address": address, "messages": n, "ok": res.ok,
        "elapsed_s": round(res.elapsed, 3),
        "msgs_per_s": round(n / res.elapsed, 1) if res.ok and res.elapsed > 0 else None,
        "node_cpu_us_per_msg": round(node_cpu * 1e6 / n, 2),
        "rabbitmq_cpu_us_per_msg": round(rabbit_cpu * 1e6 / n, 2),
        "clients_cpu_us_per_msg": round(clients_cpu * 1e6 / n, 2),
        # share of the CPUs available to the run that these three used
        "cpu_busy": round((node_cpu + rabbit_cpu + clients_cpu) / (res.elapsed * CPUS), 3)
        if res.elapsed > 0 else None,
    }
    if not res.ok:
        row["error"] = res.describe_failure()
    return row


def _threads(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except FileNotFoundError:
        return []


def pin(pid: int, cpus: set[int]) -> None:
    """Restrict every thread of process ``pid`` to ``cpus``."""
    for tid in _threads(pid):
        try:
            os.sched_setaffinity(tid, cpus)
        except (ProcessLookupError, PermissionError):
            pass


class SplitCpus:
    """Pin RabbitMQ to the first half of the CPUs, the node and our clients to the rest."""

    def __init__(self, rabbit_pid: int, node_pid: int) -> None:
        cpus = sorted(os.sched_getaffinity(0))
        half = max(1, len(cpus) // 2)
        self.all, self.broker, self.ours = set(cpus), set(cpus[:half]), set(cpus[half:])
        self.rabbit_pid, self.node_pid = rabbit_pid, node_pid

    def __enter__(self) -> "SplitCpus":
        pin(self.rabbit_pid, self.broker)
        pin(self.node_pid, self.ours)
        os.sched_setaffinity(0, self.ours)  # the C clients we start inherit it
        log(f"split layout: RabbitMQ on CPUs {sorted(self.broker)}, node and clients on "
            f"{sorted(self.ours)}")
        return self

    def __exit__(self, *exc) -> None:
        os.sched_setaffinity(0, self.all)
        pin(self.node_pid, self.all)
        pin(self.rabbit_pid, self.all)


def _rounds(layout: str, node, rabbit_pid: int, args, queues: list) -> list[dict]:
    runs = []
    for r in range(1, args.rounds + 1):
        order = ("proxy", "rabbitmq") if r % 2 else ("rabbitmq", "proxy")
        for target in order:
            row = run_target(target, node, rabbit_pid, f"{layout}{r}", args)
            row["round"], row["layout"] = r, layout
            runs.append(row)
            queues.append(row["address"].rsplit("/", 1)[-1].removeprefix("rq."))
            log(f"{layout} round {r} {target:8s} {row['msgs_per_s']} msgs/s  node "
                f"{row['node_cpu_us_per_msg']} µs/msg  rabbitmq {row['rabbitmq_cpu_us_per_msg']} "
                f"µs/msg  clients {row['clients_cpu_us_per_msg']} µs/msg  CPUs busy "
                f"{row['cpu_busy']}{'  ' + row['error'] if 'error' in row else ''}")
    return runs


def summarize(runs: list[dict]) -> dict:
    ok = [r for r in runs if r["ok"]]
    summary = {}
    for target in ("rabbitmq", "proxy"):
        rows = [r for r in ok if r["target"] == target]
        summary[target] = {key: h.median([r[key] for r in rows])
                           for key in ("msgs_per_s", "node_cpu_us_per_msg", "rabbitmq_cpu_us_per_msg",
                                       "clients_cpu_us_per_msg", "cpu_busy")}
        parts = [summary[target][k] for k in ("node_cpu_us_per_msg", "rabbitmq_cpu_us_per_msg",
                                              "clients_cpu_us_per_msg")]
        summary[target]["total_cpu_us_per_msg"] = (round(sum(parts), 1)
                                                   if None not in parts else None)
    direct, proxied = summary["rabbitmq"]["msgs_per_s"], summary["proxy"]["msgs_per_s"]
    summary["ratio"] = round(proxied / direct, 3) if direct and proxied else None
    # When the CPUs are busy the whole run, msgs/s = CPUs / total CPU per message,
    # so the ratio cannot exceed direct total / proxy total CPU per message.
    d_total = summary["rabbitmq"]["total_cpu_us_per_msg"]
    p_total = summary["proxy"]["total_cpu_us_per_msg"]
    summary["cpu_ratio"] = round(d_total / p_total, 3) if d_total and p_total else None
    summary["proxy_node_cpu_us_per_msg"] = summary["proxy"]["node_cpu_us_per_msg"]
    return summary


def throughput(args) -> dict:
    h.require_c_clients()
    rabbit_pid = h.rabbitmq_pid(RABBIT_PORT)
    node = ProxyNode(args, "rq.*", "throughput")
    runs, queues, layouts = [], [], {}
    try:
        warm = run_target("proxy", node, rabbit_pid, "warmup", argparse.Namespace(
            **{**vars(args), "messages": args.warmup}))
        queues.append("bench-px-warmup-proxy")
        log(f"warm-up: {warm}")
        for layout in args.layouts:
            if layout == "split":
                if len(os.sched_getaffinity(0)) < 2:
                    log("split layout skipped: one CPU")
                    continue
                with SplitCpus(rabbit_pid, node.pid):
                    rows = _rounds(layout, node, rabbit_pid, args, queues)
            else:
                rows = _rounds(layout, node, rabbit_pid, args, queues)
            runs += rows
            layouts[layout] = summarize(rows)
    finally:
        node.stop()
        delete_rabbit_queues(queues)
    return {"runs": runs, "layouts": layouts, "all_ok": all(r["ok"] for r in runs)}


# ---------------------------------------------------------------- idle connections
def idle(args) -> dict:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = min(hard, args.idle + 2000)
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))  # inherited by the node
    node = ProxyNode(args, "idle.*", "idle", mirror=args.mirror)
    client_cmd = [sys.executable, str(Path(__file__).with_name("idle_clients.py")),
                  "--port", str(node.port), "--address", "idle.bench-px-idle", "--link", "receiver"]
    clients = None
    try:
        warm = subprocess.run(client_cmd + ["--count", "1"], input="close\n", text=True,
                              capture_output=True, timeout=60)
        if '"ready": 1' not in warm.stdout:
            raise h.BenchError(f"warm-up client failed: {warm.stdout} {warm.stderr[-500:]}")
        time.sleep(1.0)
        base = rss_kb(node.pid)
        cpu0 = h.proc_cpu_seconds(node.pid)
        t0 = time.monotonic()
        clients = subprocess.Popen(client_cmd + ["--count", str(args.idle)], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, text=True)
        ready = None
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline:
            line = clients.stdout.readline()
            if not line:
                break
            item = json.loads(line)
            if "ready" in item:
                ready = item
                break
        if ready is None:
            raise h.BenchError("idle clients did not report ready")
        # every client link also attached upstream (one shared link with --mirror)
        wanted = 1 if args.mirror else ready["ready"]
        while time.monotonic() < deadline and node.upstream_links() < wanted:
            time.sleep(0.5)
        # ... and answered by the primary: attaches are paced (proxy.upstream), so the
        # last ones are answered a while after the clients are ready
        while time.monotonic() < deadline and node.upstream_attaching() > 0:
            time.sleep(0.5)
        upstream_links = node.upstream_links()
        connect_s = time.monotonic() - t0
        connect_cpu = h.proc_cpu_seconds(node.pid) - cpu0
        # let the node settle: the primary answers 10,000 attaches and credit
        # grants for a while after the links are registered
        settle_deadline = time.monotonic() + 60.0
        while time.monotonic() < settle_deadline:
            before = h.proc_cpu_seconds(node.pid)
            time.sleep(1.0)
            if h.proc_cpu_seconds(node.pid) - before < 0.05:
                break
        after = rss_kb(node.pid)
        cpu1 = h.proc_cpu_seconds(node.pid)
        time.sleep(args.idle_window)
        idle_cpu = h.proc_cpu_seconds(node.pid) - cpu1
        upstream = established_to(node.pid, RABBIT_PORT)
        result = {
            "connections": ready["ready"], "failed": ready["failed"],
            "mirror_auto_delete": args.mirror, "upstream_links": upstream_links,
            "connect_s": round(connect_s, 2),
            "node_cpu_ms_per_connect": round(connect_cpu * 1e3 / max(1, ready["ready"]), 3),
            "rss_base_kb": base, "rss_after_kb": after,
            "rss_kb_per_connection": round((after - base) / max(1, ready["ready"]), 2),
            "upstream_connections": upstream,
            "idle_cpu_percent": round(100 * idle_cpu / args.idle_window, 2),
        }
        log(f"idle: {result}")
        return result
    finally:
        if clients is not None:
            try:
                clients.stdin.write("close\n")
                clients.stdin.flush()
                clients.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                clients.kill()
        node.stop()
        delete_rabbit_queues(["bench-px-idle"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--warmup", type=int, default=5_000)
    parser.add_argument("--body-bytes", type=int, default=h.DEFAULT_BODY_BYTES)
    parser.add_argument("--credit", type=int, default=h.DEFAULT_CREDIT_WINDOW)
    parser.add_argument("--layouts", type=lambda v: [x for x in v.split(",") if x],
                        default=["shared", "split"],
                        help="CPU layouts for the throughput rounds: shared, split (comma-separated)")
    parser.add_argument("--idle", type=int, default=10_000)
    parser.add_argument("--mirror", action="store_true",
                        help="idle clients share one upstream link (rule mirror_auto_delete)")
    parser.add_argument("--idle-window", type=float, default=10.0,
                        help="seconds over which the idle node's CPU is measured")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--node-start-timeout", type=float, default=30.0)
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--skip-idle", action="store_true")
    parser.add_argument("--keep-data", action="store_true")
    parser.add_argument("--enforce-goals", action="store_true")
    parser.add_argument("--output", default="bench/results/proxy.json",
                        help="relative paths are relative to the repository root")
    args = parser.parse_args()

    report = {"benchmark": "proxy", "started": _dt.datetime.now(_dt.timezone.utc).isoformat(),
              "machine": h.machine_info(), "settings": vars(args).copy(),
              "goals": {"ratio": GOAL_RATIO, "node_cpu_us_per_msg": GOAL_CPU_US,
                        "rss_kb_per_connection": GOAL_RSS_KB, "upstream_connections": GOAL_UPSTREAMS}}
    status = 0
    try:
        if not args.skip_throughput:
            report["throughput"] = throughput(args)
            status = 0 if report["throughput"]["all_ok"] else 1
        if not args.skip_idle:
            report["idle"] = idle(args)
    except h.BenchError as exc:
        log(f"setup failed: {exc}")
        return 2
    missed = []
    summary = report.get("throughput", {}).get("layouts")
    for layout, figures in (summary or {}).items():
        if figures["ratio"] is None or figures["ratio"] < GOAL_RATIO:
            missed.append(f"{layout} layout: ratio {figures['ratio']} < {GOAL_RATIO}")
        cpu = figures["proxy_node_cpu_us_per_msg"]
        if cpu is None or cpu > GOAL_CPU_US:
            missed.append(f"{layout} layout: node CPU {cpu} µs/msg > {GOAL_CPU_US}")
    if "idle" in report:
        if report["idle"]["rss_kb_per_connection"] > GOAL_RSS_KB:
            missed.append(f"RSS {report['idle']['rss_kb_per_connection']} KB/connection > {GOAL_RSS_KB}")
        if report["idle"]["upstream_connections"] > GOAL_UPSTREAMS:
            missed.append(f"{report['idle']['upstream_connections']} upstream connections")
    report["goals_missed"] = missed
    text = json.dumps(report, indent=2)
    print(json.dumps({"throughput": summary, "idle": report.get("idle"), "goals_missed": missed},
                     indent=2))
    if args.output != "-":
        output = Path(args.output)
        output = output if output.is_absolute() else h.REPO_ROOT / output
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text + "\n")
        log(f"written to {h.rel(output)}")
    if status:
        return status
    return 3 if missed and args.enforce_goals else 0


if __name__ == "__main__":
    sys.exit(main())
