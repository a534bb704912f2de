#!/usr/bin/env python3
"""Transactional vs plain sends to a local queue: batches of 1, 10 and 100 messages per transaction.

Run from the repo root (after ``bash .ci/install/c-clients-txn.sh``, which also
runs ``.ci/install/c-clients.sh``):

    .venv/bin/python bench/transactions.py [--rounds 3] [--messages 50000] [--durable]

One node is started (a fresh temp data dir; the ``proxy`` package of this
checkout, ``python -m proxy``). Each run is one quiet C receiver
(``.build/bench/receive``, credit window 1,000) and one C sender
(``.build/bench/txsend``, ``bench/txsend.c``) of N messages on a queue of their
own, receiver first:

* ``plain``: unsettled sends, each waiting for its ``accepted``
  (``txsend ... 0``, as ``.build/bench/send`` does);
* ``txn-1``, ``txn-10``, ``txn-100``: the same messages in transactions of
  1, 10 or 100: declare, the transfers with ``transactional-state``, commit;
  the next declare goes out with the commit (one round trip per transaction
  on top of the messages). ``txn-1`` sends N / 5 messages (it is bound by the
  round trip, not by the node).

The modes run in a rotating order per round. Reported per run: msgs/s = N /
elapsed (both clients done), node CPU µs per message (the node process, from
/proc); summary: medians, and each mode's rate / the plain rate (goal: txn-100
>= 0.7). ``--durable``: ``[queues] durable = true`` and every message durable
(journaled, fsynced): a plain send waits for the journal's group commit, a
transaction's messages and its commit are one journal record. Results go to
``bench/results/transactions.json`` (``--output -`` for none).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as h  # noqa: E402
from charts import save_bars  # noqa: E402

TXSEND_BIN = h.BUILD_DIR / "txsend"
MODES = {"plain": 0, "txn-1": 1, "txn-10": 10, "txn-100": 100}
GOAL_RATIO = 0.7  # txn-100 / plain


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def node_exe(workdir: Path) -> Path:
    """``python -m proxy`` run from the repo root: this checkout's code, whatever the venv's
    console script points at (a worktree shares its venv with the main checkout)."""
    exe = workdir / "fedgate-here"
    exe.write_text(f"#!/bin/sh\ncd {h.REPO_ROOT}\nexec {sys.executable} -m proxy \"$@\"\n")
    exe.chmod(0o755)
    return exe


def run_one(port: int, pid: int, mode: str, tag: str, n: int, args) -> dict:
    if mode == "txn-1":
        n = max(1, n // 5)
    address = f"bench-{mode}-{tag}"
    meter = h.CpuMeter(pid, tree=True).start()
    res = h.run_concurrently([
        h.receiver_cmd("127.0.0.1", port, address, n, args.credit),
        [str(TXSEND_BIN), "127.0.0.1", str(port), address, str(n), str(MODES[mode]),
         str(args.body_bytes), "1" if args.durable else "0"],
    ], timeout=args.timeout, lead=1)
    cpu = meter.stop()
    row = {"mode": mode, "messages": n, "ok": res.ok, "elapsed_s": round(res.elapsed, 4),
           "msgs_per_s": round(n / res.elapsed, 1) if res.ok and res.elapsed > 0 else None,
           "node_cpu_s": round(cpu, 3),
           "cpu_us_per_msg": round(cpu * 1e6 / n, 2) if res.ok else None}
    if not res.ok:
        row["error"] = res.describe_failure()
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--warmup", type=int, default=5_000)
    parser.add_argument("--body-bytes", type=int, default=h.DEFAULT_BODY_BYTES)
    parser.add_argument("--credit", type=int, default=h.DEFAULT_CREDIT_WINDOW)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--durable", action="store_true")
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--output", default=str(h.REPO_ROOT / "bench" / "results" / "transactions.json"))
    args = parser.parse_args()
    for binary in (TXSEND_BIN, h.RECEIVE_BIN):
        if not binary.is_file():
            log(f"{h.rel(binary)} missing: run bash .ci/install/c-clients-txn.sh")
            return 2
    workdir = Path(tempfile.mkdtemp(prefix="fedgate-bench-txn-"))
    config = workdir / "node.toml"
    config.write_text(f"[queues]\ndurable = {'true' if args.durable else 'false'}\n")
    port = h.free_port()
    proc = None
    rows: list[dict] = []
    try:
        proc = h.start_fedgate_node(port, workdir / "data", extra_args=["--config", str(config)],
                                    log_path=workdir / "node.log", exe=node_exe(workdir))
        log(f"node pid {proc.pid} on 127.0.0.1:{port}")
        if args.warmup:
            for mode in args.modes:
                run_one(port, proc.pid, mode, "warmup", args.warmup, args)
        modes = list(args.modes)
        for rnd in range(1, args.rounds + 1):
            print(f"\nround {rnd}")
            order = modes[rnd % len(modes):] + modes[:rnd % len(modes)]
            for mode in order:
                row = run_one(port, proc.pid, mode, str(rnd), args.messages, args)
                row["round"] = rnd
                rows.append(row)
                print(f"  {mode:<8} {fmt(row['msgs_per_s'], ',.0f'):>10} msgs/s "
                      f"{fmt(row['cpu_us_per_msg'], '.1f'):>7} µs/msg"
                      + ("" if row["ok"] else f"  FAILED: {row['error']}"), flush=True)
    finally:
        h.stop_process(proc)
        shutil.rmtree(workdir, ignore_errors=True)
    summary = {}
    for mode in args.modes:
        good = [r for r in rows if r["mode"] == mode and r["ok"]]
        summary[mode] = {"runs_ok": len(good),
                         "median_msgs_per_s": h.median([r["msgs_per_s"] for r in good]),
                         "median_cpu_us_per_msg": h.median([r["cpu_us_per_msg"] for r in good])}
    plain = (summary.get("plain") or {}).get("median_msgs_per_s")
    print("\nmedians")
    for mode in args.modes:
        rate = summary[mode]["median_msgs_per_s"]
        ratio = round(rate / plain, 3) if rate and plain else None
        summary[mode]["ratio_to_plain"] = ratio
        print(f"  {mode:<8} {fmt(rate, ',.0f'):>10} msgs/s "
              f"{fmt(summary[mode]['median_cpu_us_per_msg'], '.1f'):>7} µs/msg  "
              f"{fmt(ratio, '.2f'):>5} x plain")
    goal = (summary.get("txn-100") or {}).get("ratio_to_plain")
    if goal is not None:
        print(f"\ntxn-100 / plain = {goal:.2f} (goal >= {GOAL_RATIO})")
    if args.output != "-":
        result = {"benchmark": "transactions", "date": _dt.datetime.now().isoformat(timespec="seconds"),
                  "machine": h.machine_info(), "messages": args.messages, "rounds": args.rounds,
                  "durable": args.durable, "body_bytes": args.body_bytes, "goal_ratio": GOAL_RATIO,
                  "summary": summary, "runs": rows}
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(result, indent=2) + "\n")
        save_bars(Path(args.output).with_suffix(".png"),
                  "Sends to a local queue, plain and in transactions" + (" (durable)" if args.durable else ""),
                  list(args.modes), {"msgs/s": [summary[m]["median_msgs_per_s"] for m in args.modes]},
                  "msgs/s (median)")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
