"""A replicated durable backlog larger than memory, every node killed with -9 and started again,
with real processes (issue #44, docs/paging-restart.md, "A replicated queue's recovered
backlog").

Three ``fedgate serve`` processes on the suite's etcd, each with a budget of 8 MB and a
journal; a go-amqp sender puts 80,000 durable messages of 1 KB (ten budgets) on the primary
with no consumer; every node is killed with -9 and started again. Checked as an operator
would: every node's RSS after its restart within the budget, the index of paged messages and
a fixed margin (the code before read each node's whole copy, 80 MB, into memory to wait for
the claim); a primary serves, the others catch up from it; a consumer gets every id once,
in order, bodies checked.
"""

from __future__ import annotations

import time

import pytest
from admin_client import wait_for
from etcd_servers import cluster_name, etcd_url  # noqa: F401 (fixtures)
from replication_support import (LEASE_TTL, copy_depth, replicated_nodes, replicated_rule,
                                 restart_all, rss_mb, wait_isr, wait_primary)

pytestmark = pytest.mark.timeout(500)

ADDRESS = "orders.kept"
RULE = replicated_rule(nodes=["n1", "n2", "n3"], durable=True)


def test_a_replicated_durable_backlog_of_ten_budgets_survives_a_kill_of_every_node(
        start_node, etcd_url, cluster_name, clients):  # noqa: F811
    budget = 8 * 1024 * 1024
    count, size = 80_000, 1024
    nodes = replicated_nodes(start_node, [etcd_url], cluster_name, RULE,
                             limits={"max_memory": budget},
                             journal={"fsync": False, "segment_size": 8 * 1024 * 1024})
    n1 = nodes["n1"]
    (warm,) = clients("go", "send", n1.url, address=ADDRESS, count=10, sizes=size,
                      prefix="warm", durable=True, timeout_ms=30_000).finish(timeout=40)
    assert warm["error"] is None and warm["accepted"] == 10, warm
    wait_isr(etcd_url, cluster_name, ADDRESS, ["n2", "n3"], 20.0, primary="n1")
    before = {name: rss_mb(node.proc.pid) for name, node in nodes.items()}

    (sent,) = clients("go", "send", n1.url, address=ADDRESS, count=count, sizes=size,
                      durable=True, timeout_ms=300_000).finish(timeout=320)
    assert sent["error"] is None and sent["accepted"] == count, sent
    wait_for(lambda: copy_depth(nodes["n2"], ADDRESS) == copy_depth(nodes["n3"], ADDRESS)
             == count + 10, 60.0,
             "both copies whole")

    for node in nodes.values():
        node.kill()
    started = time.monotonic()
    restart_all(list(nodes.values()), timeout=60.0)
    primary = wait_primary(nodes, ADDRESS, LEASE_TTL + 30.0)
    ready = time.monotonic() - started
    others = [name for name in nodes if name != primary]
    wait_for(lambda: all(copy_depth(nodes[n], ADDRESS) == count + 10 for n in others), 120.0,
             "the backups caught up after the restart")
    # the budget, the index of the paged messages (a journal page each and, at the primary,
    # its rid index: measured +71 MB on the primary in all, 700 bytes a message allowed: 53 MB)
    # and a fixed margin; the copy's bodies in memory alone would be 80 MB more
    index = count * 700 / 2**20
    grown = {name: rss_mb(node.proc.pid) - before[name] for name, node in nodes.items()}
    for name, growth in grown.items():
        print(f"\n{name}{' (primary)' if name == primary else ''}: RSS +{growth:.1f} MB after "
              f"the restart over its start, primary in {ready:.1f} s")
    for name, growth in grown.items():
        assert growth < budget * 1.25 / 2**20 + index + 20, \
            f"{name}'s RSS grew {growth:.1f} MB through the restart"

    lines = clients("go", "receive", nodes[primary].url, address=ADDRESS, count=count + 10,
                    credit=500, check_body=True, timeout_ms=240_000).finish(timeout=260)
    assert lines[-1]["error"] is None, lines[-1]
    ids = [line["id"] for line in lines if "id" in line]
    warm_ids = [f"warm-{n}" for n in range(10)]
    print(f"the first ten from {primary}: {ids[:10]}")
    assert len(ids) == len(set(ids)) == count + 10, "duplicates"
    assert set(ids) == set(warm_ids) | {f"go-{n}" for n in range(count)}, "not every id"
    # what the backups got live comes back in order; the ten that came to them by the
    # catch-up (newest first) may come back in their journal's order when a former backup
    # is the primary after the restart (docs/paging-restart.md, "Not yet"): not asserted
    assert ids[10:] == [f"go-{n}" for n in range(count)], "the live part out of order"
    assert sorted(ids[:10]) == warm_ids
