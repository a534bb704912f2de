"""Cluster-wide rules between live nodes: push on change, anti-entropy pull,
a node that was down converging, divergence shown by /api/v1/cluster."""

from __future__ import annotations

import time

from admin_client import READ_TOKEN, admin_node, http, wait_for
from conftest import free_port

DENY = {"name": "no-internal", "match": "internal.#", "kind": "deny"}


def start_cluster(start_node, names=("n1", "n2", "n3"), peers=None):
    ports = {name: free_port() for name in names}
    # the same table on every node: a node skips its own id
    table = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    return {
        name: admin_node(start_node, name,
                         admin={"listen": f"127.0.0.1:{ports[name]}", "cluster": table},
                         **({"peers": peers[name]} if peers and name in peers else {}))
        for name in names
    }


def rules_of(node):
    status, doc = http("GET", node.admin_url + "/api/v1/rules", token=READ_TOKEN, timeout=2)
    assert status == 200, doc
    return doc


def wait_converged(nodes, version, timeout):
    """Seconds until every node serves ``version`` with the same digest."""
    start = time.monotonic()

    def same():
        docs = [rules_of(node) for node in nodes]
        return all(d["version"] == version for d in docs) and len({d["digest"] for d in docs}) == 1

    wait_for(same, timeout=timeout, interval=0.02, what=f"rules version {version} everywhere")
    return time.monotonic() - start


def test_a_change_on_any_node_reaches_every_node_within_2s(start_node):
    nodes = start_cluster(start_node)
    status, doc = http("PUT", nodes["n1"].admin_url + "/api/v1/rules", [DENY])
    assert status == 200 and doc["version"] == 1
    elapsed = wait_converged(nodes.values(), 1, timeout=2.0)
    assert elapsed < 2.0
    for node in nodes.values():
        status, decision = http("GET", node.admin_url + "/api/v1/resolve?address=internal.x",
                                token=READ_TOKEN)
        assert decision["decision"] == "deny"

    status, doc = http("POST", nodes["n3"].admin_url + "/api/v1/rules",
                       {"name": "jobs", "match": "jobs.*", "kind": "local", "max_depth": 100})
    assert status == 201 and doc["version"] == 2
    wait_converged(nodes.values(), 2, timeout=2.0)
    assert [r["name"] for r in rules_of(nodes["n2"])["rules"]] == ["no-internal", "jobs"]
    assert rules_of(nodes["n2"])["origin"] == "n3"

    status, view = http("GET", nodes["n2"].admin_url + "/api/v1/cluster", token=READ_TOKEN)
    assert status == 200 and view["converged"] and view["divergent"] == []
    assert {n["id"]: n["version"] for n in view["nodes"]} == {"n1": 2, "n2": 2, "n3": 2}


def test_a_node_that_was_down_converges_when_it_returns(start_node):
    nodes = start_cluster(start_node)
    http("PUT", nodes["n1"].admin_url + "/api/v1/rules", [DENY])
    wait_converged(nodes.values(), 1, timeout=2.0)

    assert nodes["n3"].stop() == 0
    status, doc = http("DELETE", nodes["n2"].admin_url + "/api/v1/rules/no-internal")
    assert status == 200 and doc["version"] == 2
    wait_converged([nodes["n1"], nodes["n2"]], 2, timeout=2.0)
    status, view = http("GET", nodes["n1"].admin_url + "/api/v1/cluster", token=READ_TOKEN)
    assert view["unreachable"] == ["n3"] and not view["converged"]

    nodes["n3"].start()
    assert rules_of(nodes["n3"])["version"] in (1, 2)  # starts from its own persisted version 1
    wait_converged(nodes.values(), 2, timeout=4.0)  # first anti-entropy pull: <= 1.5 s
    status, view = http("GET", nodes["n3"].admin_url + "/api/v1/cluster", token=READ_TOKEN)
    assert view["converged"] and view["version"] == 2


def test_divergence_is_shown_when_a_node_refuses_a_change(start_node):
    # n3 does not know peer "b1": a proxy rule to b1 validates on n1/n2 only
    upstream = {"b1": "amqp://127.0.0.1:5999"}
    nodes = start_cluster(start_node, peers={"n1": upstream, "n2": upstream})
    rule = {"name": "to-b1", "match": "remote.*", "kind": "proxy", "primary": "b1"}
    status, doc = http("PUT", nodes["n1"].admin_url + "/api/v1/rules", [rule])
    assert status == 200
    wait_converged([nodes["n1"], nodes["n2"]], 1, timeout=2.0)

    def divergent():
        view = http("GET", nodes["n1"].admin_url + "/api/v1/cluster", token=READ_TOKEN)[1]
        return view if view["divergent"] == ["n3"] else None

    view = wait_for(divergent, what="n3 divergent")
    assert not view["converged"] and view["version"] == 1
    assert rules_of(nodes["n3"])["version"] == 0  # kept its own rules
    status, view = http("GET", nodes["n3"].admin_url + "/api/v1/cluster", token=READ_TOKEN)
    assert view["rejected"]["field"] == "rules[0].primary" and view["rejected"]["version"] == 1
