"""A node's local queues over TCP, with proton-python and rhea clients in their own processes."""

from __future__ import annotations

import collections

import pytest
from proton import Message, Timeout
from proton.utils import BlockingConnection, SendException

CLIENTS = ["proton", "rhea"]
SENDERS, PER_SENDER, RECEIVERS = 3, 2000, 3


def received_ids(lines):
    return [line["id"] for line in lines if "id" in line]


@pytest.mark.parametrize("kind", CLIENTS)
def test_message_set_three_senders_three_competing_receivers(node, clients, kind):
    receivers = [
        clients(kind, "receive", node.url, address="work", count=0, credit=50, idle_ms=3000,
                timeout_ms=90000)
        for _ in range(RECEIVERS)
    ]
    senders = [
        clients(kind, "send", node.url, address="work", count=PER_SENDER, prefix=f"p{i}",
                timeout_ms=90000)
        for i in range(SENDERS)
    ]
    for sender in senders:
        (result,) = sender.finish()
        assert result["error"] is None and result["accepted"] == PER_SENDER
    per_receiver = [received_ids(r.finish(timeout=90)) for r in receivers]
    everything = [i for ids in per_receiver for i in ids]
    expected = {f"p{s}-{n}" for s in range(SENDERS) for n in range(PER_SENDER)}
    duplicates = [i for i, c in collections.Counter(everything).items() if c > 1]
    assert set(everything) == expected, f"lost: {len(expected - set(everything))}"
    assert duplicates == []
    assert all(len(ids) > 0 for ids in per_receiver), "competing receivers all got work"


def test_rhea_sends_proton_receives_in_producer_order(node, clients):
    (sent,) = clients("rhea", "send", node.url, address="mixed", count=500, prefix="r").finish()
    assert sent["accepted"] == 500
    lines = clients("proton", "receive", node.url, address="mixed", count=500).finish()
    assert [line["seq"] for line in lines if "id" in line] == list(range(500))


def test_killed_receiver_unsettled_deliveries_reach_another(node, clients):
    (sent,) = clients("proton", "send", node.url, address="jobs", count=20, prefix="j").finish()
    assert sent["accepted"] == 20
    holder = clients("proton", "receive", node.url, address="jobs", credit=5, hold=True)
    held = [holder.readline()["id"] for _ in range(5)]
    holder.kill()  # SIGKILL with 5 unsettled deliveries
    lines = clients("rhea", "receive", node.url, address="jobs", count=20).finish()
    got = {line["id"]: line["delivery_count"] for line in lines if "id" in line}
    assert set(got) == {f"j-{i}" for i in range(20)}
    assert all(got[i] == 1 for i in held), "redelivered ones carry delivery-count 1"


def test_release_and_modified_redelivery(node):
    conn = BlockingConnection(node.url, timeout=10)
    try:
        sender = conn.create_sender("retry")
        sender.send(Message(id="x", body="x"))
        receiver = conn.create_receiver("retry", credit=1)
        first = receiver.receive(timeout=5)
        receiver.release(delivered=False)  # released
        again = receiver.receive(timeout=5)
        assert (first.id, again.id, again.delivery_count) == ("x", "x", 0)
        receiver.release(delivered=True)  # modified (the flags are the client's choice)
        third = receiver.receive(timeout=5)
        assert third.id == "x"
        receiver.accept()
    finally:
        conn.close()


def test_temporary_queue_is_gone_after_detach(start_node, clients):
    node = start_node({"queues": {"auto_create": False}})
    conn = BlockingConnection(node.url, timeout=10)
    try:
        temp = conn.create_receiver(None, dynamic=True, credit=1)
        address = temp.link.remote_source.address
        conn.create_sender(address).send(Message(body="to temp"))
        assert temp.receive(timeout=5).body == "to temp"
        temp.accept()
        temp.close()
    finally:
        conn.close()
    lines = clients("rhea", "receive", node.url, address=address, count=1, timeout_ms=10000).finish()
    assert lines[-1]["error"]["condition"] == "amqp:not-found"


def test_depth_limit_backpressure_loses_nothing(start_node, clients):
    node = start_node({"queues": {"max_depth": 50}})
    producer = clients("rhea", "send", node.url, address="bounded", count=300, prefix="b",
                       timeout_ms=60000)
    conn = BlockingConnection(node.url, timeout=10)
    try:
        probe = conn.create_sender("bounded")
        assert probe.link.credit <= 50  # never more credit than room in the queue
        with pytest.raises((SendException, Timeout)):  # full: no credit, the send cannot complete
            for _ in range(51):
                probe.send(Message(body="probe"), timeout=2)
    finally:
        conn.close()
    lines = clients("proton", "receive", node.url, address="bounded", count=0, idle_ms=3000,
                    timeout_ms=60000).finish(timeout=90)
    (sent,) = producer.finish()
    assert sent["accepted"] == 300
    ids = [line["id"] for line in lines if str(line.get("id")).startswith("b-")]
    assert sorted(ids) == sorted(f"b-{i}" for i in range(300))


def test_presettled_sends_and_receives(node, clients):
    (sent,) = clients("rhea", "send", node.url, address="fast", count=200, presettled=True).finish()
    assert sent["error"] is None
    conn = BlockingConnection(node.url, timeout=10)
    try:
        from proton.reactor import AtMostOnce

        receiver = conn.create_receiver("fast", credit=200, options=AtMostOnce())
        got = [receiver.receive(timeout=5).id for _ in range(200)]
        assert len(set(got)) == 200
    finally:
        conn.close()


def test_node_ends_clients_connections_on_sigterm_so_they_fail_over(start_node, clients):
    """SIGTERM: every client connection is reset (issue #42: a close frame, even with
    amqp:connection:forced, leaves python-qpid-proton's Container waiting for good); rhea sees
    its connection broken, a proton Container client with a URL list goes on at the next node."""
    node, other = start_node(name="n1"), start_node(name="n2")
    waiting = clients("rhea", "receive", node.url, address="idle", count=1, timeout_ms=20000,
                      announce=True)
    assert waiting.readline() == {"attached": "idle"}  # the receiver is in place
    sender = clients("python", "send", f"{node.url},{other.url}", address="q", count=400, rate=100,
                     failover=True, report_accepted=True)
    assert "accepted_id" in sender.readline()  # sending through n1
    assert node.stop() == 0
    lines = waiting.finish()
    assert lines[-1]["error"] is not None  # the connection broke
    done = sender.finish()
    assert {"event": "disconnected", "url": node.url} in done
    assert done[-1]["accepted"] == 400 and done[-1]["error"] is None


def test_a_proton_container_client_fails_over_when_its_node_stops(start_node, tmp_path):
    """python-qpid-proton's own Container with reconnect and a URL list (no failover code of
    its own: tests/nemesis/client.py): SIGTERM of its node breaks the connection (issue #42:
    after a close frame, even amqp:connection:forced, the Container waited for good) and it
    goes on at the next URL; every message it was told was accepted is on one node or the
    other, and nothing is left without an outcome."""
    import json
    import subprocess
    import time

    from conftest import PYTHON, TESTS

    n1, n2 = start_node(name="n1"), start_node(name="n2")
    out = tmp_path / "history.jsonl"
    producer = subprocess.Popen(
        [PYTHON, str(TESTS / "nemesis" / "client.py"), "produce", "--urls", f"{n1.url},{n2.url}",
         "--address", "q", "--process", "p", "--rate", "50", "--seconds", "4", "--grace", "4"],
        stdout=open(out, "wb"))
    time.sleep(1.5)
    assert n1.stop() == 0
    producer.wait(timeout=20)
    ops = [json.loads(line) for line in out.read_text().splitlines()]
    events = [op["event"] for op in ops if "event" in op]
    assert events[:1] == ["reconnected"] and "disconnected" in events and events[-1] == "reconnected"
    accepted = [op for op in ops if op.get("type") == "ok"]
    after = [op for op in accepted if op["time"] > ops[[op.get("event") for op in ops].index(
        "disconnected")]["time"]]
    assert len(after) > 50  # it went on at n2
    assert not [op for op in ops if op.get("type") == "info"]  # every message had an outcome
