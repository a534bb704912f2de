"""Transactions forwarded through a proxy rule, shaped as client libraries shape them (issue #41).

proton's ``Transaction.send`` queues a transactional transfer on a link that has no
credit yet, and ``commit()`` right after it sends the discharge on the coordinator
link, which has credit: on the wire the discharge overtakes the transfers. A local
queue's producer gets credit with its attach, before a declare is answered; a proxied
one only when its primary has granted credit. The node answers a declare once the
connection's senders have their first credit (the declare fence), so the same client
commits exactly its messages through a rule as into a local queue. A transfer that
still arrives after its discharge is refused with ``amqp:transaction:unknown-id``,
and the reason says the discharge came first; nothing is ever answered as committed
that the primary did not take in the transaction.
"""

from __future__ import annotations

import collections

import pytest
from proton import Delivery, Message

from playbook import World, run
from test_transactions_playbooks import TRANSACTIONAL, Txn, condition, local_depth, proxy_rule

pytestmark = pytest.mark.timeout(30)


async def gateway(world: World):
    primary = await world.node("primary")
    await world.node("gw", rules=[proxy_rule("work", "primary")])
    world.network.slow("gw", "primary", 0.02)  # the primary's answers come after our own
    client = await world.client("gw")
    return primary, client


@pytest.mark.parametrize("where", ["local", "proxy"])
def test_transfers_queued_before_credit_then_commit_at_once_deliver_the_set(tmp_path, where):
    """proton's shape: sender made, declare, Transaction.send x5 with no credit yet, commit."""
    async def play():
        world = World(tmp_path)
        primary, client = await gateway(world)
        url_node = primary if where == "local" else None
        if where == "local":
            client = await world.client("primary")
        txn_ctl = Txn(world, client)
        sender = client.sender("work.a")
        txn = await txn_ctl.declare()
        sent = [txn_ctl.send(sender, txn, f"m{i}") for i in range(5)]
        answer = await txn_ctl.discharge(txn)
        assert answer.remote_state == Delivery.ACCEPTED, condition(answer)
        await world.until(lambda: all(d in sender.outcomes for d in sent), what="outcomes")
        assert all(sender.outcomes[d] == TRANSACTIONAL for d in sent)
        assert local_depth(url_node or primary, "work.a") == 5
        await world.close()

    run(play)


@pytest.mark.parametrize("where", ["local", "proxy"])
def test_a_transfer_sent_after_its_discharge_is_refused_as_unknown_and_says_why(tmp_path, where):
    """The sender attached after the declare: its transfers wait for credit, the discharge
    does not. The commit covers what arrived before it (nothing); the transfers are refused."""
    async def play():
        world = World(tmp_path)
        primary, client = await gateway(world)
        if where == "local":
            client = await world.client("primary")
        txn_ctl = Txn(world, client)
        txn = await txn_ctl.declare()
        sender = client.sender("work.late")
        sent = [txn_ctl.send(sender, txn, f"m{i}") for i in range(3)]
        answer = await txn_ctl.discharge(txn)
        assert answer.remote_state == Delivery.ACCEPTED  # an empty transaction, committed
        await world.until(lambda: all(d in sender.outcomes for d in sent), what="refused")
        for delivery in sent:
            assert sender.outcomes[delivery] == Delivery.REJECTED
            name, description = condition(delivery)
            assert name == "amqp:transaction:unknown-id"
            assert "discharged (committed) before this arrived" in description
        await world.quiet(0.2)
        assert local_depth(primary, "work.late") == 0
        await world.close()

    run(play)


def test_a_transactional_state_in_a_disposition_after_the_transfer_fails_the_commit(tmp_path):
    """The transfer went on outside the transaction (no state on its frame); the state came in
    a disposition before it was settled: the commit is refused, never answered for it."""
    async def play():
        world = World(tmp_path)
        primary, client = await gateway(world)
        txn_ctl = Txn(world, client)
        sender = client.sender("work.d")
        await world.until(lambda: sender.credit > 0, what="credit")
        txn = await txn_ctl.declare()
        delivery = sender.send("late-state")  # no state on the transfer ...
        delivery.local.data = [txn]
        delivery.update(TRANSACTIONAL)  # ... a disposition carries it, before the primary answered
        client.flush()
        await world.until(lambda: delivery in sender.outcomes, what="answered")
        answer = await txn_ctl.discharge(txn)
        assert answer.remote_state == Delivery.REJECTED
        name, description = condition(answer)
        assert name == "amqp:transaction:rollback"
        assert "came in a disposition after the transfer" in description
        await world.close()

    run(play)


@pytest.mark.parametrize("where", ["local", "proxy"])
def test_a_transactional_state_on_a_later_frame_is_refused_and_fails_the_commit(tmp_path, where):
    """A streamed transfer: its first frame without a state, the next ones with it. proton's
    engine drops a later frame's state: the node sees it in the frame trace it turns on for
    such a transfer, refuses the message (``amqp:not-allowed``), and refuses the commit."""
    async def play():
        world = World(tmp_path)
        primary, client = await gateway(world)
        if where == "local":
            client = await world.client("primary")
        txn_ctl = Txn(world, client)
        sender = client.sender("work.stream")
        await world.until(lambda: sender.credit > 0, what="credit")
        txn = await txn_ctl.declare()
        kept = txn_ctl.send(sender, txn, "kept")
        encoded = Message(body="s" * 100_000).encode()
        delivery = sender.link.delivery(str(next(client.tags)))
        sender.link.send(encoded[:30_000])  # the first frames, with no state
        client.flush()
        delivery.local.data = [txn]
        delivery.update(TRANSACTIONAL)  # on the frames still to come
        sender.link.send(encoded[30_000:])
        sender.link.advance()
        client.flush()
        await world.until(lambda: delivery in sender.outcomes and kept in sender.outcomes,
                          what="answered")
        assert sender.outcomes[delivery] == Delivery.REJECTED
        name, description = condition(delivery)
        assert name == "amqp:not-allowed" and "later frame" in description
        answer = await txn_ctl.discharge(txn)
        assert answer.remote_state == Delivery.REJECTED
        assert condition(answer)[0] == "amqp:transaction:rollback"
        assert "later frame" in condition(answer)[1]
        # the connection goes on: a transaction after it commits
        txn2 = await txn_ctl.declare()
        again = txn_ctl.send(sender, txn2, "after")
        assert (await txn_ctl.discharge(txn2)).remote_state == Delivery.ACCEPTED
        assert sender.outcomes[again] == TRANSACTIONAL
        await world.until(lambda: local_depth(primary, "work.stream") == 1, what="committed")
        await world.close()

    run(play)


def test_a_large_transactional_transfer_in_many_frames_through_a_rule(tmp_path):
    """A message larger than a frame: its state is on the first frame; committed whole."""
    async def play():
        world = World(tmp_path)
        primary, client = await gateway(world)
        txn_ctl = Txn(world, client)
        sender = client.sender("work.big")
        txn = await txn_ctl.declare()
        bodies = ["x" * 300_000, "small", "y" * 200_000]
        sent = [txn_ctl.send(sender, txn, body) for body in bodies]
        answer = await txn_ctl.discharge(txn)
        assert answer.remote_state == Delivery.ACCEPTED, condition(answer)
        assert [sender.outcomes.get(d) for d in sent] == [TRANSACTIONAL] * 3
        assert local_depth(primary, "work.big") == 3
        reader = await world.client("primary")
        receiver = reader.receiver("work.big", credit=3)
        await world.until(lambda: len(receiver.received) == 3, what="the committed set")
        assert receiver.bodies() == bodies
        await world.close()

    run(play)


def test_the_connection_to_the_primary_lost_before_the_commit_fails_the_discharge(tmp_path):
    """Every transfer answered, then the gateway loses its primary: the commit is a failed
    discharge (``amqp:transaction:rollback``), never "committed"; nothing stays on the primary."""
    async def play():
        world = World(tmp_path)
        primary, client = await gateway(world)
        txn_ctl = Txn(world, client)
        sender = client.sender("work.lost")
        await world.until(lambda: sender.credit > 0, what="credit")
        txn = await txn_ctl.declare()
        sent = [txn_ctl.send(sender, txn, f"m{i}") for i in range(3)]
        await world.until(lambda: all(d in sender.outcomes for d in sent), what="answered")
        assert world.network.cut("gw", "primary") >= 1
        answer = await txn_ctl.discharge(txn)
        assert answer.remote_state == Delivery.REJECTED
        name, description = condition(answer)
        assert name == "amqp:transaction:rollback" and "was lost" in description
        await world.quiet(1.0)
        assert local_depth(primary, "work.lost") == 0  # the primary rolled its transaction back
        await world.close()

    run(play)


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_random_mixes_of_conveyance_frames_and_discharges(tmp_path, seed):
    """Seeded: transactions of small and multi-frame messages, each message's state on its
    transfer, or set after the transfer began (it then reaches the node in a disposition or on
    a later frame), sent before or after credit, committed or aborted. Whatever the way, a
    message is either in its transaction (answered with transactional-state), refused
    (``amqp:not-allowed``), or taken outside it (plain ``accepted``), and then its transaction's
    commit is refused: the primary ends with exactly the committed transactions' messages
    plus those taken outside, once each."""
    import random

    rng = random.Random(seed)

    async def play():
        world = World(tmp_path)
        primary, client = await gateway(world)
        txn_ctl = Txn(world, client)
        sender = client.sender("work.mix")
        expected: set = set()
        ways = collections.Counter()
        for number in range(10):
            txn = await txn_ctl.declare()
            commit = rng.random() < 0.7
            deliveries = []
            for index in range(rng.randint(1, 5)):
                body = f"{number}-{index}:" + "z" * rng.choice([10, 10, 70_000, 250_000])
                way = rng.choice(["transfer"] * 4 + ["disposition", "later-frame"])
                if way != "transfer" or rng.random() < 0.5:
                    await world.until(lambda: sender.credit > 0, what="credit")
                if way == "disposition":  # the transfer written before its state is set
                    delivery = sender.send(body)
                    delivery.local.data = [txn]
                    delivery.update(TRANSACTIONAL)
                    client.flush()
                elif way == "later-frame":  # streamed: the first frame goes, then the state is set
                    encoded = Message(body=body).encode()
                    delivery = sender.link.delivery(str(next(client.tags)))
                    sender.link.send(encoded[:len(encoded) // 2])
                    client.flush()
                    delivery.local.data = [txn]
                    delivery.update(TRANSACTIONAL)
                    sender.link.send(encoded[len(encoded) // 2:])
                    sender.link.advance()
                    client.flush()
                else:
                    delivery = txn_ctl.send(sender, txn, body)
                deliveries.append((delivery, body))
            await world.until(lambda: all(d in sender.outcomes for d, _ in deliveries), what="answered")
            outside = [body for d, body in deliveries if sender.outcomes[d] == Delivery.ACCEPTED]
            inside = [body for d, body in deliveries if sender.outcomes[d] == TRANSACTIONAL]
            refused = [d for d, _ in deliveries if sender.outcomes[d] == Delivery.REJECTED]
            assert len(outside) + len(inside) + len(refused) == len(deliveries)
            # refused: its state came on a later frame, or its transaction can only roll back now
            assert all(condition(d)[0] in ("amqp:not-allowed", "amqp:transaction:rollback")
                       for d in refused), [condition(d) for d in refused]
            ways.update(outside=len(outside), inside=len(inside), refused=len(refused),
                        not_allowed=sum(1 for d in refused if condition(d)[0] == "amqp:not-allowed"))
            answer = await txn_ctl.discharge(txn, fail=not commit)
            expected.update(outside)
            if commit and (outside or refused):
                assert answer.remote_state == Delivery.REJECTED, (seed, number)
                assert condition(answer)[0] == "amqp:transaction:rollback"
            else:
                assert answer.remote_state == Delivery.ACCEPTED, (seed, number, condition(answer))
                if commit:
                    expected.update(inside)
        print(seed, dict(ways))
        await world.until(lambda: local_depth(primary, "work.mix") >= len(expected), what="settled")
        await world.quiet(0.5)
        reader = await world.client("primary")
        receiver = reader.receiver("work.mix", credit=len(expected) + 10)
        await world.until(lambda: len(receiver.received) >= len(expected), what="drained")
        await world.quiet(0.5)
        got = receiver.bodies()
        assert len(got) == len(set(got)), "duplicates"
        assert set(got) == expected, (seed, sorted(b[:6] for b in set(got) ^ expected))
        await world.close()

    run(play)
