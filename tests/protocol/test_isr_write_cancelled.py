"""A primary's in-sync write cancelled under it is written again (issue #42, docs/nemesis.md
finding 25), on a virtual clock, and the etcd store turns a cancelled call into "unavailable".

The nemesis (combined seed 6, an etcd leader killed): a new primary's backups caught up, it
proposed them for the in-sync set, and its etcd session was lost and reconnected while the
write was in flight. A reconnect closes the old gRPC channel, which cancels the calls on it:
the write ended with a CancelledError, which every ``except Exception`` on its way let through.
The primary was left with a proposal neither written nor failed, and proposes nothing while
one is out: no backup of that queue was in sync again (20 s to the end of the run), and with
``min_in_sync = 2`` it accepted nothing.
"""

from __future__ import annotations

import asyncio

import pytest

from playbook import World, run
from proxy.cluster.etcd_store import AetcdStore
from proxy.cluster.store import StoreUnavailable
from test_replication_playbooks import etcd_cluster, placement, view

pytestmark = pytest.mark.timeout(60)
ADDRESS = "orders.x"
RULE = {"name": "orders", "match": "orders.*", "kind": "replicated", "replicas": 3,
        "min_in_sync": 2}


def test_a_cancelled_in_sync_write_is_made_again_and_the_backups_get_in_sync(tmp_path):
    async def play():
        world = World(tmp_path)
        etcd, nodes = await etcd_cluster(world, rule=RULE)
        primary = placement(nodes, ADDRESS)[0]
        coordinator = nodes[primary].coordinator
        real = coordinator.put_state
        cancelled = []

        async def put_state(key, value, **kwargs):
            if key.startswith("replication/") and b'"isr": []' not in value and not cancelled:
                cancelled.append(key)
                raise asyncio.CancelledError()  # the channel closed under the call
            return await real(key, value, **kwargs)

        coordinator.put_state = put_state
        producer = (await world.client(primary, "producer")).sender(ADDRESS)
        await world.until(lambda: view(nodes[primary], ADDRESS).get("role") == "primary",
                          what="a primary")
        await world.until(lambda: cancelled, what="an in-sync write cancelled")
        await world.until(lambda: len(view(nodes[primary], ADDRESS).get("in_sync", [])) == 2,
                          timeout=5.0, what="both backups in sync all the same")
        await world.until(lambda: producer.credit > 0, what="credit")
        producer.send("after", message_id=1)
        await world.until(lambda: producer.accepted() == 1, timeout=5.0,
                          what="accepted (min_in_sync = 2)")
        await world.close()

    run(play)


def test_the_store_reports_a_call_cancelled_under_it_as_unavailable():
    async def main():
        store = AetcdStore(["http://127.0.0.1:1"])

        async def cancelled_by_grpc():
            raise asyncio.CancelledError()

        with pytest.raises(StoreUnavailable, match="cancelled"):
            await store._call(cancelled_by_grpc())

        # the caller's own cancellation is not hidden
        started = asyncio.Event()

        async def slow():
            started.set()
            await asyncio.sleep(10)

        task = asyncio.ensure_future(store._call(slow()))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
