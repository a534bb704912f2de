"""A fragmented queue whose fragments are replicated, on real processes (issue #35): three
nodes on etcd, one rule ``kind = "fragmented"``, ``fragments = ["n1", "n2", "n3"]``,
``replicas = 2``: each member's fragment ``fragment/<address>/<member>`` is also kept on one
other member (docs/replication.md, "Fragments").

n1 (it holds a fragment, two producers and a consumer are on it) is killed with -9 in the
middle of a stream of 4 senders and 4 receivers spread over the three nodes. Every client is
given every node's URL (``proton_client.py --failover``): those on n1 go on at another node,
a sender sending again what it had not seen settled. Checked, as a user would:

* every id whose send was accepted is received; duplicates at most what was in flight at the
  kill (the receivers' credit, and the sends not yet accepted);
* n1's fragment is served again by its backup as ``<address>@n1`` (``GET /api/v1/queues`` of
  that node). Two more queues had a backlog waiting on n1's fragment and no consumer before
  the kill: one is then consumed on the backup that took n1's fragment (local consumers
  there), the other on the survivor that did not (steal-on-empty from everywhere); each
  comes out whole, once. The time from the kill to each of these is printed;
* n1 started again catches up as a backup of its own fragment (its node in the in-sync set
  etcd records) and gets it back (the owner record says n1, nobody serves ``<address>@n1``)
  while clients run; the backlog queues' fragments come home too, with no client of them
  on n1. More is sent, n1's own producers into its own fragment again; every id is
  received, duplicates at most the receivers' credit (deliveries out at the hand-back), and
  once the receivers are done no fragment on any node holds a message (nothing stranded).

Run twice: on nodes of one process, and of ``workers = 2`` (issue #45: on each node one worker
owns the queue, serves its fragment and keeps its copies; links landing on the other worker
are forwarded to it, docs/replication.md "On every core"). The same checks hold.

lease_ttl is 3 s; every wait is bounded; the test takes about 20 s.
"""

from __future__ import annotations

import time

import pytest

from admin_client import admin, wait_for
from etcd_servers import cluster_name, etcd_url  # noqa: F401 (fixtures)
from replication_support import (LEASE_TTL, NAMES, Workload, failover_urls, fragment_isr,
                                 fragment_owner, promoted_at, queues_of, replicated_nodes,
                                 restart)

ADDRESS = "jobs.a"  # the stream
NEAR = "jobs.near"  # a backlog on n1's fragment, consumed on its backup after the kill
FAR = "jobs.far"  # a backlog on n1's fragment, consumed on the other survivor after the kill
RULE = {"name": "jobs", "match": "jobs.*", "kind": "fragmented", "fragments": list(NAMES),
        "replicas": 2}
CREDIT = 20
PER_SENDER = 600  # at RATE/s: a 6 s stream, n1 killed about 2 s into it
RATE = 100
BACKLOG_SIZE = 150
SERVE_GOAL = LEASE_TTL + 2.0  # kill -9 -> the dead member's fragment served again


def adopted_by(nodes, address: str, member: str) -> str | None:
    """The live node that serves ``member``'s fragment of ``address`` in its stead (a local
    queue ``<address>@<member>`` in its ``GET /api/v1/queues``), else None."""
    name = f"{address}@{member}"
    holders = [n for n, node in nodes.items() if node.alive() and name in queues_of(node)]
    assert len(holders) <= 1, f"{name} is served by {holders}"
    return holders[0] if holders else None


def fragments_held(nodes, addresses) -> dict:
    """(node, queue) -> (depth, unacked) of every fragment of ``addresses`` on every live
    node: the members' own and those adopted (``<address>@<member>``)."""
    held = {}
    for name, node in nodes.items():
        if not node.alive():
            continue
        for queue, item in queues_of(node).items():
            if any(queue == a or queue.startswith(a + "@") for a in addresses):
                held[(name, queue)] = (item.get("depth"), item.get("unacked"))
    return held


def served(node, address: str) -> dict:
    """Where ``node`` says each member's fragment is served (``GET /api/v1/fragments``)."""
    body = admin(node, "/api/v1/fragments")
    group = next(g for g in body["fragments"] if g["address"] == address)
    return group["served"]


def wait_in_sync(etcd_url, cluster_name, address, member, timeout, *, primary=None,
                 holding=None) -> dict:
    """``member``'s fragment record: its primary (``primary``, default the member) has a
    backup in sync (``holding`` among them, if given)."""
    owner = primary or member

    def check():
        record = fragment_isr(etcd_url, cluster_name, address, member)
        if record and record.get("primary") == owner and record.get("isr") and \
                (holding is None or holding in record["isr"]):
            return record
        return None
    return wait_for(check, timeout=timeout, interval=0.1,
                    what=f"{member}'s fragment of {address}: {owner} primary with "
                         f"{holding or 'a backup'} in sync")


def wait_owner(etcd_url, cluster_name, address, member, owner, timeout) -> None:
    wait_for(lambda: (fragment_owner(etcd_url, cluster_name, address, member) or {}).get("owner")
             == owner, timeout=timeout, interval=0.1,
             what=f"{owner} owning {member}'s fragment of {address}")


def redeliveries(received) -> int:
    """Deliveries of an id seen before that carry a delivery-count (out with a consumer at the
    failure); the other duplicates are sends made again."""
    seen, count = set(), 0
    for _, ident, delivery_count in received:
        count += ident in seen and delivery_count > 0
        seen.add(ident)
    return count


def first_after(lines, when: float) -> float | None:
    times = [t for t, _ in lines if t > when]
    return min(times) if times else None


@pytest.mark.parametrize("workers", [1, 2])
def test_a_member_killed_mid_stream_its_fragment_is_served_by_its_backup_and_handed_back(
        start_node, etcd_url, cluster_name, clients, workers):
    began = time.monotonic()
    nodes = replicated_nodes(start_node, [etcd_url], cluster_name, RULE, workers=workers)
    n1, n2, n3 = nodes["n1"], nodes["n2"], nodes["n3"]

    # -- backlogs on n1's fragments of NEAR and FAR, each kept on a backup --------------------
    fill = Workload(clients, NEAR, senders=[(n1.url, "p")], receivers=[],
                    per_sender=BACKLOG_SIZE, rate=0)
    fill_far = Workload(clients, FAR, senders=[(n1.url, "q")], receivers=[],
                        per_sender=BACKLOG_SIZE, rate=0)
    fill.start_senders()
    fill_far.start_senders()
    stored = {NEAR: fill.result(timeout=20.0, want=set()),
              FAR: fill_far.result(timeout=20.0, want=set())}
    for address, outcome in stored.items():
        assert outcome.senders[0] and outcome.senders[0]["accepted"] == BACKLOG_SIZE, \
            (address, outcome.senders)
    keeper = {a: wait_in_sync(etcd_url, cluster_name, a, "n1", 10.0)["isr"][0] for a in stored}
    consumed_on = {NEAR: keeper[NEAR], FAR: next(n for n in ("n2", "n3") if n != keeper[FAR])}

    # -- the stream: 2 senders and a receiver on n1, the rest on n2 and n3 -------------------
    load = Workload(clients, ADDRESS,
                    senders=[(failover_urls(n1, n2, n3), "a"), (failover_urls(n2, n3, n1), "b"),
                             (failover_urls(n3, n1, n2), "c"), (failover_urls(n1, n3, n2), "d")],
                    receivers=[failover_urls(n1, n2, n3), failover_urls(n2, n3, n1),
                               failover_urls(n3, n1, n2), failover_urls(n2, n1, n3)],
                    per_sender=PER_SENDER, rate=RATE, credit=CREDIT, failover=True)
    load.start()
    # every member serves its own fragment, each in sync on one other member
    backups = {m: wait_in_sync(etcd_url, cluster_name, ADDRESS, m, 10.0)["isr"][0] for m in NAMES}
    epoch = fragment_owner(etcd_url, cluster_name, ADDRESS, "n1")["epoch"]
    load.wait_accepted(4 * 200, 20.0)
    killed = time.time()
    n1.kill()
    # the backlogs' consumers come now: nothing of them was out before
    drains = {a: Workload(clients, a, senders=[], receivers=[nodes[consumed_on[a]].url],
                          credit=CREDIT).start_receivers() for a in stored}
    adopter = wait_for(lambda: adopted_by(nodes, ADDRESS, "n1"), timeout=LEASE_TTL + 10.0,
                       interval=0.05, what=f"a node serving {ADDRESS}@n1")
    shown = time.time()
    assert adopter == backups["n1"], (adopter, backups)
    taken = {a: drains[a].result(timeout=30.0, quiet=0.5, want=set(stored[a].accepted))
             for a in stored}
    outcome = load.result(timeout=60.0)
    in_flight = load.in_flight_sends(killed)
    resent = load.resent()

    promoted = promoted_at(nodes[adopter], f"{ADDRESS}@n1", after=killed)
    first = {a: taken[a].first_delivery_after(killed) for a in stored}
    moved_accepted = first_after([x for r in (load.senders[0], load.senders[3])
                                  for x in r.items("accepted_id")], killed)
    print(f"\nn1 killed: its fragment of {ADDRESS} promoted on {adopter} "
          f"{promoted - killed:.2f} s after, {ADDRESS}@n1 in its admin API "
          f"{shown - killed:.2f} s; first delivery of n1's backlog to a consumer on its "
          f"backup {keeper[NEAR]} {first[NEAR] - killed:.2f} s, to one on {consumed_on[FAR]} "
          f"(not its backup) {first[FAR] - killed:.2f} s; n1's senders accepted again "
          f"{moved_accepted - killed:.2f} s after (on another member). Stream: accepted "
          f"{len(outcome.accepted)}, received {len(outcome.received)}, duplicates "
          f"{outcome.duplicates} ({redeliveries(outcome.received)} with a delivery-count), "
          f"{resent} sent again by the clients; bound: {4 * CREDIT} receivers' credit + "
          f"{in_flight} sends in flight")
    assert not outcome.corrupt
    assert not outcome.lost, sorted(outcome.lost)[:20]
    assert all(s and s["error"] is None and s["accepted"] == PER_SENDER for s in outcome.senders), \
        outcome.senders
    assert outcome.senders[0]["failovers"] >= 1 and outcome.senders[3]["failovers"] >= 1
    assert resent <= in_flight, (resent, in_flight)
    assert outcome.duplicates <= 4 * CREDIT + in_flight, (outcome.duplicates, in_flight)
    # the backlogs: every message once, from n1's fragment served by its backup
    for address in stored:
        got, want = taken[address], set(stored[address].accepted)
        assert not got.corrupt
        assert got.received_ids == want, (address, sorted(want - got.received_ids)[:20])
        assert got.duplicates == 0, (address, got.duplicated_ids())
    assert max(promoted, *first.values()) - killed <= SERVE_GOAL, \
        (promoted - killed, {a: t - killed for a, t in first.items()})
    assert fragment_owner(etcd_url, cluster_name, ADDRESS, "n1") == \
        {"resource": f"fragment/{ADDRESS}/n1", "owner": adopter, "epoch": epoch + 1}
    assert all(served(nodes[n], ADDRESS)["n1"].startswith(f"{ADDRESS}@n1 at ")
               for n in ("n2", "n3"))

    # -- n1 back: a backup of its own fragment, then its home again, while clients run -------
    restarted = time.time()
    restart(n1)
    listening = time.time()
    more = Workload(clients, ADDRESS, senders=[(n1.url, "e"), (n2.url, "f"), (n3.url, "g")],
                    receivers=[n1.url, n2.url, n3.url, n3.url], per_sender=400, rate=RATE,
                    credit=CREDIT)
    more.start()
    wait_in_sync(etcd_url, cluster_name, ADDRESS, "n1", 20.0, primary=adopter, holding="n1")
    in_sync = time.time()
    wait_owner(etcd_url, cluster_name, ADDRESS, "n1", "n1", 15.0)
    handed = time.time()
    wait_for(lambda: adopted_by(nodes, ADDRESS, "n1") is None, timeout=5.0,
             what=f"nobody serving {ADDRESS}@n1 any more")
    for address in stored:  # home too, though n1 has no client of them
        wait_owner(etcd_url, cluster_name, address, "n1", "n1", 15.0)
    wait_for(lambda: all(served(node, ADDRESS)["n1"] == "home" for node in nodes.values()),
             timeout=5.0, what="every node stealing from n1's fragment at home")
    later = more.result(timeout=60.0)
    print(f"n1 restarted: listening {listening - restarted:.2f} s after, in the in-sync set of "
          f"its fragment (primary {adopter}) {in_sync - listening:.2f} s later, its fragment "
          f"handed back {handed - in_sync:.2f} s after that; accepted {len(later.accepted)}, "
          f"received {len(later.received)}, duplicates {later.duplicates}")
    assert not later.corrupt
    assert not later.lost, sorted(later.lost)[:20]
    assert all(s and s["error"] is None and s["accepted"] == 400 for s in later.senders), \
        later.senders
    assert later.duplicates <= 4 * CREDIT, later.duplicated_ids()

    # -- more, with n1 serving its fragment: its producer enqueues there; and into FAR, whose
    # fragment came home to n1 with no client of it there ---------------------------------
    enqueued = queues_of(n1)[ADDRESS]["stats"]["enqueued"]
    last = Workload(clients, ADDRESS, senders=[(n1.url, "h"), (n2.url, "i")],
                    receivers=[n1.url, n3.url], per_sender=200, rate=0, credit=CREDIT)
    extra = Workload(clients, FAR, senders=[(n1.url, "r")], receivers=[n2.url],
                     per_sender=50, rate=0, credit=CREDIT, timeout_s=20.0)
    last.start()
    extra.start()
    end = last.result(timeout=30.0, quiet=0.5)
    end_far = extra.result(timeout=30.0, quiet=0.5)
    assert not end.lost and not end.corrupt and len(end.accepted) == 400, \
        (sorted(end.lost)[:20], end.senders)
    assert not end_far.lost and len(end_far.accepted) == 50, end_far.senders
    assert queues_of(n1)[ADDRESS]["stats"]["enqueued"] >= enqueued + 200  # n1's own fragment
    assert end.duplicates == 0 and end_far.duplicates == 0

    # nothing stranded: every fragment on every node is empty, nothing adopted is left
    wait_for(lambda: (held := fragments_held(nodes, (ADDRESS, NEAR, FAR))) and
             all(v == (0, 0) for v in held.values()) and
             not any("@" in q for _, q in held), timeout=5.0,
             what="every fragment empty on every node, none adopted")
    print(f"runtime {time.monotonic() - began:.1f} s")
