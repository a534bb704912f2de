#!/usr/bin/env python3
"""One node with 1, 2, 4, 8 worker processes ([node] workers, issue #18): local queues,
a fragmented queue and a proxy rule, K pairs of C clients.

Run from the repo root (after .ci/install/c-clients.sh):

    .venv/bin/python bench/scale.py [--kinds local,fragmented,proxy] [--workers 1,2,4,8]
                                    [--pairs 1,2,4,8] [--messages 100000] [--rounds 3]

Worker counts above the CPUs present are left out. For each round and worker
count W a node is started (``fedgate serve --workers W``, plus a fedgate primary
for the proxy rule); for each kind and pair count K, K quiet C receivers and K
C senders run at once, N/K messages per pair, timed until all exit:

* ``local``: pair i on its own local queue ``qi``; with W > 1 a link attached
  on a worker that does not own the queue is forwarded to its owner (one more
  hop inside the node);
* ``fragmented``: every pair on one fragmented queue whose only member is this
  node: a fragment on every worker, consumers steal between workers, nothing is
  forwarded;
* ``proxy``: pair i on ``px.qi``, a proxy rule to a one-process fedgate primary;
  every worker has its own upstream connection;
* ``replicated`` (issue #45): pair i on its own replicated queue (``replicas = 2``,
  ``min_in_sync = 1``, not durable: the rule's defaults) kept by this node and a second
  one of as many workers (a static cluster, ``[peers]``); even pairs' queues have this
  node as primary, odd pairs' the other (``nodes`` pinned), and each pair's clients
  connect to its queue's primary, so both nodes serve clients and keep backups. The node
  CPU is both nodes' (``peer_cpu_us_per_msg``: the second node's share).

Placement (``--placement``): ``random`` starts every client at once, so which
worker each lands on is the order their connections arrive in (with 1 pair the
receiver and the sender are always on different workers); ``spread`` starts
the receivers first, 0.1 s apart, before the clock starts, then the senders:
the supervisor gives each new connection to the worker with the fewest, so
every worker serves one receiver and one sender where pairs allow, as many
clients spread themselves over the workers in a deployment. Both can run in
one go (``--placement random,spread``); results are keyed by placement.

Placement by first attach (``--first-attach``, issue #36): with workers, a node
hands a connection to the worker that owns its first attach's local queue, or
for a fragmented queue to a worker that lacks its role (``[node]
place_by_first_attach``, on by default). ``--first-attach on,off`` runs the
worker counts above 1 both ways in one go; ``off`` is keyed ``<W>w.unplaced``.

Printed as it goes and summarised: msg/s, the ratio to W = 1, the CPU µs per
message summed over all node processes (supervisor and workers), the primary's
and the clients'. Results in bench/results/scale.json, a PNG chart beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as h  # noqa: E402
from charts import save_bars  # noqa: E402

KINDS = ("local", "fragmented", "proxy")  # and "replicated" when asked for (two nodes)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def node_config(path: Path, primary_port: int | None, place: bool = True,
                node_id: str = "bench", peer: tuple[str, int] | None = None) -> Path:
    lines = ['[node]', f'id = "{node_id}"', f'place_by_first_attach = {str(place).lower()}', '',
             '[[rules]]', 'name = "work"', 'match = "work.#"', 'kind = "fragmented"',
             f'fragments = ["{node_id}"]', '']
    if peer is not None:  # replicated queues kept by both nodes, primaries half here, half there
        ids = sorted([node_id, peer[0]])
        for half, nodes in (("a", ids), ("b", ids[::-1])):
            lines += ['[[rules]]', f'name = "rep-{half}"', f'match = "rep.{half}.*"',
                      'kind = "replicated"', 'replicas = 2',
                      f'nodes = [{", ".join(repr(n).replace(chr(39), chr(34)) for n in nodes)}]', '']
        lines += ['[peers]', f'{peer[0]} = "amqp://127.0.0.1:{peer[1]}"', '']
    if primary_port:
        lines += ['[[rules]]', 'name = "px"', 'match = "px.*"', 'kind = "proxy"',
                  f'primary = "amqp://127.0.0.1:{primary_port}"', 'remote = "{1}"', '']
    path.write_text("\n".join(lines))
    return path


def addresses(kind: str, pairs: int, tag: str) -> list[str]:
    if kind == "fragmented":
        return [f"work.{tag}"] * pairs
    if kind == "replicated":  # "rep.a.*": the first node is primary, "rep.b.*": the second
        return [f"rep.{'ab'[i % 2]}.{tag}-q{i}" for i in range(pairs)]
    prefix = "px." if kind == "proxy" else ""
    return [f"{prefix}{tag}-q{i}" for i in range(pairs)]


def one_run(port: int, pid: int, primary_pid: int | None, kind: str, pairs: int, args,
            tag: str, placement: str = "random", peer: tuple[int, int] | None = None) -> dict:
    """``peer``: (port, pid) of the second node of replicated queues (``rep.b.*`` are its)."""
    per_pair = args.messages // pairs
    targets = addresses(kind, pairs, tag)

    def port_of(address: str) -> int:
        return peer[0] if peer is not None and address.startswith("rep.b.") else port
    cmds = [h.receiver_cmd("127.0.0.1", port_of(a), a, per_pair, args.credit) for a in targets]
    cmds += [h.sender_cmd("127.0.0.1", port_of(a), a, per_pair, args.body_bytes) for a in targets]
    meter = h.CpuMeter(pid).start()  # the supervisor and its workers
    primary = h.CpuMeter(primary_pid).start() if primary_pid else None
    second = h.CpuMeter(peer[1]).start() if peer is not None and kind == "replicated" else None
    result = h.run_concurrently(cmds, timeout=args.timeout,
                                lead=pairs if placement == "spread" else 0)
    cpu = meter.stop()
    primary_cpu = primary.stop() if primary else 0.0
    peer_cpu = second.stop() if second else None
    n = per_pair * pairs
    if not result.ok:
        return {"ok": False, "error": result.describe_failure()}
    return {"ok": True, "messages": n, "elapsed_s": round(result.elapsed, 3),
            "msgs_per_s": round(n / result.elapsed),
            "node_cpu_us_per_msg": round((cpu + (peer_cpu or 0.0)) * 1e6 / n, 2),
            "peer_cpu_us_per_msg": round(peer_cpu * 1e6 / n, 2) if peer_cpu is not None else None,
            "primary_cpu_us_per_msg": round(primary_cpu * 1e6 / n, 2) if primary else None,
            "clients_cpu_us_per_msg": round(result.clients_cpu * 1e6 / n, 2)}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--workers", default="1,2,4,8", help="capped at the CPUs present")
    p.add_argument("--pairs", default="1,2,4,8")
    p.add_argument("--messages", "-n", type=int, default=100_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--placement", default="random",
                   help="random, spread, or both (random,spread): see the module note")
    p.add_argument("--first-attach", default="on",
                   help="placement by first attach with workers: on, off, or both (on,off); "
                        "off is keyed <W>w.unplaced")
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--body-bytes", type=int, default=h.DEFAULT_BODY_BYTES)
    p.add_argument("--credit", type=int, default=h.DEFAULT_CREDIT_WINDOW)
    p.add_argument("--output", default=str(Path("bench") / "results" / "scale.json"))
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    h.require_c_clients()
    cpus = len(os.sched_getaffinity(0))
    kinds = [k for k in args.kinds.split(",") if k]
    worker_counts = [w for w in (int(x) for x in args.workers.split(",")) if w <= cpus] or [1]
    pair_counts = [int(x) for x in args.pairs.split(",")]
    placements = [p for p in args.placement.split(",") if p]
    bad = [p for p in placements if p not in ("random", "spread")]
    if bad:
        log(f"unknown placement {bad}: random or spread")
        return 2
    first_attach = [x for x in args.first_attach.split(",") if x]
    if set(first_attach) - {"on", "off"}:
        log(f"--first-attach {args.first_attach!r}: on, off or on,off")
        return 2
    log(f"{cpus} CPUs: workers {worker_counts}, pairs {pair_counts}, kinds {kinds}, "
        f"placement {placements}, first attach {first_attach}")
    # (workers, placement by first attach): one process has nothing to place
    setups = [(w, place == "on") for w in worker_counts
              for place in (first_attach if w > 1 else ["on"])]
    runs: dict[str, list[dict]] = {}
    for round_ in range(args.rounds):
        order = setups if round_ % 2 == 0 else list(reversed(setups))
        for workers, place in order:
            label = f"{workers}w" + ("" if place else ".unplaced")
            data_dir = Path(tempfile.mkdtemp(prefix="fedgate-bench-scale-"))
            primary = second = None
            primary_port = h.free_port() if "proxy" in kinds else None
            port = h.free_port()
            peer_port = h.free_port() if "replicated" in kinds else None
            try:
                if primary_port:
                    primary = h.start_fedgate_node(primary_port, data_dir / "primary",
                                                   log_path=data_dir / "primary.log")
                if peer_port:  # the second node of the replicated queues, as many workers
                    config = node_config(data_dir / "peer.toml", None, place, "bench2",
                                         ("bench", port))
                    second = h.start_fedgate_node(
                        peer_port, data_dir / "peer", log_path=data_dir / "peer.log",
                        extra_args=["--config", str(config), "--workers", str(workers)])
                config = node_config(data_dir / "node.toml", primary_port, place,
                                     peer=("bench2", peer_port) if peer_port else None)
                proc = h.start_fedgate_node(port, data_dir / "node",
                                            extra_args=["--config", str(config), "--workers", str(workers)],
                                            log_path=data_dir / "node.log")
                peer = (peer_port, second.pid) if second else None
                try:
                    # warm up: workers start in the background (imports: about 0.5 s of CPU
                    # each), and first connections make the upstream and inter-worker links
                    warm = argparse.Namespace(**{**vars(args), "messages": 2000 * workers})
                    for kind in kinds:
                        one_run(port, proc.pid, None, kind, max(workers, 2 if peer else 1), warm,
                                f"warm{round_}{kind[0]}", peer=peer)
                    for kind in kinds:
                        for pairs in pair_counts:
                            for placement in placements:
                                key = f"{kind}-{label}-{pairs}p" + ("" if placement == "random"
                                                                       else f"-{placement}")
                                run = one_run(port, proc.pid, primary.pid if primary and kind == "proxy" else None,
                                              kind, pairs, args, f"r{round_}{kind[0]}{pairs}{placement[0]}",
                                              placement, peer=peer)
                                runs.setdefault(key, []).append(run)
                                log(f"round {round_ + 1}: {kind:10s} {label}, {pairs} pairs, "
                                    f"{placement}: "
                                    + (f"{run['msgs_per_s']} msg/s, node {run['node_cpu_us_per_msg']} µs/msg"
                                       + (f", primary {run['primary_cpu_us_per_msg']} µs/msg"
                                          if run["primary_cpu_us_per_msg"] is not None else "")
                                       + (f" (second node {run['peer_cpu_us_per_msg']})"
                                          if run.get("peer_cpu_us_per_msg") is not None else "")
                                       if run["ok"] else run["error"]))
                finally:
                    h.stop_process(proc)
            finally:
                h.stop_process(primary)
                h.stop_process(second)
                shutil.rmtree(data_dir, ignore_errors=True)
    summary = {}
    for key, items in runs.items():
        good = [r for r in items if r["ok"]]
        summary[key] = {
            "runs": len(items), "failed": len(items) - len(good),
            "median_msgs_per_s": h.median([r["msgs_per_s"] for r in good]),
            "median_node_cpu_us_per_msg": h.median([r["node_cpu_us_per_msg"] for r in good]),
            "median_primary_cpu_us_per_msg": h.median([r["primary_cpu_us_per_msg"] for r in good]),
            "median_peer_cpu_us_per_msg": h.median([r.get("peer_cpu_us_per_msg") for r in good]),
            "median_clients_cpu_us_per_msg": h.median([r["clients_cpu_us_per_msg"] for r in good]),
        }
    base = worker_counts[0]
    for key, s in summary.items():
        kind, _, rest = key.split("-", 2)
        ref = summary.get(f"{kind}-{base}w-{rest}")
        if ref and ref["median_msgs_per_s"] and s["median_msgs_per_s"]:
            s["ratio_to_1_worker"] = round(s["median_msgs_per_s"] / ref["median_msgs_per_s"], 3)
        if ref and ref["median_node_cpu_us_per_msg"] and s["median_node_cpu_us_per_msg"]:
            s["cpu_ratio_to_1_worker"] = round(
                s["median_node_cpu_us_per_msg"] / ref["median_node_cpu_us_per_msg"], 3)
    print(f"{'run':<31} {'msg/s':>9} {'vs W=1':>7} {'node µs/msg':>12} {'CPU vs W=1':>11} "
          f"{'primary µs/msg':>15} {'clients µs/msg':>15}")
    for key, s in summary.items():
        print(f"{key:<31} {s['median_msgs_per_s'] or 0:>9.0f} {s.get('ratio_to_1_worker', 0):>7.2f} "
              f"{s['median_node_cpu_us_per_msg'] or 0:>12.1f} {s.get('cpu_ratio_to_1_worker', 0):>11.2f} "
              f"{s['median_primary_cpu_us_per_msg'] or 0:>15.1f} "
              f"{s['median_clients_cpu_us_per_msg'] or 0:>15.1f}")
    out = {"bench": "scale", "machine": h.machine_info(), "messages": args.messages,
           "rounds": args.rounds, "body_bytes": args.body_bytes, "kinds": kinds,
           "workers": worker_counts, "pairs": pair_counts, "summary": summary, "runs": runs}
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(out, indent=2) + "\n")
    save_bars(Path(args.output).with_suffix(".png"), "msg/s by kind, pairs and workers",
              [f"{kind} {pairs}p" for kind in kinds for pairs in pair_counts],
              {f"{w} workers": [summary.get(f"{kind}-{w}w-{pairs}p", {}).get("median_msgs_per_s")
                                for kind in kinds for pairs in pair_counts] for w in worker_counts},
              "msg/s")
    log(f"wrote {h.rel(args.output)} and its chart")
    return 0


if __name__ == "__main__":
    sys.exit(main())
