"""A cluster on etcd with real node processes (issue #34): members join, leave and die,
the same id twice, rule changes compare-and-swapped (412) and converging, fragments on
every live member.

Each test has a cluster name of its own on the suite's etcd (``etcd_url``,
``.ci/install/etcd.sh``); lease_ttl is 3 s.
"""

from __future__ import annotations

import subprocess
import threading
import time

from admin_client import http, wait_for
from cluster_support import (LEASE_TTL, cluster_view, coordinator, etag_of, etcd_node, failover_list,
                             member_ids, rules_etag, wait_members)
from conftest import PYTHON, ROOT, free_port
from etcd_servers import cluster_name, etcd_url  # noqa: F401 (fixtures)
from proton import Message
from proton.utils import BlockingConnection


def test_join_leave_and_kill9_seen_by_every_node(start_node, etcd_url, cluster_name):
    n1 = etcd_node(start_node, "n1", [etcd_url], cluster_name)
    n2 = etcd_node(start_node, "n2", [etcd_url], cluster_name)
    assert wait_members(n1, ["n1", "n2"], 2.0) < 2.0
    n3 = etcd_node(start_node, "n3", [etcd_url], cluster_name)
    for node in (n1, n2, n3):  # joined: every node lists all three within a second
        wait_members(node, ["n1", "n2", "n3"], 1.0)
    view = cluster_view(n1)
    assert view["coordinator"]["kind"] == "etcd" and view["coordinator"]["healthy"]
    assert view["coordinator"]["endpoints"] == [etcd_url] and view["coordinator"]["revision"] > 0
    member = {m["id"]: m for m in view["members"]}["n2"]
    assert member["amqp"] == n2.url and member["admin"] == n2.admin_url
    assert 0 <= member["lease_age_s"] < 60 and member["workers"] == 1
    # the open frame lists the other live members, for clients' failover
    assert sorted(failover_list(n1.url)) == sorted(u.split("//")[1] for u in (n2.url, n3.url))

    n3.stop()  # leaves: its lease is revoked, gone at once
    for node in (n1, n2):
        assert wait_members(node, ["n1", "n2"], 1.0) < 1.0
    killed_at = time.monotonic()
    n2.kill()  # kill -9: its lease runs out in etcd
    gone = wait_members(n1, ["n1"], LEASE_TTL + 1.0)
    assert time.monotonic() - killed_at <= LEASE_TTL + 1.0, gone
    assert failover_list(n1.url) == []
    assert coordinator(n1)["acting"] is True


def test_the_same_id_twice_the_second_refuses_to_start(start_node, etcd_url, cluster_name, tmp_path):
    n1 = etcd_node(start_node, "n1", [etcd_url], cluster_name)
    # the same id, with ports and a data dir of its own
    twin_config = n1.config_path.read_text() \
        .replace(f"127.0.0.1:{n1.port}", f"127.0.0.1:{free_port()}") \
        .replace(n1.admin_url.split("//")[1], f"127.0.0.1:{free_port()}") \
        .replace("data-n1", "data-twin")
    path = tmp_path / "twin.toml"
    path.write_text(twin_config)
    started = time.monotonic()
    twin = subprocess.run([PYTHON, "-m", "proxy", "serve", "--config", str(path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    took = time.monotonic() - started
    assert twin.returncode == 1, twin.stderr[-2000:]
    assert "node id 'n1' is already registered" in twin.stderr
    assert "Stop that node or give this one another [node] id" in twin.stderr
    assert "listening on" not in twin.stdout
    assert took < LEASE_TTL + 10  # waits for an old registration of its own to expire, no longer
    assert member_ids(n1) == ["n1"] and coordinator(n1)["acting"] is True


def _post_rule(node, etag, name, results):
    status, body = http("POST", node.admin_url + "/api/v1/rules",
                        {"name": name, "match": f"{name}.*", "kind": "local"},
                        headers={"If-Match": etag, "Content-Type": "application/json"})
    results[name] = (status, body)


def test_two_changes_with_the_same_if_match_on_two_nodes_exactly_one_wins(
        start_node, etcd_url, cluster_name):
    n1 = etcd_node(start_node, "n1", [etcd_url], cluster_name)
    n2 = etcd_node(start_node, "n2", [etcd_url], cluster_name)
    wait_members(n1, ["n1", "n2"], 2.0)
    # no way around etcd: the static clusters' node-to-node push is refused
    status, body = http("POST", n1.admin_url + "/api/v1/cluster/rules",
                        {"version": 99, "updated_at": 1.0, "origin": "n2", "rules": []})
    assert status == 409 and body["error"] == "rules_in_etcd", body
    for round_ in range(5):
        etag = etag_of(n1)
        assert etag_of(n2) == etag
        results: dict = {}
        threads = [threading.Thread(target=_post_rule, args=(node, etag, f"r{round_}{node.config_path.stem}",
                                                             results))
                   for node in (n1, n2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        statuses = sorted(status for status, _ in results.values())
        assert statuses == [201, 412], results
        winner = next(name for name, (status, _) in results.items() if status == 201)
        loser_status, loser_body = next(r for r in results.values() if r[0] == 412)
        assert loser_body["error"] == "version_conflict"
        wait_for(lambda: etag_of(n1) == etag_of(n2), 1.0, "both nodes on the winner's rules")
        assert loser_body["etag"] == etag_of(n1)  # the 412 names the rules that won
        names = [r["name"] for r in http("GET", n2.admin_url + "/api/v1/rules")[1]["rules"]]
        assert winner in names and all(n.startswith(f"r{k}") for k, n in zip(range(round_ + 1), names))
        assert len(names) == round_ + 1  # the loser's rule is not there: nothing overwritten


def test_a_change_reaches_three_nodes_within_1s(start_node, etcd_url, cluster_name):
    nodes = [etcd_node(start_node, f"n{k}", [etcd_url], cluster_name) for k in (1, 2, 3)]
    wait_members(nodes[0], ["n1", "n2", "n3"], 2.0)
    worst = 0.0
    for k in range(6):
        node = nodes[k % 3]
        status, body = http("POST", node.admin_url + "/api/v1/rules",
                            {"name": f"q{k}", "match": f"q{k}.*", "kind": "deny"})
        assert status == 201, body
        written = time.monotonic()
        wanted = (body["version"], None)
        wait_for(lambda: all(rules_etag(n)[0] == wanted[0] for n in nodes), 1.0,
                 f"rules version {wanted[0]} on every node")
        worst = max(worst, time.monotonic() - written)
        assert len({rules_etag(n) for n in nodes}) == 1
        status, decision = http("GET", nodes[(k + 1) % 3].admin_url + f"/api/v1/resolve?address=q{k}.x")
        assert decision["decision"] == "deny"
    assert worst < 1.0
    print(f"slowest convergence across 3 nodes: {worst * 1000:.0f} ms")


WORK = {"name": "work", "match": "work.*", "kind": "fragmented", "fragments": "*"}


def _send(url: str, address: str, count: int) -> None:
    conn = BlockingConnection(url, timeout=20)
    try:
        sender = conn.create_sender(address)
        for i in range(count):
            sender.send(Message(id=i, body=f"m{i}"))
    finally:
        conn.close()


def _receive(url: str, address: str, count: int, timeout: float = 20.0) -> list[str]:
    conn = BlockingConnection(url, timeout=timeout)
    got = []
    try:
        receiver = conn.create_receiver(address, credit=50)
        while len(got) < count:
            got.append(receiver.receive(timeout=timeout).body)
            receiver.accept()
    finally:
        conn.close()
    return got


def test_fragments_on_every_live_member_follow_joins_and_deaths(start_node, etcd_url, cluster_name):
    n1 = etcd_node(start_node, "n1", [etcd_url], cluster_name, rules=[WORK])
    n2 = etcd_node(start_node, "n2", [etcd_url], cluster_name, rules=[WORK])
    wait_members(n1, ["n1", "n2"], 2.0)

    def members_on(node):
        groups = http("GET", node.admin_url + "/api/v1/fragments")[1]
        groups = groups if isinstance(groups, list) else groups.get("fragments", [])
        return sorted(next((g["members"] for g in groups if g["address"] == "work.a"), []))

    _send(n2.url, "work.a", 100)  # into n2's fragment
    assert sorted(_receive(n1.url, "work.a", 100)) == sorted(f"m{i}" for i in range(100))  # stolen
    assert members_on(n1) == ["n1", "n2"]
    n3 = etcd_node(start_node, "n3", [etcd_url], cluster_name, rules=[WORK])
    wait_for(lambda: members_on(n1) == ["n1", "n2", "n3"], 2.0, "n3 a member of work.a on n1")
    _send(n3.url, "work.a", 50)
    assert len(_receive(n1.url, "work.a", 50)) == 50
    n3.kill()
    wait_for(lambda: members_on(n1) == ["n1", "n2"], LEASE_TTL + 1.5, "n3 gone from work.a on n1")


def test_a_node_stopping_lets_the_others_take_its_fragment_first(start_node, etcd_url, cluster_name):
    n1 = etcd_node(start_node, "n1", [etcd_url], cluster_name, rules=[WORK])
    n2 = etcd_node(start_node, "n2", [etcd_url], cluster_name, rules=[WORK],
                   cluster={"drain_timeout": 30.0})
    wait_members(n1, ["n1", "n2"], 2.0)
    _send(n2.url, "work.d", 300)  # all in n2's fragment (nothing durable: gone if n2 just left)
    got: list = []

    def slow_consumer():  # on n1: it steals n2's messages a few at a time
        conn = BlockingConnection(n1.url, timeout=30)
        try:
            receiver = conn.create_receiver("work.d", credit=10)
            while len(got) < 300:
                got.append(receiver.receive(timeout=30).body)
                receiver.accept()
                time.sleep(0.01)
        finally:
            conn.close()
    consumer = threading.Thread(target=slow_consumer)
    consumer.start()
    wait_for(lambda: len(got) >= 10, 10.0, "the consumer on n1 under way")
    assert len(got) < 200
    stopping = time.monotonic()
    n2.proc.send_signal(15)  # SIGTERM: marked draining, waits until its fragment is empty
    wait_for(lambda: any(m.get("draining") for m in cluster_view(n1)["members"]), 2.0,
             "n2 shown draining")
    assert n2.proc.wait(40) == 0
    consumer.join(30)
    assert sorted(got) == sorted(f"m{i}" for i in range(300))  # every message, none twice
    assert time.monotonic() - stopping < 30
    assert "drained for leaving: 0 messages left" in n2.log_path.read_text()
    assert member_ids(n1) == ["n1"]
