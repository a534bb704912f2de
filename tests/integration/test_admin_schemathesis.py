"""Property-based run of the OpenAPI document against a live node: no 5xx.

schemathesis generates requests for every operation in /api/v1/openapi.json
(boundary values, random and invalid bodies, headers, stateful sequences) and
checks that none gets a server error. Bounded: a fixed number of examples per
operation, a fixed seed, a per-request timeout.
"""

from __future__ import annotations

import importlib.util
import subprocess

from admin_client import ADMIN_TOKEN, admin_node
from conftest import PYTHON, require


def test_no_server_errors_anywhere_in_the_api(start_node, tmp_path):
    require(importlib.util.find_spec("schemathesis") is not None, "schemathesis (pip, test extras)")
    node = admin_node(start_node, peers={"n2": "amqp://127.0.0.1:5999"})
    command = [
        PYTHON, "-m", "schemathesis.cli", "run", node.admin_url + "/api/v1/openapi.json",
        "--header", f"Authorization: Bearer {ADMIN_TOKEN}",
        "--checks", "not_a_server_error",
        "--max-examples", "10", "--seed", "20251121", "--workers", "2",
        "--request-timeout", "5",
    ]
    result = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=150)
    tail = "\n".join(result.stdout.splitlines()[-40:])
    assert result.returncode == 0, f"schemathesis found problems:\n{tail}\n{result.stderr[-2000:]}"
    assert " passed" in result.stdout and "failed" not in result.stdout.split("SUMMARY")[-1], tail
    log = node.log_path.read_text()
    assert "admin API:" not in log, "a handler raised (answered 500):\n" + log[-3000:]
    assert node.alive()
