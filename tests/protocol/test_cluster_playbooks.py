"""Playbooks of the etcd coordinator on a virtual clock: real ``EtcdCoordinator``s, an etcd in
memory (``tests/support/memory_etcd.py``: revisions, leases that expire, transactions,
watches, partitions), the event loop of ``tests/support/playbook.py`` whose clock jumps to
the next timer. Each runs in well under a second of real time; every wait is bounded in
virtual time.

The safety property checked throughout: a node stops acting before etcd can expire its
lease, so no two nodes ever act as owners of one resource at once.
"""

from __future__ import annotations

import asyncio
import random
import zlib

import pytest
from memory_etcd import MemoryEtcd
from playbook import run

from proxy.cluster.etcd import EtcdCoordinator
from proxy.cluster.lease import Backoff
from proxy.cluster.model import CoordinatorUnavailable, DuplicateNode

TTL = 3


def now() -> float:
    return asyncio.get_running_loop().time()


def make(server: MemoryEtcd, node_id: str, *, client: str | None = None, **options):
    store = server.client(client or node_id)
    coordinator = EtcdCoordinator(name="t", node_id=node_id, amqp=f"amqp://{node_id}:5672",
                                  admin=f"http://{node_id}:8080", workers=1, version="test",
                                  store=store, endpoints=[store.endpoint], lease_ttl=TTL,
                                  wall=now, **options,
                                  # the reconnect jitter drawn from a seed: every run the same
                                  backoff=Backoff(rng=random.Random(zlib.crc32(node_id.encode()))))
    coordinator.fencing = []  # (time, fenced) as on_fenced reported it
    coordinator.on_fenced(lambda fenced: coordinator.fencing.append((now(), fenced)))
    return coordinator, store


async def until(predicate, timeout: float, step: float = 0.01) -> float:
    """Wait (virtual time) until ``predicate()``; the time it took. Fails past ``timeout``."""
    started = now()
    while not predicate():
        if now() - started > timeout:
            raise AssertionError(f"not within {timeout}s: {predicate}")
        await asyncio.sleep(step)
    return now() - started


def ids(coordinator) -> list[str]:
    return [m.id for m in coordinator.members()]


def test_renewals_every_third_of_the_ttl_never_fenced():
    async def play():
        server = MemoryEtcd()
        a, store = make(server, "a")
        await a.start()
        samples = []
        for _ in range(600):  # 30 s, every 50 ms
            samples.append(a.acting())
            await asyncio.sleep(0.05)
        sent = [t for t, what in store.calls if what == "keepalive"]
        gaps = [round(b - a, 3) for a, b in zip(sent, sent[1:])]
        assert all(samples) and a.fencing == []
        assert 28 <= server.keepalives <= 31
        assert set(gaps) == {1.0}  # ttl / 3, from when the last one was sent
        assert a.keeper.registrations == 1
        await a.stop()
        assert server.leases == {} and server.kvs == {}  # revoked: gone at once
    run(play)


def test_a_stall_longer_than_the_lease_fences_before_anyone_else_can_claim():
    async def play():
        server = MemoryEtcd()
        a, _ = make(server, "a")
        b, _ = make(server, "b")
        await a.start()
        await b.start()
        claim_a = await a.claim("queue/q1")
        assert claim_a.epoch == 1 and await b.claim("queue/q1") is None
        await until(lambda: b.current_owner("queue/q1") == claim_a, 1.0)
        seen = {}

        def stall():  # the event loop blocks for 10 s in one long callback (etcd's clock goes on)
            loop = asyncio.get_running_loop()
            loop.now += 10.0
            seen["a acting right after the stall"] = a.acting()
        asyncio.get_running_loop().call_soon(stall)
        await asyncio.sleep(0)
        assert seen == {"a acting right after the stall": False}  # before any timer ran
        # both nodes find their leases gone and register again under new ones
        await until(lambda: b.acting() and b.current_owner("queue/q1") is None, 5.0)
        # the first callbacks after the stall were a's fence timer, then etcd expiring the lease
        assert a.fencing[0][1] is True and a.fencing[0][0] <= server.expired[0][0]
        claim_b = await b.claim("queue/q1")
        assert claim_b.epoch == 2
        await until(lambda: a.acting(), 5.0)
        assert a.keeper.registrations == 2 and a.current_owner("queue/q1") == claim_b
        assert await a.claim("queue/q1") is None
        await a.stop()
        await b.stop()
    run(play)


def test_epoch_race_between_two_claimants():
    async def play():
        server = MemoryEtcd()
        a, store_a = make(server, "a")
        b, _ = make(server, "b")
        await a.start()
        await b.start()
        got = await asyncio.gather(a.claim("r"), b.claim("r"))  # the same reading of epoch 0
        winners = [c for c in got if c is not None]
        assert len(winners) == 1 and winners[0].epoch == 1
        winner, loser = (a, b) if got[0] else (b, a)
        # the winner is cut off from etcd: it must stop acting before its lease can expire
        cut_at = now()
        winner.store.partition()
        await until(lambda: loser.current_owner("r") is None, TTL + 1.0)
        taken = await loser.claim("r")
        assert taken.epoch == 2 and taken.owner == loser.node_id
        fenced_time, fenced = winner.fencing[0]
        expired_time = server.expired[0][0]
        assert fenced and fenced_time < expired_time  # fenced strictly before etcd expired it
        assert fenced_time - cut_at <= TTL * 0.9 - 0.2 + 0.001  # within the window
        winner.store.heal()
        await until(lambda: winner.acting(), 5.0)
        assert await winner.claim("r") is None  # the other one owns it now
        await loser.release(taken)
        again = await winner.claim("r")
        assert again.epoch == 3  # epochs of one resource only go up
        await a.stop()
        await b.stop()
    run(play)


def test_many_rounds_of_three_claimants_one_winner_each_epochs_strictly_up():
    async def play():
        server = MemoryEtcd()
        nodes = [make(server, n)[0] for n in ("a", "b", "c")]
        for node in nodes:
            await node.start()
        epochs = []
        for _ in range(20):
            got = await asyncio.gather(*(n.claim("shared") for n in nodes))
            winners = [(n, c) for n, c in zip(nodes, got) if c is not None]
            assert len(winners) == 1
            node, claim = winners[0]
            epochs.append(claim.epoch)
            await node.release(claim)
        assert epochs == list(range(1, 21))
        for node in nodes:
            await node.stop()
    run(play)


def test_partition_fences_within_the_ttl_and_the_node_rejoins():
    async def play():
        server = MemoryEtcd()
        a, store = make(server, "a")
        b, _ = make(server, "b")
        await a.start()
        await b.start()
        await until(lambda: ids(b) == ["a", "b"], 1.0)
        store.partition()
        fenced_in = await until(lambda: not a.acting(), TTL)
        gone_in = await until(lambda: ids(b) == ["b"], TTL + 1.0 - fenced_in)
        assert fenced_in <= TTL and fenced_in + gone_in <= TTL + 1.0
        assert not a.healthy and a.describe()["fenced"] is True
        with pytest.raises(CoordinatorUnavailable):
            await a.claim("x")
        store.heal()
        await until(lambda: a.acting() and ids(b) == ["a", "b"], 5.0)
        assert a.healthy and a.keeper.registrations == 2
        await a.stop()
        await b.stop()
    run(play)


def test_etcd_restarted_quickly_nothing_changes_owners_keep_their_claims():
    async def play():
        server = MemoryEtcd()
        a, _ = make(server, "a")
        await a.start()
        claim = await a.claim("q")
        server.stop()
        await asyncio.sleep(0.5)  # well within the 2.5 s window: still acting
        assert a.acting() and not a.healthy
        with pytest.raises(CoordinatorUnavailable):
            await a.claim("other")
        server.start()
        await until(lambda: a.healthy, 3.0)
        assert a.acting() and a.keeper.registrations == 1 and a.fencing == []
        assert a.current_owner("q") == claim and await a.claim("q") == claim
        # down longer than the window: fenced, and back on the same lease (etcd extended it)
        server.stop()
        await until(lambda: not a.acting(), TTL)
        await asyncio.sleep(5.0)
        server.start()
        await until(lambda: a.acting(), 3.0)
        assert a.keeper.registrations == 1 and await a.claim("q") == claim
        assert [f for _, f in a.fencing] == [True, False]
        await a.stop()
    run(play)


def test_rules_compare_and_swap_exactly_one_of_two_wins_both_converge():
    async def play():
        server = MemoryEtcd()
        a, _ = make(server, "a")
        b, _ = make(server, "b")
        seen_by_b = []
        b.on_rules(lambda record, revision: seen_by_b.append((record, revision)))
        await a.start()
        await b.start()
        results = await asyncio.gather(a.swap_rules(0, b"from a"), b.swap_rules(0, b"from b"))
        assert sorted(r[0] for r in results) == [False, True]
        winner = next(r for r in results if r[0])
        loser = next(r for r in results if not r[0])
        assert loser[1:] == winner[1:]  # the loser is told what is there now
        await until(lambda: a.rules_record() == b.rules_record() == winner[1:], 1.0)
        if winner[1] == b"from a":
            assert seen_by_b == [(b"from a", winner[2])]
        await a.stop()
        await b.stop()
    run(play)


def test_a_node_cut_off_resumes_from_its_last_revision_or_reads_all_after_a_compaction():
    async def play():
        server = MemoryEtcd()
        a, store = make(server, "a")
        b, _ = make(server, "b")
        await a.start()
        await b.start()
        store.partition()
        await b.swap_rules(0, b"v1")
        store.heal()
        await until(lambda: a.rules_record()[0] == b"v1", 5.0)
        full_reads = [w for _, w in store.calls].count("range /fedgate/t/")
        assert full_reads == 1  # at start only: the watch resumed from the revision it had
        store.partition()
        _, _, revision = await b.swap_rules(b.rules_record()[1], b"v2")
        await b.swap_rules(revision, b"v3")
        server.compact()
        store.heal()
        await until(lambda: a.rules_record()[0] == b"v3", 5.0)
        assert [w for _, w in store.calls].count("range /fedgate/t/") == 2  # read everything again
        await a.stop()
        await b.stop()
    run(play)


def test_the_same_id_twice_the_second_refuses_and_a_restart_after_kill_waits_it_out():
    async def play():
        server = MemoryEtcd()
        a, _ = make(server, "a")
        await a.start()
        twin, _ = make(server, "a", client="a-twin", start_timeout=30.0)
        started = now()
        with pytest.raises(DuplicateNode, match="already registered"):
            await twin.start()
        assert TTL <= now() - started <= TTL + 2.5 and a.acting()
        # a is "killed": no revoke, no more renewals; a new process with its id starts
        a._task.cancel()
        a.store.partition()
        again, _ = make(server, "a", client="a-again", start_timeout=30.0)
        await again.start()
        assert again.acting() and [m.id for m in again.members()] == ["a"]
        await again.stop()
    run(play)


def test_an_etcd_replaced_by_an_empty_one_is_read_again_and_the_nodes_register_again():
    async def play():
        server = MemoryEtcd()
        a, _ = make(server, "a")
        b, _ = make(server, "b")
        seen = []
        a.on_rules(lambda record, revision: seen.append((record, revision)))
        await a.start()
        await b.start()
        await b.swap_rules(0, b"v1")
        for _ in range(30):  # the revision climbs well above what the new etcd will have
            await b.put_state("x", b"y")
        await until(lambda: a.rules_record()[0] == b"v1", 1.0)
        server.stop()
        server.wipe()
        server.start()
        await until(lambda: a.keeper.registrations == b.keeper.registrations == 2 and a.acting()
                    and b.acting() and ids(a) == ids(b) == ["a", "b"], 10.0)
        assert a.rules_record() == (None, 0) and seen[-1] == (None, 0)  # none there now
        assert a.keeper.registrations == 2 and a.revision < 30
        assert (await a.swap_rules(0, b"v2"))[0] is True
        await until(lambda: b.rules_record()[0] == b"v2", 1.0)
        await a.stop()
        await b.stop()
    run(play)


def test_an_unexpected_error_in_the_session_is_logged_and_the_session_starts_again(caplog):
    async def play():
        server = MemoryEtcd()
        a, store = make(server, "a")
        await a.start()
        real = store.keepalive
        calls = {"n": 0}

        async def surprising(lease_id):
            calls["n"] += 1
            if calls["n"] == 2:
                raise RuntimeError("a client surprise")
            return await real(lease_id)
        store.keepalive = surprising
        await until(lambda: calls["n"] >= 4, 10.0)
        assert a.acting() and a.healthy and a.keeper.registrations == 1 and a.reconnects == 1
        assert "a client surprise" in caplog.text and "etcd session failed" in caplog.text
        await a.stop()
    run(play)
