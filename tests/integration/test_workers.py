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
from admin_client import ADMIN, ADMIN_TOKEN, admin, http
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
    ws_url = url.replace("amqp://", "ws://") + "/"  # a WebSocket producer too (rhea over ws)
    producers = [clients(kind, "send", url, address="orders", count=600, prefix=kind)
                 for kind in ("proton", "rhea")]
    producers.append(clients("rhea", "send", ws_url, address="orders", count=600, prefix="websocket"))
    names = ("proton", "rhea", "websocket")
    for producer in producers:
        (sent,) = [line for line in producer.finish(timeout=90) if "sent" in line]
        assert sent["error"] is None and sent["accepted"] == 600, sent
    got = {kind: [line for line in consumer.finish(timeout=90) if "id" in line]
           for kind, consumer in consumers.items()}
    ids = [line["id"] for lines in got.values() for line in lines]
    assert set(ids) == {f"{p}-{n}" for p in names for n in range(600)}
    assert len(ids) == 1800, f"{len(ids) - len(set(ids))} duplicates"
    for kind, lines in got.items():  # one FIFO: each producer's order holds for each consumer
        # every consumer competed, wherever it landed (how a producer's bursts split among
        # consumers with credit 20 is timing: one may see none of a fast producer's)
        assert len(lines) >= 100, f"{kind} got {len(lines)} messages"
        for producer in names:
            seqs = [line["seq"] for line in lines if line["producer"] == producer]
            assert seqs == sorted(seqs), f"{kind} got {producer}'s messages out of order"
    assert set(served_by(workers_node)) == set(range(WORKERS))  # clients on both workers


def test_what_one_worker_takes_in_another_worker_hands_out(start_node):
    # placement off: every link to a queue the other worker owns is forwarded to it
    # (with placement a connection is handed to the owner: test_workers_placement.py)
    node = start_node({"node": {"workers": WORKERS, "place_by_first_attach": False}})
    for queue in (owned_by("n1", 0, "solo"), owned_by("n1", 1, "solo")):
        producer = BlockingConnection(node.url, timeout=10)  # worker 0
        consumer = BlockingConnection(node.url, timeout=10)  # worker 1
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


@pytest.mark.parametrize("kind", ["proxied", "durable", "durable-placed"])
def test_a_worker_killed_while_a_message_set_flows_loses_nothing_accepted(start_node, clients, kind):
    """Producers on both workers; worker 1 is SIGKILLed mid-stream. Its producer's
    connection drops (what it had not heard accepted is not counted); every message
    any producer heard accepted is then drained: through a proxy rule from the
    primary, for a durable local queue (owned by worker 1) from the node once worker
    1 has restarted and recovered its journal. ``durable-placed``: placement on, both
    producers are handed to worker 1, the owner, and both connections drop."""
    from fault_workload import MessageSet

    if kind == "proxied":
        primary = start_node(name="primary")
        node = start_node({"node": {"workers": WORKERS}, "rules": [
            {"name": "up", "match": "up.*", "kind": "proxy", "primary": primary.url,
             "remote": "{1}"}]}, name="front")
        address, drain_url, drain_address = "up.flow", primary.url, "flow"
    else:
        queue = owned_by("n1", 1, "flow")
        # durable: placement off, links forwarded to a queue's owner when it dies
        node = start_node({"node": {"workers": WORKERS, "place_by_first_attach": kind != "durable"},
                           "queue": [{"name": queue, "durable": True}]})
        address, drain_url, drain_address = queue, node.url, queue
    run = MessageSet(clients, send_url=node.url, receive_url=drain_url, address=address,
                     producers=WORKERS, per_producer=1500, consumers=1, rate=300,
                     timeout_ms=60000, durable=True, report_accepted=True)
    try:
        run.start_producers()
        wait_for(lambda: sum(served_by(node).values()) >= WORKERS, 20, "a producer on each worker")
        wait_for(lambda: len(run.accepted_ids()) >= len(run.expected) // 5, 30, "a fifth accepted")
        pids = worker_pids(node)
        os.kill(pids[1], signal.SIGKILL)
        accepted_at_kill = len(run.accepted_ids())
        finals = run.wait_producers(timeout=90)
        wait_for(lambda: node.log_path.read_text().count("worker 1 ready") >= 2, 20, "worker 1 restarted")
        run.address = drain_address
        run.start_consumers()
        result = run.finish(timeout=60, want=run.accepted_ids())
    finally:
        run.stop()
    assert 0 < accepted_at_kill < len(run.expected), "killed mid-stream"
    if kind != "durable-placed":
        assert sum(1 for f in finals if f.get("error") is None) >= 1  # worker 0's producer went on
    lost = result.accepted_ids - set(result.received)
    assert not lost, f"{len(lost)} accepted messages lost, e.g. {sorted(lost)[:5]}"
    assert result.corrupt == []
    print(f"\nKILLED WORKER {kind}: accepted={len(result.accepted_ids)} received={len(result.received)} "
          f"duplicates={result.duplicates} accepted_at_kill={accepted_at_kill}")


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


def test_a_node_wide_cap_on_upstream_connections_holds_with_workers(start_node, clients):
    primary = start_node(name="primary")
    # pool_size 1, both directions: 2 connections per worker; the cap allows one worker's
    front = start_node({"node": {"workers": WORKERS},
                        "rules": [{"name": "up", "match": "up.*", "kind": "proxy",
                                   "primary": primary.url, "remote": "{1}",
                                   "upstream": {"max_connections": 2}}]}, name="front")
    consumers = [clients("proton", "receive", front.url, address="up.capped", count=0, credit=50,
                         idle_ms=4000, timeout_ms=60000) for _ in range(2)]
    wait_for(lambda: sum(served_by(front).values()) >= 2, 20, "two consumers connected")
    producers = [clients("proton", "send", front.url, address="up.capped", count=300, prefix=f"c{k}")
                 for k in range(2)]
    for producer in producers:
        (sent,) = [line for line in producer.finish(timeout=90) if "sent" in line]
        assert sent["error"] is None and sent["accepted"] == 300, sent
    ids = [line["id"] for c in consumers for line in c.finish(timeout=90) if "id" in line]
    assert sorted(ids) == sorted(f"c{k}-{n}" for k in range(2) for n in range(300))
    assert set(served_by(front)) == set(range(WORKERS))  # clients on both workers ...
    # ... and the primary saw the 2 connections of one worker, not 2 per worker
    assert len(re.findall(r"authenticated", primary.log_path.read_text())) == 2


def test_an_exchange_routes_from_every_worker_into_queues_on_every_worker(start_node):
    from exchange_support import receive_ids, send_subjects

    eu, us = owned_by("n1", 0, "orders-eu"), owned_by("n1", 1, "orders-us")
    node = start_node({"node": {"workers": WORKERS},
                       "exchanges": [{"name": "orders", "type": "topic"}],
                       "bindings": [{"exchange": "orders", "queue": eu, "key": "orders.eu"},
                                    {"exchange": "orders", "queue": us, "key": "orders.us"},
                                    {"exchange": "orders", "queue": us, "key": "orders.#"}]})
    holder = None
    try:
        for worker in range(WORKERS):  # a sender on worker 0, then (worker 0 held) on worker 1
            items = [(f"w{worker}-eu-{n}", "orders.eu") for n in range(50)] + \
                    [(f"w{worker}-us-{n}", "orders.us") for n in range(50)]
            outcomes = send_subjects(node.url, "orders", items)
            assert outcomes == {i: ("accepted", None) for i, _ in items}  # settled end to end
            if holder is None:
                holder = BlockingConnection(node.url, timeout=10)  # on worker 0, the fewest
    finally:
        if holder is not None:
            holder.close()
    assert served_by(node) == {0: 2, 1: 1}  # senders on workers 0 and 1, the holder on 0
    expected_eu = {f"w{w}-eu-{n}" for w in range(WORKERS) for n in range(50)}
    expected_us = expected_eu | {f"w{w}-us-{n}" for w in range(WORKERS) for n in range(50)}
    got_eu, got_us = receive_ids(node.url, eu), receive_ids(node.url, us)
    assert sorted(got_eu) == sorted(expected_eu)  # once each, from both workers' senders
    assert sorted(got_us) == sorted(expected_us)  # orders.# too: bound twice, one copy


def test_a_remote_source_feeds_its_queue_once_from_the_queues_owner(start_node, clients):
    from exchange_support import receive_ids

    primary = start_node(name="primary")
    audit = owned_by("n1", 1, "audit")
    node = start_node({"node": {"workers": WORKERS},
                       "bindings": [{"queue": audit, "source": {"primary": primary.url,
                                                                "address": "feed", "window": 20}}]})
    (sent,) = clients("proton", "send", primary.url, address="feed", count=100, prefix="f").finish()
    assert sent["accepted"] == 100
    got = receive_ids(node.url, audit, quiet=2.0)
    assert sorted(got) == sorted(f"f-{n}" for n in range(100))  # once each: one source, on worker 1


FRAGMENTED = {"name": "work", "match": "work.#", "kind": "fragmented", "fragments": ["n1"]}


def test_a_fragmented_queue_has_a_fragment_on_every_worker_and_steals_between_them(
        start_node, clients):
    # placement off: this is about stealing between workers, which placement makes rare
    # (a producer is handed to a consumer's worker: test_workers_placement.py)
    node = start_node({"node": {"workers": WORKERS, "place_by_first_attach": False}, "admin": ADMIN,
                       "rules": [FRAGMENTED]})
    # a consumer on each worker; then producers on each worker: no forwarding anywhere
    consumers = [clients("proton", "receive", node.url, address="work.jobs", count=0, credit=20,
                         idle_ms=4000, timeout_ms=60000) for _ in range(WORKERS)]
    wait_for(lambda: sum(served_by(node).values()) >= WORKERS, 20, "a consumer on each worker")
    producers = [clients("proton", "send", node.url, address="work.jobs", count=500, prefix=f"p{k}")
                 for k in range(WORKERS)]
    for producer in producers:
        (sent,) = [line for line in producer.finish(timeout=90) if "sent" in line]
        assert sent["error"] is None and sent["accepted"] == 500, sent
    got = [[line for line in c.finish(timeout=90) if "id" in line] for c in consumers]
    ids = [line["id"] for lines in got for line in lines]
    assert set(ids) == {f"p{k}-{n}" for k in range(WORKERS) for n in range(500)}
    assert len(ids) == 500 * WORKERS, f"{len(ids) - len(set(ids))} duplicates"
    for lines in got:  # each producer's order holds for each consumer
        for k in range(WORKERS):
            seqs = [line["seq"] for line in lines if line["producer"] == f"p{k}"]
            assert seqs == sorted(seqs)
    fragments = admin(node, "/api/v1/fragments")["fragments"]
    assert sorted(f["local"] for f in fragments) == [f"n1/w{k}" for k in range(WORKERS)]
    assert all(f["forwarded_producers"] == 0 for f in fragments)
    assert sum(f["enqueued"] for f in fragments) == 500 * WORKERS

    # consumers on one worker only: they steal what producers left on the other
    wait_for(lambda: not admin(node, "/api/v1/connections")["connections"], 10, "clients gone")
    first = BlockingConnection(node.url, timeout=10)  # worker 0
    second = BlockingConnection(node.url, timeout=10)  # worker 1 (the fewest connections)
    try:
        connections = admin(node, "/api/v1/connections")["connections"]
        assert sorted(c["worker"] for c in connections) == list(range(WORKERS))
        sender = second.create_sender("work.jobs")
        for n in range(200):
            sender.send(Message(id=f"s-{n}", body=n))
        receiver = first.create_receiver("work.jobs", credit=50)
        stolen = []
        for _ in range(200):
            stolen.append(receiver.receive(timeout=10).id)
            receiver.accept()
        assert stolen == [f"s-{n}" for n in range(200)]
    finally:
        first.close()
        second.close()
    assert admin(node, "/api/v1/fragments")["steals"] >= 200


def start_pair(start_node, n1_workers: int = WORKERS) -> tuple:
    """Nodes n1 (with workers) and n2 (one process) sharing the fragmented queue work.#."""
    from conftest import free_port

    ports = {"n1": free_port(), "n2": free_port()}
    urls = {name: f"amqp://127.0.0.1:{port}" for name, port in ports.items()}
    rule = {"name": "work", "match": "work.#", "kind": "fragmented", "fragments": ["n1", "n2"]}
    nodes = {}
    for name, workers in (("n1", n1_workers), ("n2", 1)):
        nodes[name] = start_node({"node": {"listen": f"127.0.0.1:{ports[name]}", "workers": workers},
                                  "admin": {"tokens": [{"token": ADMIN_TOKEN, "role": "admin"}]},
                                  "peers": {p: u for p, u in urls.items() if p != name},
                                  "rules": [rule]}, name=name)
    return nodes["n1"], nodes["n2"]


def send_numbered(connection, address: str, producer: str, count: int) -> None:
    sender = connection.create_sender(address)
    for seq in range(count):
        sender.send(Message(id=f"{producer}-{seq}", body=f"message {seq}",
                            properties={"producer": producer, "seq": seq}))


def check_message_set(received: list[list[dict]], producers: dict[str, int]) -> None:
    """Every id once over all receivers, and each producer's order kept at each receiver."""
    ids = [line["id"] for lines in received for line in lines]
    want = {f"{p}-{n}" for p, count in producers.items() for n in range(count)}
    assert set(ids) == want, f"missing {sorted(want - set(ids))[:10]}"
    assert len(ids) == len(want), f"{len(ids) - len(want)} duplicates"
    for lines in received:
        for producer in producers:
            seqs = [line["seq"] for line in lines if line["producer"] == producer]
            assert seqs == sorted(seqs), f"{producer} out of order"


def test_a_group_with_other_nodes_has_a_fragment_on_every_worker_and_they_steal_from_all(
        start_node, clients):
    """Members n1 (2 workers) and n2: every worker of n1 holds a fragment, producers enqueue
    where they are, consumers on n1 steal from n2, and n2 steals what n1's workers hold."""
    n1, n2 = start_pair(start_node)
    # producers on both workers of n1 (the supervisor gives the second connection to worker 1)
    first, second = BlockingConnection(n1.url, timeout=10), BlockingConnection(n1.url, timeout=10)
    try:
        connections = admin(n1, "/api/v1/connections")["connections"]
        assert sorted(c["worker"] for c in connections) == [0, 1]
        send_numbered(first, "work.jobs", "a", 300)
        send_numbered(second, "work.jobs", "b", 300)
    finally:
        first.close()
        second.close()
    fragments = admin(n1, "/api/v1/fragments")["fragments"]
    assert sorted(f["local"] for f in fragments) == ["n1/w0", "n1/w1"]
    assert sorted(f["enqueued"] for f in fragments) == [300, 300]  # nothing forwarded
    assert all(f["forwarded_producers"] == 0 for f in fragments)

    # one consumer, on n2: its stealer lands on one worker of n1, which passes it the other's
    consumer = clients("proton", "receive", n2.url, address="work.jobs", count=600, credit=100,
                       timeout_ms=60000)
    lines = [line for line in consumer.finish(timeout=90) if "id" in line]
    check_message_set([lines], {"a": 300, "b": 300})
    fragments = admin(n1, "/api/v1/fragments")["fragments"]
    assert sum(f["depth"] for f in fragments) == 0
    assert sum(f["passed_to_other_nodes"] for f in fragments) > 0

    # the other way: a producer on n2, a consumer on each worker of n1, stealing from n2
    before = len(admin(n1, "/api/v1/connections")["connections"])  # n2's stealer, if still up
    receivers = [clients("proton", "receive", n1.url, address="work.jobs", count=0, credit=20,
                         idle_ms=4000, timeout_ms=60000) for _ in range(WORKERS)]
    wait_for(lambda: len(admin(n1, "/api/v1/connections")["connections"]) >= before + WORKERS,
             20, "the consumers on n1")
    producer = clients("proton", "send", n2.url, address="work.jobs", count=400, prefix="c")
    (sent,) = [line for line in producer.finish(timeout=90) if "sent" in line]
    assert sent["error"] is None and sent["accepted"] == 400, sent
    got = [[line for line in r.finish(timeout=90) if "id" in line] for r in receivers]
    check_message_set(got, {"c": 400})


def test_a_rejected_message_reaches_its_dead_letter_queue_from_any_worker(start_node):
    work, dead = owned_by("n1", 1, "work"), owned_by("n1", 0, "dead")  # apart on the ring
    node = start_node({"node": {"workers": WORKERS}, "queue": [{"name": work, "dead_letter": dead}]})
    producer = BlockingConnection(node.url, timeout=10)  # worker 0
    consumer = BlockingConnection(node.url, timeout=10)  # worker 1
    try:
        sender = producer.create_sender(work)
        for n in range(10):
            sender.send(Message(id=f"bad-{n}", body=n))
        receiver = consumer.create_receiver(work, credit=10)
        for _ in range(10):
            receiver.receive(timeout=10)
            receiver.reject()
        consumer.close()  # the rejects go out (a blocking client sends them when it runs)
        dead_letters = producer.create_receiver(dead, credit=10)
        got = []
        for _ in range(10):
            got.append(dead_letters.receive(timeout=10).id)
            dead_letters.accept()
        assert got == [f"bad-{n}" for n in range(10)]
    finally:
        producer.close()
        consumer.close()


@pytest.mark.parametrize("config", ["per-queue", "default"])
def test_a_dead_letter_queue_takes_expired_messages_from_every_worker(start_node, config):
    """Every queue dead-letters into one queue, which one worker owns; the others send their
    dead letters there (no queue has to move to worker 0), and the copies do not expire
    again there, as on one worker (the per-queue dead-letter queue has none of its own:
    an expired copy would be dropped)."""
    dlq = owned_by("n1", 0, "dlq")
    short = [owned_by("n1", w, "short") for w in range(WORKERS)]
    sections = ({"queue": [{"name": q, "dead_letter": dlq, "durable": True} for q in short]}
                if config == "per-queue" else {"queues": {"dead_letter": dlq, "durable": True}})
    node = start_node({"node": {"workers": WORKERS}, **sections})
    client = BlockingConnection(node.url, timeout=10)
    try:
        for queue in short:  # messages with a ttl of 0.2 s, never consumed
            sender = client.create_sender(queue)
            for n in range(20):
                sender.send(Message(id=f"{queue}-{n}", body=n, ttl=0.2, durable=True))
        time.sleep(0.3)  # past every ttl: a consumer's attach makes each queue look at its head
        for queue in short:
            client.create_receiver(queue, credit=10)
        time.sleep(0.3)  # past the ttl again: the copies in the dead-letter queue stay
        receiver = client.create_receiver(dlq, credit=100)
        got = []
        for _ in range(20 * WORKERS):
            got.append(receiver.receive(timeout=15).id)
            receiver.accept()
    finally:
        client.close()
    assert sorted(got) == sorted(f"{q}-{n}" for q in short for n in range(20))


# -- one admin API for the node ------------------------------------------------------
@pytest.fixture
def admin_node(start_node):
    return start_node({"node": {"workers": WORKERS}, "admin": ADMIN})


def test_the_admin_api_shows_every_worker_and_closes_a_connection_wherever_it_is(admin_node):
    first = BlockingConnection(admin_node.url, timeout=10)  # worker 0
    second = BlockingConnection(admin_node.url, timeout=10)  # worker 1
    try:
        queues = {w: owned_by("n1", w, "inspect") for w in range(WORKERS)}
        for queue in queues.values():  # each sent from worker 0, held by its owner
            first.create_sender(queue).send(Message(body="x"))
        # a consumer on worker 1 (its first attach: to worker 1's queue, so it stays there)
        receiver = second.create_receiver(queues[1], credit=0)
        view = admin(admin_node, "/api/v1/connections")
        assert view["count"] == 2 and view["workers"] == WORKERS and view["workers_unreachable"] == []
        by_worker = {c["worker"]: c for c in view["connections"]}
        assert set(by_worker) == {0, 1}
        assert len({c["id"] for c in view["connections"]}) == 2  # ids unique on the node
        held = {q["name"]: q for q in admin(admin_node, "/api/v1/queues")["queues"]}
        for owner, queue in queues.items():  # each queue once, shown with its owner
            assert held[queue]["worker"] == owner and held[queue]["depth"] == 1
        assert held[queues[1]]["consumers"] == 1
        node = admin(admin_node, "/api/v1/node")
        assert node["counters"]["connections"] == 2 and node["counters"]["queues"] >= 2
        metrics = http("GET", admin_node.admin_url + "/metrics")[1]
        assert 'fedgate_connections{worker="0"} 1' in metrics
        assert 'fedgate_connections{worker="1"} 1' in metrics

        def latest():  # the console's last hour: every worker's samples summed
            history = admin(admin_node, "/api/v1/history")
            return history["samples"][-1] if history["workers"] == WORKERS else {}

        sample = wait_for(lambda: latest().get("connections") == 2 and latest(), 12,
                          "a history sample with both workers' connections")
        assert all(sample["depths"].get(queue) == 1 for queue in queues.values()), sample["depths"]
        closed = admin(admin_node, f"/api/v1/connections/{by_worker[1]['id']}", method="DELETE")
        assert closed["condition"] == "amqp:connection:forced"
        with pytest.raises(Exception) as ended:
            receiver.receive(timeout=10)
        assert "amqp:connection:forced" in str(ended.value)
    finally:
        first.close()
        try:
            second.close()
        except Exception:  # closed by the administrator above
            pass


def test_a_rule_changed_through_the_admin_api_applies_on_every_worker(admin_node):
    rules = admin(admin_node, "/api/v1/rules")
    admin(admin_node, "/api/v1/rules", method="PUT", headers={"If-Match": rules_etag(admin_node)},
          body={"rules": [*rules["rules"], {"name": "no-secrets", "match": "secret.#", "kind": "deny"}]})
    connections = [BlockingConnection(admin_node.url, timeout=10) for _ in range(WORKERS)]
    try:
        for conn in connections:  # one on each worker
            with pytest.raises(Exception) as refused:
                conn.create_sender("secret.plans")
            assert "amqp:unauthorized-access" in str(refused.value)
            conn.create_sender("public.plans").send(Message(body="fine"))
    finally:
        for conn in connections:
            conn.close()
    assert set(served_by(admin_node)) == set(range(WORKERS))


def rules_etag(node) -> str:
    import urllib.request

    request = urllib.request.Request(node.admin_url + "/api/v1/rules",
                                     headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.headers["ETag"]
