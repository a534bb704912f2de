"""``fedgate-load``: command line of the Spark load generator.

Exit status: 0 when nothing was lost, 1 when messages were lost, 2 for bad
arguments, 3 when the run itself failed (a refused link, a gateway that
stayed unreachable, a Spark failure): the error is printed.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
import uuid
from pathlib import Path

from .settings import SETTLE_MODES, LoadSettings


def _csv_list(values: list[str] | None) -> list[str]:
    out: list[str] = []
    for value in values or []:
        out += [v.strip() for v in value.split(",") if v.strip()]
    return out


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fedgate-load",
        description="Load a fedgate cluster with Spark: producers and consumers as one barrier stage, "
                    "exact verification (lost, duplicated, order), latency and throughput report.")
    where = p.add_argument_group("where")
    where.add_argument("--gateway", "-g", action="append", metavar="URL",
                       help="gateway URL amqp[s]://[user:pass@]host:port (repeat or comma-separate); "
                            "producers and consumers are spread over them")
    where.add_argument("--address", "-a", action="append", metavar="ADDR",
                       help="address(es) to load (repeat or comma-separate; default: work). Producer i "
                            "sends to address i mod n; every consumer receives from all")
    where.add_argument("--demo", action="store_true",
                       help="start a local two-node fedgate cluster and load it (no gateway needed)")
    where.add_argument("--demo-queue", choices=("proxy", "fragmented"), default=None,
                       help="demo rules: 'fragmented' (a fragment on each node) or 'proxy' (local queue "
                            "on n1, proxied by n2); default: fragmented")
    where.add_argument("--tls-ca", metavar="FILE", help="CA file for amqps:// gateways")
    load = p.add_argument_group("load")
    load.add_argument("--producers", "-p", type=int, default=2)
    load.add_argument("--consumers", "-c", type=int, default=2)
    load.add_argument("--messages", "-n", type=int, default=1000, help="messages per producer (default 1000)")
    load.add_argument("--duration", type=float, metavar="SECONDS",
                      help="send for this long instead of a message count")
    load.add_argument("--rate", type=float, default=0.0, help="messages/s per producer (0: as fast as credit allows)")
    load.add_argument("--body-size", type=int, default=100, help="body bytes (default 100)")
    load.add_argument("--settle", choices=SETTLE_MODES, default="at-least-once")
    load.add_argument("--credit", type=int, default=200, help="consumer credit window (default 200)")
    load.add_argument("--max-in-flight", type=int, default=1000, help="producer unsettled sends at most")
    load.add_argument("--durable", action="store_true", help="mark messages durable (AMQP header)")
    load.add_argument("--trace", metavar="FILE",
                      help="replay a CSV/Parquet trace of (t_offset_ms, address, size) instead")
    load.add_argument("--speed", type=float, default=1.0, help="trace replay speed factor (default 1)")
    run = p.add_argument_group("run")
    run.add_argument("--run-id", default=None, help="run id carried by every message (default: random)")
    run.add_argument("--out", type=Path, default=None, help="output directory (default ./fedgate-load-RUNID)")
    run.add_argument("--idle-ms", type=int, default=2000,
                     help="when messages are missing: stop after the consumers were idle this long")
    run.add_argument("--drain-timeout", type=float, default=60.0,
                     help="seconds to wait for stragglers after the producers finish, at most")
    run.add_argument("--max-reconnects", type=int, default=20, help="per task, whole run")
    run.add_argument("--master", help="Spark master (default local[producers+consumers]; under "
                                      "spark-submit, the one spark-submit sets)")
    run.add_argument("--quiet", "-q", action="store_true", help="no progress lines")
    return p


def settings_from(args, gateways: list[str], addresses: list[str]) -> LoadSettings:
    return LoadSettings(
        gateways=tuple(gateways), addresses=tuple(addresses), producers=args.producers,
        consumers=args.consumers, messages=args.messages, duration_s=args.duration, rate=args.rate,
        body_size=args.body_size, settle=args.settle, credit=args.credit, max_in_flight=args.max_in_flight,
        durable=args.durable, idle_ms=args.idle_ms, drain_timeout_s=args.drain_timeout,
        max_reconnects=args.max_reconnects, speed=args.speed, tls_ca=args.tls_ca,
        run_id=args.run_id or uuid.uuid4().hex[:12])


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    gateways = _csv_list(args.gateway)
    addresses = _csv_list(args.address)
    if args.demo and gateways:
        p.error("--demo starts its own gateways: leave out --gateway")
    if not args.demo and not gateways:
        p.error("give --gateway URL (or --demo)")
    if importlib.util.find_spec("pyspark") is None or importlib.util.find_spec("matplotlib") is None:
        print("fedgate-load needs pyspark and matplotlib: pip install 'fedgate[load]'", file=sys.stderr)
        return 2
    settings = settings_from(args, gateways or ["amqp://placeholder:1"], addresses or ["work"])
    try:
        settings.validate()
    except ValueError as exc:
        p.error(str(exc))
    out = args.out or Path(f"fedgate-load-{settings.run_id}")

    from . import demo, job

    cluster = None
    try:
        if args.demo:
            cluster = demo.DemoCluster(out / "demo-cluster", args.demo_queue or demo.DEMO_QUEUE)
            print(f"fedgate-load: starting a demo cluster ({cluster.queue_kind} queue {cluster.address!r}), "
                  f"logs in {cluster.workdir}", file=sys.stderr)
            cluster.start()
            from dataclasses import replace

            settings = replace(settings, gateways=tuple(cluster.urls),
                               addresses=tuple(addresses or [cluster.address]))
        started = time.monotonic()
        spark = job.build_session(settings.partitions, args.master)
        session_s = time.monotonic() - started
        try:
            report = job.run_load(spark, settings, out, trace=args.trace, progress=not args.quiet,
                                  timings={"spark_session_start_s": session_s})
        finally:
            spark.stop()
    except ValueError as exc:  # bad trace, too few slots ...
        print(f"fedgate-load: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - the run failed: say why, exit non-zero
        print(f"fedgate-load: run failed: {_root_cause(exc)}", file=sys.stderr)
        return 3
    finally:
        if cluster is not None:
            cluster.stop()
    print(job.summary(report, out))
    return 1 if report["lost"] else 0


def _root_cause(exc: BaseException) -> str:
    """Spark wraps a task's Python error in pages of JVM trace: keep the Python error's last line."""
    text = str(exc)
    marker = "Traceback (most recent call last)"
    if marker in text:
        tail = text[text.rindex(marker):].strip().splitlines()
        for line in reversed(tail):
            if line and not line.startswith((" ", "\t", "at ")):
                return line.strip()
    return text.strip().splitlines()[0] if text.strip() else repr(exc)


if __name__ == "__main__":
    sys.exit(main())
