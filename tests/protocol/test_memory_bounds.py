"""Memory capped in bytes (issue #21): per-queue max_bytes with an overflow policy, the node's
max_memory, and temporary queues per connection.

* ``max_bytes`` with ``reject-publish``: once the queue holds that many bytes
  its producers get no new credit, and what they send on credit given before
  is rejected with ``amqp:resource-limit-exceeded``; with ``drop-head`` the
  oldest waiting messages go instead (RabbitMQ's two policies).
* ``[limits] max_memory`` with ``[paging] enabled = false`` (with paging it is a budget,
  and producers stop at a disk bound: ``test_paging.py``): above it, publishers of every queue get no new
  credit until consumers bring the node's use down; nothing accepted is lost.
* ``max_temp_queues_per_connection``: one more dynamic link is refused with
  ``amqp:resource-limit-exceeded``; temporary queues get ``[queues]`` limits.
* The same bounds for senders that do not name one queue: the anonymous relay
  gets no credit above ``max_memory``, and a message it (or an exchange) routes
  into a full ``reject-publish`` queue is refused as a direct send would be.
"""

from __future__ import annotations

import pytest
from proton import Delivery, Message

from playbook import World, run

pytestmark = pytest.mark.timeout(30)

BODY = b"x" * 10_000
NO_PAGING = {"enabled": False}


def outcome_conditions(link) -> list:
    return [d.remote.condition.name if d.remote.condition else None
            for d, state in link.outcomes.items() if state == Delivery.REJECTED]


def send_to(sender, to: str, message_id) -> None:
    """One message through the anonymous relay (a sender with no target): ``to`` says where."""
    sender.link.delivery(str(next(sender.client.tags)))
    sender.link.send(Message(body=BODY, id=message_id, address=to).encode())
    sender.link.advance()
    sender.client.flush()


async def send_all(world: World, sender, count: int, start: int = 0) -> None:
    """Send ``count`` numbered messages as credit allows (bounded waits)."""
    for i in range(start, start + count):
        await world.until(lambda: sender.credit > 0, what=f"credit for message {i}")
        sender.send(BODY, message_id=i)


async def receive_all(world: World, client, address: str, count: int) -> list:
    receiver = client.receiver(address, credit=count)
    await world.until(lambda: len(receiver.received) >= count, what=f"{count} messages")
    await world.quiet(0.2)
    receiver.settle()
    return [message.id for message, _ in receiver.received]


def test_max_bytes_reject_publish_withholds_credit_and_rejects_the_overflow(tmp_path):
    async def play():
        world = World(tmp_path)
        node = await world.node("a", queue=[{"name": "small", "max_bytes": 50_000}])
        client = await world.client("a")
        sender = client.sender("small")
        await world.until(lambda: sender.credit > 0)
        for i in range(8):  # on the credit given at attach: more than the queue takes
            sender.send(BODY, message_id=i)
        await world.until(lambda: len(sender.outcomes) == 8, what="8 outcomes")
        assert sender.accepted() == 4  # 4 x 10,000 bytes and a little: the 5th would pass 50,000
        assert outcome_conditions(sender) == ["amqp:resource-limit-exceeded"] * 4
        queue = node.queues.get("small")
        assert queue.bytes <= queue.max_bytes
        assert queue.producers_blocked or sender.credit < 1000

        ids = await receive_all(world, client, "small", 4)
        assert ids == [0, 1, 2, 3]  # every accepted message, once
        await world.until(lambda: node.queues.get("small").bytes == 0, what="settled")
        await world.quiet(0.1)
        sender.send(BODY, message_id=100)  # room again
        await world.until(lambda: sender.accepted() == 5, what="accepted again")
        await world.close()

    run(play)


def test_max_bytes_drop_head_keeps_the_newest(tmp_path):
    async def play():
        world = World(tmp_path)
        node = await world.node("a", queue=[{"name": "recent", "max_bytes": 50_000,
                                             "overflow": "drop-head"}])
        client = await world.client("a")
        sender = client.sender("recent")
        await send_all(world, sender, 20)
        await world.until(lambda: sender.accepted() == 20, what="all accepted")
        queue = node.queues.get("recent")
        assert queue.stats.dropped == 16 and queue.bytes <= 50_000
        assert await receive_all(world, client, "recent", 4) == [16, 17, 18, 19]
        await world.close()

    run(play)


def test_max_memory_stops_publishers_until_consumers_drain(tmp_path):
    async def play():
        world = World(tmp_path)
        node = await world.node("a", limits={"max_memory": 100_000}, queues={"credit_window": 4},
                                paging=NO_PAGING)
        producer = await world.client("a", "producer")
        one, two = producer.sender("one"), producer.sender("two")
        sent = 0
        while one.credit > 0 or two.credit > 0 or sent == 0:  # until the node withholds credit
            await world.until(lambda: one.credit > 0 or two.credit > 0, what="credit")
            (one if one.credit > 0 else two).send(BODY, message_id=sent)
            sent += 1
            await world.quiet(0.01)
            assert sent < 50, "credit went on past max_memory"
        await world.until(lambda: one.accepted() + two.accepted() == sent, what="all accepted")
        used = node.queues.memory.used
        assert used >= 100_000 and used <= 100_000 + 8 * len(BODY) + 1000  # credit given before
        await world.quiet(0.5)
        assert one.credit == 0 and two.credit == 0  # no new credit while above the limit

        consumer = await world.client("a", "consumer")
        got = await receive_all(world, consumer, "one", one.accepted())  # consumers go on
        await world.until(lambda: one.credit > 0 or two.credit > 0, what="credit again")
        got += await receive_all(world, consumer, "two", two.accepted())
        assert sorted(got) == list(range(sent))  # nothing accepted is lost, nothing twice
        await world.close()

    run(play)


def test_temporary_queues_per_connection_are_limited(tmp_path):
    async def play():
        world = World(tmp_path)
        node = await world.node("a", limits={"max_temp_queues_per_connection": 2},
                                queues={"max_depth": 7})
        client = await world.client("a")
        links = []
        for _ in range(3):
            link = client._session().receiver(f"dyn{len(links)}")
            link.source.dynamic = True
            link.open()
            client.flush()
            links.append(link)
        await world.until(lambda: all(link.remote_source.address or link.remote_condition
                                      for link in links), what="three answers")
        assert [link.remote_condition.name if link.remote_condition else None for link in links] \
            == [None, None, "amqp:resource-limit-exceeded"]
        temporary = node.queues.get(links[0].remote_source.address)
        assert temporary.max_depth == 7  # [queues] limits hold for temporary queues too
        links[0].close()
        client.flush()
        await world.until(lambda: node.queues.get(temporary.name) is None, what="deleted")
        again = client._session().receiver("again")
        again.source.dynamic = True
        again.open()
        client.flush()
        await world.until(lambda: again.remote_source.address, what="a temporary queue again")
        await world.close()

    run(play)


def test_incomplete_transfers_count_against_max_memory(tmp_path):
    """A sender that starts multi-frame transfers and never ends them holds node memory:
    past max_memory the next one is refused (amqp:link:message-size-exceeded), others go on."""
    from fuzz import frames as f

    from playbook import AMQP_HEADER, RawClient
    from proxy.amqp import engine

    async def play():
        world = World(tmp_path)
        node = await world.node("a", limits={"max_memory": 200_000, "max_frame_size": 65536},
                                paging=NO_PAGING)
        _, raw = await world.network.host("raw").connect(RawClient, "a", 5672)
        raw.transport.write(AMQP_HEADER + f.open_frame(max_frame=65536) + f.begin_frame()
                            + b"".join(f.attach_frame(f"s{i}", i, False, f"big{i}") for i in range(5)))
        await world.until(lambda: len(world.frames("a", "raw", "flow")) >= 5, what="credit on 5 links")
        whole = f.message(b"y" * 120_000)
        for i in range(5):  # 50,000 bytes of each, the rest never comes
            raw.transport.write(f.transfer_frame(i, i, b"t%d" % i, whole[:50_000], more=True))
            await world.quiet(0.05)
        detached = [(frame["handle"], frame.condition) for frame in world.frames("a", "raw", "detach")]
        assert detached == [(4, "amqp:link:message-size-exceeded")]  # 4 x 50,000 fill max_memory
        assert engine.partial_transfers.total == 200_000
        other = await world.client("a", "other")  # single-frame messages: accepted meanwhile
        sender = other.sender("small")
        await world.until(lambda: sender.credit > 0)
        sender.send(b"ok")
        await world.until(lambda: sender.accepted() == 1, what="another sender served")
        raw.transport.abort()  # the incomplete transfers end with their connection
        await world.until(lambda: engine.partial_transfers.total == 0, what="forgotten")
        await world.close()

    run(play)


def test_the_anonymous_relay_gets_no_credit_above_max_memory(tmp_path):
    """The relay's credit was never withheld: a client could fill the node past max_memory."""
    async def play():
        world = World(tmp_path)
        node = await world.node("a", limits={"max_memory": 100_000}, queues={"credit_window": 4},
                                paging=NO_PAGING)
        producer = await world.client("a", "producer")
        relay = producer.sender(None)
        await world.until(lambda: relay.credit > 0, what="credit")
        sent = {"one": [], "two": []}
        count = 0
        while relay.credit > 0:  # until the node withholds credit
            to = ("one", "two")[count % 2]
            send_to(relay, to, count)
            sent[to].append(count)
            count += 1
            await world.quiet(0.01)
            assert count < 50, "relay credit went on past max_memory"
        await world.until(lambda: relay.accepted() == count, what="all accepted")
        used = node.queues.memory.used
        assert 100_000 <= used <= 100_000 + 4 * len(BODY) + 1000  # credit given before
        other = producer.sender(None)  # a second relay link: no credit either
        await world.quiet(0.5)
        assert relay.credit == 0 and other.credit == 0
        assert len(node.queues.memory.waiting) == 2  # both topped up once use falls
        relay.link.close()  # a waiting link that goes away is not kept
        producer.flush()
        await world.until(lambda: len(node.queues.memory.waiting) == 1, what="closed link forgotten")

        consumer = await world.client("a", "consumer")
        got = await receive_all(world, consumer, "one", len(sent["one"]))  # consumers go on
        await world.until(lambda: other.credit > 0, what="credit again once below max_memory")
        got += await receive_all(world, consumer, "two", len(sent["two"]))
        assert sorted(got) == list(range(count))  # nothing accepted is lost, nothing twice
        await world.close()

    run(play)


def test_the_anonymous_relay_is_refused_by_a_full_reject_publish_queue_as_a_direct_send(tmp_path):
    async def play():
        world = World(tmp_path)
        node = await world.node("a", queue=[{"name": "direct", "max_bytes": 50_000},
                                            {"name": "relayed", "max_bytes": 50_000}])
        client = await world.client("a")
        direct, relay = client.sender("direct"), client.sender(None)
        await world.until(lambda: direct.credit > 0 and relay.credit > 0, what="credit")
        for i in range(8):  # more than either queue takes, on the credit given at attach
            direct.send(BODY, message_id=i)
            send_to(relay, "relayed", i)
        await world.until(lambda: len(direct.outcomes) == 8 and len(relay.outcomes) == 8,
                          what="16 outcomes")
        assert relay.accepted() == direct.accepted() == 4
        assert outcome_conditions(relay) == outcome_conditions(direct) \
            == ["amqp:resource-limit-exceeded"] * 4
        queue = node.queues.get("relayed")
        assert queue.bytes <= queue.max_bytes
        assert await receive_all(world, client, "relayed", 4) == [0, 1, 2, 3]  # every accepted one
        await world.close()

    run(play)


def test_an_exchange_store_into_a_full_reject_publish_queue_is_refused(tmp_path):
    """Nothing accepted is lost: a bound queue at max_bytes rejects (the client is told) instead
    of taking the message past its limit; the other bound queue keeps its copy."""
    async def play():
        world = World(tmp_path)
        node = await world.node("a", queue=[{"name": "small", "max_bytes": 50_000}],
                                exchanges=[{"name": "events", "type": "fanout"}],
                                bindings=[{"exchange": "events", "queue": "small"},
                                          {"exchange": "events", "queue": "all"}])
        client = await world.client("a")
        sender = client.sender("events")
        await world.until(lambda: sender.credit > 0, what="credit")
        for i in range(8):  # on the credit given at attach, while "small" was empty
            sender.send(BODY, message_id=i)
        await world.until(lambda: len(sender.outcomes) == 8, what="8 outcomes")
        assert sender.accepted() == 4
        assert outcome_conditions(sender) == ["amqp:resource-limit-exceeded"] * 4
        small = node.queues.get("small")
        assert small.bytes <= small.max_bytes
        assert await receive_all(world, client, "small", 4) == [0, 1, 2, 3]
        assert await receive_all(world, client, "all", 8) == list(range(8))  # duplicates, not loss
        await world.close()

    run(play)


def test_the_anonymous_relay_into_an_exchange_respects_its_queues_depth(tmp_path):
    async def play():
        world = World(tmp_path)
        await world.node("a", queue=[{"name": "bounded", "max_depth": 2}],
                         exchanges=[{"name": "events", "type": "fanout"}],
                         bindings=[{"exchange": "events", "queue": "bounded"}])
        client = await world.client("a")
        relay = client.sender(None)
        await world.until(lambda: relay.credit > 0, what="credit")
        for i in range(3):
            send_to(relay, "events", i)
        await world.until(lambda: len(relay.outcomes) == 3, what="3 outcomes")
        assert sorted(relay.outcomes.values(), key=str) == sorted(
            [Delivery.ACCEPTED, Delivery.ACCEPTED, Delivery.RELEASED], key=str)
        assert await receive_all(world, client, "bounded", 2) == [0, 1]
        await world.close()

    run(play)
