"""Trace replay input: ``(t_offset_ms, address, size)`` rows from CSV or Parquet.

A trace says when (milliseconds from the start), where (the address) and how
big (body bytes) each message is. Rows are dealt round-robin to the
producers (``monotonically_increasing_id() % producers``, so no job runs to
number them); each producer replays its rows in time order at ``speed``
times the recorded pace (``--speed 2`` replays a 10-minute trace in 5).
CSV files need a header line naming the three columns; extra columns are
ignored.
"""

from __future__ import annotations

TRACE_COLUMNS = ("t_offset_ms", "address", "size")


def read_trace(spark, path: str, producers: int):
    from pyspark.sql import functions as F
    from pyspark.sql.types import DoubleType, IntegerType, StringType, StructField, StructType

    if path.endswith(".csv") or path.endswith(".csv.gz"):
        raw = spark.read.option("header", True).csv(path)
    else:
        raw = spark.read.parquet(path)
    missing = [c for c in TRACE_COLUMNS if c not in raw.columns]
    if missing:
        raise ValueError(f"trace {path}: missing column(s) {', '.join(missing)} "
                         f"(needs {', '.join(TRACE_COLUMNS)}; found {', '.join(raw.columns)})")
    typed = raw.select(
        (F.monotonically_increasing_id() % producers).cast(IntegerType()).alias("producer"),
        F.col("t_offset_ms").cast(DoubleType()).alias("t_offset_ms"),
        F.col("address").cast(StringType()).alias("address"),
        F.col("size").cast(IntegerType()).alias("size"),
    )
    bad = typed.filter(F.col("t_offset_ms").isNull() | (F.col("t_offset_ms") < 0) | F.col("address").isNull()
                       | (F.col("address") == "") | F.col("size").isNull() | (F.col("size") < 0)).limit(1).collect()
    if bad:
        raise ValueError(f"trace {path}: bad row (needs t_offset_ms >= 0, a non-empty address, size >= 0): "
                         f"{bad[0].asDict()}")
    schema = StructType([StructField("producer", IntegerType()), StructField("t_offset_ms", DoubleType()),
                         StructField("address", StringType()), StructField("size", IntegerType())])
    return typed.select([F.col(f.name).cast(f.dataType) for f in schema.fields])
