"""The console's queue page (#queue/NAME) in a real headless Chromium (Debian's, driven by
playwright-core): the version in the header, the first messages of a queue, move by a
selector, delete refused with the API's reason, purge, resend, delete forced; what the
page says is checked against the queues the messages went to (issue #46)."""

from __future__ import annotations

import json
import subprocess

from admin_client import ADMIN_TOKEN, admin_node
from conftest import NODE_JS, TESTS, require
from proton import Message
from proton.utils import BlockingConnection
from test_admin_console import ARTIFACTS, CHROMIUM

from proxy.config.version import version


def test_the_queue_page_peeks_moves_purges_and_deletes(start_node):
    require(NODE_JS is not None, "node (Node.js)")
    require((TESTS / "js" / "node_modules" / "playwright-core").is_dir(),
            "playwright-core (npm ci in tests/js)")
    require(CHROMIUM.exists(), "chromium (.ci/install/chromium.sh)")
    node = admin_node(start_node)
    conn = BlockingConnection(node.url, timeout=10)
    sender = conn.create_sender("orders")
    for i in range(6):
        sender.send(Message(id=f"o{i}", subject="order", body=f"order {i}",
                            properties={"color": "red" if i % 2 else "blue"}))
    conn.close()

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    run = subprocess.run(
        [NODE_JS, str(TESTS / "js" / "admin_console_queues.js"), "--url", node.admin_url + "/",
         "--token", ADMIN_TOKEN, "--queue", "orders", "--move-to", "orders.red",
         "--selector", "color = 'red'", "--screenshot", str(ARTIFACTS / "console-queue.png"),
         "--chromium", str(CHROMIUM)], capture_output=True, text=True, timeout=120)
    assert run.stdout.strip(), run.stderr
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["error"] is None and run.returncode == 0, result["error"]

    assert result["version"] == f"v{version()}"
    assert (result["hash"], result["title"]) == ("#queue/orders", "queue orders")
    assert (result["fields"]["kind"], result["fields"]["depth"]) == ("local", "6")
    rows = [dict(zip(result["headers"], row)) for row in result["rows"]]
    assert [r["message id"] for r in rows] == [f"o{i}" for i in range(6)]
    assert rows[1]["application properties"] == '{"color":"red"}' and rows[1]["body (start)"] == "order 1"
    assert result["moved"] == "3 of 3 messages moved to orders.red."
    assert [r[0] for r in result["rows_after_move"]] == ["o0", "o2", "o4"]
    assert result["refused"].startswith("refused: queue 'orders' has 0 consumers and 3 messages")
    assert result["purged"] == "3 messages purged"
    assert result["resent"] == "0 of 0 dead-lettered messages resent."
    assert result["deleted"] == "queue orders deleted (0 messages purged, 0 links closed)"
    # the refused delete's 409 is the one error the browser logs
    assert [e for e in result["console_errors"] if "409 (Conflict)" not in e] == []

    conn = BlockingConnection(node.url, timeout=10)
    receiver = conn.create_receiver("orders.red", credit=10)
    got = []
    for _ in range(3):
        got.append(receiver.receive(timeout=5).id)
        receiver.accept()
    conn.close()
    assert got == ["o1", "o3", "o5"]
