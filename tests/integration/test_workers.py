"""A node with worker processes behind one listener ([node] workers, issue #18).

The semantics must not change with the number of workers: a local queue is one
FIFO with competing consumers wherever its clients land, a temporary queue
answers a reply-to from any worker, a killed worker is restarted without
disturbing the other workers' clients and without losing durable messages, and
SIGTERM stops everything. The supervisor gives each new connection to the worker
with the fewest, so the first connection lands on worker 0 and the second on
worker 1; each worker logs the connections it serves (``w<K>`` in the log).
"""

from __future__ import annotations

import collections
import os
import re
import signal
import time

import pytest
from proton import Message
from proton.utils import BlockingConnection
from proxy.workers.ownership import QueueOwners

WORKERS = 2


def wait_for(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def worker_pids(node) -> dict[int, int]:
    """The latest pid of each worker, from the supervisor's log."""
    pids = {}
    for index, pid in re.findall(r"worker (\d+) started \(pid (\d+)\)", node.log_path.read_text()):
        pids[int(index)] = int(pid)
    return pids


def served_by(node) -> collections.Counter:
    """How many client connections each worker authenticated."""
    return collections.Counter(int(w) for w in re.findall(
        r" w(\d+) fedgate\.node: connection from [\d.]+:\d+ authenticated", node.log_path.read_text()))


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def owned_by(node_id: str, worker: int, prefix: str) -> str:
    """A queue name that worker ``worker`` owns."""
    owners = QueueOwners(node_id, WORKERS)
    return next(f"{prefix}-{i}" for i in range(1000) if owners.owner(f"{prefix}-{i}") == worker)


@pytest.fixture
def workers_node(start_node):
    return start_node({"node": {"workers": WORKERS},
                       "queue": [{"name": owned_by("n1", 1, "jobs"), "durable": True}]})


def test_competing_consumers_of_three_client_libraries_share_one_queue_across_workers(
        workers_node, clients):
    url = workers_node.url
    consumers = {kind: clients(kind, "receive", url, address="orders", count=0, credit=20,
                               idle_ms=4000, timeout_ms=60000)
                 for kind in ("proton", "rhea", "go")}
    wait_for(lambda: sum(served_by(workers_node).values()) >= 3, 20, "three consumers connected")
    producers = [clients(kind, "send", url, address="orders", count=600, prefix=kind)
                 for kind in ("proton", "rhea")]
    for producer in producers:
        (sent,) = [line for line in producer.finish(timeout=90) if "sent" in line]
        assert sent["error"] is None and sent["accepted"] == 600, sent
    got = {kind: [line for line in consumer.finish(timeout=90) if "id" in line]
           for kind, consumer in consumers.items()}
    ids = [line["id"] for lines in got.values() for line in lines]
    assert set(ids) == {f"{p}-{n}" for p in ("proton", "rhea") for n in range(600)}
    assert len(ids) == 1200, f"{len(ids) - len(set(ids))} duplicates"
    for kind, lines in got.items():  # one FIFO: each producer's order holds for each consumer
        for producer in ("proton", "rhea"):
            seqs = [line["seq"] for line in lines if line["producer"] == producer]
            # and every consumer competed for every producer's messages, wherever each landed
            assert seqs, f"{kind} got none of {producer}'s messages"
            assert seqs == sorted(seqs), f"{kind} got {producer}'s messages out of order"
    assert set(served_by(workers_node)) == set(range(WORKERS))  # clients on both workers


def test_what_one_worker_takes_in_another_worker_hands_out(workers_node):
    for queue in (owned_by("n1", 0, "solo"), owned_by("n1", 1, "solo")):
        producer = BlockingConnection(workers_node.url, timeout=10)  # worker 0
        consumer = BlockingConnection(workers_node.url, timeout=10)  # worker 1
        try:
            sender = producer.create_sender(queue)
            for n in range(100):
                sender.send(Message(id=f"{queue}-{n}", body=n))
            receiver = consumer.create_receiver(queue, credit=100)
            got = []
            for _ in range(100):
                got.append(receiver.receive(timeout=10).id)
                receiver.accept()
            assert got == [f"{queue}-{n}" for n in range(100)]
        finally:
            producer.close()
            consumer.close()


def test_a_temporary_queue_answers_a_reply_to_from_another_worker(workers_node):
    first = BlockingConnection(workers_node.url, timeout=10)  # worker 0
    second = BlockingConnection(workers_node.url, timeout=10)  # worker 1
    try:
        replies = first.create_receiver(None, dynamic=True, credit=10)
        reply_to = replies.remote_source.address
        assert ".w0." in reply_to, reply_to
        sender = second.create_sender(reply_to)
        for n in range(5):
            sender.send(Message(id=f"reply-{n}", body=n))
        got = []
        for _ in range(5):
            got.append(replies.receive(timeout=10).id)
            replies.accept()
        assert got == [f"reply-{n}" for n in range(5)]
    finally:
        first.close()
        second.close()
    assert served_by(workers_node) == {0: 1, 1: 1}


def test_a_killed_worker_comes_back_with_its_durable_messages_and_others_see_nothing(workers_node):
    jobs = owned_by("n1", 1, "jobs")  # durable, on worker 1
    chat = owned_by("n1", 0, "chat")  # worker 0's
    bystander = BlockingConnection(workers_node.url, timeout=10)  # the first client: worker 0
    try:
        chat_in = bystander.create_receiver(chat, credit=50)
        chat_out = bystander.create_sender(chat)
        producer = BlockingConnection(workers_node.url, timeout=10)  # worker 1
        try:
            sender = producer.create_sender(jobs)
            for n in range(200):
                sender.send(Message(id=f"job-{n}", body=n, durable=True))
        finally:
            producer.close()
        pids = worker_pids(workers_node)
        os.kill(pids[1], signal.SIGKILL)
        wait_for(lambda: not alive(pids[1]), 10, "worker 1 to die")
        # the other worker's client goes on as if nothing happened
        for n in range(100):
            chat_out.send(Message(id=f"chat-{n}", body=n))
        heard = []
        for _ in range(100):
            heard.append(chat_in.receive(timeout=10).id)
            chat_in.accept()
        assert heard == [f"chat-{n}" for n in range(100)]
    finally:
        bystander.close()
    wait_for(lambda: worker_pids(workers_node)[1] != pids[1]
             and workers_node.log_path.read_text().count("worker 1 ready") >= 2, 20, "worker 1 restarted")
    consumer = BlockingConnection(workers_node.url, timeout=10)
    try:
        receiver = consumer.create_receiver(jobs, credit=100)
        got = []
        while len(got) < 200:
            got.append(receiver.receive(timeout=10).id)
            receiver.accept()
    finally:
        consumer.close()
    assert got == [f"job-{n}" for n in range(200)]


def test_sigterm_stops_the_supervisor_and_every_worker(workers_node):
    conn = BlockingConnection(workers_node.url, timeout=10)
    conn.create_sender("orders").send(Message(body="hello"))
    pids = worker_pids(workers_node)
    assert len(pids) == WORKERS
    started = time.monotonic()
    assert workers_node.stop(timeout=30) == 0
    assert time.monotonic() - started < 20
    assert not any(alive(pid) for pid in pids.values())
    try:
        conn.close()
    except Exception:  # the node closed it with amqp:connection:forced
        pass


def test_proxy_rules_work_from_every_worker(start_node, clients):
    primary = start_node(name="primary")
    front = start_node({"node": {"workers": WORKERS},
                        "rules": [{"name": "up", "match": "up.*", "kind": "proxy",
                                   "primary": primary.url, "remote": "{1}"}]}, name="front")
    consumers = [clients("proton", "receive", front.url, address="up.events", count=0, credit=50,
                         idle_ms=4000, timeout_ms=60000) for _ in range(2)]
    wait_for(lambda: sum(served_by(front).values()) >= 2, 20, "two consumers connected")
    (sent,) = [line for line in clients("rhea", "send", front.url, address="up.events", count=500,
                                        prefix="e").finish(timeout=90) if "sent" in line]
    assert sent["error"] is None and sent["accepted"] == 500, sent
    ids = [line["id"] for c in consumers for line in c.finish(timeout=90) if "id" in line]
    assert sorted(ids) == sorted(f"e-{n}" for n in range(500))
    assert set(served_by(front)) == set(range(WORKERS))
    # each worker has its own upstream connection: the primary served more than one
    assert len(re.findall(r"authenticated", primary.log_path.read_text())) >= WORKERS
