"""Durable queues over TCP: real node processes killed with SIGKILL and restarted
on the same data dir, producers and consumers in their own processes.
"""

from __future__ import annotations

import collections
import resource
import selectors
import subprocess

from conftest import PYTHON, ROOT, NodeProcess
from proton import Delivery, Message
from proton.utils import BlockingConnection

# batch_delay: each group commit waits 200 ms for more records, which widens the
# window in which a node that settled before writing would lose accepted messages
DURABLE = {"queues": {"durable": True},
           "journal": {"segment_size": 256 * 1024, "batch_delay": 0.2}}


def ids_of(lines) -> list[str]:
    return [line["id"] for line in lines if "id" in line]


def drain(clients, url, *addresses) -> list[list[dict]]:
    """Every message of each queue (receivers side by side), accepted, until each
    queue stays empty for 3 s."""
    receivers = [clients("proton", "receive", url, address=address, count=0, credit=500,
                         idle_ms=3000, timeout_ms=90000) for address in addresses]
    return [[line for line in receiver.finish(timeout=120) if "id" in line]
            for receiver in receivers]


def test_sigkill_during_load_every_accepted_message_is_delivered_after_restart(
        start_node, clients):
    node = start_node(DURABLE)
    holder = clients("proton", "receive", node.url, address="orders", credit=20, hold=True,
                     timeout_ms=120000)
    producer = clients("proton", "send", node.url, address="orders", count=100000, prefix="p",
                       durable=True, report_accepted=True, timeout_ms=120000)
    held = [holder.readline(timeout=30)["id"] for _ in range(20)]
    accepted = []
    while len(accepted) < 3000:
        line = producer.readline(timeout=30)
        assert "accepted_id" in line, line
        accepted.append(line["accepted_id"])
    node.kill()  # SIGKILL mid-stream
    tail = producer.finish(timeout=30)
    accepted += [line["accepted_id"] for line in tail if "accepted_id" in line]
    (result,) = [line for line in tail if "sent" in line]
    assert result["error"] is not None and result["sent"] < 100000, "killed mid-stream"
    holder.kill()

    node.start()  # same config, same data dir
    (lines,) = drain(clients, node.url, "orders")
    received = ids_of(lines)
    counts = collections.Counter(received)
    lost = set(accepted) - set(received)
    assert not lost, f"{len(lost)} accepted messages lost, e.g. {sorted(lost)[:5]}"
    assert [i for i, c in counts.items() if c > 1] == [], "no message twice after the restart"
    assert set(received) <= {f"p-{n}" for n in range(result["sent"])}
    # delivered before the crash but never settled: they come back (the only duplicates)
    assert set(held) <= set(received)
    assert [line["seq"] for line in lines] == sorted(line["seq"] for line in lines), \
        "restored in the order they were accepted"
    print(f"accepted {len(accepted)}, sent {result['sent']}, received after restart "
          f"{len(received)}, delivered twice (held at the crash) {len(set(held) & set(received))}")


def test_restart_restores_exactly_the_unsettled_messages(start_node, clients):
    config = {
        "queues": {"durable": False},
        "queue": [
            {"name": "keep", "durable": True, "dead_letter": "keep.dlq"},
            {"name": "keep.dlq", "durable": True},
            {"name": "plain"},
        ],
    }
    node = start_node(config)
    conn = BlockingConnection(node.url, timeout=10)
    keep = conn.create_sender("keep")
    for n in range(10):
        keep.send(Message(id=f"m{n}", body=n, durable=True))
    for n in range(2):
        keep.send(Message(id=f"n{n}", body=n))  # no durable header: not journaled
    plain = conn.create_sender("plain")
    for n in range(3):
        plain.send(Message(id=f"p{n}", body=n, durable=True))  # queue not durable
    (sent,) = clients("rhea", "send", node.url, address="keep", count=5, prefix="r",
                      durable=True).finish()
    assert sent["accepted"] == 5

    receiver = conn.create_receiver("keep", credit=1)
    assert receiver.receive(timeout=10).id == "m0"
    receiver.accept()
    assert receiver.receive(timeout=10).id == "m1"
    receiver.reject()  # dead-lettered into keep.dlq
    assert receiver.receive(timeout=10).id == "m2"
    receiver.release(delivered=False)  # back to the head
    assert receiver.receive(timeout=10).id == "m2"  # delivered again, left unsettled
    # Outcomes are journaled without making anyone wait; a durable send accepted
    # after them (same connection, so processed after them) proves they are on disk.
    keep.send(Message(id="marker", body="last", durable=True))
    node.kill()  # (the blocking connection dies with it; nothing to close)

    node.start()
    drained = drain(clients, node.url, "keep", "keep.dlq", "plain")
    keep, dead, plain = (ids_of(lines) for lines in drained)
    assert keep == [f"m{n}" for n in range(2, 10)] + [f"r-{n}" for n in range(5)] + ["marker"]
    assert dead == ["m1"]
    assert plain == []


def start_with_file_size_limit(tmp_path, config: dict, limit: int) -> NodeProcess:
    """A node whose files cannot grow past ``limit`` bytes: journal writes fail (EFBIG)."""
    node = NodeProcess(tmp_path, config, "limited")

    def apply_limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    node.log = open(node.log_path, "ab")
    node.proc = subprocess.Popen(
        [PYTHON, "-m", "proxy", "serve", "--config", str(node.config_path)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=node.log, preexec_fn=apply_limit,
    )
    selector = selectors.DefaultSelector()
    selector.register(node.proc.stdout, selectors.EVENT_READ)
    line = node.proc.stdout.readline().decode() if selector.select(15) else ""
    if "listening on" not in line:
        node.stop()
        raise RuntimeError(f"node did not start: {line!r}\n{node.log_path.read_text()}")
    return node


def test_journal_write_failure_rejects_durable_sends_and_the_node_keeps_serving(tmp_path):
    config = {"queue": [{"name": "big", "durable": True}, {"name": "plain"}]}
    node = start_with_file_size_limit(tmp_path, config, 1024 * 1024)
    conn = None
    try:
        conn = BlockingConnection(node.url, timeout=10)
        big = conn.create_sender("big")
        outcomes = []
        for n in range(40):
            delivery = big.send(Message(id=f"b{n}", body=b"x" * 65536, durable=True),
                                error_states=[])
            outcomes.append(delivery.remote_state)
            if delivery.remote_state == Delivery.REJECTED:
                condition = delivery.remote.condition
                break
        accepted = outcomes.count(Delivery.ACCEPTED)
        assert outcomes[-1] == Delivery.REJECTED and 5 < accepted < 16, outcomes
        assert condition.name == "amqp:internal-error" and "journal" in condition.description
        again = big.send(Message(id="late", body=b"y", durable=True), error_states=[])
        assert again.remote_state == Delivery.REJECTED

        plain = conn.create_sender("plain")
        plain.send(Message(id="still", body="served"))
        receiver = conn.create_receiver("plain", credit=1)
        assert receiver.receive(timeout=10).id == "still"
        receiver.accept()
        receiver = conn.create_receiver("big", credit=accepted)
        got = []
        for _ in range(accepted):
            got.append(receiver.receive(timeout=10).id)
            receiver.accept()
        assert got == [f"b{n}" for n in range(accepted)], "what was accepted is delivered"
        assert node.alive()
    finally:
        if conn is not None:
            conn.close()
        node.stop()
    assert "journal write failed" in node.log_path.read_text()
