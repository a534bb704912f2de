"""The Spark side of a load run: session, the barrier stage, verification, report.

How this works
--------------
``run_load`` builds one RDD with ``producers + consumers`` partitions (empty,
or a trace's rows partitioned by producer and sorted by time), runs
``tasks.run_partition`` on it as a barrier stage (every task starts at the
same time; ``local[N]`` needs N >= producers + consumers), gives the result an
explicit schema and writes it as Parquet. That write is the only action on
the side-effecting stage: everything after it reads the Parquet back, so no
message is ever sent twice because a DataFrame was evaluated twice.

Spark settings that matter here (``session_conf``): speculation off (a
speculative copy of a producer would send everything again), a bounded
barrier sync timeout, no console progress bar (the driver prints its own
progress, fed by UDP datagrams from partition 0, see ``coordination``).

Run it with ``fedgate-load`` / ``python -m spark_load`` or
``spark-submit spark_load/job.py ARGS`` (the same arguments).
"""

from __future__ import annotations

import functools
import json
import os
import re
import socket
import sys
import tempfile
import threading
import time
import uuid
import zipfile
from dataclasses import asdict, replace
from pathlib import Path

if __package__ in (None, ""):  # spark-submit spark_load/job.py: make the package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from spark_load import plots, records, verify  # noqa: E402
from spark_load.settings import LoadSettings  # noqa: E402
from spark_load.tasks import run_partition  # noqa: E402

PACKAGE_DIR = Path(__file__).resolve().parent


def under_spark_submit() -> bool:
    return "PYSPARK_GATEWAY_PORT" in os.environ


def local_slots(master: str) -> int | None:
    """Slots of a local master (``local``, ``local[4]``, ``local[4,2]``, ``local[*]``); None otherwise."""
    if master == "local":
        return 1
    match = re.fullmatch(r"local\[(\*|\d+)(?:,\s*\d+)?\]", master)
    if not match:
        return None
    if match.group(1) == "*":
        return os.cpu_count() or 1
    return int(match.group(1))


def session_conf() -> dict:
    return {
        "spark.speculation": "false",
        "spark.barrier.sync.timeout": "900",  # seconds; a barrier call never waits longer
        "spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures": "3",
        "spark.scheduler.barrier.maxConcurrentTasksCheck.interval": "5s",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
    }


def build_session(partitions: int, master: str | None = None, app_name: str = "fedgate-load"):
    """A SparkSession for ``partitions`` concurrent tasks (local[N] unless told otherwise)."""
    if master is None and not under_spark_submit():
        master = f"local[{partitions}]"
    if master is not None and master.startswith("local"):
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
        if master.startswith("local"):
            builder = builder.config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress",
                                                                              "127.0.0.1")
    for key, value in session_conf().items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def check_slots(spark, partitions: int) -> None:
    master = spark.sparkContext.master
    slots = local_slots(master)
    if slots is not None and slots < partitions:
        raise ValueError(f"master {master} has {slots} task slots but the barrier stage needs "
                         f"{partitions} (producers + consumers): use local[{partitions}] or more")
    if slots is None and spark.sparkContext.defaultParallelism < partitions:
        print(f"fedgate-load: warning: the cluster reports {spark.sparkContext.defaultParallelism} cores "
              f"for {partitions} barrier tasks; the stage waits for enough free slots", file=sys.stderr)


def ship_package(spark) -> None:
    """On a cluster, send this package to the executors (python-qpid-proton must be there already)."""
    if local_slots(spark.sparkContext.master) is not None:
        return
    archive = Path(tempfile.mkdtemp(prefix="fedgate-load-")) / "fedgate_spark_load.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for path in PACKAGE_DIR.glob("*.py"):
            zf.write(path, f"spark_load/{path.name}")
    spark.sparkContext.addPyFile(str(archive))


# -- progress --------------------------------------------------------------------
class ProgressListener:
    """UDP datagrams from partition 0, printed at most once a second."""

    def __init__(self, host: str, out=sys.stderr) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((host if host in ("127.0.0.1", "localhost") else "0.0.0.0", 0))
        self.sock.settimeout(0.2)
        self.address = (host, self.sock.getsockname()[1])
        self.out = out
        self.latest: dict | None = None
        self.callbacks: list = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fedgate-load-progress", daemon=True)
        self.started = time.monotonic()

    def start(self) -> "ProgressListener":
        self._thread.start()
        return self

    def _run(self) -> None:
        last_print = 0.0
        while not self._stop.is_set():
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                continue
            except OSError:
                return
            try:
                self.latest = json.loads(data)
            except ValueError:
                continue
            for callback in self.callbacks:
                callback(self.latest)
            now = time.monotonic()
            if self.out is not None and (now - last_print >= 1.0 or self.latest.get("final")):
                last_print = now
                self.out.write(format_progress(self.latest, now - self.started) + "\n")
                self.out.flush()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.sock.close()


def format_progress(p: dict, elapsed: float) -> str:
    nodes = ", ".join(f"{node} {n}" for node, n in sorted(p.get("by_node", {}).items()))
    text = (f"[fedgate-load {elapsed:6.1f}s] sent {p['sent']} accepted {p['accepted']} "
            f"received {p['received']}" + (f" ({nodes})" if nodes else "")
            + f"  producers done {p['producers_done']}/{p['producers']}")
    if p.get("reconnects") or p.get("resent"):
        text += f"  reconnects {p['reconnects']} resent {p['resent']}"
    return text + ("  (stopping)" if p.get("final") else "")


# -- input -----------------------------------------------------------------------
def input_rdd(spark, settings: LoadSettings, trace_df=None):
    """The barrier stage's input: empty partitions, or trace rows by producer, sorted by time."""
    sc = spark.sparkContext
    n = settings.partitions
    if trace_df is None:
        return sc.parallelize([], n)
    keyed = trace_df.rdd.map(lambda r: ((int(r[0]), float(r[1])), (float(r[1]), r[2], int(r[3]))))
    return keyed.repartitionAndSortWithinPartitions(n, partitionFunc=_producer_of)


def _producer_of(key) -> int:
    return key[0]


# -- the run ---------------------------------------------------------------------
def run_load(spark, settings: LoadSettings, out: Path, trace: str | None = None, progress=True,
             on_progress=None, timings: dict | None = None) -> dict:
    """Run the load, verify it, write DIR/report.json, records.parquet and plots; return the report."""
    from spark_load import trace as trace_mod

    settings.validate()
    settings = replace(settings, launch=uuid.uuid4().hex[:8])
    check_slots(spark, settings.partitions)
    ship_package(spark)
    out = Path(out).absolute()  # executors resolve relative paths elsewhere
    out.mkdir(parents=True, exist_ok=True)
    records_path = out / "records.parquet"
    listener = None
    if progress or on_progress:
        host = spark.sparkContext.getConf().get("spark.driver.host", "127.0.0.1")
        listener = ProgressListener(host, out=sys.stderr if progress else None)
        if on_progress:
            listener.callbacks.append(on_progress)
        listener.start()
        settings = replace(settings, progress=listener.address)
    trace_df = None
    if trace:
        trace_df = trace_mod.read_trace(spark, trace, settings.producers)
        # consumers must listen on every address the trace sends to
        found = sorted(r[0] for r in trace_df.select("address").distinct().collect())
        settings = replace(settings, addresses=tuple(found))
    timings = dict(timings or {})
    try:
        started = time.monotonic()
        stage = input_rdd(spark, settings, trace_df).barrier().mapPartitions(
            functools.partial(run_partition, settings, trace_df is not None))
        spark.sparkContext.setJobDescription(f"fedgate-load {settings.run_id}: producers and consumers")
        frame = spark.createDataFrame(stage, records.schema(), verifySchema=False)
        frame.write.mode("overwrite").parquet(str(records_path))  # the one action of the load stage
        timings["load_stage_s"] = time.monotonic() - started
    finally:
        if listener is not None:
            listener.close()
    started = time.monotonic()
    spark.sparkContext.setJobDescription(f"fedgate-load {settings.run_id}: verification")
    report = verify.analyze(spark.read.parquet(str(records_path)), settings.run_id)
    timings["verify_s"] = time.monotonic() - started
    report["settings"] = {k: v for k, v in asdict(settings).items() if k != "progress"}
    report["settings"]["trace"] = trace
    report["timings_s"] = timings
    report["files"] = {"records": records_path.name, **plots.write_plots(report, out)}
    text = json.dumps(report, indent=2, sort_keys=True, default=str)
    (out / "report.json").write_text(text + "\n")
    return json.loads(text)  # the same as the file (lists, not tuples)


def summary(report: dict, out: Path) -> str:
    lat = report["latency_ms"]
    dup = report["duplicates_by_cause"]

    def ms(v):
        return f"{v:.2f}" if v is not None else "-"

    rate = report["throughput_msgs_per_s"]
    s = report["settings"]
    lines = [
        f"fedgate-load run {report['run_id']}: {s['producers']} producers, {s['consumers']} consumers, "
        f"gateways {', '.join(s['gateways'])}",
        f"  sent {report['sent']} (accepted {report['accepted']})  received {report['received']} "
        f"({report['received_distinct']} distinct)  lost {report['lost']}  duplicated {report['duplicated']} "
        f"(task retry {dup['task_retry']}, producer resend {dup['producer_resend']}, "
        f"gateway redelivery {dup['gateway_redelivery']})  order violations {report['order_violations']}",
        f"  throughput {rate:,.0f} msg/s over {report['load_window_s']:.2f} s" if rate else "  throughput -",
        f"  latency ms: p50 {ms(lat['p50'])}  p90 {ms(lat['p90'])}  p99 {ms(lat['p99'])}  "
        f"p999 {ms(lat['p999'])}  max {ms(lat['max'])}",
        "  received per node: " + ", ".join(f"{k} {v}" for k, v in sorted(report["per_node"]["received"].items(),
                                                                          key=lambda kv: str(kv[0]))),
        f"  reconnects {report['reconnects']}, resent {report['resent']}; "
        f"load stage {report['timings_s']['load_stage_s']:.1f} s, verification {report['timings_s']['verify_s']:.1f} s",
        f"  files: {out / 'report.json'}, {out / report['files']['records']}, "
        f"{out / report['files']['latency']}, {out / report['files']['throughput']}",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    from spark_load.cli import main

    sys.exit(main())
