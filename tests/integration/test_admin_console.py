"""The web console in a real headless Chromium (Debian's, driven by playwright-core)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from admin_client import ADMIN_TOKEN, admin_node, http, wait_for
from conftest import NODE_JS, ROOT, TESTS, error_of, free_port, require

CHROMIUM = Path("/usr/bin/chromium")
# screenshots kept after the run, for a look at the console (gitignored, see docs/testing.md)
ARTIFACTS = ROOT / "var" / "test-artifacts" / "admin-console"
FILLED, PASSED = 300, 300  # messages left in "orders"; sent through "work" and received
REPLICATED = 3  # messages in the replicated queue "repl.x"


def test_console_adds_a_rule_that_the_api_and_the_node_then_serve(start_node, clients):
    require(NODE_JS is not None, "node (Node.js)")
    require((TESTS / "js" / "node_modules" / "playwright-core").is_dir(),
            "playwright-core (npm ci in tests/js)")
    require(CHROMIUM.exists(), "chromium (.ci/install/chromium.sh)")
    primary = start_node(name="primary")
    # a replicated queue "repl.x": this node its primary, n2 its backup (a static cluster)
    ports = {"n1": free_port(), "n2": free_port()}
    peers = {name: f"amqp://127.0.0.1:{port}" for name, port in ports.items()}
    replicated = {"name": "repl", "match": "repl.*", "kind": "replicated", "nodes": ["n1", "n2"]}
    start_node({"node": {"listen": f"127.0.0.1:{ports['n2']}"}, "peers": {"n1": peers["n1"]},
                "rules": [replicated]}, "n2")
    node = admin_node(start_node, rules=[{"name": "up", "match": "up.*", "kind": "proxy",
                                          "primary": primary.url, "remote": "{1}"}, replicated],
                      node={"listen": f"127.0.0.1:{ports['n1']}"}, peers={"n2": peers["n2"]})
    # load the charts must show: 300 messages wait in "orders"; 300 go through "work"
    (sent,) = clients("proton", "send", node.url, address="orders", count=FILLED).finish()
    assert sent["accepted"] == FILLED
    (sent,) = clients("proton", "send", node.url, address="work", count=PASSED).finish()
    assert sent["accepted"] == PASSED
    received = clients("proton", "receive", node.url, address="work", count=PASSED).finish()
    assert received[-1] == {"done": True, "received": PASSED, "error": None}
    # a client held open through the proxy rule: its connection page and the upstream's
    waiting = clients("rhea", "receive", node.url, address="up.events", count=0, credit=7,
                      timeout_ms=60000, announce=True)
    assert waiting.readline() == {"attached": "up.events"}
    (sent,) = clients("proton", "send", node.url, address="repl.x", count=REPLICATED).finish()
    assert sent["accepted"] == REPLICATED

    def backup_ready():
        queues = http("GET", node.admin_url + "/api/v1/queues")[1]["queues"]
        return any(q["name"] == "repl.x" and q["replication"]["in_sync"] == ["n2"] for q in queues)
    wait_for(backup_ready, timeout=10, what="n2 in sync")

    ARTIFACTS.mkdir(parents=True, exist_ok=True)  # kept after the run (docs/testing.md)
    for old in ARTIFACTS.glob("console*.png"):
        old.unlink()
    screenshot = ARTIFACTS / "console.png"
    run = subprocess.run(
        [NODE_JS, str(TESTS / "js" / "admin_console.js"), "--url", node.admin_url + "/",
         "--token", ADMIN_TOKEN, "--screenshot", str(screenshot), "--chromium", str(CHROMIUM),
         "--rule-name", "ui-deny", "--rule-match", "ui.secret.#", "--edit-match", "ui.hidden.#",
         "--filled-queue", "orders", "--upstream", primary.url, "--replicated-queue", "repl.x"],
        capture_output=True, text=True, timeout=120)
    assert run.stdout.strip(), run.stderr
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["error"] is None and run.returncode == 0, result["error"]

    assert result["rules"] == ["up", "repl", "ui-deny"]
    assert result["added"] == "rule ui-deny added (version 1)"
    assert "rule.primary" in result["invalid_error"]  # the server's validation, shown as is
    # Edit (PUT): saved, and an edit the server refuses shows its message
    assert result["edited"] == "rule ui-deny saved (version 2)" and result["edit_form_hidden"]
    assert result["edit_error"].startswith("not saved: ") and "rule.primary" in result["edit_error"]
    assert sorted(result["queues"]) == ["orders", "repl.x", "work"]

    history = result["history"]  # the charts of the last hour, raw figures read from the page
    assert history["in"]["peak"] > 0 and history["out"]["peak"] > 0  # messages / s
    assert history["in"]["samples"] >= 2
    assert history["bytes"]["last"] > 0  # the 300 wait in "orders"
    assert history["connections"]["samples"] == history["in"]["samples"]
    depths = {line["queue"]: line for line in result["depths"]}
    assert depths["orders"]["peak"] == FILLED and depths["orders"]["last"] == FILLED
    assert f"orders (peak {FILLED})" in result["depths_legend"]
    assert depths.get("work", {"last": 0})["last"] == 0  # drained (a line only if sampled full)
    # the page's figures are the node's: no rate above what /api/v1/history says
    status, doc = http("GET", node.admin_url + "/api/v1/history")
    assert status == 200
    top_in = max(s["messages_in_per_s"] or 0 for s in doc["samples"])
    assert 0 < history["in"]["peak"] <= top_in
    assert doc["samples"][-1]["messages_in"] == FILLED + PASSED + REPLICATED  # totals since the start
    unexpected = [e for e in result["console_errors"] if "422" not in e]
    assert unexpected == [], unexpected

    page = result["connection_page"]  # the rhea receiver's connection
    assert page["hash"].startswith("#connection/") and page["title"].startswith("connection ")
    assert page["fields"]["transport"] == "tcp" and page["fields"]["links"] == "1"
    columns = page["headers"]
    (link,) = [dict(zip(columns, row)) for row in page["rows"]]
    assert link["address"] == "up.events" and link["credit"] == "7" and link["unsettled"] == "0"
    page = result["upstream_page"]  # the pool to the primary
    assert page["title"] == f"upstream {primary.url}" and page["fields"]["primary"] == primary.url
    assert page["fields"]["state"] == "up" and page["fields"]["reconnects"] == "0"
    assert page["fields"]["sessions ended"] == "0"
    members = [dict(zip(page["headers"], row)) for row in page["rows"]]
    # split directions: the receiving member carries the rhea receiver's link, the
    # sending one was never needed (idle, not down)
    assert [(m["role"], m["state"], m["links"]) for m in members] == [("receive", "up", "1"),
                                                                       ("send", "idle", "0")]

    # the replicated queues: this node primary at epoch 1, n2 its ready backup
    (row,) = result["replicated"]
    assert row[:5] == ["repl.x", "primary", "n1", "1", "n2 ready"]
    assert row[5:] == ["1 / 1", "0", "0", "0"]  # in sync, lag (messages, ms), failovers
    page = result["replicated_page"]
    assert page["hash"] == "#replicated/repl.x" and page["title"] == "replicated queue repl.x"
    fields = page["fields"]
    assert (fields["this node"], fields["primary"], fields["epoch"], fields["depth"]) == \
        ("primary", "n1", "1", str(REPLICATED))
    assert fields["replica set"] == "n1, n2" and fields["in sync"] == "n2"
    backups = [dict(zip(page["headers"], r)) for r in page["rows"]]
    assert backups == [{"backup": "n2", "state": "ready", "lag (messages)": "0", "lag (ms)": "0",
                        "catch-up left": "0"}]

    status, doc = http("GET", node.admin_url + "/api/v1/rules/ui-deny")  # as edited
    assert status == 200 and doc["rule"] == {"name": "ui-deny", "match": "ui.hidden.#", "kind": "deny"}
    assert http("GET", node.admin_url + "/api/v1/rules/ui-invalid")[0] == 404
    lines = clients("proton", "receive", node.url, address="ui.hidden.plans", count=1,
                    timeout_ms=10000).finish()
    assert error_of(lines)["condition"] == "amqp:unauthorized-access"

    for name in ("console", "console-charts", "console-connection", "console-upstream",
                 "console-replicated", "console-replicated-queue"):
        png = (ARTIFACTS / f"{name}.png").read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5_000, name
