"""A first run is usable (issue #23): with no [admin] tokens and a loopback admin listener the
node makes an admin token in its data dir (owner-only), uses it, and ``fedgate admin-token``
and the admin commands find it; an admin listener on another address stays closed.
"""

from __future__ import annotations

import asyncio
import os
import stat
import sys

import aiohttp
import pytest
from conftest import ROOT

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
    import json

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
        assert code == 0 and lines[0].split()[:3] == ["NAME", "DEPTH", "UNACKED"]
        assert lines[1].split()[:3] == ["orders", "0", "0"]
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
