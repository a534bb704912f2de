"""Replicated queues on nodes of several workers (issue #45, docs/workers.md): two nodes on etcd,
``workers = 2`` each, ``replicas = 2`` pinned to n1 then n2 (n1 the preferred primary).

Each queue's copy on a node, its claim in etcd and its replication links belong to the worker
that owns the queue on the ring (as a local queue's); the queues here are chosen so that each
worker owns one (``orders.q3`` on worker 0, ``orders.q0`` on worker 1, the ring of
``proxy.workers.ownership``). What a user would check:

* every id accepted is received, on queues served by both workers, and ``GET /api/v1/queues``
  names the primary's worker and the backup's state;
* a worker killed with -9 is a failure of the queues it owned: their backups take over
  (etcd's owner record names n2 at the next epoch), every accepted id still arrives, and the
  queue of the other worker is untouched (n1 still its primary, same epoch);
* a primary node of one process (n1, ``workers = 1``) pushes both queues over one connection,
  which lands on one worker of n2: the other queue's replication link is forwarded to its
  owner, and that copy too becomes in sync and holds every message (it serves them alone
  after n1 is killed).

Every wait is bounded.
"""

from __future__ import annotations

import time

from admin_client import wait_for
from conftest import descendants
from etcd_servers import cluster_name, etcd_url  # noqa: F401 (fixtures)
from replication_support import (LEASE_TTL, Workload, failover_urls, owner_record,
                                 replicated_nodes, replicated_rule, view_of, wait_isr,
                                 wait_primary)

from proxy.workers.ownership import QueueOwners

ON_W0, ON_W1 = "orders.q3", "orders.q0"
PINNED = replicated_rule(nodes=["n1", "n2"], replicas=2)
NAMES = ("n1", "n2")


def test_the_ring_gives_each_worker_one_of_the_queues():
    owners = QueueOwners("n1", 2)
    assert (owners.owner(ON_W0), owners.owner(ON_W1)) == (0, 1)


def two_nodes(start_node, etcd_url, cluster_name, **options):
    nodes = replicated_nodes(start_node, [etcd_url], cluster_name, PINNED, names=NAMES,
                             workers=2, **options)
    return nodes, nodes["n1"], nodes["n2"]


def worker_pid(node, index: int) -> int:
    """The pid of worker ``index`` of a node: its children in the order they were started
    (the supervisor's log names each)."""
    import re
    pids = {int(k): int(p) for k, p in re.findall(r"worker (\d+) started \(pid (\d+)\)",
                                                    node.log_path.read_text())}
    assert pids[index] in descendants(node.proc.pid), pids
    return pids[index]


def loads(clients, nodes, n1, n2, per_sender=600, rate=150, failover=False):
    out = {}
    for address in (ON_W0, ON_W1):
        urls = failover_urls(n1, n2) if failover else n1.url
        out[address] = Workload(clients, address, senders=[(urls, "a"), (urls, "b")],
                                receivers=[urls, urls], per_sender=per_sender, rate=rate,
                                failover=failover).start()
    return out


def test_replicated_queues_on_both_workers_every_id_arrives(start_node, etcd_url, cluster_name,
                                                            clients):
    nodes, n1, n2 = two_nodes(start_node, etcd_url, cluster_name)
    work = loads(clients, nodes, n1, n2)
    for address in work:
        assert wait_primary(nodes, address, 10.0) == "n1"
        wait_isr(etcd_url, cluster_name, address, ["n2"], 10.0, primary="n1")
    for address, load in work.items():
        outcome = load.result(timeout=60.0)
        assert not outcome.corrupt and not outcome.lost, sorted(outcome.lost)[:20]
        assert len(outcome.accepted) == 1200, (address, len(outcome.accepted))
        assert outcome.duplicates == 0, (address, outcome.duplicated_ids())
    for address, worker in ((ON_W0, 0), (ON_W1, 1)):
        primary, backup = view_of(n1, address), view_of(n2, address)
        assert primary["role"] == "primary" and primary["worker"] == worker, primary
        assert backup["role"] == "ready" and backup["worker"] == worker, backup
        # each worker holds a lease of its own in etcd: the owner record is the node's
        assert owner_record(etcd_url, cluster_name, address)["owner"] == "n1"


def test_a_worker_killed_is_a_failure_of_its_queues_alone(start_node, etcd_url, cluster_name,
                                                          clients):
    nodes, n1, n2 = two_nodes(start_node, etcd_url, cluster_name)
    work = loads(clients, nodes, n1, n2, per_sender=1000, rate=100, failover=True)
    for address in work:
        assert wait_primary(nodes, address, 10.0) == "n1"
        wait_isr(etcd_url, cluster_name, address, ["n2"], 10.0, primary="n1")
    epochs = {a: owner_record(etcd_url, cluster_name, a)["epoch"] for a in work}
    work[ON_W1].wait_accepted(600, 20.0)
    import os
    import signal
    killed = time.time()
    os.kill(worker_pid(n1, 1), signal.SIGKILL)
    # worker 1's lease ends: n2's copy of its queue claims it at the next epoch
    wait_for(lambda: (owner_record(etcd_url, cluster_name, ON_W1) or {}).get("owner") == "n2",
             timeout=LEASE_TTL + 10.0, interval=0.05, what=f"n2 owning {ON_W1}")
    took = time.time() - killed
    assert owner_record(etcd_url, cluster_name, ON_W1)["epoch"] == epochs[ON_W1] + 1
    for address, load in work.items():
        outcome = load.result(timeout=90.0)
        assert not outcome.corrupt and not outcome.lost, (address, sorted(outcome.lost)[:20])
        assert len(outcome.accepted) == 2000, (address, len(outcome.accepted), outcome.senders)
    # worker 0's queue saw nothing of it: same primary, same epoch, no duplicates
    assert owner_record(etcd_url, cluster_name, ON_W0) == \
        {"resource": f"queue/{ON_W0}", "owner": "n1", "epoch": epochs[ON_W0]}
    print(f"\nworker 1 of n1 killed: n2 owns {ON_W1} {took:.2f} s later")
    # the supervisor started worker 1 again: it catches up as n2's backup
    wait_isr(etcd_url, cluster_name, ON_W1, ["n1"], 20.0, primary="n2")


def test_replication_links_forwarded_to_the_owner_when_not_placed(start_node, etcd_url,
                                                                  cluster_name, clients):
    # n1 runs in one process: its one connection to n2 carries both queues' replication links,
    # and lands on one worker of n2 (placed by its first attach): the other link is forwarded
    nodes, n1, n2 = two_nodes(start_node, etcd_url, cluster_name,
                              per_node={"n1": {"node": {"workers": 1}}})
    sent = {}
    for address in (ON_W0, ON_W1):  # no consumer yet: the messages wait in the queue
        sent[address] = Workload(clients, address, senders=[(n1.url, "a"), (n1.url, "b")],
                                 receivers=[], per_sender=500, rate=250).start()
    for address, load in sent.items():
        wait_isr(etcd_url, cluster_name, address, ["n2"], 10.0, primary="n1")
        load.wait_accepted(1000, 30.0)
    # each copy on n2 is its owner's, in sync, one of them through a forwarded link
    for address, worker in ((ON_W0, 0), (ON_W1, 1)):
        view = view_of(n2, address)
        assert view["worker"] == worker and view["role"] == "ready", view
    forwarded = [line for line in n2.log_path.read_text().splitlines()
                 if "replication link forwarded to worker" in line]
    assert len(forwarded) >= 1, "no replication link was forwarded"
    assert {line.split("queue/")[1].split(":")[0] for line in forwarded} < {ON_W0, ON_W1}
    # n2 alone: its copies hold every message accepted
    n1.kill()
    want = {f"{p}-{i}" for p in "ab" for i in range(500)}
    for address in sent:
        wait_primary({"n2": n2}, address, LEASE_TTL + 10.0)
        load = Workload(clients, address, senders=[], receivers=[n2.url], credit=50).start()
        load.wait_received(1000, 30.0)
        outcome = load.result(timeout=10.0, want=want)
        assert outcome.received_ids == want, (address, len(outcome.received_ids))
