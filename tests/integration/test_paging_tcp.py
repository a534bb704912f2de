"""Queues larger than memory with real processes (issue #44, docs/paging.md).

A ``fedgate serve`` process with a small ``[limits] max_memory``, go-amqp clients (Azure's
Go client) sending and receiving over TCP, the node's RSS read from ``/proc`` while it
fills, and the admin API for what an operator sees:

* a backlog of fifteen budgets is taken without stopping the producer, with the node's
  RSS bounded (the budget, the index, a fixed margin), then drained: every id once, in
  order, bodies checked;
* a deep priority queue keeps runs per level: RSS bounded, each level counted, every id in
  priority order;
* kill -9 while paging: durable messages come back from the journal, every one once, and
  the page store left by the crash is emptied at start; a durable backlog of ten and of
  twelve budgets restarts with RSS bounded (the second in runs of journal records);
* the disk bounds (``max_disk``, ``min_free_disk``) hold the producer at the budget, name
  the bound in ``/api/v1/node``, and nothing is lost once a consumer drains.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from admin_client import ADMIN, admin

pytestmark = pytest.mark.timeout(240)

SIZE = 2000


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class RssWatch:
    """The node's RSS every 50 ms while a step runs: its peak."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.start = rss_mb(pid)
        self.peak = self.start
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, rss_mb(self.pid))

    def stop(self) -> float:
        self._stop.set()
        self._thread.join(5)
        return self.peak


def paging_config(max_memory: int, **limits) -> dict:
    return {"admin": dict(ADMIN), "limits": {"max_memory": max_memory, **limits}}


def ids_of(lines) -> list:
    return [line["id"] for line in lines if "id" in line]


def memory_of(node) -> dict:
    return admin(node, "/api/v1/node")["memory"]


def until(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout}s: {what}")


def test_a_backlog_of_fifteen_budgets_with_rss_bounded_then_drained_in_order(start_node, clients):
    budget = 8 * 1024 * 1024
    count = 60_000  # 120 MB of bodies: fifteen budgets
    node = start_node(paging_config(budget))
    watch = RssWatch(node.proc.pid)
    (sent,) = clients("go", "send", node.url, address="backlog", count=count, sizes=SIZE,
                      timeout_ms=150_000).finish(timeout=170)
    peak = watch.stop()
    assert sent["error"] is None and sent["accepted"] == count, sent
    memory = memory_of(node)
    queue = admin(node, "/api/v1/queues")["queues"][0]
    assert queue["depth"] == count and queue["paging"]
    assert memory["paged_bytes"] >= count * SIZE - 3 * budget, memory
    assert memory["resident_bytes"] <= budget * 1.25, memory
    assert memory["bound"] is None and memory["paging"]["error"] is None
    # the budget (1.25 of it while the writer catches up), the index of 60,000 messages
    # (about 12 MB) and a fixed margin; all in memory it would be 120 MB of bodies alone
    growth = peak - watch.start
    assert growth < budget * 1.25 / 2**20 + 12 + 30, \
        f"RSS grew {growth:.1f} MB (from {watch.start:.1f} MB)"  # measured: 28 MB

    lines = clients("go", "receive", node.url, address="backlog", count=count, credit=500,
                    check_body=True, timeout_ms=150_000).finish(timeout=170)
    assert lines[-1]["error"] is None, lines[-1]
    assert ids_of(lines) == [f"go-{n}" for n in range(count)], "not every id once, in order"
    memory = memory_of(node)
    assert (memory["queued_bytes"], memory["paged_bytes"]) == (0, 0), memory
    assert memory["paging"]["live_bytes"] == 0
    assert memory["paging"]["read_back"] >= count - 3 * budget // SIZE


def test_a_deep_queue_of_small_messages_keeps_no_index_in_memory(start_node, clients):
    """Runs (docs/paging.md): 300,000 waiting messages of 512 bytes, most in runs on disk.
    Paged one by one, their index alone would be about 90 MB (300 bytes each); in runs the
    RSS stays within the budget and a fixed margin, then every id comes back in order."""
    budget = 8 * 1024 * 1024
    count, size = 300_000, 512
    node = start_node(paging_config(budget))
    watch = RssWatch(node.proc.pid)
    (sent,) = clients("go", "send", node.url, address="deep", count=count, sizes=size,
                      timeout_ms=200_000).finish(timeout=220)
    peak = watch.stop()
    assert sent["error"] is None and sent["accepted"] == count, sent
    queue = admin(node, "/api/v1/queues")["queues"][0]
    assert queue["depth"] == count and queue["paged_messages"] >= count - 3 * budget // size
    growth = peak - watch.start
    assert growth < budget * 1.25 / 2**20 + 40, \
        f"RSS grew {growth:.1f} MB (from {watch.start:.1f} MB)"
    lines = clients("go", "receive", node.url, address="deep", count=count, credit=500,
                    check_body=True, timeout_ms=200_000).finish(timeout=220)
    assert lines[-1]["error"] is None, lines[-1]
    assert ids_of(lines) == [f"go-{n}" for n in range(count)], "not every id once, in order"
    memory = memory_of(node)
    assert (memory["queued_bytes"], memory["paged_bytes"]) == (0, 0), memory
    assert memory["paging"]["live_bytes"] == 0


def test_a_deep_priority_queue_keeps_runs_per_level_and_no_index_in_memory(start_node,
                                                                           clients):
    """A priority queue in runs (docs/paging.md): 200,000 waiting messages of 512 bytes at
    ten priorities, most in runs on disk. Paged one by one, their index alone would be
    about 80 MB (410 bytes each); in runs per level the RSS stays within the budget and a
    fixed margin, the admin API counts each level, then every id comes back in priority
    order (FIFO within a level)."""
    budget = 8 * 1024 * 1024
    count, size, levels = 200_000, 512, 10
    node = start_node(paging_config(budget))
    watch = RssWatch(node.proc.pid)
    (sent,) = clients("proton", "send", node.url, address="prio", count=count, sizes=size,
                      priorities=levels, timeout_ms=200_000).finish(timeout=220)
    peak = watch.stop()
    assert sent["error"] is None and sent["accepted"] == count, sent
    queue = admin(node, "/api/v1/queues")["queues"][0]
    assert queue["depth"] == count and queue["paged_messages"] >= count - 3 * budget // size
    assert queue["by_priority"] == {str(p): count // levels for p in range(levels)}
    growth = peak - watch.start
    assert growth < budget * 1.25 / 2**20 + 40, \
        f"RSS grew {growth:.1f} MB (from {watch.start:.1f} MB)"
    lines = clients("proton", "receive", node.url, address="prio", count=count, credit=500,
                    sizes=size, check_body=True, timeout_ms=200_000).finish(timeout=220)
    assert lines[-1]["error"] is None, lines[-1]
    order = sorted(range(count), key=lambda n: (-(n % levels), n))
    assert ids_of(lines) == [f"proton-{n}" for n in order], "not every id once, in order"
    memory = memory_of(node)
    assert (memory["queued_bytes"], memory["paged_bytes"]) == (0, 0), memory
    assert memory["paging"]["live_bytes"] == 0


def test_kill_while_paging_loses_no_durable_message_and_the_store_starts_empty(start_node,
                                                                            clients, tmp_path):
    config = paging_config(2 * 1024 * 1024)
    config["queue"] = [{"name": "keep", "durable": True}]
    node = start_node(config)
    count = 10_000
    (sent,) = clients("go", "send", node.url, address="keep", count=count, sizes=SIZE,
                      durable=True, timeout_ms=100_000).finish(timeout=120)
    assert sent["error"] is None and sent["accepted"] == count, sent
    assert memory_of(node)["paged_bytes"] > count * SIZE // 2
    store = tmp_path / "data-n1" / "paging"
    before = {p.name: p.stat().st_ino for p in store.glob("*.page")}
    assert before, "nothing paged on disk"
    node.kill()

    node = start_node(config, name="n1")
    after = {p.name: p.stat().st_ino for p in store.glob("*.page")}
    assert not set(before.items()) & set(after.items()), "a page file of the crash was kept"
    lines = clients("go", "receive", node.url, address="keep", count=count, credit=500,
                    check_body=True, timeout_ms=100_000).finish(timeout=120)
    assert lines[-1]["error"] is None, lines[-1]
    assert ids_of(lines) == [f"go-{n}" for n in range(count)]


def status_mb(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def test_a_restart_with_a_durable_backlog_of_ten_budgets_stays_within_the_budget(start_node,
                                                                               clients):
    """docs/paging.md, "Durable messages: the journal as page store": 80,000 durable messages
    of 1 KB (ten budgets), kill -9, restart: recovery keeps bodies up to half the budget and
    only the index of the rest, their bodies read back from the journal as the consumer
    nears them; every id once, in order, bodies checked."""
    # the empty node, the budget, 100 bytes a message (the journal's entry, 21, and a place
    # in a journal run, about 29: docs/journal-index.md, docs/paging-restart.md) and a fixed
    # margin. Measured +11.1 MB in all (peak +31.8); a paged message each, with the journal's
    # dict, was 420 bytes a message, +47.5 MB; all bodies in memory would be 80 MB more
    restart_a_durable_backlog(start_node, clients, "durable-backlog", 80_000, 1024,
                              per_message=100, margin=20, peak_margin=30)


def test_a_restarted_durable_backlog_of_small_messages_waits_in_journal_runs(start_node,
                                                                              clients):
    """docs/paging.md, "Recovered durable messages in runs": 200,000 durable messages of 512
    bytes (twelve budgets), kill -9, restart: the backlog beyond half the budget comes back
    as runs of journal records, about 29 bytes a message on top of the journal's own entry
    (about 21), where each was a paged message of about 420 bytes before (the code before
    grew the RSS by about 126 MB here; the bound is about 39); every id once, in order."""
    # the empty node, the budget, 100 bytes a message (as above) and a fixed margin.
    # Measured +21.6 MB in all (peak +45.9); +45.6 MB with the journal's dict, and message
    # by message 420 bytes a message, +125.7 MB
    restart_a_durable_backlog(start_node, clients, "journal-runs", 200_000, 512,
                              per_message=100, margin=12, peak_margin=40)


def restart_a_durable_backlog(start_node, clients, address: str, count: int, size: int, *,
                              per_message: int, margin: int, peak_margin: int) -> None:
    """``count`` durable messages of ``size`` bytes into ``address`` of a node with a budget
    of 8 MB, kill -9, restart: the backlog restored within the budget (nothing written to
    the page store), RSS over the same node started empty under the budget + ``per_message``
    bytes a message + ``margin`` MB (its peak: ``peak_margin``), then drained: every id once,
    in order, bodies checked."""
    budget = 8 * 1024 * 1024
    config = paging_config(budget)
    config["queue"] = [{"name": address, "durable": True}]
    config["journal"] = {"fsync": False, "segment_size": 8 * 1024 * 1024}
    started = time.monotonic()
    empty = start_node(config, name="n0")  # the same node with nothing to recover
    empty_start = time.monotonic() - started
    base = rss_mb(empty.proc.pid)
    empty.stop()
    node = start_node(config)
    (sent,) = clients("go", "send", node.url, address=address, count=count,
                      sizes=size, durable=True, timeout_ms=200_000).finish(timeout=220)
    assert sent["error"] is None and sent["accepted"] == count, sent
    node.kill()

    started = time.monotonic()
    node = start_node(config, name="n1")
    restart = time.monotonic() - started
    queue = admin(node, "/api/v1/queues")["queues"][0]
    memory = memory_of(node)
    rss, peak = rss_mb(node.proc.pid), status_mb(node.proc.pid, "VmHWM")
    print(f"restart {restart:.2f}s (empty node {empty_start:.2f}s), RSS {rss:.1f} MB (peak "
          f"{peak:.1f} MB), empty node {base:.1f} MB, resident {memory['resident_bytes']}, "
          f"paged {memory['paged_bytes']}")
    assert queue["depth"] == count and queue["paged_messages"] >= count - budget // size, queue
    assert memory["resident_bytes"] <= budget, memory
    assert memory["paging"]["disk_bytes"] == 0, "the restart wrote bodies to the page store"
    index = count * per_message / 2**20
    assert rss < base + budget / 2**20 + index + margin, f"RSS {rss:.1f} MB after the restart"
    assert peak < base + budget / 2**20 + index + peak_margin, f"RSS peaked at {peak:.1f} MB"

    lines = clients("go", "receive", node.url, address=address, count=count,
                    credit=500, check_body=True, timeout_ms=200_000).finish(timeout=220)
    assert lines[-1]["error"] is None, lines[-1]
    assert ids_of(lines) == [f"go-{n}" for n in range(count)], "not every id once, in order"
    memory = memory_of(node)
    assert (memory["queued_bytes"], memory["paged_bytes"]) == (0, 0), memory
