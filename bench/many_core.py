#!/usr/bin/env python3
"""The many-core table (issues #36 and #45): every row in one command, then the table.

Run from the repo root on the machine to measure (after ``.ci/install/c-clients.sh``):

    .venv/bin/python bench/many_core.py [--rounds 2] [--messages 1000000] [--quick]
        [--rows replicated,fragmented,local,proxy,latency,spread] [--results DIR]

Rows, each a run of another bench script (its JSON kept in ``--results``, default
``bench/results/many-core``), with the issues' goals:

* ``replicated``: two nodes on this machine, 16 replicated queues (``replicas = 2``, half
  the primaries on each node), one C sender and one C receiver per queue, each node with
  ``W/2`` workers (8 on 16 CPUs) against one process per node, side by side in each round
  (``bench/scale.py --kinds replicated``). Goal: >= 4x one process, >= 150k msg/s.
* ``fragmented``: one node of ``W/2`` workers, ``W/2`` pairs on one fragmented queue: >= 350k msg/s.
* ``local``: one node of ``W`` workers, ``W`` pairs, a local queue each: >= 250k msg/s.
* ``proxy``: one pair through a node to a fedgate primary against the same pair on the
  primary directly (``bench/proxy.py --primaries fedgate --pairs 1``): >= 0.9x direct.
* ``latency``: what the node adds at 1,000 msg/s (``bench/proxy.py --latency``):
  p50 <= 0.3 ms, p99 <= 1 ms.
* ``spread``: how evenly placement by first attach loads W workers when each queue's
  clients land on its owner, for 16, 64 and 1,000 queues: the busiest worker's queues over
  the mean (goal <= 1.5), with the supervisor's table of owners (what a node does) and with
  the ketama ring alone (before issue #45). Computed, no processes.

``W`` is the CPUs present (16 on the table's machine). ``--quick`` shrinks everything to
check the script itself on a small machine. The table is printed and written to
``<results>/table.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

ROWS = ("replicated", "fragmented", "local", "proxy", "latency", "spread")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run(args: list[str], timeout: float) -> int:
    log("$ " + " ".join(args))
    began = time.monotonic()
    try:
        code = subprocess.run([sys.executable, *args], cwd=ROOT, timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        code = 124
    log(f"  exit {code} after {time.monotonic() - began:.0f} s")
    return code


def load(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def spread(workers: int) -> dict:
    """Queues per worker when each of ``queues`` names goes to its owner: the supervisor's
    table (what a node does, issue #45) and, for comparison, the ketama ring alone."""
    from proxy.workers.ownership import OwnerTable, QueueOwners

    out = {}
    for queues in (16, 64, 1000):
        names = [f"q{i}" for i in range(queues)]
        table = OwnerTable(workers)
        for how, owner in (("table", table.owner), ("ring", QueueOwners("n1", workers).owner)):
            counts = Counter(owner(name) for name in names)
            out[f"{queues}-{how}"] = {
                "busiest": max(counts.values()), "idle_workers": workers - len(counts),
                "max_over_mean": round(max(counts.values()) / (queues / workers), 2),
                "per_worker": [counts.get(k, 0) for k in range(workers)]}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", default=",".join(ROWS))
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--messages", type=int, default=1_000_000, help="per run of the scale rows")
    p.add_argument("--proxy-messages", type=int, default=200_000)
    p.add_argument("--cpus", type=int, default=0, help="W (default: the CPUs present)")
    p.add_argument("--quick", action="store_true", help="tiny runs: check the script itself")
    p.add_argument("--results", default=str(ROOT / "bench" / "results" / "many-core"))
    args = p.parse_args(argv)
    rows = [r for r in args.rows.split(",") if r]
    cpus = args.cpus or len(os.sched_getaffinity(0))
    half = max(1, cpus // 2)
    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    n = 20_000 if args.quick else args.messages
    rounds = 1 if args.quick else args.rounds
    log(f"{cpus} CPUs: W = {cpus}; rows {rows}; {n} messages a run, {rounds} rounds")
    table: dict = {"cpus": cpus, "messages": n, "rounds": rounds, "rows": {}}
    scale = ["bench/scale.py", "--messages", str(n), "--rounds", str(rounds)]
    if "replicated" in rows:
        out = results / "replicated.json"
        run([*scale, "--kinds", "replicated", "--workers", "1" if half == 1 else f"1,{half}",
             "--pairs", "16",
             "--output", str(out)], timeout=1800)
        s = load(out).get("summary", {})
        one, many = s.get("replicated-1w-16p", {}), s.get(f"replicated-{half}w-16p", {})
        rate, base = many.get("median_msgs_per_s"), one.get("median_msgs_per_s")
        table["rows"]["replicated"] = {
            "what": f"2 nodes x {half} workers, 16 replicated queues (replicas 2), 16 pairs",
            "msgs_per_s": rate, "one_process_msgs_per_s": base,
            "ratio": round(rate / base, 2) if rate and base else None,
            "cpu_us_per_msg": many.get("median_node_cpu_us_per_msg"),
            "one_process_cpu_us_per_msg": one.get("median_node_cpu_us_per_msg"),
            "goal": ">= 4x one process per node, >= 150k msg/s",
            "met": bool(rate and base and rate >= 4 * base and rate >= 150_000)}
    for name, workers, pairs, goal, what in (
            ("fragmented", half, half, 350_000, f"1 node x {half} workers, {half} pairs on one "
                                                "fragmented queue"),
            ("local", cpus, cpus, 250_000, f"1 node x {cpus} workers, {cpus} pairs, a local "
                                           "queue each")):
        if name not in rows:
            continue
        out = results / f"{name}.json"
        run([*scale, "--kinds", name, "--workers", str(workers), "--pairs", str(pairs),
             "--output", str(out)], timeout=1200)
        s = load(out).get("summary", {}).get(f"{name}-{workers}w-{pairs}p", {})
        rate = s.get("median_msgs_per_s")
        table["rows"][name] = {"what": what, "msgs_per_s": rate,
                               "cpu_us_per_msg": s.get("median_node_cpu_us_per_msg"),
                               "goal": f">= {goal // 1000}k msg/s", "met": bool(rate and rate >= goal)}
    if "proxy" in rows or "latency" in rows:
        out = results / "proxy.json"
        extra = []
        if "proxy" not in rows:
            extra.append("--skip-throughput")
        if "latency" in rows:
            extra += ["--latency", "--latency-rate", "1000", "--latency-messages",
                      "1000" if args.quick else "5000", "--latency-rounds", str(max(rounds, 2))]
        run(["bench/proxy.py", "--primaries", "fedgate", "--pairs", "1", "--skip-idle",
             "--layouts", "shared", "--rounds", str(max(rounds, 3) if not args.quick else 1),
             "--messages", str(5000 if args.quick else args.proxy_messages), *extra,
             "--output", str(out)], timeout=1200)
        body = load(out)
        if "proxy" in rows:
            case = body.get("throughput", {}).get("cases", {}).get("fedgate-shared-1p-concurrent", {})
            ratio = case.get("ratio")
            table["rows"]["proxy"] = {
                "what": "1 pair through a node to a fedgate primary, against direct",
                "direct_msgs_per_s": case.get("direct", {}).get("msgs_per_s"),
                "proxy_msgs_per_s": case.get("proxy", {}).get("msgs_per_s"), "ratio": ratio,
                "node_cpu_us_per_msg": case.get("proxy_node_cpu_us_per_msg"),
                "goal": ">= 0.9x direct", "met": bool(ratio and ratio >= 0.9)}
        if "latency" in rows:
            added = body.get("latency", {}).get("primaries", {}).get("fedgate", {}).get("added", {})
            acc, dlv = added.get("accept_ms", {}), added.get("deliver_ms", {})
            worst50 = max((v for v in (acc.get("p50"), dlv.get("p50")) if v is not None), default=None)
            worst99 = max((v for v in (acc.get("p99"), dlv.get("p99")) if v is not None), default=None)
            table["rows"]["latency"] = {
                "what": "added by the node at 1,000 msg/s (acceptance, delivery)",
                "added_p50_ms": [acc.get("p50"), dlv.get("p50")],
                "added_p99_ms": [acc.get("p99"), dlv.get("p99")],
                "goal": "p50 <= 0.3 ms, p99 <= 1 ms",
                "met": bool(worst50 is not None and worst50 <= 0.3 and worst99 <= 1.0)}
    if "spread" in rows:
        figures = spread(cpus)
        worst = max(v["max_over_mean"] for k, v in figures.items() if k.endswith("-table"))
        table["rows"]["spread"] = {"what": f"queues per worker, {cpus} workers, ring placement",
                                   "queues": figures, "goal": "busiest <= 1.5x its share",
                                   "met": worst <= 1.5}
    (results / "table.json").write_text(json.dumps(table, indent=2) + "\n")
    print(f"\n{'row':<11} {'figure':<58} {'goal':<40} met")
    for name, row in table["rows"].items():
        if name == "replicated":
            figure = (f"{row['msgs_per_s']} msg/s, {row['ratio']}x one process "
                      f"({row['one_process_msgs_per_s']}); {row['cpu_us_per_msg']} µs/msg")
        elif name in ("fragmented", "local"):
            figure = f"{row['msgs_per_s']} msg/s, {row['cpu_us_per_msg']} µs/msg"
        elif name == "proxy":
            figure = (f"{row['ratio']}x ({row['proxy_msgs_per_s']} / {row['direct_msgs_per_s']}"
                      f" msg/s), node {row['node_cpu_us_per_msg']} µs/msg")
        elif name == "latency":
            figure = f"+p50 {row['added_p50_ms']} ms, +p99 {row['added_p99_ms']} ms"
        else:
            figure = ", ".join(f"{q}: {v['max_over_mean']}x" for q, v in row["queues"].items())
        print(f"{name:<11} {figure:<58} {row['goal']:<40} {'yes' if row['met'] else 'NO'}")
    log(f"wrote {results / 'table.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
