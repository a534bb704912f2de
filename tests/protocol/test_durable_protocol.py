"""Durable queues at the protocol level: real proton clients pumped in memory
against the real broker, with a real journal on disk (no loop: ``sync()``
stands for "the writer thread finished an fsync").
"""

from __future__ import annotations

import pytest
from memory import Harness
from proton import Delivery, Message

from proxy.journal.journal import Journal


@pytest.fixture
def durable(tmp_path):
    """A harness whose broker journals durable messages of queue ``d`` (dead letters: ``dlq``)."""
    harness = Harness(credit_window=10)
    journal = Journal(tmp_path / "journal", fsync=False)
    journal.open()
    harness.broker.journal = journal
    harness.queues.declare("d", durable=True, dead_letter="dlq")
    harness.queues.declare("dlq", durable=True)
    harness.queues.declare("plain", durable=False)
    harness.journal = journal
    harness.directory = tmp_path / "journal"
    yield harness
    journal.close()


def durable_message(n: int, durable: bool = True) -> Message:
    return Message(id=f"m{n}", body=f"body {n}", durable=durable)


def flush_journal(harness) -> None:
    """Transfers reach the broker, the journal writes them, the answers go out."""
    harness.pump()
    harness.journal.sync()
    harness.pump()


def recovered_ids(directory, tmp_path) -> dict[str, list[str]]:
    """What a restart would put back: a fresh journal over a copy of the directory."""
    import shutil

    copy = tmp_path / "recovered"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(directory, copy)
    journal = Journal(copy, fsync=False)
    recovered = journal.open()
    journal.close()
    result = {}
    for queue, messages in recovered.queues.items():
        ids = []
        for _, payload in messages:
            message = Message()
            message.decode(payload)
            ids.append(message.id)
        result[queue] = ids
    return result


def test_producer_is_settled_only_once_the_journal_is_durable(durable):
    client = durable.client()
    sender = client.sender("d")
    receiver = client.receiver("d", credit=10)
    deliveries = [client.send(sender, durable_message(n)) for n in range(3)]
    durable.pump()
    assert not any(d.remote_state for d in deliveries), "no outcome yet"
    assert not any(d.settled for d in deliveries)
    assert client.received(receiver) == [], "not visible before it is durable"

    flush_journal(durable)
    assert [d.remote_state for d in deliveries] == [Delivery.ACCEPTED] * 3
    assert [r.message.id for r in client.received(receiver)] == ["m0", "m1", "m2"]


def test_credit_counts_deliveries_waiting_for_the_disk(durable):
    client = durable.client()
    sender = client.sender("d")
    assert sender.credit == 10
    for n in range(10):
        client.send(sender, durable_message(n))
    durable.pump()
    assert sender.credit == 0, "no new credit while 10 deliveries wait for the journal"
    flush_journal(durable)
    assert sender.credit == 10


def test_depth_limit_counts_messages_waiting_for_the_disk(tmp_path):
    harness = Harness(credit_window=10)
    journal = Journal(tmp_path / "j", fsync=False)
    journal.open()
    harness.broker.journal = journal
    harness.queues.declare("small", durable=True, max_depth=4)
    try:
        client = harness.client()
        sender = client.sender("small")
        assert sender.credit == 4
        for n in range(4):
            client.send(sender, durable_message(n))
        harness.pump()
        assert sender.credit == 0
        journal.sync()
        harness.pump()
        assert sender.credit == 0, "queue full: still no credit"
        assert harness.queues.get("small").depth == 4
    finally:
        journal.close()


def test_message_without_durable_header_keeps_its_place_behind_durable_ones(durable):
    client = durable.client()
    sender = client.sender("d")
    receiver = client.receiver("d", credit=10)
    first = client.send(sender, durable_message(0))
    second = client.send(sender, durable_message(1, durable=False))
    durable.pump()
    assert not second.remote_state, "waits behind the durable one"
    flush_journal(durable)
    assert (first.remote_state, second.remote_state) == (Delivery.ACCEPTED, Delivery.ACCEPTED)
    assert [r.message.id for r in client.received(receiver)] == ["m0", "m1"]
    # alone, a non-durable message is accepted at once
    third = client.send(sender, durable_message(2, durable=False))
    durable.pump()
    assert third.remote_state == Delivery.ACCEPTED
    assert durable.journal.stats.enqueued == 1


def test_non_durable_queue_does_not_journal(durable):
    client = durable.client()
    sender = client.sender("plain")
    delivery = client.send(sender, durable_message(0))
    durable.pump()
    assert delivery.remote_state == Delivery.ACCEPTED
    assert durable.journal.stats.enqueued == 0


def test_presettled_durable_messages_are_journaled_and_delivered(durable, tmp_path):
    client = durable.client()
    sender = client.sender("d", presettled=True)
    for n in range(3):
        client.send(sender, durable_message(n))
    durable.pump()
    flush_journal(durable)
    assert recovered_ids(durable.directory, tmp_path) == {"d": ["m0", "m1", "m2"]}


def test_outcomes_are_journaled_restart_keeps_exactly_the_unsettled(durable, tmp_path):
    client = durable.client()
    sender = client.sender("d")
    for n in range(6):
        client.send(sender, durable_message(n))
    flush_journal(durable)
    receiver = client.receiver("d", credit=6)
    got = client.received(receiver)
    assert [r.message.id for r in got] == [f"m{n}" for n in range(6)]
    got[0].delivery.update(Delivery.ACCEPTED)
    got[0].delivery.settle()
    got[1].delivery.update(Delivery.REJECTED)  # dead-lettered to dlq (durable)
    got[1].delivery.settle()
    got[2].delivery.update(Delivery.RELEASED)  # back in the queue
    got[2].delivery.settle()
    durable.pump()
    flush_journal(durable)
    # m2 (released, redelivered), m3..m5 delivered and unsettled: all still live
    assert recovered_ids(durable.directory, tmp_path) == {
        "d": ["m2", "m3", "m4", "m5"], "dlq": ["m1"]}


def test_producer_gone_before_the_disk_answers(durable, tmp_path):
    """Its messages are still enqueued once durable (a restart would have them too)."""
    client = durable.client()
    sender = client.sender("d")
    for n in range(3):
        client.send(sender, durable_message(n))
    durable.pump()
    durable.drop(client)
    flush_journal(durable)
    other = durable.client()
    receiver = other.receiver("d", credit=10)
    assert [r.message.id for r in other.received(receiver)] == ["m0", "m1", "m2"]
    assert recovered_ids(durable.directory, tmp_path) == {"d": ["m0", "m1", "m2"]}
