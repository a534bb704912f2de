"""A replicated queue deeper than its nodes' memory, with real processes (issue #44,
docs/paging.md, "A backup's copy in runs").

Three ``fedgate serve`` processes on the suite's etcd, each with a budget of 8 MB; a
go-amqp sender puts 300,000 messages of 512 bytes (150 MB, nineteen budgets) on the
primary with no consumer. Checked as an operator would: the backups' copies are whole
(the admin API's copy depth), their bodies on disk, and their RSS (and the primary's, whose
backlog is in runs too) grew by no more than the budget and a fixed margin (entry by entry, the copies' index alone was about 300 bytes a
message: 85 MB); then the primary is killed with -9, a backup takes over keeping the copy's
runs (docs/paging_failover.md: its RSS within the same bound, the other backup caught up
from them) and a consumer gets every id once, in order, bodies checked.
"""

from __future__ import annotations

import time

import pytest
from admin_client import admin, wait_for
from etcd_servers import cluster_name, etcd_url  # noqa: F401 (fixtures)
from replication_support import (LEASE_TTL, copy_depth, replicated_nodes, replicated_rule,
                                 rss_mb, wait_isr, wait_primary)

pytestmark = pytest.mark.timeout(420)

ADDRESS = "orders.deep"
RULE = replicated_rule(nodes=["n1", "n2", "n3"])


def test_backups_hold_a_deep_replicated_backlog_in_runs_and_one_serves_it(
        start_node, etcd_url, cluster_name, clients):  # noqa: F811
    budget = 8 * 1024 * 1024
    count, size = 300_000, 512
    nodes = replicated_nodes(start_node, [etcd_url], cluster_name, RULE,
                             limits={"max_memory": budget})
    n1, n2, n3 = nodes["n1"], nodes["n2"], nodes["n3"]
    (warm,) = clients("go", "send", n1.url, address=ADDRESS, count=10, sizes=size,
                      prefix="warm", timeout_ms=30_000).finish(timeout=40)
    assert warm["error"] is None and warm["accepted"] == 10, warm
    wait_isr(etcd_url, cluster_name, ADDRESS, ["n2", "n3"], 20.0, primary="n1")
    before = {name: rss_mb(nodes[name].proc.pid) for name in ("n1", "n2", "n3")}

    started = time.monotonic()
    (sent,) = clients("go", "send", n1.url, address=ADDRESS, count=count, sizes=size,
                      timeout_ms=300_000).finish(timeout=320)
    fill = time.monotonic() - started
    assert sent["error"] is None and sent["accepted"] == count, sent
    wait_for(lambda: copy_depth(n2, ADDRESS) == copy_depth(n3, ADDRESS) == count + 10, 30.0,
             "both copies whole")
    for name in ("n2", "n3"):
        node = nodes[name]
        growth = rss_mb(node.proc.pid) - before[name]
        paging = admin(node, "/api/v1/node")["memory"]["paging"]
        print(f"\n{name}: copy of {count + 10} messages, RSS +{growth:.1f} MB, "
              f"{paging['backups_paged_bytes'] / 2**20:.1f} MB of it on disk (fill {fill:.1f} s)")
        assert paging["backups_paged_bytes"] >= count * size - 3 * budget, paging
        # what the copy keeps in memory is said too, and it is within the budget
        assert 0 < paging["backups_resident_bytes"] <= budget * 1.25, paging
        assert paging["backups_paged_bytes"] + paging["backups_resident_bytes"] >= \
            (count + 10) * size, paging
        # the budget (1.25 of it while the writer catches up), 12 bytes a message in runs
        # (3.6 MB) and a fixed margin; entry by entry the index alone would be 85 MB more
        assert growth < budget * 1.25 / 2**20 + 4 + 40, f"{name}'s RSS grew {growth:.1f} MB"

    # the primary keeps its backlog in runs too (docs/paging.md, "A replicated primary in
    # runs"): message by message its index would be about 300 bytes a message, 90 MB more
    growth = rss_mb(n1.proc.pid) - before["n1"]
    memory = admin(n1, "/api/v1/node")["memory"]
    print(f"\nn1 (primary): {count + 10} messages, RSS +{growth:.1f} MB, "
          f"{memory.get('paged_bytes', 0) / 2**20:.1f} MB on disk")
    assert growth < budget * 1.25 / 2**20 + 4 + 40, f"the primary's RSS grew {growth:.1f} MB"

    n1.kill()
    new = wait_primary(nodes, ADDRESS, LEASE_TTL + 10.0)
    assert new in ("n2", "n3")
    # the new primary keeps the copy's runs (docs/paging_failover.md): its backlog on disk,
    # its RSS within the same bound (message by message it was about 350 bytes a paged
    # message: 100 MB more); the other backup catches up from those runs
    third = "n3" if new == "n2" else "n2"
    wait_for(lambda: admin(nodes[new], "/api/v1/node")["memory"].get("paged_bytes", 0)
             >= count * size - 3 * budget, 30.0, "the new primary's backlog on disk")
    growth = rss_mb(nodes[new].proc.pid) - before[new]
    print(f"\n{new} (promoted): RSS +{growth:.1f} MB over its start")
    assert growth < budget * 1.25 / 2**20 + 4 + 40, f"the new primary's RSS grew {growth:.1f} MB"
    wait_for(lambda: copy_depth(nodes[third], ADDRESS) == count + 10, 120.0,
             f"{third} caught up from the new primary")
    growth = rss_mb(nodes[new].proc.pid) - before[new]
    print(f"{new} after {third}'s catch-up: RSS +{growth:.1f} MB")
    assert growth < budget * 1.25 / 2**20 + 4 + 40, f"the new primary's RSS grew {growth:.1f} MB"
    lines = clients("go", "receive", nodes[new].url, address=ADDRESS, count=count + 10,
                    credit=500, check_body=True, timeout_ms=240_000).finish(timeout=260)
    assert lines[-1]["error"] is None, lines[-1]
    ids = [line["id"] for line in lines if "id" in line]
    assert ids == [f"warm-{n}" for n in range(10)] + [f"go-{n}" for n in range(count)], \
        "not every id once, in order"
