#!/usr/bin/env python3
"""Proxy benchmark: a primary directly vs through a fedgate proxy node; 10,000 idle clients.

Run from the repo root (``make bench-proxy`` installs RabbitMQ and the C clients first):

    .venv/bin/python bench/proxy.py [--rounds 3] [--messages 50000] [--idle 10000]
                                    [--primaries rabbitmq,artemis,fedgate] [--pairs 1,8]
                                    [--modes concurrent,phased] [--layouts shared,split,node]
                                    [--skip-throughput] [--skip-idle]
                                    [--latency] [--latency-rate 1000] [--latency-messages 5000]

1. Throughput, for each primary (``rabbitmq``: RabbitMQ 3.10 on 5682, queues
   ``/queue/NAME``; ``artemis``: Artemis on 5673, ANYCAST queue ``NAME``;
   ``fedgate``: a second fedgate node started here), pair count, mode and CPU
   layout. Targets: ``direct`` (C senders and receivers on the primary) and
   ``proxy`` (the same clients on a fedgate node whose rule ``rq.*`` proxies to
   the primary). ``--pairs K``: K senders and K receivers at once, each pair on
   its own queue, ``--messages`` each. Modes: ``concurrent`` (receivers and
   senders at the same time) and ``phased`` (the senders fill the queues, then
   the receivers drain them). Each round runs both targets (order alternates);
   msgs/s = K x N / wall time; CPU per message of the node (both hops cross it;
   also given per hop), of the primary and of the clients. Reported per case:
   medians, the proxy/direct ratio, and the primary's CPU per message through
   the proxy against direct (``primary_cpu_ratio``, goal <= 1.1).
   CPU layouts:
   - ``shared``: every process on every CPU. On a 2-CPU machine the primary alone
     saturates both, so each µs the proxy spends is taken from the broker, and a
     broker that falls behind builds a backlog that costs it more per message.
   - ``split``: the primary pinned to the first half of the CPUs, the node and the
     clients to the other half (``sched_setaffinity``), as when the proxy runs
     on its own host in front of the broker. Affinities are restored at the end.
   - ``node``: the node alone on the second half, the primary and the clients on the
     first (direct: the second half idles), as when the node has cores of its own:
     the ratio then says whether the node is the slowest hop.
   ``--same-rate`` adds two targets per round (after ``direct`` and ``proxy``):
   ``paced``, direct again with the senders paced to the rate the proxy reached
   in that round, so the primary's CPU per message is also compared at one rate
   (``primary_cpu_ratio_same_rate``); and ``loaded``, direct again beside a busy
   loop taking the share of a CPU the node took (``primary_cpu_ratio_same_load``).
   ``--python-path`` adds the target ``python``: the same clients through a second
   node on the same rule with the C fast path switched off (``FEDGATE_NO_FASTPATH``),
   so the fast path's gain is measured side by side in each round.
   A speed probe (``harness.speed_probe``) is recorded before every run.
2. Idle connections. A fresh node proxies ``idle.*`` to RabbitMQ; one process
   (``bench/idle_clients.py``, proton engine objects in one asyncio loop) opens
   ``--idle`` connections with one receiver link each to ``idle.bench-px-idle``.
   Reported: node RSS delta / connections (baseline taken after one warm-up
   client, so imports and the upstream connection are not counted), the node's
   upstream TCP connections to RabbitMQ (from /proc), and its idle CPU.

3. ``--latency``: added latency at a fixed rate, for each primary. One paced proton
   client (``bench/latency_probe.py``: a sender and a receiver on connections of their
   own, ``--latency-rate`` msgs/s, ``--latency-messages`` per run, the first 10 % left
   out) on the primary directly and through the node, order alternating over
   ``--latency-rounds``. Reported per target, over every round's messages: p50 / p99 /
   max of send -> acceptance and send -> delivery, and ``added`` = proxy - direct
   (goal: p50 <= 0.3 ms, p99 <= 1 ms); the node's CPU per message at that rate.

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
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as h  # noqa: E402
import latency_probe as lp  # noqa: E402
from charts import save_bars  # noqa: E402
from proxy_setup import (  # noqa: E402
    RABBIT_PORT, Primary, ProxyNode, delete_rabbit_queues, log, rss_kb,
)

GOAL_RATIO = 0.9
GOAL_CPU_US = 30.0
GOAL_RSS_KB = 30.0
GOAL_UPSTREAMS = 4
GOAL_ADDED_P50_MS = 0.3
GOAL_ADDED_P99_MS = 1.0
CPUS = len(os.sched_getaffinity(0))  # all of them, also while the split layout pins this process


# ---------------------------------------------------------------- throughput
def run_target(target: str, node: ProxyNode, primary: Primary, tag: str, args, pairs: int = 1,
               mode: str = "concurrent", rate: float = 0, burn: float = 0) -> dict:
    """``pairs`` C sender/receiver pairs, each on its own queue, ``args.messages`` each.

    ``concurrent``: receivers and senders run at the same time; ``phased``: the
    senders fill the queues first, then the receivers drain them (two batches,
    their times added). ``rate`` > 0 paces each sender to ``rate / pairs`` msgs/s
    (target ``paced``: direct, at the rate the proxy reached). ``burn`` > 0 runs a
    process that keeps that share of one CPU busy meanwhile (target ``loaded``:
    direct, with the CPU the node took from the machine taken by something else).
    """
    n = args.messages
    if target in ("proxy", "python"):
        if target == "python":
            node = node.python_twin
        host, port = "127.0.0.1", node.port
        addresses = [f"rq.bench-px-{tag}-{i}-{target}" for i in range(pairs)]
        primary.queues += [a.removeprefix("rq.") for a in addresses]
    else:
        host, port = "127.0.0.1", primary.port
        addresses = [primary.direct_address(f"bench-px-{tag}-{i}-direct") for i in range(pairs)]
    receivers = [h.receiver_cmd(host, port, a, n, args.credit) for a in addresses]
    senders = [h.sender_cmd(host, port, a, n, args.body_bytes, rate / pairs) for a in addresses]
    burner = h.start_burner(burn) if burn > 0 else None
    node_meter = h.CpuMeter(node.pid, tree=False).start()
    primary_meter = h.CpuMeter(primary.pid, tree=False).start()
    if mode == "phased":
        batches = [h.run_concurrently(senders, timeout=args.timeout)]
        if batches[0].ok:
            batches.append(h.run_concurrently(receivers, timeout=args.timeout))
    else:
        batches = [h.run_concurrently(receivers + senders, timeout=args.timeout)]
    node_cpu, primary_cpu = node_meter.stop(), primary_meter.stop()
    burner_cpu = h.stop_burner(burner) if burner is not None else 0.0
    elapsed = sum(b.elapsed for b in batches)
    clients_cpu = sum(b.clients_cpu for b in batches)
    ok = all(b.ok for b in batches) and len(batches) == (2 if mode == "phased" else 1)
    total = n * pairs
    row = {
        "target": target, "primary": primary.name, "pairs": pairs, "mode": mode,
        "address": addresses[0], "messages": total, "ok": ok,
        "elapsed_s": round(elapsed, 3),
        "msgs_per_s": round(total / elapsed, 1) if ok and elapsed > 0 else None,
        # both hops of every message cross the node: sender -> primary, primary -> receiver
        "node_cpu_us_per_msg": round(node_cpu * 1e6 / total, 2),
        "node_cpu_us_per_hop": round(node_cpu * 1e6 / total / 2, 2),
        "primary_cpu_us_per_msg": round(primary_cpu * 1e6 / total, 2),
        "clients_cpu_us_per_msg": round(clients_cpu * 1e6 / total, 2),
        "node_cpu_share": round(node_cpu / elapsed, 3) if elapsed > 0 else None,
        **({"burner_cpu_share": round(burner_cpu / elapsed, 3)} if burner is not None else {}),
        # share of the CPUs available to the run that these three used
        "cpu_busy": round((node_cpu + primary_cpu + clients_cpu) / (elapsed * CPUS), 3)
        if elapsed > 0 else None,
    }
    if not ok:
        row["error"] = "; ".join(b.describe_failure() for b in batches if not b.ok) or "incomplete"
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
    """Pin the primary to the first half of the CPUs, the node and our clients to the rest;
    with ``node_alone`` (layout ``node``) the clients go with the primary instead."""

    def __init__(self, primary_pid: int, node_pid: int, *, node_alone: bool = False) -> None:
        cpus = sorted(os.sched_getaffinity(0))
        half = max(1, len(cpus) // 2)
        self.all, self.broker, self.node = set(cpus), set(cpus[:half]), set(cpus[half:])
        self.clients = self.broker if node_alone else self.node
        self.primary_pid, self.node_pid = primary_pid, node_pid

    def __enter__(self) -> "SplitCpus":
        pin(self.primary_pid, self.broker)
        pin(self.node_pid, self.node)
        os.sched_setaffinity(0, self.clients)  # the C clients we start inherit it
        if self.clients is self.node:
            log(f"split layout: the primary on CPUs {sorted(self.broker)}, node and clients on "
                f"{sorted(self.node)}")
        else:
            log(f"node layout: the primary and clients on CPUs {sorted(self.broker)}, the node "
                f"alone on {sorted(self.node)}")
        return self

    def __exit__(self, *exc) -> None:
        os.sched_setaffinity(0, self.all)
        pin(self.node_pid, self.all)
        pin(self.primary_pid, self.all)


def _rounds(case: str, node, primary: Primary, args, pairs: int, mode: str) -> list[dict]:
    runs = []
    for r in range(1, args.rounds + 1):
        order = ("proxy", "direct") if r % 2 else ("direct", "proxy")
        if args.same_rate:
            order = ("direct", "proxy", "paced", "loaded")
        if args.python_path:
            order = ("python",) + order if r % 2 else order + ("python",)
        for target in order:
            rate = burn = 0.0
            if target in ("paced", "loaded"):
                done = [x for x in runs if x["round"] == r and x["target"] == "proxy" and x["ok"]]
                if not done:
                    continue
                if target == "paced":
                    rate = done[0]["msgs_per_s"]
                else:
                    burn = done[0]["node_cpu_share"]
            probe = h.speed_probe()
            row = run_target(target, node, primary, f"{case}{r}", args, pairs, mode, rate, burn)
            row["round"] = r
            row["speed_probe_us"] = probe
            runs.append(row)
            log(f"{case} round {r} {target:6s} {row['msgs_per_s']} msgs/s  node "
                f"{row['node_cpu_us_per_hop']} µs/hop  {primary.name} {row['primary_cpu_us_per_msg']} "
                f"µs/msg  clients {row['clients_cpu_us_per_msg']} µs/msg  CPUs busy "
                f"{row['cpu_busy']}  probe {probe} µs{'  ' + row['error'] if 'error' in row else ''}")
    return runs


def summarize(runs: list[dict]) -> dict:
    ok = [r for r in runs if r["ok"]]
    summary = {}
    for target in ("direct", "proxy", "paced", "loaded", "python"):
        rows = [r for r in ok if r["target"] == target]
        if not rows and target in ("paced", "loaded", "python"):
            continue
        summary[target] = {key: h.median([r[key] for r in rows])
                           for key in ("msgs_per_s", "node_cpu_us_per_msg", "node_cpu_us_per_hop",
                                       "primary_cpu_us_per_msg", "clients_cpu_us_per_msg", "cpu_busy")}
        parts = [summary[target][k] for k in ("node_cpu_us_per_msg", "primary_cpu_us_per_msg",
                                              "clients_cpu_us_per_msg")]
        summary[target]["total_cpu_us_per_msg"] = (round(sum(parts), 1)
                                                   if None not in parts else None)
    direct, proxied = summary["direct"]["msgs_per_s"], summary["proxy"]["msgs_per_s"]
    summary["ratio"] = round(proxied / direct, 3) if direct and proxied else None
    # When the CPUs are busy the whole run, msgs/s = CPUs / total CPU per message,
    # so the ratio cannot exceed direct total / proxy total CPU per message.
    d_total = summary["direct"]["total_cpu_us_per_msg"]
    p_total = summary["proxy"]["total_cpu_us_per_msg"]
    summary["cpu_ratio"] = round(d_total / p_total, 3) if d_total and p_total else None
    summary["proxy_node_cpu_us_per_msg"] = summary["proxy"]["node_cpu_us_per_msg"]
    summary["proxy_node_cpu_us_per_hop"] = summary["proxy"]["node_cpu_us_per_hop"]
    d_primary, p_primary = summary["direct"]["primary_cpu_us_per_msg"], summary["proxy"]["primary_cpu_us_per_msg"]
    # the primary's work per message through the proxy against direct (goal: <= 1.1)
    summary["primary_cpu_ratio"] = round(p_primary / d_primary, 3) if d_primary and p_primary else None
    if "paced" in summary:
        # the same, against direct clients paced to the rate the proxy reached: a broker's
        # CPU per message grows as its rate falls (fewer messages per wake-up, its own
        # background work spread over fewer messages), so this separates the work the
        # proxy's traffic makes from the rate it runs at
        s_primary = summary["paced"]["primary_cpu_us_per_msg"]
        summary["primary_cpu_ratio_same_rate"] = (round(p_primary / s_primary, 3)
                                                  if s_primary and p_primary else None)
    if "python" in summary:
        # the node's CPU per hop and the throughput without the C fast path, same round
        summary["python_node_cpu_us_per_hop"] = summary["python"]["node_cpu_us_per_hop"]
        py_rate = summary["python"]["msgs_per_s"]
        summary["python_ratio"] = round(py_rate / direct, 3) if direct and py_rate else None
    if "loaded" in summary:
        # and against direct clients with a busy loop taking the CPU the node took: the
        # same contention for the primary, its clients' traffic unchanged
        l_primary = summary["loaded"]["primary_cpu_us_per_msg"]
        summary["primary_cpu_ratio_same_load"] = (round(p_primary / l_primary, 3)
                                                  if l_primary and p_primary else None)
    return summary


def throughput(args) -> dict:
    h.require_c_clients()
    runs, cases = [], {}
    for primary_name in args.primaries:
        primary = Primary(primary_name, args)
        node = ProxyNode(args, "rq.*", f"throughput-{primary_name}", primary=primary)
        node.python_twin = None
        try:
            warm = run_target("proxy", node, primary, "warmup", argparse.Namespace(
                **{**vars(args), "messages": args.warmup}))
            log(f"warm-up: {warm}")
            if args.python_path:
                node.python_twin = ProxyNode(args, "rq.*", f"throughput-{primary_name}-python",
                                             primary=primary, python_path=True)
                run_target("python", node, primary, "warmup-py", argparse.Namespace(
                    **{**vars(args), "messages": args.warmup}))
            for layout in args.layouts:
                for pairs in args.pairs:
                    for mode in args.modes:
                        case = f"{primary_name}-{layout}-{pairs}p-{mode}"
                        if layout in ("split", "node"):
                            if len(os.sched_getaffinity(0)) < 2:
                                log(f"{layout} layout skipped: one CPU")
                                continue
                            with SplitCpus(primary.pid, node.pid, node_alone=layout == "node"):
                                rows = _rounds(case, node, primary, args, pairs, mode)
                        else:
                            rows = _rounds(case, node, primary, args, pairs, mode)
                        for row in rows:
                            row["layout"] = layout
                        runs += rows
                        cases[case] = {"primary": primary_name, "layout": layout, "pairs": pairs,
                                       "mode": mode, **summarize(rows)}
                        figures = cases[case]
                        log(f"{case}: ratio {figures['ratio']}, node {figures['proxy_node_cpu_us_per_hop']} "
                            f"µs/hop, {primary_name} through the proxy {figures['primary_cpu_ratio']}x "
                            "its CPU per message direct"
                            + (f", {figures['primary_cpu_ratio_same_rate']}x at the same rate"
                               if "primary_cpu_ratio_same_rate" in figures else "")
                            + (f", {figures['primary_cpu_ratio_same_load']}x beside the same load"
                               if "primary_cpu_ratio_same_load" in figures else "")
                            + (f"; without the C fast path ratio {figures['python_ratio']}, node "
                               f"{figures['python_node_cpu_us_per_hop']} µs/hop"
                               if "python_ratio" in figures else ""))
        finally:
            if node.python_twin is not None:
                node.python_twin.stop()
            node.stop()
            primary.stop()
    return {"runs": runs, "cases": cases, "all_ok": all(r["ok"] for r in runs)}


# ---------------------------------------------------------------- latency at a fixed rate
def latency(args) -> dict:
    """Paced probe on each primary: direct and through a node, side by side (module doc, 3)."""
    out: dict = {"rate": args.latency_rate, "messages": args.latency_messages,
                 "rounds": args.latency_rounds, "primaries": {}}
    skip = args.latency_messages // 10
    for primary_name in args.primaries:
        primary = Primary(primary_name, args)
        node = ProxyNode(args, "rq.*", f"latency-{primary_name}", primary=primary)
        samples: dict = {"direct": {"accept_ms": [], "deliver_ms": []},
                         "proxy": {"accept_ms": [], "deliver_ms": []}}
        runs = []
        try:
            # warm-up through the node (its upstream connection, the first attach)
            warm = lp.run_probe(f"amqp://127.0.0.1:{node.port}", f"amqp://127.0.0.1:{node.port}",
                                f"rq.bench-lat-{primary_name}-warm", 500, args.latency_rate)
            primary.queues.append(f"bench-lat-{primary_name}-warm")
            if warm["errors"]:
                raise h.BenchError(f"latency warm-up failed: {warm['errors']}")
            for r in range(1, args.latency_rounds + 1):
                order = ("proxy", "direct") if r % 2 else ("direct", "proxy")
                for target in order:
                    queue = f"bench-lat-{primary_name}-{r}-{target}"
                    if target == "proxy":
                        port, address = node.port, f"rq.{queue}"
                        primary.queues.append(queue)
                    else:
                        port, address = primary.port, primary.direct_address(queue)
                    url = f"amqp://127.0.0.1:{port}"
                    node_meter = h.CpuMeter(node.pid, tree=False).start()
                    primary_meter = h.CpuMeter(primary.pid, tree=False).start()
                    result = lp.run_probe(url, url, address, args.latency_messages, args.latency_rate,
                                          args.body_bytes)
                    node_cpu, primary_cpu = node_meter.stop(), primary_meter.stop()
                    got = lp.latencies(result, skip)
                    for kind in ("accept_ms", "deliver_ms"):
                        samples[target][kind] += got[kind]
                    row = {"round": r, "target": target, "errors": result["errors"],
                           "node_cpu_us_per_msg": round(node_cpu * 1e6 / args.latency_messages, 2),
                           "primary_cpu_us_per_msg": round(primary_cpu * 1e6 / args.latency_messages, 2),
                           **{kind: lp.summary(got[kind]) for kind in ("accept_ms", "deliver_ms")}}
                    runs.append(row)
                    log(f"latency {primary_name} round {r} {target:6s} acceptance p50/p99/max "
                        f"{row['accept_ms']['p50']}/{row['accept_ms']['p99']}/{row['accept_ms']['max']} ms"
                        f", delivery {row['deliver_ms']['p50']}/{row['deliver_ms']['p99']}/"
                        f"{row['deliver_ms']['max']} ms, node {row['node_cpu_us_per_msg']} µs/msg"
                        + (f"  errors {result['errors']}" if result["errors"] else ""))
        finally:
            node.stop()
            primary.stop()
        figures = {target: {kind: lp.summary(values) for kind, values in kinds.items()}
                   for target, kinds in samples.items()}
        added = {kind: {p: (round(figures["proxy"][kind][p] - figures["direct"][kind][p], 3)
                            if figures["proxy"][kind][p] is not None
                            and figures["direct"][kind][p] is not None else None)
                        for p in ("p50", "p99", "max")}
                 for kind in ("accept_ms", "deliver_ms")}
        node_cpu = h.median([r["node_cpu_us_per_msg"] for r in runs if r["target"] == "proxy"])
        out["primaries"][primary_name] = {**figures, "added": added, "runs": runs,
                                          "proxy_node_cpu_us_per_msg": node_cpu,
                                          "all_ok": all(not r["errors"] for r in runs)}
        log(f"latency {primary_name}: added by the proxy at {args.latency_rate:g} msg/s: delivery "
            f"p50 {added['deliver_ms']['p50']:+} ms, p99 {added['deliver_ms']['p99']:+} ms, max "
            f"{added['deliver_ms']['max']:+} ms; acceptance p50 {added['accept_ms']['p50']:+} ms, "
            f"p99 {added['accept_ms']['p99']:+} ms, max {added['accept_ms']['max']:+} ms")
    return out


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
        upstream = h.established_to(node.pid, RABBIT_PORT)
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
                        help="CPU layouts for the throughput rounds: shared, split, node (comma-separated)")
    parser.add_argument("--primaries", type=lambda v: [x for x in v.split(",") if x], default=["rabbitmq"],
                        help="comma-separated: rabbitmq (3.10 on 5682), artemis (5673), fedgate (a node)")
    parser.add_argument("--producer-window-growth", type=int, default=None,
                        help="the node's [queues] producer_window_growth (1: the proxied senders' "
                             "window fixed at credit_window); default: the node's own")
    parser.add_argument("--primary-credit", type=int, default=None,
                        help="a fedgate primary's [queues] credit_window (what it grants each "
                             "producer, direct or proxied); default: the node's own (1000)")
    parser.add_argument("--node-credit", type=int, default=None,
                        help="the proxy node's [queues] credit_window (the window of its proxied "
                             "links); default: the node's own (1000)")
    parser.add_argument("--pool-size", type=int, default=1,
                        help="the rule's upstream.pool_size: connections per direction to the primary")
    parser.add_argument("--pairs", type=lambda v: [int(x) for x in v.split(",") if x], default=[1],
                        help="comma-separated pair counts, each pair on its own queue (e.g. 1,8)")
    parser.add_argument("--modes", type=lambda v: [x for x in v.split(",") if x], default=["concurrent"],
                        help="concurrent (send and receive at once) and/or phased (fill, then drain)")
    parser.add_argument("--same-rate", action="store_true",
                        help="after each round's proxy run, run direct twice more: the senders "
                             "paced to the proxy's rate (target 'paced'), and beside a busy loop "
                             "taking the CPU share the node took (target 'loaded')")
    parser.add_argument("--python-path", action="store_true",
                        help="also run each round through a second node without the C fast path "
                             "(target 'python')")
    parser.add_argument("--etcd", default=None, metavar="URL",
                        help="the proxy node registers in this etcd ([cluster] etcd): the same "
                             "runs with the cluster on etcd, to compare")
    parser.add_argument("--latency", action="store_true",
                        help="also measure the latency the proxy adds at a fixed rate (paced probe)")
    parser.add_argument("--latency-rate", type=float, default=1000.0, help="msgs/s of the probe")
    parser.add_argument("--latency-messages", type=int, default=5000,
                        help="messages per latency run (the first 10%% left out)")
    parser.add_argument("--latency-rounds", type=int, default=3)
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
        if args.latency:
            report["latency"] = latency(args)
            if not all(p["all_ok"] for p in report["latency"]["primaries"].values()):
                status = 1
        if not args.skip_idle:
            report["idle"] = idle(args)
    except h.BenchError as exc:
        log(f"setup failed: {exc}")
        return 2
    missed = []
    summary = report.get("throughput", {}).get("cases")
    for case, figures in (summary or {}).items():
        if figures["ratio"] is None or figures["ratio"] < GOAL_RATIO:
            missed.append(f"{case}: ratio {figures['ratio']} < {GOAL_RATIO}")
        cpu = figures["proxy_node_cpu_us_per_msg"]
        if cpu is None or cpu > GOAL_CPU_US:
            missed.append(f"{case}: node CPU {cpu} µs/msg > {GOAL_CPU_US}")
    if "idle" in report:
        if report["idle"]["rss_kb_per_connection"] > GOAL_RSS_KB:
            missed.append(f"RSS {report['idle']['rss_kb_per_connection']} KB/connection > {GOAL_RSS_KB}")
        if report["idle"]["upstream_connections"] > GOAL_UPSTREAMS:
            missed.append(f"{report['idle']['upstream_connections']} upstream connections")
    for name, figures in report.get("latency", {}).get("primaries", {}).items():
        added = figures["added"]["deliver_ms"]
        if added["p50"] is None or added["p50"] > GOAL_ADDED_P50_MS:
            missed.append(f"latency {name}: added p50 {added['p50']} ms > {GOAL_ADDED_P50_MS}")
        if added["p99"] is None or added["p99"] > GOAL_ADDED_P99_MS:
            missed.append(f"latency {name}: added p99 {added['p99']} ms > {GOAL_ADDED_P99_MS}")
    report["goals_missed"] = missed
    text = json.dumps(report, indent=2)
    latency_summary = {name: {k: v for k, v in figures.items() if k != "runs"}
                       for name, figures in report.get("latency", {}).get("primaries", {}).items()}
    print(json.dumps({"throughput": summary, "latency": latency_summary or None,
                      "idle": report.get("idle"), "goals_missed": missed}, indent=2))
    if args.output != "-":
        output = Path(args.output)
        output = output if output.is_absolute() else h.REPO_ROOT / output
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text + "\n")
        log(f"written to {h.rel(output)}")
        if summary:
            names = list(summary)
            chart = save_bars(output.with_suffix(".png"), "proxy against direct (medians)", names,
                              {"direct msg/s": [summary[n]["direct"]["msgs_per_s"] for n in names],
                               "proxy msg/s": [summary[n]["proxy"]["msgs_per_s"] for n in names]},
                              "msg/s")
            if chart:
                log(f"chart written to {h.rel(chart)}")
    if status:
        return status
    return 3 if missed and args.enforce_goals else 0


if __name__ == "__main__":
    sys.exit(main())
