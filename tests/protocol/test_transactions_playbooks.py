"""Transactions with real nodes on a memory network and a virtual clock (``playbook.World``).

Covered: a durable queue's commit is one journal record and survives a restart
(a crash before it leaves nothing), an exchange's bound queues get a posting
together at commit, a transaction forwarded through a proxy rule to a primary
fedgate (commit, rollback, a transactional accept given back, outcomes end to
end, what crossed the wire), refusals that name their reason (two primaries,
this node and a primary), the timeout on the virtual clock, and a connection
dropped mid-transaction on the gateway.
"""

from __future__ import annotations

import shutil

import pytest
from proton import Delivery, Described, Message, Terminus, symbol, ulong

from playbook import ClientLink, World, run

DECLARED = 0x33
TRANSACTIONAL = 0x34

pytestmark = pytest.mark.timeout(30)


class Txn:
    """A transaction controller on a playbook client (as proton's Transaction does it)."""

    def __init__(self, world: World, client) -> None:
        self.world = world
        self.client = client
        link = client._session().sender(f"{client.name}-txn")
        link.target.type = Terminus.COORDINATOR
        link.open()
        self.ctl = client.links[link] = ClientLink(client, link)
        client.flush()

    async def _control(self, descriptor: str, fields: list) -> Delivery:
        await self.world.until(lambda: self.ctl.credit > 0, what="coordinator credit")
        delivery = self.ctl.send(Described(symbol(descriptor), fields))
        await self.world.until(lambda: delivery in self.ctl.outcomes, what=descriptor)
        return delivery

    async def declare(self) -> bytes:
        delivery = await self._control("amqp:declare:list", [None])
        assert delivery.remote_state == DECLARED
        return bytes(delivery.remote.data[0])

    async def discharge(self, txn: bytes, fail: bool = False) -> Delivery:
        return await self._control("amqp:discharge:list", [txn, fail])

    def send(self, sender: ClientLink, txn: bytes, body, *, durable: bool = False) -> Delivery:
        delivery = sender.link.delivery(str(next(self.client.tags)))
        sender.link.send(Message(body=body, durable=durable).encode())
        sender.link.advance()
        delivery.local.data = [txn]
        delivery.update(TRANSACTIONAL)
        self.client.flush()
        return delivery

    def retire(self, receiver: ClientLink, txn: bytes, outcome: int = Delivery.ACCEPTED) -> None:
        for _, delivery in receiver.received:
            if not delivery.settled:
                delivery.local.data = [txn, Described(ulong(outcome), [])]
                delivery.update(TRANSACTIONAL)
                delivery.settle()
        self.client.flush()


def condition(delivery: Delivery) -> tuple[str, str]:
    remote = delivery.remote.condition
    return (remote.name, remote.description) if remote is not None else ("", "")


async def fill(world: World, node: str, address: str, bodies: list) -> None:
    client = await world.client(node)
    sender = client.sender(address)
    await world.until(lambda: sender.credit > 0)
    for body in bodies:
        sender.send(body)
    await world.until(lambda: sender.accepted() == len(bodies), what="fill accepted")


def local_depth(node, address: str) -> int:
    queue = node.queues.get(address)
    return 0 if queue is None else queue.depth


# -- durable queues ---------------------------------------------------------------------------
def test_a_durable_commit_survives_a_restart_and_an_earlier_crash_leaves_nothing(tmp_path):
    async def play():
        world = World(tmp_path)
        node = await world.node("n", queues={"durable": True})
        client = await world.client("n")
        txn_ctl = Txn(world, client)
        sender = client.sender("orders")
        await world.until(lambda: sender.credit > 0)
        txn = await txn_ctl.declare()
        for i in range(3):
            txn_ctl.send(sender, txn, f"t{i}", durable=True)
        await world.until(lambda: len(sender.outcomes) == 3, what="postings answered")
        assert node.journal.live == 0  # nothing journaled before the commit
        crash_copy = tmp_path / "crash-before-commit"
        shutil.copytree(tmp_path / "n" / "journal", crash_copy)
        answer = await txn_ctl.discharge(txn)
        assert answer.remote_state == Delivery.ACCEPTED
        assert local_depth(node, "orders") == 3
        await world.close()
        return crash_copy

    crash_copy = run(play)

    async def restart():
        world = World(tmp_path)
        node = await world.node("n", queues={"durable": True})
        assert local_depth(node, "orders") == 3  # journaled as one record, recovered whole
        await world.close()
        # the copy taken before the commit: nothing of the transaction
        shutil.rmtree(tmp_path / "n" / "journal")
        shutil.copytree(crash_copy, tmp_path / "n" / "journal")
        world = World(tmp_path)
        node = await world.node("n", queues={"durable": True})
        assert local_depth(node, "orders") == 0
        await world.close()

    run(restart)


# -- exchanges ---------------------------------------------------------------------------------
def test_an_exchange_posting_reaches_every_bound_queue_at_commit(tmp_path):
    async def play():
        world = World(tmp_path)
        node = await world.node("n", exchanges=[{"name": "events", "type": "fanout"}],
                                bindings=[{"exchange": "events", "queue": "audit"},
                                          {"exchange": "events", "queue": "billing"}])
        client = await world.client("n")
        txn_ctl = Txn(world, client)
        sender = client.sender("events")
        await world.until(lambda: sender.credit > 0)
        txn = await txn_ctl.declare()
        posted = txn_ctl.send(sender, txn, "e1")
        await world.until(lambda: posted in sender.outcomes)
        assert posted.remote_state == TRANSACTIONAL
        assert (local_depth(node, "audit"), local_depth(node, "billing")) == (0, 0)
        assert (await txn_ctl.discharge(txn)).remote_state == Delivery.ACCEPTED
        assert (local_depth(node, "audit"), local_depth(node, "billing")) == (1, 1)
        await world.close()

    run(play)


# -- forwarded to a primary -----------------------------------------------------------------------
def proxy_rule(name: str, primary: str) -> dict:
    return {"name": name, "match": f"{name}.#", "kind": "proxy", "primary": f"amqp://{primary}:5672"}


def test_a_transaction_through_a_proxy_rule_is_the_primarys(tmp_path):
    async def play():
        world = World(tmp_path)
        primary = await world.node("primary")
        await world.node("gw", rules=[proxy_rule("work", "primary")])
        client = await world.client("gw")
        txn_ctl = Txn(world, client)
        sender = client.sender("work.a")
        await world.until(lambda: sender.credit > 0, what="proxy credit")
        txn = await txn_ctl.declare()
        sent = [txn_ctl.send(sender, txn, f"m{i}") for i in range(3)]
        await world.until(lambda: all(d in sender.outcomes for d in sent), what="forwarded")
        # the primary's answer, with the client's txn-id and the primary's outcome
        assert all(d.remote_state == TRANSACTIONAL for d in sent)
        assert {bytes(d.remote.data[0]) for d in sent} == {txn}
        assert local_depth(primary, "work.a") == 0  # held in the primary's transaction
        attaches = world.frames("gw", "primary", "attach")
        assert any(getattr(f["target"], "descriptor", None) == 0x30 for f in attaches)
        assert (await txn_ctl.discharge(txn)).remote_state == Delivery.ACCEPTED
        assert local_depth(primary, "work.a") == 3
        # the primary discharged it: a declare and a discharge crossed, one of each
        transfers = world.frames("gw", "primary", "transfer")
        assert sum(1 for f in transfers if f["state"] is not None) == 3

        # a second transaction, rolled back at the primary
        txn2 = await txn_ctl.declare()
        txn_ctl.send(sender, txn2, "dropped")
        await world.until(lambda: len(sender.outcomes) == 4)
        assert (await txn_ctl.discharge(txn2, fail=True)).remote_state == Delivery.ACCEPTED
        await world.quiet(0.5)
        assert local_depth(primary, "work.a") == 3
        assert primary.broker.transactions.stats.rolled_back == 1
        await world.close()

    run(play)


def test_a_transactional_accept_through_a_proxy_rule_given_back_at_abort(tmp_path):
    async def play():
        world = World(tmp_path)
        primary = await world.node("primary")
        await world.node("gw", rules=[proxy_rule("work", "primary")])
        await fill(world, "primary", "work.q", ["a", "b"])
        client = await world.client("gw")
        txn_ctl = Txn(world, client)
        receiver = client.receiver("work.q", credit=2)
        await world.until(lambda: len(receiver.received) == 2, what="received through the proxy")
        txn = await txn_ctl.declare()
        txn_ctl.retire(receiver, txn)
        await world.until(lambda: primary.queues.get("work.q").unacked == 2
                          and primary.broker.transactions.held()[0] == 2, what="retired upstream")
        assert (await txn_ctl.discharge(txn, fail=True)).remote_state == Delivery.ACCEPTED
        receiver.flow(2)
        await world.until(lambda: primary.queues.get("work.q").unacked == 2
                          and len(receiver.received) == 4, what="given back and sent again")
        again = receiver.received[2:]
        assert [m.body for m, _ in again] == ["a", "b"]
        assert [m.delivery_count for m, _ in again] == [1, 1]

        txn2 = await txn_ctl.declare()
        txn_ctl.retire(receiver, txn2)
        assert (await txn_ctl.discharge(txn2)).remote_state == Delivery.ACCEPTED
        queue = primary.queues.get("work.q")
        await world.until(lambda: queue.unacked == 0 and queue.depth == 0, what="committed")
        await world.close()

    run(play)


def test_a_transaction_spanning_two_primaries_is_refused_with_its_reason(tmp_path):
    async def play():
        world = World(tmp_path)
        await world.node("p1")
        await world.node("p2")
        await world.node("gw", rules=[proxy_rule("one", "p1"), proxy_rule("two", "p2")])
        client = await world.client("gw")
        txn_ctl = Txn(world, client)
        first, second = client.sender("one.q"), client.sender("two.q")
        await world.until(lambda: first.credit > 0 and second.credit > 0)
        txn = await txn_ctl.declare()
        ok = txn_ctl.send(first, txn, "to p1")
        await world.until(lambda: ok in first.outcomes)
        refused = txn_ctl.send(second, txn, "to p2")
        await world.until(lambda: refused in second.outcomes)
        assert ok.remote_state == TRANSACTIONAL
        assert refused.remote_state == Delivery.REJECTED
        name, description = condition(refused)
        assert name == "amqp:not-implemented"
        assert "spans primary amqp://p1:5672 and primary amqp://p2:5672" in description
        answer = await txn_ctl.discharge(txn)
        assert answer.remote_state == Delivery.REJECTED
        assert condition(answer)[0] == "amqp:transaction:rollback"
        assert "spans primary amqp://p1:5672 and primary amqp://p2:5672" in condition(answer)[1]
        await world.close()

    run(play)


def test_a_transaction_spanning_this_node_and_a_primary_is_refused(tmp_path):
    async def play():
        world = World(tmp_path)
        primary = await world.node("primary")
        gw = await world.node("gw", rules=[proxy_rule("work", "primary")])
        client = await world.client("gw")
        txn_ctl = Txn(world, client)
        local, remote = client.sender("here"), client.sender("work.q")
        await world.until(lambda: local.credit > 0 and remote.credit > 0)
        txn = await txn_ctl.declare()
        ok = txn_ctl.send(local, txn, "local")
        refused = txn_ctl.send(remote, txn, "remote")
        await world.until(lambda: ok in local.outcomes and refused in remote.outcomes)
        assert refused.remote_state == Delivery.REJECTED
        assert "spans this node's queues and primary amqp://primary:5672" in condition(refused)[1]
        assert (await txn_ctl.discharge(txn)).remote_state == Delivery.REJECTED
        assert local_depth(gw, "here") == 0 and local_depth(primary, "work.q") == 0
        await world.close()

    run(play)


# -- time and loss -----------------------------------------------------------------------------
def test_an_undischarged_transaction_times_out_on_the_clock(tmp_path):
    async def play():
        world = World(tmp_path)
        node = await world.node("n", limits={"transaction_timeout": 5})
        client = await world.client("n")
        txn_ctl = Txn(world, client)
        sender = client.sender("q")
        await world.until(lambda: sender.credit > 0)
        txn = await txn_ctl.declare()
        txn_ctl.send(sender, txn, "held")
        await world.quiet(4.0)
        assert txn_ctl.ctl.closed_with is None
        await world.until(lambda: txn_ctl.ctl.closed_with is not None, timeout=3.0)
        assert txn_ctl.ctl.closed_with == "amqp:transaction:timeout"
        assert local_depth(node, "q") == 0 and node.broker.transactions.stats.timed_out == 1
        await world.close()

    run(play)


def test_a_dropped_client_connection_rolls_back_at_the_primary(tmp_path):
    async def play():
        world = World(tmp_path)
        primary = await world.node("primary")
        gw = await world.node("gw", rules=[proxy_rule("work", "primary")])
        client = await world.client("gw")
        txn_ctl = Txn(world, client)
        sender = client.sender("work.q")
        await world.until(lambda: sender.credit > 0)
        txn = await txn_ctl.declare()
        sent = txn_ctl.send(sender, txn, "never")
        await world.until(lambda: sent in sender.outcomes)
        assert primary.broker.transactions.open == 1
        client.transport_io.abort()
        await world.until(lambda: gw.broker.transactions.open == 0
                          and primary.broker.transactions.open == 0, what="rolled back on both")
        assert local_depth(primary, "work.q") == 0
        assert primary.broker.transactions.stats.rolled_back == 1
        await world.close()

    run(play)


# -- fragments ---------------------------------------------------------------------------------
FRAGMENTS = {"name": "fq", "match": "fq.#", "kind": "fragmented", "fragments": ["a", "b"]}
PEERS = {"a": "amqp://a:5672", "b": "amqp://b:5672"}


def test_a_fragment_takes_a_transaction_of_its_own_node_and_refuses_stolen_messages(tmp_path):
    async def play():
        world = World(tmp_path)
        a = await world.node("a", peers=PEERS, rules=[FRAGMENTS])
        b = await world.node("b", peers=PEERS, rules=[FRAGMENTS])
        client = await world.client("a")
        txn_ctl = Txn(world, client)
        sender = client.sender("fq.t")
        await world.until(lambda: sender.credit > 0)
        txn = await txn_ctl.declare()
        posted = txn_ctl.send(sender, txn, "into a's fragment")
        await world.until(lambda: posted in sender.outcomes)
        assert local_depth(a, "fq.t") == 0
        assert (await txn_ctl.discharge(txn)).remote_state == Delivery.ACCEPTED
        assert local_depth(a, "fq.t") == 1  # this node's own fragment

        # a message stolen from b's fragment cannot be settled in a transaction on a
        await fill(world, "b", "fq.s", ["on b"])
        receiver = client.receiver("fq.s", credit=1)
        await world.until(lambda: len(receiver.received) == 1, what="stolen from b")
        txn2 = await txn_ctl.declare()
        txn_ctl.retire(receiver, txn2)
        answer = await txn_ctl.discharge(txn2)
        assert answer.remote_state == Delivery.REJECTED
        assert "another node's fragment" in condition(answer)[1]
        await world.until(lambda: b.queues.get("fq.s").unacked == 0, what="back home on b")
        await world.close()

    run(play)


def test_a_commit_barrier_never_done_ends_the_coordinator_link_with_the_outcome_unknown(tmp_path):
    async def play():
        world = World(tmp_path)
        node = await world.node("n", limits={"transaction_timeout": 2})
        node.queues.lookup_or_create("r").commit_barrier = lambda done: None  # never confirms
        client = await world.client("n")
        txn_ctl = Txn(world, client)
        sender = client.sender("r")
        await world.until(lambda: sender.credit > 0)
        txn = await txn_ctl.declare()
        txn_ctl.send(sender, txn, "applied, not confirmed")
        await world.until(lambda: len(sender.outcomes) == 1)
        await world.until(lambda: txn_ctl.ctl.credit > 0)
        txn_ctl.ctl.send(Described(symbol("amqp:discharge:list"), [txn, False]))
        await world.until(lambda: txn_ctl.ctl.closed_with is not None, timeout=5)
        assert txn_ctl.ctl.closed_with == "amqp:transaction:timeout"
        assert "outcome" in txn_ctl.ctl.link.remote_condition.description
        assert local_depth(node, "r") == 1  # applied on this node
        assert node.broker.transactions.stats.unknown == 1
        await world.close()

    run(play)
