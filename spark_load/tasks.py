"""The function every partition of the barrier stage runs.

Partition ``i`` is producer ``i`` for ``i < producers``, else consumer
``i - producers`` (``LoadSettings.role_of``). Everything with a socket or a
proton object is created here, inside the task, and closed in the task's
``finally``; the closure Spark pickles holds only the settings.

A producer's input rows are its slice of a replayed trace
``(key, (t_offset_ms, address, size))``, already sorted by time; without a
trace the input is empty and the producer generates its own plan.
"""

from __future__ import annotations

from .consumer import Consumer
from .coordination import Coordinator
from .producer import Producer, generated_plan, trace_plan


def run_partition(settings, trace: bool, rows):
    from pyspark import BarrierTaskContext

    context = BarrierTaskContext.get()
    partition = context.partitionId()
    attempts = (f"{settings.launch}-{context.taskAttemptId()}", context.attemptNumber())
    role, index = settings.role_of(partition)
    coordinator = Coordinator(context, settings, partition)
    if role == "producer":
        plan = trace_plan(settings, (value for _, value in rows)) if trace else generated_plan(settings, index)
        worker = Producer(settings, index, attempts, plan, coordinator)
    else:
        for _ in rows:  # consumers get no input rows
            pass
        worker = Consumer(settings, index, attempts, coordinator)
    coordinator.snapshot = worker.snapshot
    yield from worker.run()
