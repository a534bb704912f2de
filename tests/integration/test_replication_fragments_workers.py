"""Replicated fragments on nodes of several workers (issue #45, docs/replication.md "Replicated
fragments on every core"): three nodes on etcd, ``workers = 2`` each, one rule
``kind = "fragmented"`` over n1..n3 with ``replicas = 2``.

On each node one worker owns a fragmented queue (the supervisor's table, by its name): it
serves the node's one fragment of it, keeps the copies of its fragments and their claims in
etcd under a lease of its own; the other worker forwards its links there. The queues here are
chosen so that each worker owns one (``jobs.a`` on worker 1, ``jobs.c`` on worker 0: the ring
of ``proxy.workers.ownership``, which the table follows while the loads are equal). What a
user would check:

* each node shows one fragment of each queue (its own member id, not one per worker), served
  by the worker that owns it;
* the worker of n1 that owns ``jobs.a`` killed with -9 in the middle of a stream (4 senders
  and 4 receivers with every node's URL): n1's fragment of ``jobs.a`` is claimed by its
  backup at the next epoch and served there as ``jobs.a@n1``; every accepted id is received,
  duplicates at most the receivers' credit and the sends in flight;
* ``jobs.c``, owned by n1's other worker, sees nothing of it: n1 still serves its fragment at
  the same epoch, every id arrives, no duplicate;
* the supervisor starts the worker again: it catches up as a backup of n1's fragment and gets
  it back (the owner record says n1, nobody serves ``jobs.a@n1``); more is sent, n1's own
  producer into its own fragment; every id arrives, and at the end no fragment holds a message;
* worker 0 of n1 killed, the owner of ``jobs.c``: the same for ``jobs.c``, though n1's member
  record goes with worker 0's lease for a moment; ``jobs.a``, served by worker 1, keeps its
  primary and epoch and every id of it arrives.

lease_ttl is 3 s; every wait is bounded.
"""

from __future__ import annotations

import os
import signal
import time

from admin_client import admin, wait_for
from etcd_servers import cluster_name, etcd_url  # noqa: F401 (fixtures)
from replication_support import (LEASE_TTL, NAMES, Workload, failover_urls, fragment_owner,
                                 queues_of, replicated_nodes)
from test_replication_fragments import (CREDIT, RULE, adopted_by, fragments_held, served,
                                        wait_in_sync, wait_owner)
from test_replication_workers import worker_pid

from proxy.workers.ownership import QueueOwners

ON_W1, ON_W0 = "jobs.a", "jobs.c"
PER_SENDER = 800  # at RATE/s: an 8 s stream, the worker killed about 2 s into it
RATE = 100


def test_the_ring_gives_each_worker_one_of_the_queues():
    owners = QueueOwners("n1", 2)
    assert (owners.ring_owner(ON_W1), owners.ring_owner(ON_W0)) == (1, 0)


def groups_of(node, address: str) -> list[dict]:
    """The fragment groups of ``address`` a node shows (``GET /api/v1/fragments``), each with
    the ``worker`` that serves it."""
    return [g for g in admin(node, "/api/v1/fragments")["fragments"] if g["address"] == address]


def test_a_worker_killed_is_a_failure_of_the_fragments_it_owned(start_node, etcd_url,
                                                                cluster_name, clients):
    began = time.monotonic()
    nodes = replicated_nodes(start_node, [etcd_url], cluster_name, RULE, workers=2)
    n1, n2, n3 = nodes["n1"], nodes["n2"], nodes["n3"]
    load = Workload(clients, ON_W1,
                    senders=[(failover_urls(n1, n2, n3), "a"), (failover_urls(n2, n3, n1), "b"),
                             (failover_urls(n3, n1, n2), "c"), (failover_urls(n1, n3, n2), "d")],
                    receivers=[failover_urls(n1, n2, n3), failover_urls(n2, n3, n1),
                               failover_urls(n3, n1, n2), failover_urls(n1, n2, n3)],
                    per_sender=PER_SENDER, rate=RATE, credit=CREDIT, failover=True)
    other = Workload(clients, ON_W0, senders=[(n1.url, "x"), (n2.url, "y")],
                     receivers=[n1.url, n3.url], per_sender=PER_SENDER, rate=RATE, credit=CREDIT)
    load.start()
    other.start()
    backups = {m: wait_in_sync(etcd_url, cluster_name, ON_W1, m, 10.0)["isr"][0] for m in NAMES}
    wait_in_sync(etcd_url, cluster_name, ON_W0, "n1", 10.0)
    # one fragment per node, the node's, on the worker that owns the queue
    for name, node in nodes.items():
        for address, worker in ((ON_W1, 1), (ON_W0, 0)):
            groups = groups_of(node, address)
            assert [(g["worker"], g["local"]) for g in groups] == [(worker, name)], (name, groups)
    epochs = {a: fragment_owner(etcd_url, cluster_name, a, "n1")["epoch"] for a in (ON_W1, ON_W0)}
    load.wait_accepted(4 * 200, 20.0)

    killed = time.time()
    os.kill(worker_pid(n1, 1), signal.SIGKILL)
    adopter = wait_for(lambda: adopted_by(nodes, ON_W1, "n1"), timeout=LEASE_TTL + 10.0,
                       interval=0.05, what=f"a node serving {ON_W1}@n1")
    took = time.time() - killed
    assert adopter == backups["n1"], (adopter, backups)
    assert fragment_owner(etcd_url, cluster_name, ON_W1, "n1") == \
        {"resource": f"fragment/{ON_W1}/n1", "owner": adopter, "epoch": epochs[ON_W1] + 1}
    outcome = load.result(timeout=60.0)
    in_flight = load.in_flight_sends(killed)
    untouched = other.result(timeout=60.0)
    print(f"\nworker 1 of n1 killed: {ON_W1}@n1 served on {adopter} {took:.2f} s after; "
          f"stream: accepted {len(outcome.accepted)}, received {len(outcome.received)}, "
          f"duplicates {outcome.duplicates}, {load.resent()} sent again; bound: "
          f"{4 * CREDIT} receivers' credit + {in_flight} sends in flight")
    assert not outcome.corrupt
    assert not outcome.lost, sorted(outcome.lost)[:20]
    assert all(s and s["error"] is None and s["accepted"] == PER_SENDER for s in outcome.senders), \
        outcome.senders
    assert outcome.duplicates <= 4 * CREDIT + in_flight, (outcome.duplicates, in_flight)
    # the other worker's queue saw nothing of it
    assert not untouched.corrupt and not untouched.lost, sorted(untouched.lost)[:20]
    assert len(untouched.accepted) == 2 * PER_SENDER and untouched.duplicates == 0, \
        (untouched.senders, untouched.duplicated_ids())
    assert fragment_owner(etcd_url, cluster_name, ON_W0, "n1") == \
        {"resource": f"fragment/{ON_W0}/n1", "owner": "n1", "epoch": epochs[ON_W0]}

    # -- the supervisor started worker 1 again: a backup of n1's fragment, then its home ------
    more = Workload(clients, ON_W1, senders=[(n1.url, "e"), (n2.url, "f"), (n3.url, "g")],
                    receivers=[n1.url, n2.url, n3.url], per_sender=300, rate=RATE, credit=CREDIT)
    wait_for(lambda: n1.log_path.read_text().count("worker 1 started") >= 2,
             timeout=10.0, what="n1's worker 1 started again")
    more.start()  # its clients run through the catch-up and the hand-back
    wait_owner(etcd_url, cluster_name, ON_W1, "n1", "n1", 30.0)
    back = time.time() - killed
    assert fragment_owner(etcd_url, cluster_name, ON_W1, "n1")["epoch"] == epochs[ON_W1] + 2
    # n1 came back as a backup of its fragment: the adopter had it in sync, then handed it
    # back (the in-sync window is 2 s, the hand-back's wait: read from the adopter's log)
    told = nodes[adopter].log_path.read_text()
    in_sync = told.find(f"queue {ON_W1}@n1: in-sync backups now ['n1'] (epoch {epochs[ON_W1] + 1})")
    handed = told.find(f"fragment {ON_W1}@n1: handed back to its home member n1")
    assert 0 <= in_sync < handed, (in_sync, handed)
    wait_for(lambda: adopted_by(nodes, ON_W1, "n1") is None, timeout=5.0,
             what=f"nobody serving {ON_W1}@n1 any more")
    wait_for(lambda: all(served(node, ON_W1)["n1"] == "home" for node in (n2, n3)),
             timeout=5.0, what="n2 and n3 stealing from n1's fragment at home")
    later = more.result(timeout=60.0)
    assert not later.corrupt and not later.lost, sorted(later.lost)[:20]
    assert all(s and s["error"] is None and s["accepted"] == 300 for s in later.senders), \
        later.senders
    assert later.duplicates <= 3 * CREDIT, later.duplicated_ids()
    # n1's own producer into its own fragment again, on the worker started again
    enqueued = queues_of(n1)[ON_W1]["stats"]["enqueued"]
    last = Workload(clients, ON_W1, senders=[(n1.url, "h")], receivers=[n2.url],
                    per_sender=200, rate=0, credit=CREDIT)
    last.start()
    end = last.result(timeout=30.0, quiet=0.5)
    assert not end.lost and len(end.accepted) == 200 and end.duplicates == 0, end.senders
    assert queues_of(n1)[ON_W1]["stats"]["enqueued"] >= enqueued + 200
    assert [g["worker"] for g in groups_of(n1, ON_W1)] == [1]
    wait_for(lambda: (held := fragments_held(nodes, (ON_W1, ON_W0))) and
             all(v == (0, 0) for v in held.values()) and
             not any("@" in q for _, q in held), timeout=5.0,
             what="every fragment empty on every node, none adopted")
    print(f"worker 1 of n1 back as its fragment's primary {back:.2f} s after the kill; "
          f"runtime {time.monotonic() - began:.1f} s")


def test_worker_0_killed_is_a_failure_of_its_fragments_and_of_the_member_record_a_moment(
        start_node, etcd_url, cluster_name, clients):
    nodes = replicated_nodes(start_node, [etcd_url], cluster_name, RULE, workers=2)
    n1, n2, n3 = nodes["n1"], nodes["n2"], nodes["n3"]
    survivors = {"n2": n2, "n3": n3}  # n1's admin API is worker 0's: away while it restarts
    streams = {}
    for address in (ON_W0, ON_W1):
        streams[address] = Workload(
            clients, address,
            senders=[(failover_urls(n1, n2, n3), "a"), (failover_urls(n2, n3, n1), "b"),
                     (failover_urls(n3, n1, n2), "c")],
            receivers=[failover_urls(n1, n2, n3), failover_urls(n2, n3, n1),
                       failover_urls(n3, n1, n2)],
            per_sender=PER_SENDER, rate=RATE, credit=CREDIT, failover=True).start()
    backup = wait_in_sync(etcd_url, cluster_name, ON_W0, "n1", 10.0)["isr"][0]
    wait_in_sync(etcd_url, cluster_name, ON_W1, "n1", 10.0)
    assert [g["worker"] for g in groups_of(n1, ON_W0)] == [0]
    epochs = {a: fragment_owner(etcd_url, cluster_name, a, "n1")["epoch"] for a in streams}
    streams[ON_W0].wait_accepted(3 * 200, 20.0)

    killed = time.time()
    os.kill(worker_pid(n1, 0), signal.SIGKILL)
    adopter = wait_for(lambda: adopted_by(survivors, ON_W0, "n1"), timeout=LEASE_TTL + 10.0,
                       interval=0.05, what=f"a node serving {ON_W0}@n1")
    took = time.time() - killed
    assert adopter == backup, (adopter, backup)
    assert fragment_owner(etcd_url, cluster_name, ON_W0, "n1") == \
        {"resource": f"fragment/{ON_W0}/n1", "owner": adopter, "epoch": epochs[ON_W0] + 1}
    outcomes = {a: load.result(timeout=60.0) for a, load in streams.items()}
    for address, outcome in outcomes.items():
        in_flight = streams[address].in_flight_sends(killed)
        print(f"\nworker 0 of n1 killed: {address}: accepted {len(outcome.accepted)}, received "
              f"{len(outcome.received)}, duplicates {outcome.duplicates}; bound: "
              f"{3 * CREDIT} receivers' credit + {in_flight} sends in flight")
        assert not outcome.corrupt
        assert not outcome.lost, (address, sorted(outcome.lost)[:20])
        assert all(s and s["error"] is None and s["accepted"] == PER_SENDER
                   for s in outcome.senders), (address, outcome.senders)
        assert outcome.duplicates <= 3 * CREDIT + in_flight, (address, outcome.duplicates)
    # worker 1's queue keeps n1 as its fragment's primary, at the same epoch
    assert fragment_owner(etcd_url, cluster_name, ON_W1, "n1") == \
        {"resource": f"fragment/{ON_W1}/n1", "owner": "n1", "epoch": epochs[ON_W1]}
    # worker 0 back: n1 a member again, a backup of its fragment of jobs.c, then its home
    wait_owner(etcd_url, cluster_name, ON_W0, "n1", "n1", 30.0)
    back = time.time() - killed
    assert fragment_owner(etcd_url, cluster_name, ON_W0, "n1")["epoch"] == epochs[ON_W0] + 2
    told = nodes[adopter].log_path.read_text()
    in_sync = told.find(f"queue {ON_W0}@n1: in-sync backups now ['n1'] (epoch {epochs[ON_W0] + 1})")
    handed = told.find(f"fragment {ON_W0}@n1: handed back to its home member n1")
    assert 0 <= in_sync < handed, (in_sync, handed)
    wait_for(lambda: adopted_by(nodes, ON_W0, "n1") is None, timeout=10.0,
             what=f"nobody serving {ON_W0}@n1 any more")
    last = Workload(clients, ON_W0, senders=[(n1.url, "h")], receivers=[n2.url],
                    per_sender=200, rate=0, credit=CREDIT)
    last.start()
    end = last.result(timeout=30.0, quiet=0.5)
    assert not end.lost and len(end.accepted) == 200 and end.duplicates == 0, end.senders
    wait_for(lambda: (held := fragments_held(nodes, (ON_W1, ON_W0))) and
             all(v == (0, 0) for v in held.values()) and
             not any("@" in q for _, q in held), timeout=5.0,
             what="every fragment empty on every node, none adopted")
    print(f"{ON_W0}@n1 served on {adopter} {took:.2f} s after the kill; worker 0 of n1 back as "
          f"its fragment's primary {back:.2f} s after")
