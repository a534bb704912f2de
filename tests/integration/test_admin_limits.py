"""The admin listener bounds its clients (issue #21): slow heads and bodies are timed out, bodies
are capped at 1 MiB, and a large rule set is validated without stopping the event loop the node's
AMQP clients share.

The node runs in the test's event loop with ``AdminService`` (the real listener,
on a free port); the slow clients are raw sockets.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
import pytest_asyncio

from admin_api.app import MAX_BODY, AdminService
from proxy.node import Node
from test_admin_api import ADMIN_H, make_config

pytestmark = pytest.mark.timeout(60)


@pytest_asyncio.fixture
async def admin(tmp_path):
    node = Node(make_config(tmp_path, admin={
        "listen": "127.0.0.1:0", "header_timeout": 0.5, "body_timeout": 0.5,
        "tokens": [{"token": ADMIN_H["Authorization"].split()[1], "role": "admin"}]}))
    await node.start()
    service = AdminService(node)
    await service.start()
    yield service
    await service.stop()
    await node.stop()


async def connect(service):
    host, port = service.url.removeprefix("http://").rsplit(":", 1)
    return await asyncio.open_connection(host, int(port))


@pytest.mark.asyncio
async def test_a_request_head_sent_slowly_is_closed(admin):
    reader, writer = await connect(admin)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # never finished
    await writer.drain()
    assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the node, no answer
    writer.close()


@pytest.mark.asyncio
async def test_an_idle_keep_alive_connection_is_closed(admin):
    reader, writer = await connect(admin)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert head.startswith(b"HTTP/1.1 200")
    await asyncio.wait_for(reader.read(), 5)  # the body, then the node closes the idle connection
    assert reader.at_eof()
    writer.close()


@pytest.mark.asyncio
async def test_a_body_that_does_not_arrive_gets_408(admin):
    reader, writer = await connect(admin)
    writer.write(b"PUT /api/v1/rules HTTP/1.1\r\nHost: x\r\nAuthorization: " +
                 ADMIN_H["Authorization"].encode() +
                 b"\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n[{\"na")
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 5)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:80]
    assert b"body_timeout" in answer
    writer.close()


@pytest.mark.asyncio
async def test_a_body_over_1_mib_gets_413_with_a_reason_and_the_node_goes_on(admin):
    rule = b'{"name": "r", "match": "a.#", "kind": "deny", "description": "%s"},'
    body = b"[" + rule % (b"x" * MAX_BODY) + b"]"  # valid JSON, only too large
    async with aiohttp.ClientSession() as session:
        async with session.put(admin.url + "/api/v1/rules", data=body, headers={
                **ADMIN_H, "Content-Type": "application/json"}) as response:
            assert response.status == 413
            answer = await response.json()
        assert answer["error"] == "payload_too_large"
        assert str(MAX_BODY) in answer["detail"], answer  # says what the limit is
        async with session.get(admin.url + "/api/v1/rules", headers=ADMIN_H) as response:
            assert response.status == 200  # still serving, the rules untouched
            assert (await response.json())["rules"] == []
        async with session.put(admin.url + "/api/v1/rules", headers=ADMIN_H, json=[
                {"name": "small", "match": "a.#", "kind": "deny"}]) as response:
            assert response.status == 200  # a body under the limit is taken
    assert MAX_BODY == 1024 * 1024


@pytest.mark.asyncio
async def test_a_large_rule_set_does_not_stop_the_event_loop(admin):
    """16,000 rules took 2.3 s of validation on the event loop (every AMQP client waited)."""
    rules = [{"name": f"r{i}", "match": f"area{i}.#", "kind": "deny"} for i in range(16_000)]
    lags = []

    async def ticker():
        while True:
            started = time.perf_counter()
            await asyncio.sleep(0.01)
            lags.append(time.perf_counter() - started - 0.01)

    ticking = asyncio.create_task(ticker())
    try:
        async with aiohttp.ClientSession() as session:
            async with session.put(admin.url + "/api/v1/rules", json=rules, headers=ADMIN_H) as response:
                assert response.status == 200
                assert len((await response.json())["rules"]) == 16_000
    finally:
        ticking.cancel()
    assert max(lags) < 1.0  # 2.0 s with the validation on the loop; about 0.08 s in a thread
