#!/usr/bin/env python3
"""Local queues on a node with 1 and N worker processes ([node] workers, issue #18).

Run from the repo root (after .ci/install/c-clients.sh):

    .venv/bin/python bench/workers.py [--workers 1,2] [--pairs 1,8] [--messages 100000] [--rounds 3]

For each worker count a node is started (``fedgate serve --workers W``); for
each pair count P, P quiet C receivers and P C senders (one pair per queue
``q0``..``qP-1``) run at once, N/P messages per pair, timed until all exit.
Reported per run: msgs/s (N / elapsed), the node's CPU per message (all its
processes: supervisor and workers) and the clients' CPU per message. With more
than one worker, a link attached on a worker that does not own its queue is
forwarded to the owner (one more hop inside the node): about half the links
with two workers. Results go to bench/results/workers.json (and a PNG chart).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as h  # noqa: E402
from charts import save_bars  # noqa: E402


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def one_run(port: int, pid: int, pairs: int, messages: int, timeout: float, body: int,
            credit: int, tag: str) -> dict:
    per_pair = messages // pairs
    cmds = []
    for i in range(pairs):
        cmds.append(h.receiver_cmd("127.0.0.1", port, f"{tag}-q{i}", per_pair, credit))
    for i in range(pairs):
        cmds.append(h.sender_cmd("127.0.0.1", port, f"{tag}-q{i}", per_pair, body))
    meter = h.CpuMeter(pid).start()
    result = h.run_concurrently(cmds, timeout=timeout)
    cpu = meter.stop()
    n = per_pair * pairs
    if not result.ok:
        return {"ok": False, "error": result.describe_failure()}
    return {"ok": True, "messages": n, "elapsed_s": round(result.elapsed, 3),
            "msgs_per_s": round(n / result.elapsed), "node_cpu_us_per_msg": round(cpu * 1e6 / n, 2),
            "clients_cpu_us_per_msg": round(result.clients_cpu * 1e6 / n, 2)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workers", default="1,2")
    p.add_argument("--pairs", default="1,8")
    p.add_argument("--messages", "-n", type=int, default=100_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--body-bytes", type=int, default=h.DEFAULT_BODY_BYTES)
    p.add_argument("--credit", type=int, default=h.DEFAULT_CREDIT_WINDOW)
    p.add_argument("--output", default=str(Path("bench") / "results" / "workers.json"))
    args = p.parse_args()
    h.require_c_clients()
    worker_counts = [int(w) for w in args.workers.split(",")]
    pair_counts = [int(x) for x in args.pairs.split(",")]
    runs: dict[str, list[dict]] = {}
    for round_ in range(args.rounds):
        order = worker_counts if round_ % 2 == 0 else list(reversed(worker_counts))
        for workers in order:
            data_dir = Path(tempfile.mkdtemp(prefix="fedgate-bench-workers-"))
            port = h.free_port()
            proc = h.start_fedgate_node(port, data_dir, extra_args=["--workers", str(workers)],
                                        log_path=data_dir / "node.log")
            try:
                for pairs in pair_counts:
                    key = f"{workers}w-{pairs}p"
                    run = one_run(port, proc.pid, pairs, args.messages, args.timeout,
                                  args.body_bytes, args.credit, f"r{round_}")
                    runs.setdefault(key, []).append(run)
                    log(f"round {round_ + 1}: {workers} workers, {pairs} pairs: "
                        + (f"{run['msgs_per_s']} msg/s, node {run['node_cpu_us_per_msg']} µs/msg"
                           if run["ok"] else run["error"]))
            finally:
                h.stop_process(proc)
                shutil.rmtree(data_dir, ignore_errors=True)
    summary = {}
    for key, items in runs.items():
        good = [r for r in items if r["ok"]]
        summary[key] = {
            "runs": len(items), "failed": len(items) - len(good),
            "median_msgs_per_s": h.median([r["msgs_per_s"] for r in good]),
            "median_node_cpu_us_per_msg": h.median([r["node_cpu_us_per_msg"] for r in good]),
            "median_clients_cpu_us_per_msg": h.median([r["clients_cpu_us_per_msg"] for r in good]),
        }
    base = worker_counts[0]
    for key, s in summary.items():
        workers, pairs = key.split("-")
        ref = summary.get(f"{base}w-{pairs}")
        if ref and ref["median_msgs_per_s"] and s["median_msgs_per_s"]:
            s["ratio_to_1_worker"] = round(s["median_msgs_per_s"] / ref["median_msgs_per_s"], 3)
    print(f"{'run':<10} {'msg/s':>9} {'node µs/msg':>12} {'clients µs/msg':>15} {'vs 1 worker':>12}")
    for key, s in summary.items():
        print(f"{key:<10} {s['median_msgs_per_s'] or 0:>9.0f} {s['median_node_cpu_us_per_msg'] or 0:>12.1f} "
              f"{s['median_clients_cpu_us_per_msg'] or 0:>15.1f} {s.get('ratio_to_1_worker', 1.0):>12.2f}")
    out = {"bench": "workers", "machine": h.machine_info(), "messages": args.messages,
           "rounds": args.rounds, "body_bytes": args.body_bytes, "summary": summary, "runs": runs}
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(out, indent=2) + "\n")
    save_bars(Path(args.output).with_suffix(".png"), "Local queues: msg/s by pairs and workers",
              [f"{pairs} pairs" for pairs in pair_counts],
              {f"{w} workers": [summary.get(f"{w}w-{pairs}p", {}).get("median_msgs_per_s")
                                for pairs in pair_counts] for w in worker_counts}, "msg/s")
    log(f"wrote {h.rel(args.output)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
