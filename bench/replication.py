#!/usr/bin/env python3
"""Replicated queues (issue #35): 2 and 3 copies against a local queue on the same nodes,
and the time a failover takes.

Run from the repo root (after .ci/install/c-clients.sh and .ci/install/etcd.sh start):

    .venv/bin/python bench/replication.py [--rounds 3] [--messages 50000]
        [--latency-messages 2000] [--latency-rate 500] [--failover-runs 5]
        [--etcd http://127.0.0.1:2479] [--output bench/results/replication.json]

Three fedgate nodes on etcd (lease_ttl 3 s), started once. Their rules make
``r2.*`` replicated with 2 copies (n1, n2) and ``r3.*`` with 3 (n1, n2, n3); any
other address is a local queue. n1 is the primary of both (the rule's ``nodes``).

1. Throughput: each round runs each target once (the order rotates): a quiet C
   receiver and a C sender of N messages (100-byte bodies) on n1, on a new address
   each time (a local queue ``lq.*``, ``r2.*``, ``r3.*``). msgs/s = N / elapsed;
   CPU µs per message of every node from /proc (utime + stime, after minus before).
   A run still going after ``--timeout`` seconds is recorded as stalled, with n1's view of
   the queue (``waiting_acceptance``, the backups' lag), and left out of the medians.
2. Latency, paced: one proton client with a sender and a receiver on n1 sends
   ``--latency-messages`` at ``--latency-rate`` per second; for each message the time
   from the send to its acceptance (the producer's view: a replicated queue accepts once
   every in-sync backup holds the message) and to its delivery. Percentiles per target,
   and what replication adds to the local queue's p50 and p99.
3. Failover: a paced proton sender and receiver on the two nodes that are not the
   primary of ``r3.failover``; the primary killed with -9; measured from the kill to the
   new primary's first acceptance and to the first delivery after it (its log line
   ``this node is its primary now`` dates its reign). The killed node is started again
   and the next run waits until both backups are in sync. ``--failover-runs 20`` for the
   issue's figure (default 5).

Goals (issue #35): 2 copies >= 0.6x a local queue's msg/s; failover p99 <= lease_ttl + 2 s.
The summary is printed and written to bench/results/replication.json. See bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as h  # noqa: E402
import latency_probe as lp  # noqa: E402

NAMES = ("n1", "n2", "n3")
TOKEN = "bench-admin-token-0123456789"
LEASE_TTL = 3
GOAL_RATIO_2 = 0.6
GOAL_FAILOVER_S = LEASE_TTL + 2.0
TARGETS = {"local": "lq", "replicated-2": "r2", "replicated-3": "r3"}


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- the cluster ---------------------------------------------------------------------------
class Node:
    def __init__(self, workdir: Path, name: str, etcd: str, cluster: str) -> None:
        self.name = name
        self.port = h.free_port()
        self.admin_port = h.free_port()
        self.url = f"amqp://127.0.0.1:{self.port}"
        self.admin_url = f"http://127.0.0.1:{self.admin_port}"
        self.data_dir = workdir / f"data-{name}"
        self.log_path = workdir / f"{name}.log"
        self.config = workdir / f"{name}.toml"
        rules = [("r2", 2, ["n1", "n2"]), ("r3", 3, ["n1", "n2", "n3"])]
        lines = [
            "[node]", f'id = "{name}"', 'log_level = "info"',
            "[admin]", f'tokens = [{{ token = "{TOKEN}", role = "admin" }}]',
            "[cluster]", f'name = "{cluster}"', f'etcd = ["{etcd}"]', f"lease_ttl = {LEASE_TTL}",
        ]
        for prefix, replicas, nodes in rules:
            lines += ["[[rules]]", f'name = "{prefix}"', f'match = "{prefix}.*"',
                      'kind = "replicated"', f"replicas = {replicas}",
                      "nodes = [" + ", ".join(f'"{n}"' for n in nodes) + "]"]
        self.config.write_text("\n".join(lines) + "\n")
        self.proc: subprocess.Popen | None = None

    def start(self) -> "Node":
        # a node killed with -9 waits for its old registration to expire (lease_ttl + 1.5 s)
        self.proc = h.start_fedgate_node(self.port, self.data_dir, extra_args=["--config", str(self.config)],
                                         log_path=self.log_path, admin=f"127.0.0.1:{self.admin_port}",
                                         ready_timeout=30.0)
        return self

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        h.stop_process(self.proc)

    def cpu(self) -> float:
        return h.tree_cpu_seconds(self.proc.pid)

    def queues(self) -> dict:
        request = urllib.request.Request(self.admin_url + "/api/v1/queues",
                                         headers={"Authorization": f"Bearer {TOKEN}"})
        with urllib.request.urlopen(request, timeout=3) as response:
            return {q["name"]: q for q in json.loads(response.read())["queues"]}

    def promoted_at(self, address: str, after: float) -> float | None:
        """When this node logged becoming the primary of ``address`` (wall clock)."""
        pattern = re.compile(r"^(\S+ \S+),(\d{3}) .*queue " + re.escape(address)
                             + r": this node is its primary now")
        for line in self.log_path.read_text(errors="replace").splitlines():
            match = pattern.match(line)
            if match:
                stamp = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S").timestamp() \
                    + int(match.group(2)) / 1000
                if stamp >= after - 0.001:
                    return stamp
        return None


def wait_for(predicate, timeout: float, what: str, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = predicate()
        except OSError:
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise h.BenchError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def primary_of(nodes: dict, address: str) -> str | None:
    for name, node in nodes.items():
        if node.proc is None or node.proc.poll() is not None:
            continue
        try:
            item = node.queues().get(address)
        except OSError:
            continue
        if item and item.get("role") == "primary":
            return name
    return None


def in_sync(nodes: dict, address: str, primary: str, backups: int) -> bool:
    item = nodes[primary].queues().get(address) or {}
    return len((item.get("replication") or {}).get("in_sync") or []) >= backups


def etcd_healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/health", timeout=2) as response:
            return json.loads(response.read()).get("health") == "true"
    except (OSError, ValueError):
        return False


# -- the paced proton client (bench/latency_probe.py, a subprocess) ------------------------
def run_probe(send_url: str, receive_url: str, address: str, count: int, rate: float,
              timeout: float) -> subprocess.Popen:
    """bench/latency_probe.py, started: wall-clock stamps (compared with the kill and the
    nodes' log lines), errors recorded and the run goes on (the links fail over)."""
    return lp.start_probe(send_url, receive_url, address, count, rate, timeout,
                          "--credit", "100", "--wall-clock", "--keep-going")


def probe_result(proc: subprocess.Popen, timeout: float) -> dict:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise h.BenchError(f"probe did not finish in {timeout:.0f}s: {err[-500:]}")
    if proc.returncode != 0 or not out.strip():
        raise h.BenchError(f"probe failed ({proc.returncode}): {err[-1000:]}")
    return json.loads(out.strip().splitlines()[-1])


percentile = lp.percentile


# -- the measurements ---------------------------------------------------------------------
def throughput_run(nodes: dict, target: str, tag: str, messages: int, timeout: float) -> dict:
    """One C receiver and one C sender of ``messages`` on n1. A run that does not end within
    ``timeout`` is recorded as stalled, with what n1's admin API said of the queue shortly
    before the clients were stopped (replicated queues: ``waiting_acceptance``, the backups)."""
    n1 = nodes["n1"]
    address = f"{TARGETS[target]}.bench-{tag}"
    snapshot: dict = {}

    def watch(done: threading.Event) -> None:
        if not done.wait(max(1.0, timeout - 2.0)):
            try:
                snapshot.update(n1.queues().get(address) or {})
            except OSError as exc:
                snapshot["error"] = str(exc)
    done = threading.Event()
    watcher = threading.Thread(target=watch, args=(done,), daemon=True)
    watcher.start()
    before = {name: node.cpu() for name, node in nodes.items()}
    result = h.run_concurrently([h.receiver_cmd("127.0.0.1", n1.port, address, messages),
                                 h.sender_cmd("127.0.0.1", n1.port, address, messages)],
                                timeout=timeout)
    done.set()
    watcher.join(5)
    cpu = {name: node.cpu() - before[name] for name, node in nodes.items()}
    run = {"target": target, "address": address, "messages": messages}
    if not result.ok:
        if not result.timed_out:
            raise h.BenchError(f"{target}: {result.describe_failure()}")
        replication = snapshot.get("replication") or {}
        run.update(stalled=True, failure=result.describe_failure(),
                   ended={h.rel(r.cmd[0]): r.returncode for r in result.runs},
                   queue={"depth": snapshot.get("depth"), "stats": snapshot.get("stats"),
                          "waiting_acceptance": replication.get("waiting_acceptance"),
                          "in_sync": replication.get("in_sync"), "backups": replication.get("backups")})
        return run
    run.update(elapsed_s=round(result.elapsed, 3), msgs_per_s=round(messages / result.elapsed),
               cpu_us_per_msg={name: round(seconds * 1e6 / messages, 2) for name, seconds in cpu.items()},
               clients_cpu_us_per_msg=round(result.clients_cpu * 1e6 / messages, 2))
    run["cpu_us_per_msg_all_nodes"] = round(sum(run["cpu_us_per_msg"].values()), 2)
    return run


def latency_run(nodes: dict, target: str, messages: int, rate: float) -> dict:
    n1 = nodes["n1"]
    address = f"{TARGETS[target]}.latency-{uuid.uuid4().hex[:6]}"
    result = probe_result(run_probe(n1.url, n1.url, address, messages, rate,
                                    timeout=messages / rate + 30), timeout=messages / rate + 60)
    accepted = [(a - s) * 1000 for s, a, _ in result["times"] if s and a]
    delivered = [(r - s) * 1000 for s, _, r in result["times"] if s and r]
    # the first messages wait for the queue to be made (a claim in etcd): left out
    skip = min(50, len(accepted) // 10)
    accepted, delivered = accepted[skip:], delivered[skip:]
    return {"target": target, "messages": messages, "rate": rate, "errors": result["errors"],
            "accept_ms": {f"p{int(p * 100)}": round(percentile(accepted, p), 3) for p in (0.5, 0.9, 0.99)},
            "deliver_ms": {f"p{int(p * 100)}": round(percentile(delivered, p), 3) for p in (0.5, 0.9, 0.99)}}


def failover_run(nodes: dict, address: str, rate: float, seconds: float) -> dict:
    if primary_of(nodes, address) is None:  # the first run: the queue is made by a few messages
        probe_result(run_probe(nodes["n2"].url, nodes["n3"].url, address, 10, 100.0, 20.0), 40.0)
    primary = wait_for(lambda: primary_of(nodes, address), 30.0, f"a primary of {address}")
    wait_for(lambda: in_sync(nodes, address, primary, 2), 60.0, "both backups in sync")
    others = [n for n in NAMES if n != primary]
    count = int(rate * seconds)
    probe = run_probe(nodes[others[0]].url, nodes[others[1]].url, address, count, rate,
                      timeout=seconds + 30)
    time.sleep(min(2.0, seconds / 4))  # flowing
    killed = time.time()
    nodes[primary].kill()
    result = probe_result(probe, timeout=seconds + 60)
    new = wait_for(lambda: primary_of(nodes, address), 30.0, "the new primary")
    promoted = nodes[new].promoted_at(address, killed)
    times = result["times"]
    accepts = [a for _, a, _ in times if a and a >= promoted]
    deliveries = [r for _, _, r in times if r and r >= promoted]
    lost = sum(1 for _, a, r in times if a and not r)
    run = {"killed": primary, "new_primary": new,
           "promoted_s": round(promoted - killed, 3),
           "first_acceptance_s": round(min(accepts) - killed, 3) if accepts else None,
           "first_delivery_s": round(min(deliveries) - killed, 3) if deliveries else None,
           "accepted": sum(1 for _, a, _ in times if a), "received": sum(1 for *_, r in times if r),
           "lost": lost, "errors": result["errors"]}
    nodes[primary].start()  # back as a backup
    return run


def summarise(values: list[float]) -> dict:
    values = [v for v in values if v is not None]
    if not values:
        return {}
    return {"p50": round(percentile(values, 0.5), 3), "p99": round(percentile(values, 0.99), 3),
            "max": round(max(values), 3), "min": round(min(values), 3), "n": len(values)}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--latency-messages", type=int, default=2000)
    parser.add_argument("--latency-rate", type=float, default=500.0)
    parser.add_argument("--failover-runs", type=int, default=5)
    parser.add_argument("--failover-rate", type=float, default=200.0)
    parser.add_argument("--failover-seconds", type=float, default=8.0)
    parser.add_argument("--etcd", default="http://127.0.0.1:2479")
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="seconds a throughput run may take; one that takes longer is "
                             "recorded as stalled")
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--skip-latency", action="store_true")
    parser.add_argument("--targets", default=",".join(TARGETS),
                        help="throughput targets, of: " + ", ".join(TARGETS))
    parser.add_argument("--keep-data", action="store_true",
                        help="keep the nodes' data dirs, configs and logs (the path is printed)")
    parser.add_argument("--output", default=str(Path(__file__).resolve().parent / "results"
                                                / "replication.json"))
    args = parser.parse_args(argv)
    try:
        h.require_c_clients()
        if not etcd_healthy(args.etcd):
            raise h.BenchError(f"no healthy etcd at {args.etcd}: run bash .ci/install/etcd.sh start")
    except h.BenchError as exc:
        log(f"setup failed: {exc}")
        return 2

    cluster = f"bench-{uuid.uuid4().hex[:8]}"
    summary: dict = {"command": "bench/replication.py " + " ".join(argv), "cluster": cluster,
                     "lease_ttl_s": LEASE_TTL, "machine": h.machine_info()}
    tmp = tempfile.mkdtemp(prefix="fedgate-bench-repl-")
    failed = True
    try:
        nodes = {name: Node(Path(tmp), name, args.etcd, cluster) for name in NAMES}
        try:
            for node in nodes.values():
                node.start()
            time.sleep(1.0)  # every node sees the others
            if not args.skip_throughput:
                summary["throughput"] = throughput(nodes, args)
            if not args.skip_latency:
                summary["latency"] = latency(nodes, args)
            if args.failover_runs:
                summary["failover"] = failover(nodes, args)
            failed = False
        except h.BenchError as exc:
            log(f"failed: {exc}")
            for node in nodes.values():
                log(f"--- {node.name}.log (tail)\n" + "\n".join(
                    node.log_path.read_text(errors="replace").splitlines()[-15:]))
            return 1
        finally:
            for node in nodes.values():
                if node.proc is not None:
                    node.stop()
    finally:
        if args.keep_data or failed:
            log(f"kept {tmp} (the nodes' configs, logs and data)")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    summary["machine"]["loadavg_1m_end"] = os.getloadavg()[0]
    goals = {}
    if "ratio_replicated-2" in summary.get("throughput", {}):
        value = summary["throughput"]["ratio_replicated-2"]
        goals["ratio_2_copies_over_local"] = {"goal": f">= {GOAL_RATIO_2}", "value": value,
                                              "met": value >= GOAL_RATIO_2}
    if "failover" in summary:
        value = summary["failover"]["first_acceptance_s"].get("p99")
        goals["failover_first_acceptance_p99_s"] = {
            "goal": f"<= {GOAL_FAILOVER_S}", "value": value,
            "met": value is not None and value <= GOAL_FAILOVER_S}
    summary["goals"] = goals
    if args.output != "-":
        out = Path(args.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(summary, indent=2) + "\n")
        log(f"wrote {h.rel(out)}")
    for name, goal in goals.items():
        log(f"goal {name}: {goal['value']} (goal {goal['goal']}): {'met' if goal['met'] else 'MISSED'}")
    return 0


def throughput(nodes: dict, args) -> dict:
    runs = []
    order = [t.strip() for t in args.targets.split(",") if t.strip()]
    log(f"throughput: {args.rounds} rounds of {args.messages} messages, C clients on n1")
    for round_no in range(args.rounds):
        for target in order[round_no % len(order):] + order[:round_no % len(order)]:
            run = throughput_run(nodes, target, f"{round_no}-{uuid.uuid4().hex[:4]}",
                                 args.messages, args.timeout)
            run["round"] = round_no + 1
            runs.append(run)
            if run.get("stalled"):
                log(f"  round {round_no + 1} {target:13} STALLED: {run['failure']}; queue on n1: "
                    f"{json.dumps(run['queue'])}")
                continue
            log(f"  round {round_no + 1} {target:13} {run['msgs_per_s']:>8,} msg/s  CPU µs/msg "
                + "  ".join(f"{n} {v:5.1f}" for n, v in run["cpu_us_per_msg"].items()))
    out: dict = {"messages": args.messages, "rounds": args.rounds, "runs": runs, "medians": {}}
    out["stalled"] = {target: sum(1 for r in runs if r["target"] == target and r.get("stalled"))
                      for target in order}
    for target in order:
        mine = [r for r in runs if r["target"] == target and not r.get("stalled")]
        if not mine:
            continue
        out["medians"][target] = {
            "msgs_per_s": round(statistics.median(r["msgs_per_s"] for r in mine)),
            "cpu_us_per_msg": {n: round(statistics.median(r["cpu_us_per_msg"][n] for r in mine), 2)
                               for n in NAMES},
            "cpu_us_per_msg_all_nodes": round(statistics.median(r["cpu_us_per_msg_all_nodes"]
                                                                for r in mine), 2)}
    local = out["medians"].get("local", {}).get("msgs_per_s")
    for target in ("replicated-2", "replicated-3"):
        if local and target in out["medians"]:
            out[f"ratio_{target}"] = round(out["medians"][target]["msgs_per_s"] / local, 3)
    for target, median in out["medians"].items():
        log(f"median {target:13} {median['msgs_per_s']:>8,} msg/s"
            + (f" ({out[f'ratio_{target}']}x local)" if f"ratio_{target}" in out else "")
            + "  CPU µs/msg " + "  ".join(f"{n} {v:5.1f}" for n, v in median["cpu_us_per_msg"].items()))
    if any(out["stalled"].values()):
        log(f"stalled runs (left out of the medians): {out['stalled']}")
    return out


def latency(nodes: dict, args) -> dict:
    log(f"latency: {args.latency_messages} messages at {args.latency_rate:g}/s, sender and "
        "receiver on n1")
    out: dict = {"messages": args.latency_messages, "rate": args.latency_rate, "targets": {}}
    for target in TARGETS:
        run = latency_run(nodes, target, args.latency_messages, args.latency_rate)
        out["targets"][target] = run
        log(f"  {target:13} accepted after p50 {run['accept_ms']['p50']:.2f} ms, p99 "
            f"{run['accept_ms']['p99']:.2f} ms; delivered after p50 {run['deliver_ms']['p50']:.2f} ms, "
            f"p99 {run['deliver_ms']['p99']:.2f} ms" + (f" errors {run['errors']}" if run["errors"] else ""))
    local = out["targets"]["local"]
    for target in ("replicated-2", "replicated-3"):
        mine = out["targets"][target]
        out[f"added_{target}"] = {
            kind: {p: round(mine[kind][p] - local[kind][p], 3) for p in ("p50", "p99")}
            for kind in ("accept_ms", "deliver_ms")}
        log(f"  added by {target}: acceptance p50 {out[f'added_{target}']['accept_ms']['p50']:+.2f} ms, "
            f"p99 {out[f'added_{target}']['accept_ms']['p99']:+.2f} ms")
    return out


def failover(nodes: dict, args) -> dict:
    address = "r3.failover"
    log(f"failover: {args.failover_runs} runs, kill -9 of the primary of {address}, clients on "
        f"the other two nodes at {args.failover_rate:g} msg/s")
    runs = []
    for number in range(args.failover_runs):
        run = failover_run(nodes, address, args.failover_rate, args.failover_seconds)
        runs.append(run)
        log(f"  run {number + 1}: {run['killed']} killed -> {run['new_primary']}: promoted "
            f"{run['promoted_s']} s, first acceptance {run['first_acceptance_s']} s, first "
            f"delivery {run['first_delivery_s']} s; lost {run['lost']}"
            + (f" errors {run['errors']}" if run["errors"] else ""))
    out = {"runs": runs, "rate": args.failover_rate,
           "promoted_s": summarise([r["promoted_s"] for r in runs]),
           "first_acceptance_s": summarise([r["first_acceptance_s"] for r in runs]),
           "first_delivery_s": summarise([r["first_delivery_s"] for r in runs]),
           "lost": sum(r["lost"] for r in runs)}
    log(f"failover over {len(runs)} runs: first acceptance p50 {out['first_acceptance_s'].get('p50')} s, "
        f"p99 {out['first_acceptance_s'].get('p99')} s; first delivery p50 "
        f"{out['first_delivery_s'].get('p50')} s, p99 {out['first_delivery_s'].get('p99')} s; "
        f"lost {out['lost']}")
    return out


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
