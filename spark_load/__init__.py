"""Spark load generator for fedgate: ``fedgate-load``, ``python -m spark_load``, ``spark-submit spark_load/job.py``.

Producers and consumers are the partitions of one Spark barrier stage, each
with its own AMQP connection (``amqp_client``) to a gateway; they agree when
to stop through ``BarrierTaskContext.allGather`` (``coordination``). The raw
records go to Parquet, and ``verify`` checks them exactly with DataFrames
(sent, received, lost, duplicated by cause, order violations) and computes
latency percentiles and throughput; ``plots`` draws PNGs. ``demo`` starts a
local two-node cluster for ``--demo``. spark_load talks to fedgate only over
AMQP and HTTP.
"""
