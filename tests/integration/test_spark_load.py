"""The Spark load generator against real fedgate nodes (one Spark session for the module).

Every run here is a real barrier stage of producers and consumers talking
AMQP to real node processes; the checks read what the run wrote (report.json,
the PNGs, the Parquet records) the way a user would.
"""

from __future__ import annotations

import collections
import importlib.util
import json
import shutil
import struct
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import ROOT, require

HAVE_SPARK = importlib.util.find_spec("pyspark") is not None and shutil.which("java") is not None
PRODUCERS, CONSUMERS = 3, 2
SLOTS = PRODUCERS + CONSUMERS + 1


@pytest.fixture(scope="module")
def spark():
    require(HAVE_SPARK, "pyspark and a Java runtime (make test installs both)")
    from spark_load import job

    session = job.build_session(SLOTS)
    yield session
    session.stop()


@pytest.fixture
def cluster(tmp_path):
    """The demo's two nodes with its default rules (a fragmented queue `work.#` on both)."""
    from spark_load.demo import DemoCluster

    with DemoCluster(tmp_path / "cluster") as demo_cluster:
        yield demo_cluster


@pytest.fixture
def proxy_cluster(tmp_path):
    """`work` is a local queue on n1; n2 holds nothing and proxies `work.#` to n1."""
    from spark_load.demo import DemoCluster

    with DemoCluster(tmp_path / "cluster", queue_kind="proxy") as demo_cluster:
        yield demo_cluster


def settings_for(cluster, **options):
    from spark_load.settings import LoadSettings

    options.setdefault("addresses", (cluster.address,))
    return LoadSettings(gateways=tuple(cluster.urls), producers=options.pop("producers", PRODUCERS),
                        consumers=options.pop("consumers", CONSUMERS), **options)


def read_records(spark, out: Path) -> dict[str, list]:
    rows = spark.read.parquet(str(out / "records.parquet")).collect()
    by_kind = collections.defaultdict(list)
    for row in rows:
        by_kind[row.kind].append(row)
    return by_kind


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path.name} is not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def assert_duplicates_consistent(report: dict, recv_rows: list) -> None:
    """duplicated = received copies - distinct messages, and the causes add up to it."""
    ours = [r for r in recv_rows if r.run_id == report["run_id"]]
    distinct = {(r.producer, r.seq) for r in ours}
    assert report["received"] == len(ours)
    assert report["received_distinct"] == len(distinct)
    assert report["duplicated"] == len(ours) - len(distinct)
    assert sum(report["duplicates_by_cause"].values()) == report["duplicated"]
    resend_copies = len({(r.producer, r.seq, r.attempt_id, r.resend) for r in ours})
    assert report["duplicates_by_cause"]["gateway_redelivery"] == len(ours) - resend_copies


# -- the command a user runs ---------------------------------------------------------------
@pytest.mark.timeout(300)
def test_demo_command_loses_nothing_and_writes_report_plots_and_records(spark, tmp_path):
    """`fedgate-load --demo` on a fresh machine: its own two-node cluster, 3 x 2000 messages."""
    out = tmp_path / "out"
    command = [str(Path(sys.executable).with_name("fedgate-load")), "--demo", "--producers", "3",
               "--consumers", "2", "--messages", "2000", "--out", str(out)]
    if not Path(command[0]).exists():
        command[:1] = [sys.executable, "-m", "spark_load"]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "lost 0" in done.stdout and "latency ms: p50" in done.stdout
    assert "[fedgate-load" in done.stderr  # progress lines while it ran

    report = json.loads((out / "report.json").read_text())
    assert report["sent"] == report["accepted"] == 6000
    assert report["lost"] == 0 and report["lost_sample"] == []
    assert report["received_distinct"] == 6000
    assert report["order_violations"] == 0
    assert report["throughput_msgs_per_s"] > 0
    latency = report["latency_ms"]
    assert 0 <= latency["p50"] <= latency["p90"] <= latency["p99"] <= latency["p999"] <= latency["max"]
    # consumers were spread over both nodes, and each node served some of them
    assert set(report["per_node"]["received"]) == {"n1", "n2"}
    assert set(report["per_consumer"]) == {"c0", "c1"}
    assert sum(c["received"] for c in report["per_consumer"].values()) == report["received"]
    assert set(report["per_producer"]) == {"p0", "p1", "p2"}
    assert all(p["accepted"] == 2000 for p in report["per_producer"].values())

    for name in ("latency.png", "throughput.png"):
        width, height = png_size(out / name)
        assert width >= 400 and height >= 300
        assert (out / name).stat().st_size > 5000  # something was drawn

    records = read_records(spark, out)
    assert len(records["sent"]) == 6000 and len(records["task"]) == 5
    sent = {(r.producer, r.seq) for r in records["sent"]}
    assert sent == {(p, s) for p in range(3) for s in range(2000)}
    assert {(r.producer, r.seq) for r in records["recv"] if r.run_id == report["run_id"]} == sent
    assert {r.node for r in records["recv"]} == {"n1", "n2"}
    assert_duplicates_consistent(report, records["recv"])


# -- a node restarted mid-run ------------------------------------------------------------
@pytest.mark.timeout(300)
def test_restarting_the_proxy_node_mid_run_loses_nothing(spark, proxy_cluster, tmp_path):
    """n2 (proxying `work` to n1) is killed and restarted while producers and consumers use it."""
    from spark_load import job

    cluster = proxy_cluster

    settings = settings_for(cluster, messages=1000, rate=250.0)
    halfway = threading.Event()

    def watch(progress):
        if progress["received"] >= 500:
            halfway.set()

    result: dict = {}

    def run():
        try:
            result["report"] = job.run_load(spark, settings, tmp_path / "out", progress=False, on_progress=watch)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread
            result["error"] = exc

    runner = threading.Thread(target=run)
    runner.start()
    try:
        assert halfway.wait(120), f"the run made no progress: {result.get('error')!r}"
        cluster.restart("n2", kill=True)
    finally:
        runner.join(240)
    assert not runner.is_alive()
    if "error" in result:
        raise result["error"]
    report = result["report"]

    assert report["lost"] == 0, report["lost_sample"]
    assert report["sent"] == report["accepted"] == 3000
    # the producer and the consumer connected to n2 noticed, reconnected, and said why
    on_n2 = [t for t, d in report["tasks"].items() if d["reconnects"]]
    assert on_n2, "nobody reconnected: the restart did not happen mid-run"
    for task in on_n2:
        errors = report["tasks"][task]["errors"]
        assert errors and cluster.nodes["n2"].url in errors[0]
    assert report["reconnects"] >= 1
    records = read_records(spark, tmp_path / "out")
    assert_duplicates_consistent(report, records["recv"])
    resent = sum(d.get("resent", 0) for d in report["tasks"].values())
    assert report["resent"] == resent
    # a resent copy is told apart from the first one by its resend number
    if report["duplicates_by_cause"]["producer_resend"]:
        assert any(r.resend > 0 for r in records["recv"])


# -- trace replay ---------------------------------------------------------------------------
@pytest.mark.timeout(180)
def test_trace_replay_sends_each_row_to_its_address_at_the_given_speed(spark, cluster, tmp_path):
    from spark_load import job

    rows = [(i * 5, f"work.{'ab'[i % 2]}", 10 + (i % 7) * 100) for i in range(300)]  # 1.5 s of trace
    trace = tmp_path / "trace.csv"
    trace.write_text("t_offset_ms,address,size\n" + "".join(f"{t},{a},{s}\n" for t, a, s in rows))
    settings = settings_for(cluster, producers=2, consumers=2, speed=3.0)
    report = job.run_load(spark, settings, tmp_path / "out", trace=str(trace), progress=False)

    assert report["sent"] == 300 and report["lost"] == 0
    assert report["settings"]["addresses"] == ["work.a", "work.b"]
    records = read_records(spark, tmp_path / "out")
    first_copies = {}
    for r in records["recv"]:
        first_copies.setdefault((r.producer, r.seq), (r.address, r.size))
    assert collections.Counter(first_copies.values()) == collections.Counter((a, s) for _, a, s in rows)
    # paced: the sends spread over the trace's 1.5 s divided by the speed (0.5 s), not blasted at once
    by_producer = collections.defaultdict(list)
    for r in records["sent"]:
        by_producer[r.producer].append(r.sent_ns)
    for times in by_producer.values():
        assert (max(times) - min(times)) / 1e6 >= 0.9 * 1495 / 3.0


# -- failures surface -------------------------------------------------------------------------
@pytest.mark.timeout(180)
def test_a_refused_address_fails_the_run_with_the_condition(spark, start_node, tmp_path):
    from spark_load import job
    from spark_load.settings import LoadSettings

    node = start_node({"queues": {"auto_create": False}})
    settings = LoadSettings(gateways=(node.url,), addresses=("nowhere",), producers=1, consumers=1,
                            messages=10)
    with pytest.raises(Exception) as failure:
        job.run_load(spark, settings, tmp_path / "out", progress=False)
    assert "amqp:not-found" in str(failure.value)
    assert not (tmp_path / "out" / "report.json").exists()


# -- the verification itself -------------------------------------------------------------------
def test_verification_counts_exactly_on_crafted_records(spark):
    """Known records: one lost, one duplicate of each cause, one order violation, one foreign message."""
    from spark_load import records, verify
    from spark_load.records import Row

    run, a1, a0 = "run1", "L-7", "L-3"  # a1: the producer's final attempt; a0: an earlier one

    def sent(seq, outcome="accepted"):
        return Row.sent("p0", run, 0, seq, (a1, 0), 0, "work", 10, "n1", 1_000_000_000 + seq, 1_005_000_000,
                        outcome)

    index = iter(range(100))

    def recv(seq, consumer=0, attempt_id=a1, resend=0, run_id=run, delivery_count=0):
        props = {"run_id": run_id, "producer": 0, "seq": seq, "attempt_id": attempt_id, "attempt": 0,
                 "resend": resend, "sent_ns": 1_000_000_000 + seq}
        return Row.recv(f"c{consumer}", consumer, props, "work", 10, "n2", next(index), delivery_count,
                        1_002_000_000 + seq * 1_000_000)

    rows = [sent(s) for s in range(6)] + [sent(6, "rejected")] + [
        recv(0), recv(0, delivery_count=1),          # gateway redelivery
        recv(1), recv(1, resend=1),                  # producer resend
        recv(2, attempt_id=a0), recv(2),             # task retry (an earlier attempt's copy)
        recv(5), recv(4),                            # 4 after 5 on consumer 0: an order violation
        recv(9, run_id="other"),                     # another run's leftover
        # seq 3: lost; seq 6: rejected, not expected
        Row.task("p0", (a1, 0), "n1", {"role": "producer", "gateway": "amqp://x", "sent": 7, "expected": 6,
                                       "resent": 1, "reconnects": 1, "errors": ["boom"]}),
        Row.task("c0", (a1, 0), "n2", {"role": "consumer", "gateway": "amqp://y", "received": 9,
                                       "by_node": {"n2": 9}, "reconnects": 0, "errors": []}),
    ]
    frame = spark.createDataFrame(rows, records.schema())
    report = verify.analyze(frame, run)

    assert report["sent"] == 7 and report["accepted"] == 6
    assert report["outcomes"] == {"accepted": 6, "rejected": 1}
    assert report["lost"] == 1 and report["lost_sample"] == [[0, 3]]
    assert report["received"] == 8 and report["received_distinct"] == 5
    assert report["duplicated"] == 3
    assert report["duplicates_by_cause"] == {"task_retry": 1, "producer_resend": 1, "gateway_redelivery": 1}
    assert report["stale_attempt_copies"] == 1
    assert report["redelivery_marked"] == 1
    assert report["foreign"] == 1
    assert report["order_violations"] == 1
    assert report["order_violations_by_consumer"] == {"c0": {"p0": 1}}
    assert report["per_node"]["received"] == {"n2": 8}
    assert report["per_producer"]["p0"]["accepted"] == 6 and report["per_producer"]["p0"]["resent"] == 1
    # latency of the final attempt's first copies (seq 0, 1, 2, 4, 5): 2 ms + seq ms
    assert report["latency_ms"]["min"] == pytest.approx(2.0, abs=0.01)
    assert report["latency_ms"]["max"] == pytest.approx(7.0, abs=0.01)


def test_spark_submit_entry_runs_as_a_script():
    """`spark-submit spark_load/job.py ARGS` runs job.py as a script: it must find its package."""
    done = subprocess.run([sys.executable, str(ROOT / "spark_load" / "job.py"), "--help"],
                          capture_output=True, text=True, timeout=60, cwd="/")
    assert done.returncode == 0, done.stderr
    assert "--gateway" in done.stdout and "--demo" in done.stdout
