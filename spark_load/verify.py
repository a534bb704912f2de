"""Exact verification of a run's records with Spark DataFrames.

Keys: a message is ``(producer, seq)``; one *send attempt* of it is
``(producer, seq, attempt_id)``, ``attempt_id`` naming the producer task
attempt that sent it (``LAUNCH-taskAttemptId()``). All ``sent`` rows come
from the producers' successful attempt (Spark discards a failed attempt's
output), so:

* ``expected`` = sent rows with outcome ``accepted`` (or ``presettled``);
* ``lost`` = expected left-anti-joined with the received send-attempt keys;
* ``duplicated`` = received rows minus distinct received messages, split
  exactly into
  - ``task_retry``: copies sent by another task attempt (an earlier, failed
    launch with the same run id, or a re-run stage),
  - ``producer_resend``: copies with another ``resend`` number (the producer
    resent a message whose outcome it never learnt, after a reconnect),
  - ``gateway_redelivery``: the same send delivered more than once (e.g. an
    acceptance lost with a broken consumer connection);
* ``order_violations``: per consumer and per (producer, address, task attempt),
  received rows whose ``seq`` is below the largest ``seq`` that consumer had
  already received from that producer (receive order = ``recv_index``);
* latency = receive time of a message's first copy minus its first send
  time, in ms (wall clocks of two hosts: see the README about clock skew).
"""

from __future__ import annotations

import json
import math

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

MSG = ["producer", "seq"]
SEND = ["producer", "seq", "attempt_id"]
PERCENTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99, "p999": 0.999}
EXPECTED = ("accepted", "presettled")


def analyze(records: DataFrame, run_id: str, max_listed: int = 20) -> dict:
    """The report's numbers from the raw records (a handful of Spark jobs, all exact but the percentiles)."""
    spark = records.sparkSession
    tasks = [(row.task, row.node, json.loads(row.detail))
             for row in records.filter(F.col("kind") == "task").select("task", "node", "detail").collect()]
    rows = sum(d.get("sent", 0) + d.get("received", 0) for _, _, d in tasks)
    # small runs: one shuffle partition and no adaptive re-planning (scheduling dominates);
    # big ones: about 250k rows per shuffle partition
    conf = {"spark.sql.shuffle.partitions": str(min(400, rows // 250_000 + 1)),
            "spark.sql.adaptive.enabled": "false" if rows < 1_000_000 else "true"}
    previous = {key: spark.conf.get(key) for key in conf}
    for key, value in conf.items():
        spark.conf.set(key, value)
    try:
        return _analyze(records, run_id, tasks, max_listed)
    finally:
        for key, value in previous.items():
            spark.conf.set(key, value)


def _analyze(records: DataFrame, run_id: str, tasks: list, max_listed: int) -> dict:
    ours = F.coalesce(F.col("run_id") == F.lit(run_id), F.lit(False))
    sent = records.filter(F.col("kind") == "sent").select(
        *SEND, "outcome", "sent_ns", F.col("t_ns").alias("outcome_ns"))
    recv = records.filter((F.col("kind") == "recv") & ours)

    # one row per send attempt: its outcome (if it is from the final attempt) and its received copies
    got = recv.groupBy(*SEND).agg(
        F.count(F.lit(1)).alias("copies"), F.countDistinct("resend").alias("variants"),
        F.min("t_ns").alias("first_ns"),
        F.sum(F.when(F.col("delivery_count") > 0, 1).otherwise(0)).alias("marked"))
    joined = (sent.join(got, on=SEND, how="full_outer")
              .withColumn("expected", F.col("outcome").isin(*EXPECTED))
              .withColumn("latency_ms", F.when(F.col("outcome").isNotNull(),
                                               (F.col("first_ns") - F.col("sent_ns")) / 1e6))
              .cache())
    received = F.col("copies").isNotNull()
    totals = joined.agg(
        F.sum("copies").alias("rows"),
        F.count("copies").alias("sends"),
        F.sum("variants").alias("resends"),
        F.countDistinct(F.when(received, F.col("producer")), F.when(received, F.col("seq"))).alias("messages"),
        F.sum("marked").alias("marked"),
        F.sum(F.when(F.col("expected") & ~received, 1).otherwise(0)).alias("lost"),
        F.sum(F.when(F.col("outcome").isNull(), F.col("copies")).otherwise(0)).alias("stale"),
        *[F.sum(F.when(F.col("outcome") == o, 1).otherwise(0)).alias(o)
          for o in ("accepted", "rejected", "presettled")],
        F.count("outcome").alias("sent"),
        F.percentile_approx("latency_ms", list(PERCENTILES.values()), 100000).alias("q"),
        F.min("latency_ms").alias("lat_min"), F.max("latency_ms").alias("lat_max"),
        F.mean("latency_ms").alias("lat_mean"),
        F.min("sent_ns").alias("first_send"), F.max("outcome_ns").alias("last_outcome"),
        F.max(F.when(F.col("outcome").isNotNull(), F.col("first_ns"))).alias("last_recv"),
    ).first()
    n = {k: int(totals[k] or 0) for k in ("rows", "sends", "resends", "messages", "marked", "lost", "stale",
                                          "accepted", "rejected", "presettled", "sent")}
    lost_sample = []
    if n["lost"]:
        lost_sample = [list(r) for r in joined.filter(F.col("expected") & ~received)
                       .select(*MSG).orderBy(*MSG).limit(max_listed).collect()]

    latency = {"min": totals["lat_min"], "mean": totals["lat_mean"], "max": totals["lat_max"]}
    quantiles = totals["q"] or [None] * len(PERCENTILES)
    latency.update({k: (float(v) if v is not None else None) for k, v in zip(PERCENTILES, quantiles)})
    first_send, last_recv, last_outcome = totals["first_send"], totals["last_recv"], totals["last_outcome"]
    window_s = (last_recv - first_send) / 1e9 if first_send and last_recv else None
    send_window_s = (last_outcome - first_send) / 1e9 if first_send and last_outcome else None

    order, per_consumer = _order(recv)
    per_node, per_producer, foreign = _counts(records, ours)
    for task, node, detail in tasks:
        if detail["role"] == "consumer":
            per_consumer.setdefault(task, {"received": 0, "distinct": 0, "duplicates": 0, "order_violations": 0})
            per_consumer[task].update({"by_node": detail["by_node"], "reconnects": detail["reconnects"],
                                       "gateway": detail["gateway"]})
        else:
            per_producer.setdefault(task, {"messages": 0, "accepted": 0}).update(
                {"sends": detail["sent"], "resent": detail["resent"], "reconnects": detail["reconnects"],
                 "gateway": detail["gateway"], "errors": detail["errors"]})

    report = {
        "run_id": run_id,
        "sent": n["sent"],
        "accepted": n["accepted"] + n["presettled"],
        "outcomes": {k: n[k] for k in ("accepted", "rejected", "presettled") if n[k]},
        "received": n["rows"],
        "received_distinct": n["messages"],
        "lost": n["lost"],
        "lost_sample": lost_sample,
        "duplicated": n["rows"] - n["messages"],
        "duplicates_by_cause": {
            "task_retry": n["sends"] - n["messages"],
            "producer_resend": n["resends"] - n["sends"],
            "gateway_redelivery": n["rows"] - n["resends"],
        },
        "redelivery_marked": n["marked"],
        "stale_attempt_copies": n["stale"],
        "foreign": foreign,
        "order_violations": sum(c["order_violations"] for c in per_consumer.values()),
        "order_violations_first_copies": sum(c["order_violations_first_copies"] for c in per_consumer.values()
                                             if "order_violations_first_copies" in c),
        "order_violations_by_consumer": order,
        "throughput_msgs_per_s": (n["messages"] / window_s) if window_s else None,
        "send_throughput_msgs_per_s": (n["sent"] / send_window_s) if send_window_s else None,
        "load_window_s": window_s,
        "latency_ms": latency,
        "per_node": per_node,
        "per_consumer": per_consumer,
        "per_producer": per_producer,
        "reconnects": sum(d["reconnects"] for _, _, d in tasks),
        "resent": sum(d.get("resent", 0) for _, _, d in tasks),
        "tasks": {task: {"node": node, **detail} for task, node, detail in tasks},
        "series": series(joined, first_send, last_recv),
    }
    joined.unpersist()
    return report


def _order(recv: DataFrame) -> tuple[dict, dict]:
    """Order violations per consumer and producer, and per-consumer counts (one job)."""
    stream = ["consumer", "producer", "address", "attempt_id"]
    before = Window.partitionBy(*stream).orderBy("recv_index").rowsBetween(Window.unboundedPreceding, -1)
    first_here = Window.partitionBy("consumer", *SEND).orderBy("recv_index")
    ordered = (recv.withColumn("prev_max", F.max("seq").over(before))
               .withColumn("copy", F.row_number().over(first_here))
               .withColumn("violation", F.coalesce((F.col("seq") < F.col("prev_max")).cast("int"), F.lit(0))))
    rows = (ordered.groupBy("consumer", "producer")
            .agg(F.count(F.lit(1)).alias("received"), F.countDistinct("seq").alias("distinct"),
                 F.sum("violation").alias("violations"),
                 F.sum(F.when(F.col("copy") == 1, F.col("violation")).otherwise(0)).alias("first_copy"))
            .collect())
    order: dict = {}
    per_consumer: dict = {}
    for r in rows:
        name = f"c{r.consumer}"
        order.setdefault(name, {})[f"p{r.producer}"] = int(r.violations)
        c = per_consumer.setdefault(name, {"received": 0, "distinct": 0, "duplicates": 0, "order_violations": 0,
                                           "order_violations_first_copies": 0})
        c["received"] += int(r.received)
        c["distinct"] += int(r.distinct)
        c["duplicates"] = c["received"] - c["distinct"]
        c["order_violations"] += int(r.violations)
        c["order_violations_first_copies"] += int(r.first_copy)
    return order, per_consumer


def _counts(records: DataFrame, ours) -> tuple[dict, dict, int]:
    """Per-node and per-producer counts, and messages from other runs (one job)."""
    rows = (records.filter(F.col("kind") != "task")
            .groupBy("kind", "node", "producer", ours.alias("ours"), "outcome").count().collect())
    per_node: dict = {"received": {}, "acknowledged_sends": {}}
    per_producer: dict = {}
    foreign = 0
    for r in rows:
        node = r.node if r.node is not None else "?"
        if r.kind == "recv":
            if r.ours:
                per_node["received"][node] = per_node["received"].get(node, 0) + r["count"]
            else:
                foreign += r["count"]
        else:
            per_node["acknowledged_sends"][node] = per_node["acknowledged_sends"].get(node, 0) + r["count"]
            p = per_producer.setdefault(f"p{r.producer}", {"messages": 0, "accepted": 0})
            p["messages"] += r["count"]
            if r.outcome in EXPECTED:
                p["accepted"] += r["count"]
    return per_node, per_producer, foreign


def series(joined: DataFrame, origin_ns: int | None, end_ns: int | None, buckets: int = 100) -> dict:
    """Small aggregates for the plots (one job): receive/send counts over time, latency histogram."""
    if origin_ns is None:
        return {"bucket_s": None, "received": [], "sent": [], "latency_hist": []}
    width_s = max(0.1, ((end_ns or origin_ns) - origin_ns) / 1e9 / buckets)
    width_ns = int(width_s * 1e9)

    def bucket(column: str):
        return F.floor((F.col(column) - F.lit(origin_ns)) / F.lit(width_ns))

    # 20 log-spaced latency bins per decade, from 1 µs
    lat_bin = F.floor(F.log10(F.greatest(F.col("latency_ms"), F.lit(0.001))) * 20)
    final = joined.filter(F.col("outcome").isNotNull())
    points = final.select(F.explode(F.array(
        F.struct(F.lit("sent").alias("s"), bucket("sent_ns").alias("b")),
        F.struct(F.lit("received").alias("s"), bucket("first_ns").alias("b")),
        F.struct(F.lit("latency").alias("s"), lat_bin.alias("b")),
    )).alias("p")).select("p.s", "p.b").filter(F.col("b").isNotNull())
    out: dict = {"bucket_s": width_s, "received": [], "sent": [], "latency_hist": []}
    for r in points.groupBy("s", "b").count().orderBy("s", "b").collect():
        if r.s == "latency":
            out["latency_hist"].append([math.pow(10, int(r.b) / 20), math.pow(10, (int(r.b) + 1) / 20),
                                        int(r["count"])])
        else:
            out[r.s].append([int(r.b), int(r["count"])])
    return out
