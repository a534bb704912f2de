"""A cluster on etcd when etcd fails (issue #34): a node cut off from etcd (Toxiproxy)
fences itself within lease_ttl and rejoins; etcd restarted; the etcd leader of a 3-member
etcd killed. What is checked is what a user sees: ``GET /api/v1/cluster`` (members,
coordinator healthy and acting), ``fedgate status``, rule changes (503 while etcd is out of
reach), AMQP still served. lease_ttl is 3 s; every wait is bounded.
"""

from __future__ import annotations

import os
import subprocess
import time

import pytest
from admin_client import ADMIN_TOKEN, http, wait_for
from cluster_support import LEASE_TTL, cluster_view, coordinator, etcd_node, member_ids, rules_etag, wait_members
from conftest import PYTHON, ROOT
from etcd_servers import cluster_name, etcd_members, etcd_url  # noqa: F401 (fixtures)
from proton import Message
from proton.utils import BlockingConnection
from toxi import toxi, toxiproxy_server  # noqa: F401 (fixtures)


def amqp_round_trip(url: str, address: str = "local.check") -> str:
    """A message sent and received back through a local queue of the node."""
    conn = BlockingConnection(url, timeout=10)
    try:
        conn.create_sender(address).send(Message(body="still here"))
        receiver = conn.create_receiver(address, credit=1)
        body = receiver.receive(timeout=10).body
        receiver.accept()
        return body
    finally:
        conn.close()


def status_text(node) -> str:
    proc = subprocess.run([PYTHON, "-m", "proxy", "status", "--admin", node.admin_url], cwd=ROOT,
                          capture_output=True, text=True, timeout=30,
                          env=dict(os.environ, FEDGATE_TOKEN=ADMIN_TOKEN))
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def put_rule(node, name: str):
    return http("POST", node.admin_url + "/api/v1/rules", {"name": name, "match": f"{name}.*",
                                                          "kind": "deny"})


def cut(proxy, how: str) -> None:
    if how == "disabled":  # connections dropped, new ones refused
        proxy.proxy.disable()
    else:  # blackhole: every byte dropped, nothing closed
        for stream in ("upstream", "downstream"):
            proxy.proxy.add_toxic(name=f"hole_{stream}", type="timeout", stream=stream,
                                  attributes={"timeout": 0})


def heal(proxy, how: str) -> None:
    if how == "disabled":
        proxy.proxy.enable()
    else:
        for stream in ("upstream", "downstream"):
            proxy.proxy.destroy_toxic(f"hole_{stream}")


@pytest.mark.parametrize("how", ["disabled", "blackhole"])
def test_a_node_cut_off_from_etcd_fences_itself_within_the_ttl_then_rejoins(
        start_node, etcd_url, cluster_name, toxi, how):
    proxy = toxi.proxy("etcd", int(etcd_url.rsplit(":", 1)[1]))
    through = f"http://127.0.0.1:{proxy.port}"
    n1 = etcd_node(start_node, "n1", [through], cluster_name)
    n2 = etcd_node(start_node, "n2", [etcd_url], cluster_name)
    wait_members(n1, ["n1", "n2"], 2.0)
    wait_members(n2, ["n1", "n2"], 2.0)

    cut_at = time.monotonic()
    cut(proxy, how)
    wait_for(lambda: coordinator(n1)["acting"] is False, LEASE_TTL + 0.5, "n1 fenced")
    fenced_after = time.monotonic() - cut_at
    assert fenced_after <= LEASE_TTL, fenced_after  # before its lease can have expired
    wait_members(n2, ["n2"], LEASE_TTL + 1.5)
    assert time.monotonic() - cut_at <= LEASE_TTL + 1.5
    view = coordinator(n1)
    assert view["healthy"] is False and view["fenced"] is True and view["last_error"]
    status, body = put_rule(n1, "during")  # no rule change without etcd
    assert status == 503 and body["error"] == "coordinator_unavailable", body
    assert "etcd" in body["detail"]
    text = status_text(n1)
    assert "UNREACHABLE" in text and "FENCED" in text, text
    assert amqp_round_trip(n1.url) == "still here"  # serving what it has, with what it knows
    assert member_ids(n1) == ["n1", "n2"]  # the last it knew
    assert put_rule(n2, "meanwhile")[0] == 201  # the rest of the cluster goes on

    heal(proxy, how)
    wait_for(lambda: coordinator(n1)["acting"] is True, 10.0, "n1 acting again")
    wait_members(n2, ["n1", "n2"], 2.0)
    wait_for(lambda: rules_etag(n1) == rules_etag(n2), 2.0, "n1 caught up on the rules")
    lease = coordinator(n1)["lease"]
    assert lease["registrations"] == 2  # its old lease expired: a new one, new epochs
    assert "acting" in status_text(n1)
    assert put_rule(n1, "after")[0] == 201
    print(f"{how}: fenced {fenced_after:.2f} s after the cut")


def test_etcd_restarted_nodes_serve_on_and_recover(start_node, etcd_members, cluster_name):
    etcd = etcd_members.member()
    n1 = etcd_node(start_node, "n1", [etcd.url], cluster_name)
    n2 = etcd_node(start_node, "n2", [etcd.url], cluster_name)
    wait_members(n1, ["n1", "n2"], 2.0)
    assert put_rule(n1, "before")[0] == 201

    etcd.kill()
    for node in (n1, n2):
        wait_for(lambda: coordinator(node)["acting"] is False, LEASE_TTL + 0.5, "fenced")
        assert coordinator(node)["healthy"] is False
        assert put_rule(node, "down")[0] == 503
        assert amqp_round_trip(node.url) == "still here"
        assert member_ids(node) == ["n1", "n2"]
    time.sleep(2.0)  # down well past every lease's ttl

    etcd.start()
    for node in (n1, n2):
        wait_for(lambda: coordinator(node)["acting"] is True and coordinator(node)["healthy"],
                 10.0, "acting again")
    wait_members(n1, ["n1", "n2"], 5.0)
    wait_members(n2, ["n1", "n2"], 5.0)
    assert put_rule(n2, "after")[0] == 201
    wait_for(lambda: rules_etag(n1) == rules_etag(n2), 1.0, "the change on both nodes")
    print("registrations after the restart:", [coordinator(n)["lease"]["registrations"] for n in (n1, n2)])


def test_the_etcd_leader_killed_in_a_3_member_etcd_the_nodes_carry_on(
        start_node, etcd_members, cluster_name):
    etcd = etcd_members.cluster(3)
    leader = etcd.leader()
    followers = [m for m in etcd.members if m is not leader]
    # n1 talks to the leader first, n2 to a follower first; both know all three
    n1 = etcd_node(start_node, "n1", [leader.url] + [m.url for m in followers], cluster_name)
    n2 = etcd_node(start_node, "n2", [m.url for m in followers] + [leader.url], cluster_name)
    wait_members(n1, ["n1", "n2"], 2.0)
    wait_members(n2, ["n1", "n2"], 2.0)

    leader.kill()
    killed_at = time.monotonic()
    fenced_for = {"n1": 0.0, "n2": 0.0}
    last = time.monotonic()
    while time.monotonic() - killed_at < 8.0:
        for name, node in (("n1", n1), ("n2", n2)):
            view = cluster_view(node)
            assert [m["id"] for m in view["members"]] == ["n1", "n2"]  # nobody dropped out
            if not view["coordinator"]["acting"]:
                fenced_for[name] += time.monotonic() - last
        last = time.monotonic()
        time.sleep(0.1)
    new_leader = etcd.leader()
    assert new_leader is not leader
    for node in (n1, n2):
        view = coordinator(node)
        assert view["healthy"] and view["acting"], view
        assert view["lease"]["registrations"] == 1  # the lease lived through the election
    assert coordinator(n1)["endpoint"] != leader.url
    assert put_rule(n1, "after-election")[0] == 201
    wait_for(lambda: rules_etag(n1) == rules_etag(n2), 1.0, "the change on both nodes")
    print(f"fenced during the election: n1 {fenced_for['n1']:.2f} s, n2 {fenced_for['n2']:.2f} s")
