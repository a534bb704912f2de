"""What selectors, priority and scheduled delivery cost a local queue (issue #43).

The queue layer itself (``proxy.queues``: ``LocalQueue`` with its stores, the selector
package, the schedule), driven in one process with consumers that take what they are given
and accept it at once: no sockets, no proton engine, so that the figures are the queue's
own CPU per message, side by side with the plain FIFO queue in the same run.

Scenarios (N messages each, default 100,000; ``--rounds`` medians):

* ``fifo``: N plain messages enqueued, then one consumer takes them all (the reference);
* ``priority``: the same with priorities 0-9 drawn at random (the queue turns into a
  ``PriorityStore``);
* ``selective-deep``: N waiting messages, 1 % of them ``colour = 'red'``; a consumer with
  that selector attaches (evaluates the queue once) and takes its 1 %; reported per
  message delivered and per message in the queue;
* ``selective-live``: a consumer with the selector attached first, then N enqueued (each
  evaluated once as it arrives) and a plain consumer beside it takes the other 99 %;
* ``scheduled``: N messages each with ``x-opt-delivery-time`` spread over a second
  (8 to 9 s ahead), then, once due, taken by one consumer.

    .venv/bin/python bench/queue_semantics.py [--messages 100000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from proton import Message, symbol  # noqa: E402

from proxy import selectors  # noqa: E402
from proxy.queues.local import LocalQueue, StoredMessage  # noqa: E402


class Taker:
    """A consumer with endless credit that accepts each message at once."""

    _ids = iter(range(1, 1 << 30))

    def __init__(self, queue: LocalQueue, selector=None) -> None:
        self.queue = queue
        self.consumer_id = next(Taker._ids)
        self.selector = selector
        self.matched = None
        self.taken = 0
        self.credit = 1 << 30

    def deliver(self, message: StoredMessage) -> None:
        self.taken += 1
        self.queue.settled_accepted(message)


def payloads(count: int, *, priority=False, colour_every=0, due_within=0.0,
             due_after=0.0) -> list[bytes]:
    rng = random.Random(7)
    out = []
    now_ms = int(time.time() * 1000)
    for i in range(count):
        properties = {"n": i, "colour": "red" if colour_every and i % colour_every == 0 else "blue",
                      "region": "eu", "weight": i % 50, "express": bool(i % 2)}
        kwargs = {}
        if priority:
            kwargs["priority"] = rng.randrange(10)
        annotations = None
        if due_within:
            annotations = {symbol("x-opt-delivery-time"):
                           now_ms + int((due_after + rng.random() * due_within) * 1000)}
        out.append(Message(id=i, body="x" * 200, properties=properties, annotations=annotations,
                           **kwargs).encode())
    return out


def cpu() -> float:
    return time.process_time()


def fifo(n: int, data: list[bytes]) -> dict:
    queue = LocalQueue("b")
    start = cpu()
    for payload in data:
        queue.enqueue(StoredMessage(payload))
    enqueued = cpu()
    taker = Taker(queue)
    queue.add_consumer(taker)
    queue.dispatch()
    done = cpu()
    assert taker.taken == n
    return {"enqueue_us": (enqueued - start) / n * 1e6, "deliver_us": (done - enqueued) / n * 1e6,
            "total_us": (done - start) / n * 1e6, "rate": n / (done - start)}


def selective_deep(n: int, data: list[bytes]) -> dict:
    queue = LocalQueue("b")
    for payload in data:
        queue.enqueue(StoredMessage(payload))
    start = cpu()
    taker = Taker(queue, selectors.parse("colour = 'red'"))
    queue.add_consumer(taker)
    attached = cpu()
    queue.dispatch()
    done = cpu()
    assert taker.taken == n // 100, taker.taken
    return {"attach_us_per_queued": (attached - start) / n * 1e6,
            "deliver_us": (done - attached) / taker.taken * 1e6,
            "total_us": (done - start) / n * 1e6, "rate": n / (done - start),
            "selected": taker.taken}


def selective_live(n: int, data: list[bytes]) -> dict:
    queue = LocalQueue("b")
    red = Taker(queue, selectors.parse("colour = 'red'"))
    queue.add_consumer(red)
    plain = Taker(queue)
    queue.add_consumer(plain)
    start = cpu()
    for payload in data:
        queue.enqueue(StoredMessage(payload))
        queue.dispatch()
    done = cpu()
    assert red.taken + plain.taken == n and red.taken >= n // 100
    return {"total_us": (done - start) / n * 1e6, "rate": n / (done - start),
            "selected": red.taken}


def scheduled(n: int, data: list[bytes]) -> dict:
    data = payloads(n, due_within=1.0, due_after=8.0)  # due 8-9 s from now (made in ~3 s)
    queue = LocalQueue("b")
    start = cpu()
    for payload in data:
        queue.enqueue(StoredMessage(payload))
    enqueued = cpu()
    assert len(queue.scheduled) == n
    wall = time.time()
    last = max(entry[0] for entry in queue.scheduled)
    while last > time.time():
        time.sleep(max(0.0, min(0.05, last - time.time())))
    waited = cpu()
    taker = Taker(queue)
    queue.add_consumer(taker)
    queue.dispatch()
    done = cpu()
    assert taker.taken == n, taker.taken
    return {"enqueue_us": (enqueued - start) / n * 1e6, "deliver_us": (done - waited) / n * 1e6,
            "total_us": (enqueued - start + done - waited) / n * 1e6,
            "rate": n / (enqueued - start + done - waited), "waited_s": time.time() - wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output", default=str(ROOT / "bench" / "results" / "queue_semantics.json"))
    args = parser.parse_args()
    n = args.messages
    data = {
        "fifo": payloads(n),
        "priority": payloads(n, priority=True),
        "selective-deep": payloads(n, colour_every=100),
        "selective-live": payloads(n, colour_every=100),
        "scheduled": [],  # made by the scenario, just before it runs
    }
    runs = {"fifo": fifo, "priority": fifo, "selective-deep": selective_deep,
            "selective-live": selective_live, "scheduled": scheduled}
    results: dict[str, list[dict]] = {name: [] for name in runs}
    for round_no in range(args.rounds):
        for name, run in runs.items():
            result = run(n, data[name])
            results[name].append(result)
            print(f"round {round_no + 1} {name:>15}: {result['rate']:>10,.0f} msg/s, "
                  f"{result['total_us']:.2f} µs/msg  {json.dumps({k: round(v, 3) for k, v in result.items()})}",
                  flush=True)
    summary = {}
    base = statistics.median(r["total_us"] for r in results["fifo"])
    print(f"\nmedians of {args.rounds} rounds, {n:,} messages, CPU µs per message of the queue layer:")
    for name, items in results.items():
        keys = items[0].keys()
        summary[name] = {k: statistics.median(r[k] for r in items) for k in keys}
        print(f"  {name:>15}: {summary[name]['rate']:>10,.0f} msg/s  {summary[name]['total_us']:6.2f} µs/msg"
              f"  ({summary[name]['total_us'] / base:4.2f}x fifo)")
    if args.output != "-":
        Path(args.output).write_text(json.dumps({"messages": n, "rounds": args.rounds,
                                                 "summary": summary, "runs": results}, indent=1))


if __name__ == "__main__":
    main()
