#!/usr/bin/env python3
"""Where a proxied message's CPU goes: py-spy samples the node during one proxy run.

    .venv/bin/python bench/profile_proxy.py [--messages 100000] [--top 25]
                                            [--primary rabbitmq|rabbitmq4|artemis|fedgate] [--pairs 1]
                                            [--layout shared|split|node]

Starts the same node as ``bench/proxy.py`` (rule ``rq.* -> the primary``), runs
``--pairs`` C senders and receivers through it while ``py-spy record`` samples the node
(``--native`` off: Python frames; C time shows in the calling function), then
prints the functions with the most samples of their own (self) and the most
samples including what they call (total), as shares of all samples, and the
node's CPU µs per message. Needs py-spy (``pip install py-spy``) and, like
``bench/proxy.py``, RabbitMQ and the C clients (``make bench-deps``).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import proxy as bench_proxy  # noqa: E402  (bench/proxy.py)


def collapse(path: Path) -> tuple[collections.Counter, collections.Counter, int]:
    """Self and total sample counts per function from py-spy's raw (collapsed) output."""
    own, total, samples = collections.Counter(), collections.Counter(), 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        samples += n
        frames = [f.split(" (")[0] + " (" + f.split(" (")[1].split(":")[0].rsplit("/", 1)[-1] + ")"
                  if " (" in f else f for f in stack.split(";")]
        own[frames[-1]] += n
        for frame in set(frames):
            total[frame] += n
    return own, total, samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--primary", default="rabbitmq",
                        help="rabbitmq (3.10), rabbitmq4, artemis or fedgate, as in bench/proxy.py")
    parser.add_argument("--pairs", type=int, default=1)
    parser.add_argument("--layout", choices=("shared", "split", "node"), default="shared",
                        help="CPU layout of the profiled run, as in bench/proxy.py")
    args = parser.parse_args()
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    node_args = argparse.Namespace(node_start_timeout=30.0, keep_data=False, timeout=300.0,
                                   body_bytes=bench_proxy.h.DEFAULT_BODY_BYTES,
                                   credit=bench_proxy.h.DEFAULT_CREDIT_WINDOW,
                                   messages=args.messages, pool_size=1)
    primary = bench_proxy.Primary(args.primary, node_args)
    node = bench_proxy.ProxyNode(node_args, "rq.*", "profile", primary=primary)
    raw = Path(tempfile.mkdtemp(prefix="fedgate-profile-")) / "node.txt"
    try:
        bench_proxy.run_target("proxy", node, primary, "profile-warmup",
                               argparse.Namespace(**{**vars(node_args), "messages": 5000}))
        recorder = subprocess.Popen([spy, "record", "-p", str(node.pid), "-r", str(args.rate),
                                     "--format", "raw", "-o", str(raw), "--nonblocking"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with (bench_proxy.SplitCpus(primary.pid, node.pid, node_alone=args.layout == "node")
              if args.layout != "shared" else contextlib.nullcontext()):
            row = bench_proxy.run_target("proxy", node, primary, "profile", node_args, args.pairs)
        recorder.send_signal(2)
        recorder.wait(timeout=30)
    finally:
        node.stop()
        primary.stop()
    own, total, samples = collapse(raw)
    print(f"{row['msgs_per_s']} msg/s, node {row['node_cpu_us_per_msg']} µs/msg, {samples} samples")
    print("\nself (own samples)")
    for name, n in own.most_common(args.top):
        print(f"  {100 * n / samples:5.1f}%  {name}")
    print("\ntotal (with callees)")
    for name, n in total.most_common(args.top):
        print(f"  {100 * n / samples:5.1f}%  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
