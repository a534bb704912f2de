"""The nemesis (issue #42): replicated queues and fragments under seeded faults, checked as
Jepsen checks a queue (``harness.py``, ``checker.py``, docs/nemesis.md).

``make test`` runs one short seed per mode: ``single`` (one fault at a time, drawn from
every kind), ``combined`` (faults chosen to overlap: a backup paused while the primary is
killed, latency on every link with a kill, etcd paused, the etcd leader killed (etcd of three
members), power loss of every node, a rolling restart), and the control run (a plain local queue, which a kill -9 is allowed to lose: the
checker must say so, or it proves nothing). ``make nemesis`` runs 20 seeds or more of each
(``NEMESIS_SEED``, ``NEMESIS_SEEDS``, ``NEMESIS_SECONDS``, ``NEMESIS_KINDS``).

Pass: 0 lost and 0 unexpected, no client left with a link the server ended
(``link-closed``), and for every single fault the longest time without an acceptance stays
within lease_ttl + 2 s of the fault's start and end (a fault's own length excepted where the
fault stops the whole cluster: etcd paused, every node killed), per queue; and, where every
node keeps running, each producer's own wait within 2 x lease_ttl + 2 s.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
from etcd_servers import cluster_name  # noqa: F401 (fixture)
from toxi import toxi, toxiproxy_server  # noqa: F401 (fixtures)

import harness

# make test: per mode, a seed whose short schedule covers the most (NEMESIS_SEED: both);
# combined seed 10 has etcd paused, a backup paused as the primary dies, a kill and the etcd
# leader killed (etcd of three members). Its finding, a claim kept alive by a lease renewed
# after the node had fenced itself (nem.r3 without a primary), is fixed (docs/nemesis.md, 9)
SEEDS = {"single": 5, "combined": 10}
SEED = int(os.environ.get("NEMESIS_SEED", "0")) or None
SECONDS = float(os.environ.get("NEMESIS_SECONDS", "45"))
KINDS = [k for k in os.environ.get("NEMESIS_KINDS", "").split(",") if k]  # "one-way@primary,kill"
GAP_LIMIT = harness.LEASE_TTL + 2.0
# faults during which nothing can be accepted anywhere, by design: the gap is their length too
WHOLE_CLUSTER = ("etcd-pause", "power-loss")
# faults after which each producer on its own must be accepted again within the same limit
# (docs/nemesis.md, finding 15): every node keeps running. Not a pause: a client connected to a
# frozen node leaves it after its idle timeout (3 s, finding 21), and may try it again first
# (python-qpid-proton starts its URL list over after a connection that was opened), where
# the kernel accepts the connection and nothing answers for another idle timeout.
PER_PRODUCER = ("kill", "etcd-cut", "one-way", "isolate", "peers-cut")
# one producer may also wait for its node to find itself cut off and send it away, and for its
# own reconnection: a lease more than its queue (finding 15 measured 14-34 s before its fix)
PRODUCER_GAP_LIMIT = 2 * harness.LEASE_TTL + 2.0


def report_line(name: str, result: dict) -> str:
    keys = ("seed", "attempted", "accepted", "lost", "lost_by_design", "unexpected", "duplicated",
            "recovered", "unknown", "link_closed")
    return f"nemesis {name}: " + json.dumps({k: result[k] for k in keys})


def check_episodes(result: dict) -> list[str]:
    problems = []
    for episode in result["episodes"]:
        allowed = GAP_LIMIT + (episode["end"] - episode["start"]
                               if episode["fault"] in WHOLE_CLUSTER else 0.0)
        if episode["longest_gap_s"] is not None and episode["longest_gap_s"] > allowed + 0.0:
            problems.append(f"{episode['fault']} on {episode['node']}: {episode['longest_gap_s']} s "
                            f"without an acceptance (allowed {allowed:.1f})")
        waited = episode.get("producer_gap_s")
        if episode["fault"] in PER_PRODUCER and waited is not None and waited > PRODUCER_GAP_LIMIT:
            problems.append(f"{episode['fault']} on {episode['node']}: {episode['gap_producer']} "
                            f"waited {waited} s for an acceptance (allowed {PRODUCER_GAP_LIMIT:.1f})")
    return problems


def keep(tmp_path, name: str) -> None:
    """``NEMESIS_KEEP``: a directory each run's node logs, configurations, history and faults are
    copied to (``<dir>/<name>-<time>/``): pytest keeps only its last three temporary trees,
    and a finding is read in these files."""
    target = os.environ.get("NEMESIS_KEEP")
    if not target:
        return
    out = Path(target) / f"{name}-{time.strftime('%Y%m%dT%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    for pattern in ("*.log", "*.jsonl", "*.toml"):
        for path in tmp_path.glob(pattern):
            shutil.copy2(path, out / path.name)


def record(mode: str, result: dict) -> None:
    """``NEMESIS_RESULTS``: a JSON-lines file every run's report is appended to (summary.py)."""
    path = os.environ.get("NEMESIS_RESULTS")
    if path:
        with open(path, "a") as out:
            out.write(json.dumps({"mode": mode, **result}) + "\n")


@pytest.mark.timeout(int(SECONDS * 3 + 400))
@pytest.mark.parametrize("mode", ["single", "combined"])
def test_nemesis(tmp_path, start_node, toxi, cluster_name, mode):  # noqa: F811
    kinds = harness.SINGLE if mode == "single" else harness.COMBINED
    if KINDS:  # NEMESIS_KINDS: one fault again and again, to reproduce a finding
        kinds = KINDS
    seed = SEED or SEEDS[mode]
    episodes = harness.schedule(seed, SECONDS, kinds=kinds)
    # a schedule with the etcd leader killed runs on etcd of three members
    leader = any(e["fault"] == "etcd-leader-kill" for e in episodes)
    cluster = harness.NemesisCluster(tmp_path, start_node, toxi, cluster_name,
                                     etcd_size=3 if leader else 1)
    try:
        print(f"nemesis {mode} seed {seed}: {episodes}")
        result = harness.Run(cluster, tmp_path, seed=seed, run_id=f"{mode}{seed}").run(episodes)
    finally:
        cluster.stop()
        keep(tmp_path, f"{mode}{seed}")
    print(report_line(mode, result))
    record(mode, result)
    for episode in result["episodes"]:
        print(f"  {episode['fault']:>26} {episode['target']:>8} {episode['node']:>3}: first ok "
              f"{episode['first_ok_s']} s, longest gap {episode['longest_gap_s']} s, "
              f"({episode['gap_queue']}), one producer's {episode['producer_gap_s']} s "
              f"({episode['gap_producer']}), p50 {episode['latency_p50_s']} s, p99 "
              f"{episode['latency_p99_s']} s, duplicated {episode['duplicated']} of "
              f"{episode['in_flight']} in flight")
    assert result["accepted"] > 0
    assert result["lost"] == 0, result["lost_values"]
    assert result["unexpected"] == 0, result["unexpected_values"]
    assert result["link_closed"] == 0, "a client was left with a link the server ended"
    if mode == "single":
        assert not check_episodes(result), check_episodes(result)
    # duplicates within what was in flight at each fault (issue #42)
    assert all(e["duplicated"] <= e["in_flight"] for e in result["episodes"]), result["episodes"]


@pytest.mark.timeout(300)
def test_the_control_run_reports_loss(tmp_path, start_node, toxi, cluster_name):  # noqa: F811
    """A plain local queue on each node (no copies): the same checker must report what kill -9 lost."""
    rule = {"name": "ctl", "match": "ctl.local", "kind": "local"}
    cluster = harness.NemesisCluster(tmp_path, start_node, toxi, cluster_name,
                                     queues={"ctl.local": rule})
    try:
        run = harness.Run(cluster, tmp_path, seed=SEED or 5, run_id=f"ctl{SEED or 5}", rate=40.0,
                          addresses=["ctl.local"], consumers=False)
        episodes = [{"fault": "kill", "target": "n1", "at": 6.0, "length": 3.0}]
        result = run.run(episodes, drain_timeout=10.0)
    finally:
        cluster.stop()
    print(report_line("control", result))
    record("control", result)
    assert result["accepted"] > 0
    assert result["lost"] > 0  # held by the killed node only, accepted, gone
