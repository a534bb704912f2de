"""A first run is usable (issue #23): with no [admin] tokens and a loopback admin listener the
node makes an admin token in its data dir (owner-only), uses it, and ``fedgate admin-token``
and the admin commands find it; an admin listener on another address stays closed.
"""

from __future__ import annotations

import asyncio
import json
import os
import selectors
import signal
import stat
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest
from admin_client import wait_for
from conftest import ROOT, free_port

from admin_api.app import AdminService
from proxy.config import settings as config_mod
from proxy.node import Node

pytestmark = pytest.mark.timeout(60)


def config(tmp_path, admin_listen: str):
    return config_mod.from_dict({
        "node": {"id": "n1", "listen": "127.0.0.1:0", "data_dir": str(tmp_path / "data")},
        "admin": {"listen": admin_listen},
    })


async def started(cfg):
    node = Node(cfg)
    await node.start()
    service = AdminService(node)
    await service.start()
    return node, service


async def status_of(url: str, token: str | None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as session:
        async with session.get(url + "/api/v1/node", headers=headers) as response:
            return response.status


async def fedgate(*args: str) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items() if k != "FEDGATE_TOKEN"}
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "proxy", *args, cwd=ROOT, env=env,
                                                stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    out, _ = await asyncio.wait_for(proc.communicate(), 30)
    return proc.returncode, out.decode()


@pytest.mark.asyncio
async def test_a_loopback_admin_api_without_tokens_makes_one_and_uses_it(tmp_path):
    node, service = await started(config(tmp_path, "127.0.0.1:0"))
    token_file = tmp_path / "data" / "admin-token"
    try:
        token = token_file.read_text().strip()
        assert len(token) >= 40
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600  # owner-only
        assert await status_of(service.url, token) == 200
        assert await status_of(service.url, None) == 401
        code, out = await fedgate("admin-token", "--data-dir", str(tmp_path / "data"))
        assert code == 0 and out.strip() == token
        code, out = await fedgate("status", "--admin", service.url, "--data-dir", str(tmp_path / "data"))
        assert code == 0 and "n1" in out  # found the token without $FEDGATE_TOKEN
    finally:
        await service.stop()
        await node.stop()
    node, service = await started(config(tmp_path, "127.0.0.1:0"))  # a restart keeps it
    try:
        assert token_file.read_text().strip() == token
        assert await status_of(service.url, token) == 200
    finally:
        await service.stop()
        await node.stop()


@pytest.mark.asyncio
async def test_an_admin_api_on_other_addresses_needs_a_configured_token(tmp_path):
    node, service = await started(config(tmp_path, "0.0.0.0:0"))
    try:
        assert not (tmp_path / "data" / "admin-token").exists()
        url = "http://127.0.0.1:" + service.url.rsplit(":", 1)[1]
        assert await status_of(url, None) == 401
    finally:
        await service.stop()
        await node.stop()


@pytest.mark.asyncio
async def test_fedgate_queues_connections_and_rules_print_tables(tmp_path):
    """``fedgate queues | connections | rules`` as rabbitmqctl and qdstat users expect (--json too)."""
    cfg = config_mod.from_dict({
        "node": {"id": "n1", "listen": "127.0.0.1:0", "data_dir": str(tmp_path / "data")},
        "admin": {"listen": "127.0.0.1:0"},
        "queue": [{"name": "orders", "max_depth": 10}],
        "rules": [{"name": "no-internal", "match": "internal.#", "kind": "deny"}],
    })
    node, service = await started(cfg)
    where = ["--admin", service.url, "--data-dir", str(tmp_path / "data")]
    try:
        code, out = await fedgate("queues", *where)
        lines = out.splitlines()
        assert code == 0 and lines[0].split()[:4] == ["NAME", "DEPTH", "SCHEDULED", "UNACKED"]
        assert lines[1].split()[:4] == ["orders", "0", "0", "0"]
        code, out = await fedgate("queues", "--json", *where)
        assert code == 0 and [q["name"] for q in json.loads(out)["queues"]] == ["orders"]
        code, out = await fedgate("connections", *where)
        assert code == 0 and out.splitlines()[0].split()[:3] == ["ID", "PEER", "USER"]
        code, out = await fedgate("rules", *where)
        assert code == 0 and out.splitlines()[0].startswith("rules version 0")
        assert out.splitlines()[2].split()[:3] == ["no-internal", "internal.#", "deny"]
    finally:
        await service.stop()
        await node.stop()


def run_fedgate(*args: str, cwd=ROOT, env: dict | None = None) -> subprocess.CompletedProcess:
    """The ``fedgate`` command as a user types it, without ``$FEDGATE_TOKEN``."""
    base = {k: v for k, v in os.environ.items() if k not in ("FEDGATE_TOKEN", "FEDGATE_ADMIN")}
    return subprocess.run([*FEDGATE, *args], cwd=cwd, env={**base, **(env or {})},
                          capture_output=True, text=True, timeout=30)


# the console script pip installed next to this Python, as `make run` starts it
FEDGATE = ([str(Path(sys.executable).parent / "fedgate")]
           if (Path(sys.executable).parent / "fedgate").is_file() else [sys.executable, "-m", "proxy"])


def test_make_run_then_fedgate_admin_token_and_status_with_no_flags(tmp_path):
    """`make run` in one terminal (deploy/examples/standalone.toml, from the checkout), then
    `fedgate admin-token` and `fedgate status` with no flags in another: the token the node
    made is the one printed, and status gets in. Only the ports differ (free ones here)."""
    text = (ROOT / "deploy" / "examples" / "standalone.toml").read_text()
    amqp_port, admin_port = free_port(), free_port()
    for default, port in (("127.0.0.1:5672", amqp_port), ("127.0.0.1:8080", admin_port)):
        assert text.count(f'listen = "{default}"') == 1
        text = text.replace(f'listen = "{default}"', f'listen = "127.0.0.1:{port}"')
    config = tmp_path / "standalone.toml"
    config.write_text(text)
    checkout = tmp_path / "checkout"  # the node's and the commands' working directory
    checkout.mkdir()
    log_path = tmp_path / "node.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([*FEDGATE, "serve", "--config", str(config)], cwd=checkout,
                                stdout=subprocess.PIPE, stderr=log)
    try:
        selector = selectors.DefaultSelector()
        selector.register(proc.stdout, selectors.EVENT_READ)
        line = proc.stdout.readline().decode() if selector.select(20) else ""
        assert line.strip() == f"fedgate node n1 listening on amqp://127.0.0.1:{amqp_port}", \
            log_path.read_text()
        admin = f"http://127.0.0.1:{admin_port}"
        console = [x.split(": ", 1)[1] for x in log_path.read_text().splitlines()
                   if "admin console:" in x]
        shown = (f"admin console: {admin}/ -- log in with the token in var/fedgate/admin-token "
                 "(`fedgate admin-token` prints it)")
        assert console == [shown]
        # what README.md shows after `make run` is what the node logs
        assert shown.replace(str(admin_port), "8080") in (ROOT / "README.md").read_text()
        token_file = checkout / "var" / "fedgate" / "admin-token"
        token = token_file.read_text().strip()
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600

        # the other terminal: same directory, no flags (FEDGATE_ADMIN only moves the port)
        env = {"FEDGATE_ADMIN": admin}
        shown_token = run_fedgate("admin-token", cwd=checkout, env=env)
        assert shown_token.returncode == 0 and shown_token.stdout.strip() == token
        assert shown_token.stderr == ""  # found, not made now
        status = run_fedgate("status", cwd=checkout, env=env)
        assert status.returncode == 0, status.stderr
        assert status.stdout.startswith(f"node n1 amqp amqp://127.0.0.1:{amqp_port} admin {admin} ")

        # from somewhere else the token is not found: 401, and what to do about it
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        status = run_fedgate("status", cwd=elsewhere, env=env)
        assert status.returncode == 1 and "401" in status.stderr
        assert f"no admin token: $FEDGATE_TOKEN is not set and there is none in " \
               f"{elsewhere / 'var' / 'fedgate' / 'admin-token'}" in status.stderr
        assert run_fedgate("status", "--config", str(config), "--data-dir",
                           str(checkout / "var" / "fedgate"), cwd=elsewhere, env=env).returncode == 0
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        proc.stdout.close()
    assert proc.returncode == 0, log_path.read_text()[-2000:]


def test_fedgate_status_connections_and_rules_as_json_and_a_live_connection(start_node, clients,
                                                                             tmp_path):
    """``--json`` of status, connections and rules, and the connections table's row for a
    client that holds a receiver open."""
    node = start_node({"rules": [{"name": "no-internal", "match": "internal.#", "kind": "deny"}]})
    where = ["--admin", node.admin_url, "--data-dir", str(tmp_path / "data-n1")]

    def json_of(*command: str):
        done = run_fedgate(*command, "--json", *where)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    assert json_of("connections") == {"count": 0, "connections": []}
    receiver = clients("proton", "receive", node.url, address="orders", count=1, hold=True,
                       timeout_ms=60000)
    # the connection is listed once it is open; its receiver attaches just after
    (conn,) = wait_for(lambda: [c for c in json_of("connections")["connections"] if c["links"]], 20,
                       "the receiver's connection with its link")
    assert conn["links"] == 1 and conn["transport"] == "tcp" and conn["amqp_open"]
    assert conn["peer"].startswith("127.0.0.1:")

    table = run_fedgate("connections", *where)
    assert table.returncode == 0, table.stderr
    heading, row = table.stdout.splitlines()
    assert heading.split() == ["ID", "PEER", "USER", "MECHANISM", "LINKS", "SENT", "RECEIVED",
                               "STALLED_S"]
    assert row.split() == [str(conn["id"]), conn["peer"], conn["user"] or "-",
                           conn["mechanism"] or "-", "1", "0", "0", "0.0"]

    status = json_of("status")
    assert status["node"]["id"] == "n1" and status["node"]["url"] == node.url
    assert status["node"]["counters"]["connections"] == 1
    assert status["node"]["counters"]["links"] == 1
    assert [(n["id"], n["self"], n["reachable"]) for n in status["cluster"]["nodes"]] == \
        [("n1", True, True)]
    assert status["cluster"]["divergent"] == []

    rules = json_of("rules")
    assert rules["version"] == 0 and rules["source"] == "config"
    assert rules["rules"] == [{"name": "no-internal", "match": "internal.#", "kind": "deny"}]
    receiver.kill()
    wait_for(lambda: json_of("connections")["count"] == 0, 20, "the receiver's connection closed")
