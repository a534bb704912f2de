"""Ownership with fencing on a real etcd, with a real partition (issue #34): two coordinators
(``EtcdCoordinator`` on aetcd, as a node builds them) in this process, A reaching etcd through
Toxiproxy, B directly. A claims a resource; A is cut off; A must stop acting before etcd
expires its lease (B sees the owner gone only then), B claims at a higher epoch; A heals,
registers again and finds B the owner. lease_ttl 3 s; every wait bounded.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from etcd_servers import cluster_name, etcd_url  # noqa: F401 (fixtures)
from toxi import toxi, toxiproxy_server  # noqa: F401 (fixtures)

from proxy.cluster.etcd import EtcdCoordinator
from proxy.cluster.etcd_store import AetcdStore


def coordinator(node_id: str, endpoint: str, name: str) -> EtcdCoordinator:
    store = AetcdStore([endpoint], request_timeout=1.0)
    return EtcdCoordinator(name=name, node_id=node_id, amqp=f"amqp://{node_id}:5672", admin=None,
                           workers=1, version="test", store=store, endpoints=[endpoint],
                           lease_ttl=3)


async def until(predicate, timeout: float) -> float:
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"not within {timeout}s")
        await asyncio.sleep(0.01)
    return time.monotonic()


@pytest.mark.asyncio
async def test_a_partitioned_owner_stops_acting_before_another_can_claim(etcd_url, cluster_name, toxi):
    proxy = toxi.proxy("etcd-claims", int(etcd_url.rsplit(":", 1)[1]))
    a = coordinator("a", f"http://127.0.0.1:{proxy.port}", cluster_name)
    b = coordinator("b", etcd_url, cluster_name)
    fenced_at: list[float] = []
    a.on_fenced(lambda fenced: fenced and fenced_at.append(time.monotonic()))
    owners: list[tuple[float, object]] = []
    b.on_owner("queue/", lambda resource, claim: owners.append((time.monotonic(), claim)))
    await a.start()
    await b.start()
    try:
        mine = await a.claim("queue/orders")
        assert mine.owner == "a" and mine.epoch >= 1
        assert await b.claim("queue/orders") is None  # a live owner holds it
        await until(lambda: b.current_owner("queue/orders") == mine, 2.0)

        proxy.proxy.disable()  # a is cut off from etcd
        cut = time.monotonic()
        gone = await until(lambda: b.current_owner("queue/orders") is None, 3 + 1.5)
        assert fenced_at and fenced_at[0] < gone  # a stopped acting before etcd let go
        assert fenced_at[0] - cut <= 3.0 and not a.acting()
        taken = await b.claim("queue/orders")
        assert taken.owner == "b" and taken.epoch == mine.epoch + 1

        proxy.proxy.enable()
        await until(lambda: a.acting() and a.keeper.registrations == 2, 10.0)
        await until(lambda: a.current_owner("queue/orders") == taken, 2.0)
        assert await a.claim("queue/orders") is None
        await b.release(taken)
        again = await a.claim("queue/orders")
        assert again.owner == "a" and again.epoch == taken.epoch + 1
        epochs = [claim.epoch for _, claim in owners if claim is not None]
        assert epochs == sorted(epochs) and len(set(epochs)) == len(epochs)  # only ever up
    finally:
        await a.stop()
        await b.stop()
