#!/usr/bin/env python3
"""AMQP over WebSocket against plain TCP: the same client library, one node, side by side.

Run from the repo root (after ``make venv npm``):

    .venv/bin/python bench/websocket.py [--rounds 3] [--messages 50000] [--pairs 1]

A run is ``--pairs`` rhea receivers and rhea senders (tests/js, Node.js; the
``ws`` package for WebSocket) on one local queue each, started together,
timed until all exit; every message is counted by its receiver. Each round
runs both transports (order alternating). Reported per run: msg/s, the node's
CPU µs per message (sent and received) and the clients' CPU µs per message;
the summary gives medians and the WebSocket / TCP ratio (target >= 0.8).
Results in ``bench/results/websocket.json`` with a chart beside it.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as h  # noqa: E402
from charts import save_bars  # noqa: E402

JS = h.REPO_ROOT / "tests" / "js"
TRANSPORTS = ("tcp", "websocket")
GOAL_RATIO = 0.8


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def url(transport: str, port: int) -> str:
    return f"amqp://127.0.0.1:{port}" if transport == "tcp" else f"ws://127.0.0.1:{port}/"


def run_one(node_pid: int, port: int, transport: str, tag: str, args) -> dict:
    node_js = shutil.which("node")
    cmds = []
    for pair in range(args.pairs):
        address = f"bench-ws-{tag}-{pair}"
        cmds.append([node_js, str(JS / "receive.js"), "--url", url(transport, port), "--address",
                     address, "--count", str(args.messages), "--credit", str(args.credit),
                     "--timeout-ms", str(int(args.timeout * 1000))])
    for pair in range(args.pairs):
        address = f"bench-ws-{tag}-{pair}"
        cmds.append([node_js, str(JS / "send.js"), "--url", url(transport, port), "--address",
                     address, "--count", str(args.messages), "--presettled" if args.presettled else "",
                     "--timeout-ms", str(int(args.timeout * 1000))])
    cmds = [[part for part in cmd if part] for cmd in cmds]
    meter = h.CpuMeter(node_pid, tree=False).start()
    batch = h.run_concurrently(cmds, timeout=args.timeout)
    node_cpu = meter.stop()
    total = args.messages * args.pairs
    received = 0
    for run in batch.runs[:args.pairs]:
        lines = [json.loads(line) for line in run.output.splitlines() if line.startswith("{")]
        received += next((line["received"] for line in reversed(lines) if "received" in line), 0)
    ok = batch.ok and received == total
    return {
        "transport": transport, "pairs": args.pairs, "messages": total, "ok": ok,
        "received": received, "elapsed_s": round(batch.elapsed, 3),
        "msgs_per_s": round(total / batch.elapsed, 1) if ok else None,
        "node_cpu_us_per_msg": round(node_cpu / total * 1e6, 2),
        "clients_cpu_us_per_msg": round(batch.clients_cpu / total * 1e6, 2),
        "failure": None if ok else batch.describe_failure(),
    }


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--messages", type=int, default=50000, help="per pair")
    parser.add_argument("--pairs", type=int, default=1)
    parser.add_argument("--credit", type=int, default=500)
    parser.add_argument("--presettled", action="store_true", help="senders send pre-settled")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--output", default="bench/results/websocket.json")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if shutil.which("node") is None or not (JS / "node_modules" / "ws").is_dir():
        log("needs Node.js and tests/js/node_modules (make npm)")
        return 2
    started = _dt.datetime.now(_dt.timezone.utc).isoformat()
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="fedgate-bench-ws-") as workdir:
        port = h.free_port()
        proc = h.start_fedgate_node(port, Path(workdir) / "data", log_path=Path(workdir) / "node.log")
        try:
            # warm up both paths once (imports, first connections)
            for transport in TRANSPORTS:
                warm = argparse.Namespace(**{**vars(args), "messages": 2000, "pairs": 1})
                run_one(proc.pid, port, transport, f"warm-{transport}", warm)
            for rnd in range(1, args.rounds + 1):
                order = TRANSPORTS if rnd % 2 else tuple(reversed(TRANSPORTS))
                for transport in order:
                    row = run_one(proc.pid, port, transport, f"r{rnd}-{transport}", args)
                    row["round"] = rnd
                    rows.append(row)
                    log(f"round {rnd} {transport:9s} {row['msgs_per_s'] or 'FAILED':>10} msg/s  "
                        f"node {row['node_cpu_us_per_msg']:6.1f} µs/msg  clients "
                        f"{row['clients_cpu_us_per_msg']:6.1f} µs/msg"
                        + (f"  ({row['failure']})" if row["failure"] else ""))
        finally:
            h.stop_process(proc)
    summary = {}
    for transport in TRANSPORTS:
        mine = [r for r in rows if r["transport"] == transport and r["ok"]]
        summary[transport] = {
            "msgs_per_s": h.median([r["msgs_per_s"] for r in mine]),
            "node_cpu_us_per_msg": h.median([r["node_cpu_us_per_msg"] for r in mine]),
            "clients_cpu_us_per_msg": h.median([r["clients_cpu_us_per_msg"] for r in mine]),
        }
    tcp, ws = summary["tcp"]["msgs_per_s"], summary["websocket"]["msgs_per_s"]
    ratio = round(ws / tcp, 3) if tcp and ws else None
    summary["ratio"] = ratio
    log(f"median: tcp {tcp} msg/s, websocket {ws} msg/s, ratio {ratio} (goal >= {GOAL_RATIO}); "
        f"node µs/msg tcp {summary['tcp']['node_cpu_us_per_msg']} websocket "
        f"{summary['websocket']['node_cpu_us_per_msg']}")
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps({
        "benchmark": "websocket", "started": started, "machine": h.machine_info(),
        "settings": vars(args), "goal_ratio": GOAL_RATIO, "runs": rows, "summary": summary,
    }, indent=2) + "\n")
    save_bars(output.with_suffix(".png"), "rhea over TCP and over WebSocket (one node)",
              [f"round {r}" for r in range(1, args.rounds + 1)],
              {t: [next((x["msgs_per_s"] for x in rows if x["round"] == r and x["transport"] == t), None)
                   for r in range(1, args.rounds + 1)] for t in TRANSPORTS}, "msg/s")
    log(f"wrote {output} and {output.with_suffix('.png')}")
    return 0 if ratio is not None else 1


if __name__ == "__main__":
    sys.exit(main())
