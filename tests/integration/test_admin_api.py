"""Admin API in-process: a real Node in the test's event loop, aiohttp's test client.

Covers auth, the rules endpoints (validation, If-Match, persistence), resolve,
inspection views, metrics format, errors as JSON, config checks, and the
OpenAPI document being in step with the routes.
"""

from __future__ import annotations

import hashlib
import json
import logging

import pytest
import pytest_asyncio

from admin_api import openapi
from admin_api.app import ROUTES, build_app
from proxy.config import settings as config_mod
from proxy.config.errors import ConfigError
from proxy.metrics import Histogram
from proxy.node import Node

ADMIN = "admin-token-0123456789abcdef"
READ = "read-token-0123456789abcdef"
ADMIN_H = {"Authorization": f"Bearer {ADMIN}"}
READ_H = {"Authorization": f"Bearer {READ}"}


def make_config(tmp_path, **extra):
    raw = {
        "node": {"id": "n1", "listen": "127.0.0.1:0", "data_dir": str(tmp_path / "data")},
        "peers": {"n2": "amqp://127.0.0.1:5999"},
        "admin": {"listen": "127.0.0.1:0", "tokens": [
            {"token": ADMIN, "role": "admin"},
            {"token_sha256": hashlib.sha256(READ.encode()).hexdigest(), "role": "read"},
        ]},
        "queue": [{"name": "orders", "max_depth": 10}],
    }
    raw.update(extra)
    return config_mod.from_dict(raw)


@pytest_asyncio.fixture
async def api(tmp_path, aiohttp_client):
    node = Node(make_config(tmp_path))
    await node.start()
    client = await aiohttp_client(build_app(node))
    client.node = node
    yield client
    await node.stop()


async def body(response):
    return json.loads(await response.read())


@pytest.mark.asyncio
async def test_responses_do_not_give_the_server_software_version(api):
    """Issue #21: the ``Server`` header named aiohttp's and Python's versions."""
    for path in ("/healthz", "/api/v1/rules", "/no-such-page"):
        response = await api.get(path)
        assert response.headers["Server"] == "fedgate", path


@pytest.mark.asyncio
async def test_a_malformed_request_gets_400_and_one_log_line_without_a_traceback(api, caplog):
    """Issue #21: a 100 KB URL was logged as an error with a traceback."""
    import asyncio

    reader, writer = await asyncio.open_connection(api.server.host, api.server.port)
    writer.write(b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert head.startswith(b"HTTP/1.0 400")
    # aiohttp answers it itself, past the application's hooks: no versions there either
    headers = dict(line.split(": ", 1) for line in head.decode("latin-1").split("\r\n")[1:] if line)
    assert headers.get("Server") == "fedgate", headers
    writer.close()  # aiohttp logs before it answers: the record is there already
    records = [r for r in caplog.records if r.name == "aiohttp.server"]
    assert records and all(r.exc_info is None and r.levelno < logging.ERROR for r in records)
    assert "bad request refused" in records[0].getMessage()


# -- auth ----------------------------------------------------------------------------
@pytest.mark.asyncio
async def test_health_needs_no_token_everything_else_does(api):
    assert (await api.get("/healthz")).status == 200
    assert (await body(await api.get("/readyz"))) == {"status": "ready"}
    for path in ("/metrics", "/api/v1/rules", "/api/v1/node", "/api/v1/openapi.json"):
        response = await api.get(path)
        assert response.status == 401, path
        assert response.headers["WWW-Authenticate"].startswith("Bearer")
        assert (await body(response))["error"] == "unauthorized"
    response = await api.get("/api/v1/rules", headers={"Authorization": "Bearer wrong-token-xxxxxxxx"})
    assert response.status == 401 and (await body(response))["detail"] == "unknown token"


@pytest.mark.asyncio
async def test_read_token_reads_but_may_not_write(api):
    assert (await api.get("/api/v1/rules", headers=READ_H)).status == 200  # by its sha256
    response = await api.put("/api/v1/rules", json=[], headers=READ_H)
    assert response.status == 403 and (await body(response))["error"] == "forbidden"
    response = await api.delete("/api/v1/connections/1", headers=READ_H)
    assert response.status == 403
    assert (await api.put("/api/v1/rules", json=[], headers=ADMIN_H)).status == 200


# -- rules -----------------------------------------------------------------------------
DENY = {"name": "no-internal", "match": "internal.#", "kind": "deny"}
PROXY = {"name": "to-n2", "match": "remote.*", "kind": "proxy", "primary": "n2", "on_change": "redirect"}


@pytest.mark.asyncio
async def test_rules_replace_with_etag_and_if_match(api):
    first = await api.get("/api/v1/rules", headers=READ_H)
    doc = await body(first)
    assert (doc["version"], doc["source"], doc["rules"]) == (0, "config", [])
    etag = first.headers["ETag"]

    changed = await api.put("/api/v1/rules", json={"rules": [DENY, PROXY]},
                            headers={**ADMIN_H, "If-Match": etag})
    assert changed.status == 200
    doc = await body(changed)
    assert doc["version"] == 1 and [r["name"] for r in doc["rules"]] == ["no-internal", "to-n2"]
    assert changed.headers["ETag"] != etag

    stale = await api.put("/api/v1/rules", json=[], headers={**ADMIN_H, "If-Match": etag})
    assert stale.status == 412
    error = await body(stale)
    assert error["error"] == "version_conflict" and error["field"] == "If-Match"
    assert (await body(await api.get("/api/v1/rules", headers=READ_H)))["version"] == 1

    bare = await api.put("/api/v1/rules", json=[DENY], headers={**ADMIN_H, "If-Match": "1"})
    assert bare.status == 200 and (await body(bare))["version"] == 2
    assert api.node.routing.resolve("internal.x").kind == "deny"


@pytest.mark.asyncio
async def test_invalid_changes_leave_the_rules_intact(api):
    await api.put("/api/v1/rules", json=[DENY], headers=ADMIN_H)
    before = await body(await api.get("/api/v1/rules", headers=READ_H))

    response = await api.put("/api/v1/rules", data=b"{not json", headers=ADMIN_H)
    assert response.status == 400 and (await body(response))["error"] == "invalid_json"
    response = await api.put("/api/v1/rules", data=b"", headers=ADMIN_H)
    assert response.status == 400
    response = await api.put("/api/v1/rules", json={"rulez": []}, headers=ADMIN_H)
    assert response.status == 400 and (await body(response))["field"] == "rulez"
    response = await api.put("/api/v1/rules", json="rules", headers=ADMIN_H)
    assert response.status == 400 and (await body(response))["field"] == "rules"

    bad = [DENY, {"name": "x", "match": "a.b", "kind": "proxy", "primary": "nowhere"},
           {"name": "y", "match": "internal.z", "kind": "local"}]
    response = await api.put("/api/v1/rules", json=bad, headers=ADMIN_H)
    assert response.status == 422
    error = await body(response)
    assert error["error"] == "invalid_rules" and error["field"] == "rules[1].primary"
    assert {p["field"] for p in error["problems"]} == {"rules[1].primary", "rules[2].match"}

    after = await body(await api.get("/api/v1/rules", headers=READ_H))
    assert after == before
    assert api.node.routing.resolve("a.b").kind == "local"
    assert json.loads(api.node.rules_store.path.read_text())["version"] == before["version"]


@pytest.mark.asyncio
async def test_single_rule_endpoints(api):
    response = await api.post("/api/v1/rules", json=DENY, headers=ADMIN_H)
    assert response.status == 201 and response.headers["Location"] == "/api/v1/rules/no-internal"
    response = await api.post("/api/v1/rules?position=0", json=PROXY, headers=ADMIN_H)
    assert (await body(response))["position"] == 0
    doc = await body(await api.get("/api/v1/rules", headers=READ_H))
    assert [r["name"] for r in doc["rules"]] == ["to-n2", "no-internal"] and doc["version"] == 2

    response = await api.post("/api/v1/rules", json=DENY, headers=ADMIN_H)
    assert response.status == 409 and (await body(response))["field"] == "rule.name"
    response = await api.post("/api/v1/rules", json={"name": "z", "match": "q", "kind": "teleport"},
                              headers=ADMIN_H)
    assert response.status == 422 and (await body(response))["field"] == "rule.kind"
    response = await api.post("/api/v1/rules?position=9", json={"name": "z", "match": "q", "kind": "local"},
                              headers=ADMIN_H)
    assert response.status == 400 and (await body(response))["field"] == "position"
    response = await api.post("/api/v1/rules?position=x", json={}, headers=ADMIN_H)
    assert response.status == 400 and (await body(response))["field"] == "position"

    got = await body(await api.get("/api/v1/rules/to-n2", headers=READ_H))
    assert got["rule"] == PROXY and got["position"] == 0
    changed = {**PROXY, "match": "remote.#"}
    response = await api.put("/api/v1/rules/to-n2", json=changed, headers=ADMIN_H)
    assert response.status == 200 and (await body(response))["rule"]["match"] == "remote.#"
    response = await api.put("/api/v1/rules/to-n2", json={**PROXY, "name": "other"}, headers=ADMIN_H)
    assert response.status == 400 and (await body(response))["field"] == "rule.name"
    response = await api.put("/api/v1/rules/new-one", json={"match": "n.*", "kind": "local"},
                             headers=ADMIN_H)
    assert response.status == 201 and (await body(response))["position"] == 2

    assert (await api.delete("/api/v1/rules/to-n2", headers=ADMIN_H)).status == 200
    response = await api.get("/api/v1/rules/to-n2", headers=READ_H)
    assert response.status == 404 and (await body(response))["error"] == "rule_not_found"
    assert (await api.delete("/api/v1/rules/to-n2", headers=ADMIN_H)).status == 404
    doc = await body(await api.get("/api/v1/rules", headers=READ_H))
    assert [r["name"] for r in doc["rules"]] == ["no-internal", "new-one"]


@pytest.mark.asyncio
async def test_resolve_names_rule_decision_and_reason(api):
    await api.put("/api/v1/rules", json=[DENY, PROXY], headers=ADMIN_H)
    deny = await body(await api.get("/api/v1/resolve", params={"address": "internal.secrets"},
                                    headers=READ_H))
    assert deny["decision"] == "deny" and deny["rule"]["name"] == "no-internal"
    assert "no-internal" in deny["reason"]
    proxied = await body(await api.get("/api/v1/resolve", params={"address": "remote.q"}, headers=READ_H))
    assert (proxied["decision"], proxied["primary_url"]) == ("proxy", "amqp://127.0.0.1:5999")
    local = await body(await api.get("/api/v1/resolve", params={"address": "orders"}, headers=READ_H))
    assert (local["decision"], local["rule"]) == ("local", None)
    response = await api.get("/api/v1/resolve", headers=READ_H)
    assert response.status == 400 and (await body(response))["field"] == "address"


@pytest.mark.asyncio
async def test_changes_persist_and_win_over_the_config_at_start(api, tmp_path):
    await api.put("/api/v1/rules", json=[DENY], headers=ADMIN_H)
    stored = json.loads((tmp_path / "data" / "rules.json").read_text())
    assert (stored["version"], stored["origin"], stored["rules"]) == (1, "n1", [DENY])
    assert not list((tmp_path / "data").glob(".rules.*"))  # no temp file left behind

    config = make_config(tmp_path, rules=[{"name": "from-config", "match": "cfg", "kind": "deny"}])
    restarted = Node(config)
    assert restarted.rules_store.current.version == 1
    assert [r.name for r in restarted.routing.current.rules] == ["no-internal"]
    assert restarted.routing.resolve("cfg").kind == "local"


@pytest.mark.asyncio
async def test_bad_persisted_rules_fail_the_start_naming_the_key(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    path = data / "rules.json"
    path.write_text('{"format": 1, "version": 3, "updated_at": 1.0, "origin": "n1", '
                    '"rules": [{"name": "a", "match": "x", "kind": "teleport"}]}')
    with pytest.raises(ConfigError) as info:
        Node(make_config(tmp_path))
    assert info.value.key == f"{path}: rules[0].kind"
    path.write_text('{"format": 1, "version": "three", "updated_at": 1.0, "origin": "n1", "rules": []}')
    with pytest.raises(ConfigError) as info:
        Node(make_config(tmp_path))
    assert info.value.key == f"{path}: version"
    path.write_text("{oops")
    with pytest.raises(ConfigError, match="not valid JSON"):
        Node(make_config(tmp_path))


# -- inspection, metrics -------------------------------------------------------------------
@pytest.mark.asyncio
async def test_inspection_views(api):
    node = await body(await api.get("/api/v1/node", headers=READ_H))
    assert node["id"] == "n1" and node["url"] == api.node.url
    assert node["counters"]["queues"] == 1 and node["rules_version"] == 0
    queues = await body(await api.get("/api/v1/queues", headers=READ_H))
    assert queues["count"] == 1
    (orders,) = queues["queues"]
    assert (orders["name"], orders["depth"], orders["max_depth"]) == ("orders", 0, 10)
    for path, key in (("connections", "connections"), ("links", "links"),
                      ("fragments", "fragments"), ("upstreams", "upstreams")):
        doc = await body(await api.get(f"/api/v1/{path}", headers=READ_H))
        assert doc[key] == [] and doc["count"] == 0, path
    response = await api.delete("/api/v1/connections/77", headers=ADMIN_H)
    assert response.status == 404 and (await body(response))["field"] == "id"
    response = await api.delete("/api/v1/connections/abc", headers=ADMIN_H)
    assert response.status == 400


@pytest.mark.asyncio
async def test_fragments_and_upstreams_come_from_the_node(api):
    # the shape of fragments.group.FragmentGroup.describe
    api.node.describe_fragments = lambda: [{"address": "work", "local": "n1", "depth": 5, "stolen_in": 2}]
    api.node.describe_upstreams = lambda: [
        {"name": "n2", "url": "amqp://x:1", "state": "up", "reconnects": 3},
        {"primary": "amqp://b:5672", "pool_size": 2, "connected": False,
         "members": [{"state": "backoff", "reconnects": 2}, {"state": "down", "reconnects": 1}]},
    ]
    fragments = await body(await api.get("/api/v1/fragments", headers=READ_H))
    assert (fragments["depth"], fragments["steals"]) == (5, 2)
    upstreams = await body(await api.get("/api/v1/upstreams", headers=READ_H))
    assert (upstreams["count"], upstreams["up"], upstreams["reconnects"]) == (2, 1, 6)
    pool = upstreams["upstreams"][1]
    assert (pool["name"], pool["state"], pool["pool_size"]) == ("amqp://b:5672", "backoff", 2)
    text = await (await api.get("/metrics", headers=READ_H)).text()
    assert "fedgate_steals_total 2" in text
    assert 'fedgate_fragment_depth{queue="work",fragment="n1"} 5' in text
    assert 'fedgate_upstream_up{upstream="n2"} 1' in text
    assert 'fedgate_upstream_up{upstream="amqp://b:5672"} 0' in text
    assert 'fedgate_upstream_reconnects_total{upstream="n2"} 3' in text
    api.node.upstreams_ready = lambda: False
    response = await api.get("/readyz")
    assert response.status == 503 and "upstreams" in (await body(response))["detail"]


def parse_exposition(text: str) -> dict[str, float]:
    """Prometheus text format -> {'name{labels}': value}; checks every line's shape."""
    samples = {}
    for line in text.splitlines():
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            continue
        name, _, value = line.rpartition(" ")
        assert name and name.startswith("fedgate_"), line
        samples[name] = float(value)
    return samples


@pytest.mark.asyncio
async def test_metrics_in_prometheus_text_format(api):
    response = await api.get("/metrics", headers=READ_H)
    assert response.status == 200
    assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    samples = parse_exposition(await response.text())
    assert samples["fedgate_connections"] == 0
    assert samples['fedgate_queue_depth{queue="orders"}'] == 0
    assert samples['fedgate_messages_in_total{kind="local"}'] == 0
    assert samples["fedgate_steals_total"] == 0
    assert samples['fedgate_delivery_latency_seconds_bucket{le="+Inf"}'] == 0
    assert "fedgate_delivery_latency_seconds_count" in samples


def test_latency_histogram_buckets_are_cumulative():
    histogram = Histogram((0.001, 0.01, 0.1))
    for value in (0.0005, 0.001, 0.005, 0.05, 5.0):
        histogram.observe(value)
    snap = histogram.snapshot()
    assert snap.cumulative == (2, 3, 4) and snap.count == 5
    assert snap.total == pytest.approx(5.0565)


# -- errors, OpenAPI, config -----------------------------------------------------------------
@pytest.mark.asyncio
async def test_unknown_paths_and_methods_answer_json(api):
    response = await api.get("/api/v1/nothing", headers=READ_H)
    assert response.status == 404 and (await body(response))["error"] == "not_found"
    response = await api.patch("/api/v1/rules", headers=ADMIN_H)
    assert response.status == 405 and (await body(response))["error"] == "method_not_allowed"
    response = await api.get("/ui/rules.json")
    assert response.status == 404 and (await body(response))["field"] == "file"
    assert (await api.get("/ui/app.js")).status == 200


@pytest.mark.asyncio
async def test_openapi_describes_every_route_and_nothing_else(api):
    document = await body(await api.get("/api/v1/openapi.json", headers=READ_H))
    assert document["openapi"].startswith("3.1")
    in_spec = openapi.operations(document)
    in_app = set()
    for route in api.app.router.routes():
        if route.method == "HEAD":  # added by aiohttp for every GET
            continue
        in_app.add((route.method, route.resource.canonical))
    assert in_app == in_spec
    assert in_app == {(method, path) for method, path, _, _ in ROUTES}
    for (method, path) in in_spec:
        operation = document["paths"][path][method.lower()]
        assert operation["summary"] and operation["responses"], (method, path)


@pytest.mark.parametrize("admin, key", [
    ({"tokens": [{"token": "short", "role": "admin"}]}, "admin.tokens[0].token"),
    ({"tokens": [{"token": "x" * 20, "role": "root"}]}, "admin.tokens[0].role"),
    ({"tokens": [{"token_sha256": "abc", "role": "read"}]}, "admin.tokens[0].token_sha256"),
    ({"tokens": [{"token": "x" * 20, "token_sha256": "0" * 64, "role": "read"}]}, "admin.tokens[0]"),
    ({"tokens": [{"token": "x" * 20, "role": "read", "who": "me"}]}, "admin.tokens[0].who"),
    ({"cluster": {"n2": "amqp://h:1"}, "cluster_token": "x" * 20}, "admin.cluster.n2"),
    ({"cluster": {"n2": "http://h:99999"}, "cluster_token": "x" * 20}, "admin.cluster.n2"),
    ({"cluster": {"n2": "http://h:8081"}}, "admin.cluster_token"),
    ({"cluster": "n2"}, "admin.cluster"),
    ({"enabled": "no"}, "admin.enabled"),
])
def test_admin_config_errors_name_the_key(admin, key):
    with pytest.raises(ConfigError) as info:
        config_mod.from_dict({"admin": admin})
    assert info.value.key == key


def test_cluster_token_defaults_to_an_admin_token():
    config = config_mod.from_dict({"admin": {
        "tokens": [{"token": READ, "role": "read"}, {"token": ADMIN, "role": "admin"}],
        "cluster": {"n2": "http://127.0.0.1:8081"}}})
    assert config.admin.node_token() == ADMIN


# -- history (issue #23) ------------------------------------------------------------
@pytest.mark.asyncio
async def test_history_keeps_the_last_hour_of_rates_depths_and_connections(api):
    from admin_api.history import HISTORY
    from proxy.queues.local import StoredMessage

    history = api.app[HISTORY]
    history.samples.clear()
    node = api.node
    history.sample(now=1000.0)
    orders = node.queues.get("orders")
    for i in range(10):
        node.broker.enqueue(orders, StoredMessage(b"x" * 100))
    history.sample(now=1005.0)
    body_ = await body(await api.get("/api/v1/history", headers=READ_H))
    assert body_["interval_s"] == 5.0 and body_["count"] == 2
    first, last = body_["samples"]
    assert first["messages_in_per_s"] is None
    assert last["messages_in_per_s"] == 2.0  # 10 messages in 5 s
    assert last["depths"]["orders"] == 10 and last["queued_bytes"] >= 1000
    assert last["connections"] == 0
    for i in range(history.samples.maxlen + 50):  # an hour at most: bounded
        history.sample(now=2000.0 + 5 * i)
    assert len(history.samples) == history.samples.maxlen == 720
