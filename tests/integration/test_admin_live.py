"""Admin API against live `fedgate serve` processes with real AMQP clients,
and the `fedgate rules` / `fedgate status` commands."""

from __future__ import annotations

import json
import os
import socket
import subprocess

from admin_client import ADMIN_TOKEN, READ_TOKEN, admin_node, http, wait_for
from conftest import PYTHON, ROOT, error_of


def test_deny_rule_applied_live_refuses_the_next_attach(start_node, clients):
    node = admin_node(start_node)
    (sent,) = clients("proton", "send", node.url, address="internal.audit", count=3).finish()
    assert sent["accepted"] == 3  # no rule yet: a local queue

    status, doc = http("POST", node.admin_url + "/api/v1/rules",
                       {"name": "no-internal", "match": "internal.#", "kind": "deny"})
    assert status == 201 and doc["version"] == 1

    for kind in ("proton", "rhea"):
        lines = clients(kind, "receive", node.url, address="internal.audit", count=1,
                        timeout_ms=10000).finish()
        assert error_of(lines)["condition"] == "amqp:unauthorized-access", (kind, lines)
    lines = clients("proton", "send", node.url, address="internal.other", count=1,
                    timeout_ms=10000).finish()
    assert error_of(lines)["condition"] == "amqp:unauthorized-access"

    # local queues keep working next to the denied addresses
    (sent,) = clients("rhea", "send", node.url, address="orders", count=20, prefix="o").finish()
    assert sent["accepted"] == 20
    lines = clients("proton", "receive", node.url, address="orders", count=20).finish()
    assert {line["id"] for line in lines if "id" in line} == {f"o-{i}" for i in range(20)}

    status, doc = http("GET", node.admin_url + "/api/v1/resolve?address=internal.audit",
                       token=READ_TOKEN)
    assert (status, doc["decision"], doc["rule"]["name"]) == (200, "deny", "no-internal")

    status, _ = http("DELETE", node.admin_url + "/api/v1/rules/no-internal")
    assert status == 200
    lines = clients("proton", "receive", node.url, address="internal.audit", count=3).finish()
    assert [line["id"] for line in lines if "id" in line] != [] and error_of(lines) is None


def test_connections_and_links_listed_and_one_closed_forced(start_node, clients):
    node = admin_node(start_node)
    receiver = clients("rhea", "receive", node.url, address="jobs", count=1, timeout_ms=20000)

    def consumer_listed():
        _, links = http("GET", node.admin_url + "/api/v1/links", token=READ_TOKEN)
        return [link for link in links["links"] if link["role"] == "consumer"]

    (link,) = wait_for(consumer_listed, what="the receiver's link")
    assert (link["address"], link["unsettled"]) == ("jobs", 0)
    status, connections = http("GET", node.admin_url + "/api/v1/connections", token=READ_TOKEN)
    (conn,) = [c for c in connections["connections"] if c["id"] == link["connection"]]
    assert conn["links"] == 1 and conn["user"] == "anonymous" and conn["peer"].startswith("127.0.0.1:")

    status, _ = http("DELETE", node.admin_url + f"/api/v1/connections/{conn['id']}", token=READ_TOKEN)
    assert status == 403
    status, doc = http("DELETE", node.admin_url + f"/api/v1/connections/{conn['id']}")
    assert status == 200 and doc["condition"] == "amqp:connection:forced"
    lines = receiver.finish(timeout=20)
    assert error_of(lines)["condition"] == "amqp:connection:forced"
    wait_for(lambda: http("GET", node.admin_url + "/api/v1/connections")[1]["count"] == 0,
             what="the connection to go")
    status, _ = http("DELETE", node.admin_url + f"/api/v1/connections/{conn['id']}")
    assert status == 404


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in metrics")


def test_metrics_count_traffic_and_delivery_latency(start_node, clients):
    node = admin_node(start_node)
    (sent,) = clients("proton", "send", node.url, address="m", count=40, prefix="m").finish()
    assert sent["accepted"] == 40
    lines = clients("rhea", "receive", node.url, address="m", count=40).finish()
    assert len([line for line in lines if "id" in line]) == 40

    def settled():
        text = http("GET", node.admin_url + "/metrics", token=READ_TOKEN)[1]
        return text if metric(text, 'fedgate_messages_settled_total{kind="local",outcome="accepted"}') == 40 else None

    text = wait_for(settled, what="40 accepted settlements")
    assert metric(text, 'fedgate_messages_in_total{kind="local"}') == 40
    assert metric(text, 'fedgate_messages_out_total{kind="local"}') == 40
    assert metric(text, 'fedgate_queue_depth{queue="m"}') == 0
    assert metric(text, "fedgate_delivery_latency_seconds_count") == 40
    assert metric(text, 'fedgate_delivery_latency_seconds_bucket{le="+Inf"}') == 40
    assert 0 < metric(text, "fedgate_delivery_latency_seconds_sum") < 40 * 30


def fedgate(*args, token: str | None = ADMIN_TOKEN):
    env = {k: v for k, v in os.environ.items() if k not in ("FEDGATE_TOKEN", "FEDGATE_ADMIN")}
    if token:
        env["FEDGATE_TOKEN"] = token
    return subprocess.run([PYTHON, "-m", "proxy", *args], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=60)


def test_cli_rules_get_apply_resolve_and_status(start_node, tmp_path):
    node = admin_node(start_node)
    admin = ["--admin", node.admin_url]
    rules_file = tmp_path / "rules.toml"
    rules_file.write_text('[[rules]]\nname = "no-internal"\nmatch = "internal.#"\nkind = "deny"\n')
    result = fedgate("rules", "apply", str(rules_file), *admin)
    assert result.returncode == 0, result.stderr
    assert "rules version 1 applied (1 rules)" in result.stdout

    result = fedgate("rules", "get", *admin, token=READ_TOKEN)
    assert json.loads(result.stdout)["rules"] == [{"name": "no-internal", "match": "internal.#",
                                                   "kind": "deny"}]
    result = fedgate("rules", "resolve", "internal.x", *admin)
    assert result.returncode == 0 and result.stdout.startswith("internal.x: deny (rule no-internal)")

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"rules": [{"name": "b", "match": "x", "kind": "teleport"}]}))
    result = fedgate("rules", "apply", str(bad), *admin)
    assert result.returncode == 1 and "rules[0].kind" in result.stderr
    result = fedgate("rules", "apply", str(rules_file), "--if-version", "0", *admin)
    assert result.returncode == 1 and "412 version_conflict" in result.stderr
    result = fedgate("rules", "apply", str(rules_file), *admin, token=READ_TOKEN)
    assert result.returncode == 1 and "403 forbidden" in result.stderr
    result = fedgate("rules", "get", *admin, token=None)
    assert result.returncode == 1 and "401 unauthorized" in result.stderr

    result = fedgate("status", *admin, token=READ_TOKEN)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"node n1 amqp {node.url} admin {node.admin_url}")
    assert "rules v1" in result.stdout


def test_admin_disabled_listens_nowhere(start_node):
    node = start_node({"admin": {"enabled": False}})
    host, port = node.admin_url.removeprefix("http://").split(":")
    with socket.socket() as sock:
        assert sock.connect_ex((host, int(port))) != 0


def test_bad_persisted_rules_stop_the_node_at_start(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "rules.json").write_text(json.dumps({
        "format": 1, "version": 2, "updated_at": 1.0, "origin": "n9",
        "rules": [{"name": "p", "match": "a.*", "kind": "proxy", "primary": "nowhere"}]}))
    config = tmp_path / "n1.toml"
    config.write_text(f'[node]\nid = "n1"\nlisten = "127.0.0.1:0"\ndata_dir = "{data}"\n'
                      '[admin]\nlisten = "127.0.0.1:0"\n')
    result = fedgate("serve", "--config", str(config))
    assert result.returncode == 2
    assert "rules.json: rules[0].primary" in result.stderr


def test_upstreams_links_and_readiness_follow_a_proxied_primary(start_node, clients):
    primary = start_node({}, name="n2")
    node = admin_node(start_node, peers={"n2": primary.url})
    status, _ = http("POST", node.admin_url + "/api/v1/rules",
                     {"name": "orders", "match": "orders.#", "kind": "proxy", "primary": "n2"})
    assert status == 201
    receiver = clients("rhea", "receive", node.url, address="orders.eu", count=1, timeout_ms=30000)

    def pool(state):
        doc = http("GET", node.admin_url + "/api/v1/upstreams", token=READ_TOKEN)[1]
        return next((u for u in doc["upstreams"] if u["state"] == state), None)

    up = wait_for(lambda: pool("up"), timeout=10, what="the upstream pool to n2 up")
    assert up["name"] == primary.url
    _, links = http("GET", node.admin_url + "/api/v1/links", token=READ_TOKEN)
    (link,) = links["links"]
    assert (link["address"], link["remote_address"]) == ("orders.eu", "orders.eu")
    assert http("GET", node.admin_url + "/readyz", token=None)[0] == 200
    text = http("GET", node.admin_url + "/metrics", token=READ_TOKEN)[1]
    assert metric(text, f'fedgate_upstream_up{{upstream="{primary.url}"}}') == 1

    primary.stop()
    wait_for(lambda: http("GET", node.admin_url + "/readyz", token=None)[0] == 503, timeout=10,
             what="not ready once the primary is gone")
    status, doc = http("GET", node.admin_url + "/readyz", token=None)
    assert doc["error"] == "not_ready" and "upstreams" in doc["detail"]
    (down,) = http("GET", node.admin_url + "/api/v1/upstreams", token=READ_TOKEN)[1]["upstreams"]
    assert down["state"] != "up"
    receiver.kill()
