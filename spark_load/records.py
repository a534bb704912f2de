"""The raw records of a run: one row type for sends, receives and task summaries.

The barrier stage yields plain tuples in ``COLUMNS`` order; the job turns
them into a DataFrame with the explicit ``schema()`` (no inference, so the
side-effecting stage is evaluated exactly once) and writes them as Parquet.

``kind``
    ``sent``: one per final send outcome (``outcome`` = accepted, rejected or
    presettled; ``t_ns`` = when the outcome arrived);
    ``recv``: one per message a consumer received (``t_ns`` = receive time,
    ``node`` = the serving node's container id, ``recv_index`` = the
    consumer's own receive order, ``run_id`` empty for a message that is not
    from this run);
    ``task``: one per task, ``detail`` holds its counters as JSON.
"""

from __future__ import annotations

import json

COLUMNS = (
    ("kind", "string"), ("task", "string"), ("run_id", "string"),
    ("attempt_id", "string"), ("attempt", "int"), ("producer", "int"), ("seq", "long"),
    ("resend", "int"), ("address", "string"), ("size", "int"), ("node", "string"),
    ("consumer", "int"), ("recv_index", "long"), ("delivery_count", "int"),
    ("sent_ns", "long"), ("t_ns", "long"), ("outcome", "string"), ("detail", "string"),
)


def schema():
    from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

    types = {"string": StringType(), "int": IntegerType(), "long": LongType()}
    return StructType([StructField(name, types[kind], True) for name, kind in COLUMNS])


class Row:
    """Builders for the three kinds of row (tuples in ``COLUMNS`` order)."""

    @staticmethod
    def sent(task, run_id, producer, seq, attempts, resend, address, size, node, sent_ns, t_ns, outcome):
        attempt_id, attempt = attempts
        return ("sent", task, run_id, attempt_id, attempt, producer, seq, resend, address, size,
                node, None, None, None, sent_ns, t_ns, outcome, None)

    @staticmethod
    def recv(task, consumer, props, address, size, node, recv_index, delivery_count, t_ns):
        def get(key, cast):
            value = props.get(key)
            return cast(value) if value is not None else None

        return ("recv", task, get("run_id", str), get("attempt_id", str), get("attempt", int),
                get("producer", int), get("seq", int), get("resend", int), address, size, node,
                consumer, recv_index, delivery_count, get("sent_ns", int), t_ns, None, None)

    @staticmethod
    def task(task, attempts, node, detail: dict):
        attempt_id, attempt = attempts
        return ("task", task, None, attempt_id, attempt, None, None, None, None, None, node,
                None, None, None, None, None, None, json.dumps(detail))
