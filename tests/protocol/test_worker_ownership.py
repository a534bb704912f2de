"""Which worker owns a local queue (proxy.workers.ownership): pure logic."""

from __future__ import annotations

import collections
from pathlib import Path

import pytest
from proxy.workers.ownership import QueueOwners, temp_prefix
from proxy.workers.worker import WorkerContext
from routing import Decision


def test_every_name_has_one_owner_and_the_ring_spreads_them():
    owners = QueueOwners("n1", 4)
    counts = collections.Counter(owners.owner(f"queue-{i}") for i in range(4000))
    assert set(counts) == {0, 1, 2, 3}
    assert min(counts.values()) > 600  # ketama: roughly a quarter each
    # the same answer in every worker process (no per-process salt)
    again = QueueOwners("n1", 4)
    assert all(owners.owner(f"queue-{i}") == again.owner(f"queue-{i}") for i in range(4000))


def test_a_temporary_queue_belongs_to_the_worker_that_made_it():
    owners = QueueOwners("n1", 3)
    for worker in range(3):
        assert owners.owner(temp_prefix("n1", worker) + "17") == worker
    # a look-alike outside the range, or another node's prefix, goes by the ring
    from uhashring import HashRing

    ring = HashRing(nodes=["w0", "w1", "w2"])
    for name in ("tmp.n1.w9.1", "tmp.n2.w2.1", "tmp.n1.wx.1"):
        assert f"w{owners.owner(name)}" == ring.get_node(name)


def test_one_worker_owns_everything():
    owners = QueueOwners("n1", 1)
    assert {owners.owner(f"q{i}") for i in range(100)} == {0}


def test_fragmented_addresses_and_proxy_rules_are_served_by_every_worker():
    owners = QueueOwners("n1", 4)
    # a fragment on every worker of a member node, whoever the other members are
    assert owners.owner_of_kind("fragmented", "orders") is None
    assert owners.owner_of_kind("proxy", "ext.orders") is None
    assert owners.owner_of_kind("deny", "secret") is None
    assert owners.owner_of_kind("local", "orders") == owners.owner("orders")


def test_at_least_one_worker():
    with pytest.raises(ValueError):
        QueueOwners("n1", 0)


def test_routing_forwards_what_another_worker_owns_to_its_socket():
    context = WorkerContext(index=0, count=2, data_dir=Path("/var/fg"), owners=QueueOwners("n1", 2))
    resolve = context.resolver(lambda address: Decision(kind="local", rule=None, address=address))
    names = [f"q{i}" for i in range(50)]
    mine = [n for n in names if context.owners.owner(n) == 0]
    theirs = [n for n in names if context.owners.owner(n) == 1]
    assert mine and theirs
    assert all(resolve(n).kind == "local" for n in mine)
    for name in theirs:
        decision = resolve(name)
        assert decision.kind == "proxy"
        assert decision.remote_address == name
        assert decision.primary_url == "amqp+unix:///var/fg/workers/worker-1.sock"
        assert "worker 1" in decision.reason
    # one rule (so one upstream pool) per worker
    assert resolve(theirs[0]).rule is resolve(theirs[-1]).rule



def test_fragmented_routing_stays_on_the_worker_of_the_link():
    from routing import RuleSet

    rules = RuleSet.build([
        {"name": "mine", "match": "mine.#", "kind": "fragmented", "fragments": ["n1"]},
        {"name": "shared", "match": "shared.#", "kind": "fragmented", "fragments": ["n1", "n2"]},
    ], peers={"n2": "amqp://127.0.0.1:1"}, node_id="n1")
    for index in range(2):
        context = WorkerContext(index=index, count=2, data_dir=Path("/var/fg"),
                                owners=QueueOwners("n1", 2))
        resolve = context.resolver(rules.resolve)
        assert resolve("mine.q").kind == "fragmented"
        assert resolve("shared.q").kind == "fragmented"


def replicated_fragment_rules():
    """``jobs.*``: fragments with replicas on n1 and n2; ``plain.*``: without. The rules, a
    2-worker node's owners, and the owner of ``jobs.a``."""
    from routing import RuleSet

    rules = RuleSet.build([
        {"name": "jobs", "match": "jobs.*", "kind": "fragmented", "fragments": ["n1", "n2"],
         "replicas": 2},
        {"name": "plain", "match": "plain.*", "kind": "fragmented", "fragments": ["n1", "n2"]},
    ], peers={"n2": "amqp://127.0.0.1:1"}, node_id="n1")
    owners = QueueOwners("n1", 2)
    return rules, owners, owners.owner("jobs.a")


def test_a_fragmented_queue_with_replicated_fragments_and_its_adopted_names_go_to_its_owner():
    # issue #45: one worker of a node serves such a queue (its fragment, its copies, the dead
    # members' fragments it adopted); every other worker forwards its links there
    rules, owners, owner = replicated_fragment_rules()
    for index in range(2):
        context = WorkerContext(index=index, count=2, data_dir=Path("/var/fg"), owners=owners)
        resolve = context.resolver(rules.resolve)
        for name in ("jobs.a", "jobs.a@n2", "jobs.a@n1"):
            decision = resolve(name)
            if index == owner:
                assert decision.kind != "proxy", (index, name, decision)
            else:
                assert decision.kind == "proxy" and decision.remote_address == name, decision
                assert decision.primary_url.endswith(f"worker-{owner}.sock")
        assert resolve("plain.a").kind == "fragmented"  # not replicated: a fragment per worker


def test_a_connection_whose_first_attach_names_a_replicated_fragmented_queue_goes_to_its_owner():
    # placement (issue #36): to the queue's owner, not the balance of producers and consumers
    from types import SimpleNamespace

    from proxy.workers.placement import Placement

    rules, owners, owner = replicated_fragment_rules()
    for index in range(2):
        node = SimpleNamespace(worker=SimpleNamespace(owners=owners, index=index),
                               routing=SimpleNamespace(resolve=rules.resolve))
        placement = Placement(node, None)
        for address in ("jobs.a", "jobs.a@n2"):
            for receiver in (False, True):
                where = placement.where(SimpleNamespace(address=address, receiver=receiver, replication=False))
                assert where == (None if index == owner else {"to": owner}), (index, address)
        where = placement.where(SimpleNamespace(address="plain.a", receiver=True, replication=False))
        assert where["to"] is None and where["balance"][0] == "plain.a"


def test_replicated_fragments_are_accepted_on_a_node_of_several_workers(tmp_path):
    from proxy.config.settings import load

    path = tmp_path / "node.toml"
    path.write_text('[node]\nid = "n1"\nworkers = 2\n\n[peers]\nn2 = "amqp://127.0.0.1:1"\n\n[[rules]]\nname = "jobs"\n'
                    'match = "jobs.*"\nkind = "fragmented"\nfragments = ["n1"]\nreplicas = 1\n')
    assert load(path).node.workers == 2
    path.write_text(path.read_text().replace("replicas = 1", "replicas = 2")
                    .replace('["n1"]', '["n1", "n2"]'))
    assert load(path).node.workers == 2  # was refused: "need workers = 1 for now"


def test_a_cap_on_upstream_connections_sends_the_other_workers_links_through_the_first():
    owners = QueueOwners("n1", 4)
    # no cap: every worker connects itself
    assert [owners.upstream_owner(k, 0, 2) for k in range(4)] == [None] * 4
    # 4 connections, 2 per worker (both directions): workers 0 and 1 connect, 2 and 3 go through them
    assert [owners.upstream_owner(k, 4, 2) for k in range(4)] == [None, None, 0, 1]
    # the cap of one worker's connections: everything through worker 0
    assert [owners.upstream_owner(k, 2, 2) for k in range(4)] == [None, 0, 0, 0]
    assert QueueOwners("n1", 1).upstream_owner(0, 2, 2) is None  # one process: nothing to share


# -- the supervisor's table (issue #45): balanced at first sight, kept across restarts --------
def test_the_table_spreads_any_names_evenly_where_the_ring_does_not():
    from proxy.workers.ownership import OwnerTable

    for workers, queues in ((16, 16), (16, 64), (16, 1000), (8, 16), (3, 10)):
        table = OwnerTable(workers)
        counts = collections.Counter(table.owner(f"q{i}") for i in range(queues))
        assert max(counts.values()) - min(counts.get(k, 0) for k in range(workers)) <= 1, counts
    ring = QueueOwners("n1", 16)
    spread = collections.Counter(ring.owner(f"q{i}") for i in range(16))
    assert max(spread.values()) >= 3  # what the table is for: the ring put 4 on one worker


def test_the_table_prefers_the_ring_owner_among_the_least_loaded_and_answers_the_same_again():
    from proxy.workers.ownership import OwnerTable

    table = OwnerTable(4)
    first = table.owner("orders")
    assert first == table.ring_owner("orders")  # every worker equal: the ring's choice
    assert [table.owner("orders") for _ in range(3)] == [first] * 3
    others = [table.owner(f"x{i}") for i in range(3)]
    assert sorted([first, *others]) == [0, 1, 2, 3]


def test_backup_copies_weigh_half_so_each_worker_gets_as_many_served_queues_as_backups():
    """16 replicated queues on a node of 8 workers, half of them served here (their clients
    attach here) and half backup copies (first used by a primary's replication link): in
    whatever order they come, no worker serves two queues' clients while another has only
    backups (on 16 cores a served queue costs a worker about twice what a backup does)."""
    import random

    from proxy.workers.ownership import BACKUP, SERVED, OwnerTable

    for seed in range(50):
        kinds = [SERVED] * 8 + [BACKUP] * 8
        random.Random(seed).shuffle(kinds)
        table = OwnerTable(8)
        served = collections.Counter()
        for i, weight in enumerate(kinds):
            owner = table.owner(f"rep.q{i}", weight=weight)
            served[owner] += weight == SERVED
        assert table.load == [SERVED + BACKUP] * 8, (seed, table.load)
        assert sorted(served.values()) == [1] * 8, (seed, served)
    counted = OwnerTable(8)  # all of one weight: as before, never more than one apart
    counts = collections.Counter(counted.owner(f"q{i}", weight=BACKUP) for i in range(20))
    assert max(counts.values()) - min(counts.values()) <= 1


def test_the_table_is_kept_and_read_again_and_a_claim_wins_only_for_a_new_name(tmp_path):
    from proxy.workers.ownership import OwnerTable

    path = tmp_path / "owners"
    table = OwnerTable(4, path)
    owners = {f"q{i}": table.owner(f"q{i}") for i in range(10)}
    assert table.owner("journaled", claim=3) == 3
    assert table.owner("q0", claim=(owners["q0"] + 1) % 4) == owners["q0"]  # taken: not moved
    table.close()
    with open(path, "ab") as handle:
        handle.write(b'["cut sho')  # a line a crash cut short
    again = OwnerTable(4, path)
    assert {name: again.owner(name) for name in owners} == owners
    assert again.owner("journaled") == 3
    assert sum(again.load) == 11 * 2  # each kept name counts as a served queue (SERVED, 2)
    fewer = OwnerTable(2, path)  # started with fewer workers: names of workers 2, 3 go again
    assert all(fewer.owner(name) in (0, 1) for name in owners)


def test_beyond_its_bound_the_table_records_nothing_and_the_ring_decides(monkeypatch):
    from proxy.workers import ownership

    monkeypatch.setattr(ownership, "MAX_ASSIGNED", 5)
    table = ownership.OwnerTable(4)
    for i in range(5):
        table.owner(f"q{i}")
    assert table.owner("late") == table.ring_owner("late")
    assert len(table.assigned) == 5


def test_a_worker_asks_once_per_name_and_keeps_the_answer():
    asked = []

    def ask(name):
        asked.append(name)
        return 3

    owners = QueueOwners("n1", 4, ask=ask)
    assert [owners.owner("a"), owners.owner("a"), owners.owner("b")] == [3, 3, 3]
    assert asked == ["a", "b"]
    assert owners.owner(temp_prefix("n1", 2) + "9") == 2  # a temporary queue: its name says
    assert asked == ["a", "b"]
