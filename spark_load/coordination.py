"""Tasks of the barrier stage agree when the run is over.

How this works
--------------
Producers and consumers run at the same time as one barrier stage. No task
can know alone when the consumers have everything: a consumer only sees its
own messages, a producer only what it sent. So every task runs a
``Coordinator`` thread that calls ``BarrierTaskContext.allGather`` every
``sync_interval_s`` with a small JSON snapshot of its counters. Every task
gets the same list back (ordered by partition) and applies the same pure
rule, ``should_stop``; so every task leaves the loop after the same round,
which ``allGather`` requires (a task that stopped calling it would leave the
others waiting).

The stop rule, once every producer is done sending (all outcomes known):

* nothing was resent and no one reconnected, and the consumers' distinct
  counts add up to what the producers expect to arrive: stop at once;
* otherwise (duplicates possible, or something is missing): stop when every
  consumer has been idle for ``idle_ms`` (and ``idle_ms`` passed since the
  producers finished);
* in any case stop ``drain_timeout_s`` after the producers finished (bounded;
  whatever has not arrived by then is reported lost).

The thread first waits at the start barrier (``BarrierTaskContext.barrier``:
every task has connected and attached): producers wait for it before their
first send, consumers receive meanwhile (Spark releases barrier callers up to
a second apart, and a consumer that is not reading yet would add that second
to the first messages' latency).

Partition 0 also sends the gathered totals to the driver as one UDP datagram
per round (best effort: progress display only, never part of the results).
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time


def should_stop(states: list[dict], idle_ms: float, drain_timeout_ms: float) -> bool:
    """The stop rule (see the module docstring); pure, the same on every task."""
    producers = [s for s in states if s["role"] == "producer"]
    consumers = [s for s in states if s["role"] == "consumer"]
    if not all(p["done"] for p in producers):
        return False
    since_done = min((p["done_for_ms"] for p in producers), default=float("inf"))
    expected = sum(p["expected"] for p in producers)
    distinct = sum(c["distinct"] for c in consumers)
    clean = (all(p["resent"] == 0 and p["reconnects"] == 0 for p in producers)
             and all(c["reconnects"] == 0 for c in consumers))
    if clean and distinct >= expected:
        return True
    quiet = min((c["idle_ms"] for c in consumers), default=float("inf"))
    if quiet >= idle_ms and since_done >= idle_ms:
        return True
    return since_done >= drain_timeout_ms


def totals(states: list[dict]) -> dict:
    """What the driver shows while the run goes on."""
    producers = [s for s in states if s["role"] == "producer"]
    consumers = [s for s in states if s["role"] == "consumer"]
    by_node: dict[str, int] = {}
    for c in consumers:
        for node, n in c.get("by_node", {}).items():
            by_node[node] = by_node.get(node, 0) + n
    return {
        "sent": sum(p["sent"] for p in producers),
        "accepted": sum(p["expected"] for p in producers),
        "received": sum(c["received"] for c in consumers),
        "producers_done": sum(1 for p in producers if p["done"]),
        "producers": len(producers),
        "reconnects": sum(s["reconnects"] for s in states),
        "resent": sum(p["resent"] for p in producers),
        "by_node": by_node,
    }


class Coordinator:
    """The allGather thread of one task; ``stopped`` is set when all agree to stop."""

    def __init__(self, context, settings, partition: int, snapshot=None) -> None:
        self.context = context  # pyspark BarrierTaskContext
        self.settings = settings
        self.partition = partition
        self.snapshot = snapshot  # () -> dict, called from this thread; set by the task
        self.started = threading.Event()  # every task is attached: producers may send
        self.stopped = threading.Event()
        self.error: BaseException | None = None
        self.rounds = 0
        self._thread = threading.Thread(target=self._run, name="fedgate-load-sync", daemon=True)
        self._udp: socket.socket | None = None

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        settings = self.settings
        try:
            self.context.barrier()
            self.started.set()
            while True:
                time.sleep(settings.sync_interval_s)
                gathered = self.context.allGather(json.dumps(self.snapshot()))
                states = [json.loads(item) for item in gathered]
                self.rounds += 1
                stop = should_stop(states, settings.idle_ms, settings.drain_timeout_s * 1000)
                if self.partition == 0:
                    self._progress(states, stop)
                if stop:
                    return
        except BaseException as exc:  # noqa: BLE001 - handed to the task's main thread
            self.error = exc
        finally:
            self.stopped.set()
            if self._udp is not None:
                self._udp.close()

    def _progress(self, states: list[dict], final: bool) -> None:
        if self.settings.progress is None:
            return
        line = dict(totals(states), run_id=self.settings.run_id, final=final)
        try:
            if self._udp is None:
                self._udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            self._udp.sendto(json.dumps(line).encode(), tuple(self.settings.progress))
        except OSError as exc:  # progress is a display: report once, then stop trying
            print(f"fedgate-load: progress to the driver disabled: {exc}", file=sys.stderr)
            self.settings = _without_progress(self.settings)

    def wait_started(self, timeout: float) -> None:
        """Block until every task has attached its links (the start barrier)."""
        deadline = time.monotonic() + timeout
        while not self.started.wait(0.1):
            if self.stopped.is_set() or time.monotonic() > deadline:
                raise RuntimeError(f"start barrier failed: {self.error!r}" if self.error
                                   else f"the tasks did not all start within {timeout:.0f}s")

    def wait(self, timeout: float) -> None:
        """Block the task until the agreed stop; raise if the agreement failed."""
        if not self.stopped.wait(timeout):
            raise TimeoutError(f"the tasks did not agree to stop within {timeout:.0f}s")
        if self.error is not None:
            raise RuntimeError(f"barrier sync failed: {self.error!r}") from self.error


def _without_progress(settings):
    from dataclasses import replace

    return replace(settings, progress=None)
