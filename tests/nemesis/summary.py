"""The nemesis's report as a table, Jepsen-style: per fault kind, the runs, messages accepted,
lost, duplicated, recovered, and unavailability (the longest gap without an acceptance on any
queue, p50 and max; and one producer's longest wait, max), from the reports ``NEMESIS_RESULTS`` collected (``make nemesis``).

    python tests/nemesis/summary.py var/nemesis/results.jsonl
"""

from __future__ import annotations

import collections
import json
import sys


def main(path: str) -> int:
    runs = [json.loads(line) for line in open(path) if line.strip()]
    by_fault = collections.defaultdict(list)
    totals = collections.Counter()
    for run in runs:
        if run["mode"] == "control":
            continue
        for key in ("accepted", "lost", "unexpected", "duplicated", "recovered", "lost_by_design"):
            totals[key] += run.get(key, 0)
        totals["runs"] += 1
        for episode in run["episodes"]:
            by_fault[episode["fault"]].append(episode)
    print("| fault | episodes | longest gap p50 (s) | longest gap max (s) | one producer's max (s) "
          "| duplicates (in flight) |")
    print("|---|---|---|---|---|---|")
    for fault, episodes in sorted(by_fault.items()):
        gaps = sorted(e["longest_gap_s"] for e in episodes if e["longest_gap_s"] is not None)
        p50 = gaps[len(gaps) // 2] if gaps else None
        dup = sum(e.get("duplicated", 0) for e in episodes)
        flight = sum(e.get("in_flight", 0) for e in episodes)
        producer = max((e["producer_gap_s"] for e in episodes if e.get("producer_gap_s") is not None),
                       default=None)  # runs from before it was measured have none
        print(f"| {fault} | {len(episodes)} | {p50} | {gaps[-1] if gaps else None} | {producer} "
              f"| {dup} ({flight}) |")
    seeds = sorted({r["seed"] for r in runs if r["mode"] != "control"})
    print(f"\n{totals['lost']} lost of {totals['accepted']} accepted across {len(seeds)} seeds "
          f"({totals['runs']} runs); unexpected {totals['unexpected']}, duplicated "
          f"{totals['duplicated']}, recovered {totals['recovered']}; lost by design (queues not "
          f"durable, every node killed at once) {totals['lost_by_design']}")
    controls = [r for r in runs if r["mode"] == "control"]
    if controls:
        print(f"control runs (a local queue, kill -9): {sum(r['lost'] for r in controls)} lost of "
              f"{sum(r['accepted'] for r in controls)} accepted in {len(controls)} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
