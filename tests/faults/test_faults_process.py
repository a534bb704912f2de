"""Process faults: a primary or a fragment's home node SIGKILLed mid-stream, then restarted.

What a user checks: every message the primary (or home fragment) accepted
is delivered after the restart (producers print each accepted id with
``--report-accepted``), bodies intact; duplicates are counted and printed
(at-least-once: what was delivered but not yet settled at the crash comes
back). Durable messages on durable queues, since a process dies.

* fedgate primary: producers -> node P -> primary (``[queues] durable``);
  consumers on node Q (also proxying to the primary). P keeps its clients'
  links attached while the primary is down and replays its in-flight sends
  after reconnecting, so the producers finish with every message accepted.
* RabbitMQ primary (3.10, and 4.0 with a quorum queue): the same producers through P;
  RabbitMQ's server VM is SIGKILLed (``toxi.kill_rabbitmq``) and started again; then the queue is
  drained directly from RabbitMQ. The queue is declared durable and written
  to disk beforehand, as an operator's queue would be: RabbitMQ can lose a
  queue declared a moment before a crash, messages and all
  (``brokers.rabbitmq_declare_durable_queue``).
* fragments: producers on n1 (home fragment), consumers on n2 stealing from
  it; n1 is SIGKILLed while n2's consumers hold stolen messages unsettled,
  and restarted on the same data dir: its journal puts back everything not
  yet settled, and n2 steals it again.
"""

from __future__ import annotations

import time
import uuid

import brokers
import pytest
from conftest import free_port
from fault_workload import MessageSet
from fragment_cluster import TOKEN, admin
from toxi import kill_rabbitmq

ADMIN = {"tokens": [{"token": TOKEN, "role": "admin"}]}
DURABLE = {"durable": True}
JOURNAL = {"segment_size": 1024 * 1024}
PRODUCERS = 4
PER_PRODUCER = 1500
CONSUMERS = 2
CREDIT = 50


def reconnects(node) -> int:
    return int(admin(node, "/api/v1/upstreams")["reconnects"])


def report(name: str, run: MessageSet, result, **extra) -> None:
    accepted = result.accepted_ids
    print(f"\nPROCESS {name}: accepted={len(accepted)} received={len(result.received)} "
          f"lost={len(accepted - set(result.received))} duplicates={result.duplicates} "
          + " ".join(f"{k}={v}" for k, v in extra.items()))


def test_fedgate_primary_killed_mid_stream_loses_nothing_it_accepted(start_node, clients):
    started = time.monotonic()
    primary = start_node({"queues": {**DURABLE, "credit_window": 100}, "journal": JOURNAL,
                          "limits": {"idle_timeout": 4.0}}, name="primary")
    rule = {"name": "orders", "match": "orders.#", "kind": "proxy", "primary": primary.url,
            "upstream": {"heartbeat": 1.0}}
    proxy_p = start_node({"admin": ADMIN, "rules": [rule]}, name="p")
    proxy_q = start_node({"admin": ADMIN, "rules": [rule]}, name="q")
    run = MessageSet(clients, send_url=proxy_p.url, receive_url=proxy_q.url,
                     address="orders.durable", producers=PRODUCERS, per_producer=PER_PRODUCER,
                     consumers=CONSUMERS, credit=CREDIT, rate=300, timeout_ms=60000,
                     durable=True, report_accepted=True)
    try:
        run.start()
        run.wait_received(len(run.expected) // 5, timeout=30)
        accepted_before = len(run.accepted_ids())
        primary.kill()  # SIGKILL: no shutdown, the journal is all that is left
        primary.start()  # same config, port and data dir
        result = run.finish(timeout=60)
    finally:
        run.stop()
    report("fedgate-primary", run, result, accepted_at_kill=accepted_before,
           reconnects=reconnects(proxy_p) + reconnects(proxy_q),
           seconds=f"{time.monotonic() - started:.1f}")
    assert result.corrupt == [] and result.consumer_errors == [], (result.corrupt, result.consumer_errors)
    assert 0 < accepted_before < len(run.expected), "killed mid-stream"
    lost = result.accepted_ids - set(result.received)
    assert not lost, f"{len(lost)} accepted messages lost, e.g. {sorted(lost)[:5]}"
    # the proxy replayed what was in flight: every producer ended with everything accepted
    for final in result.producers:
        assert final.get("error") is None and final.get("accepted") == PER_PRODUCER, final
    assert set(result.received) == run.expected
    assert reconnects(proxy_p) >= 1 and reconnects(proxy_q) >= 1


RABBITS = {  # version: (url, durable declare, count, delete, rule remote, direct address)
    3: (brokers.RABBITMQ_URL, brokers.rabbitmq_declare_durable_queue, brokers.rabbitmq_queue_count,
        brokers.rabbitmq_delete_queue, "/queue/{1}", "/amq/queue/{0}"),
    4: (brokers.RABBITMQ4_URL, brokers.rabbitmq4_declare_durable_queue,
        brokers.rabbitmq4_queue_count, brokers.rabbitmq4_delete_queue, "/queues/{1}", "/queues/{0}"),
}


@pytest.fixture(params=[3, 4], ids=["rabbitmq", "rabbitmq4"])
def rabbitmq_queue(request):
    """(RabbitMQ version, queue name). The queue is declared durable (on 4.0 a quorum
    queue) and written to disk before the test: a queue RabbitMQ declared a moment before
    a SIGKILL can be gone after it, with its messages."""
    version = request.param
    _, declare, _, delete, _, _ = RABBITS[version]
    (brokers.ensure_rabbitmq if version == 3 else brokers.ensure_rabbitmq4)()
    name = f"fg-kill-{uuid.uuid4().hex[:8]}"
    declare(name)
    yield version, name
    (brokers.ensure_rabbitmq if version == 3 else brokers.ensure_rabbitmq4)()  # a failed test may have left it down
    delete(name)


def test_rabbitmq_killed_mid_stream_loses_nothing_it_accepted(start_node, clients, rabbitmq_queue):
    version, queue = rabbitmq_queue
    url, _, queue_count, _, remote, direct = RABBITS[version]
    started = time.monotonic()
    proxy_p = start_node({"admin": ADMIN, "rules": [
        {"name": "rq", "match": "rq.*", "kind": "proxy", "primary": url,
         "remote": remote, "upstream": {"heartbeat": 1.0}}]}, name="p")
    run = MessageSet(clients, send_url=proxy_p.url, receive_url=url,
                     address=f"rq.{queue}", producers=PRODUCERS,
                     per_producer=PER_PRODUCER, rate=300, timeout_ms=120000, durable=True,
                     report_accepted=True)
    try:
        run.start_producers()
        deadline = time.monotonic() + 30
        while len(run.accepted_ids()) < len(run.expected) // 5:
            assert time.monotonic() < deadline, "RabbitMQ accepted too little in 30 s"
            time.sleep(0.05)
        accepted_before = len(run.accepted_ids())
        kill_started = time.monotonic()
        kill_rabbitmq(restart=True, version=version)  # SIGKILL beam.smp, then start it again
        restart_seconds = time.monotonic() - kill_started
        # what RabbitMQ kept: nothing consumes yet, so a count below what it
        # had accepted before the kill is a loss inside RabbitMQ, not the proxy
        queued_after_restart = queue_count(queue)
        finals = run.wait_producers(timeout=120)
        # drain directly from RabbitMQ (the queue as it is: no re-declare)
        run.address = direct.format(queue)
        run.start_consumers()
        result = run.finish(timeout=60, want=run.accepted_ids())
    finally:
        run.stop()
    report(f"rabbitmq{version}", run, result, accepted_at_kill=accepted_before,
           queued_after_restart=queued_after_restart,
           restart=f"{restart_seconds:.1f}s", reconnects=reconnects(proxy_p),
           seconds=f"{time.monotonic() - started:.1f}")
    assert result.corrupt == [] and result.consumer_errors == [], (result.corrupt, result.consumer_errors)
    assert 0 < accepted_before < len(run.expected), "killed mid-stream"
    lost = result.accepted_ids - set(result.received)
    assert not lost, (f"{len(lost)} accepted messages lost, e.g. {sorted(lost)[:5]}; RabbitMQ held "
                      f"{queued_after_restart} messages after its restart, {accepted_before} had "
                      f"been accepted before the kill")
    for final in finals:
        assert final.get("error") is None and final.get("accepted") == PER_PRODUCER, final
    assert reconnects(proxy_p) >= 1


def test_home_fragment_killed_while_a_stealer_holds_its_messages(start_node, clients):
    """n1 (home) dies while n2's consumers hold messages stolen from it, unsettled."""
    started = time.monotonic()
    ports = {"n1": free_port(), "n2": free_port()}
    rule = {"name": "work", "match": "work.#", "kind": "fragmented", "fragments": ["n1", "n2"],
            "upstream": {"heartbeat": 1.0}}
    nodes = {name: start_node({
        "node": {"listen": f"127.0.0.1:{ports[name]}"}, "admin": ADMIN,
        "queues": DURABLE, "journal": JOURNAL,
        "peers": {other: f"amqp://127.0.0.1:{ports[other]}"}, "rules": [rule]}, name=name)
        for name, other in (("n1", "n2"), ("n2", "n1"))}
    home, stealer = nodes["n1"], nodes["n2"]
    # a consumer on n2 that never settles: what it got stays unsettled at home
    holder = clients("proton", "receive", stealer.url, address="work.jobs", credit=20, hold=True,
                     timeout_ms=120000)
    run = MessageSet(clients, send_url=home.url, receive_url=stealer.url, address="work.jobs",
                     producers=PRODUCERS, per_producer=PER_PRODUCER, consumers=CONSUMERS,
                     credit=CREDIT, rate=300, timeout_ms=60000, durable=True, report_accepted=True)
    try:
        run.start()
        held = {holder.readline(timeout=30)["id"] for _ in range(20)}
        run.wait_received(len(run.expected) // 5, timeout=30)
        home.kill()  # SIGKILL the home fragment mid-stream (its producers die with it)
        finals = run.wait_producers(timeout=30)
        home.start()  # same data dir: the journal restores what was not settled
        holder.kill()  # the held messages were never settled: they must come back
        result = run.finish(timeout=60, want=run.accepted_ids())
    finally:
        run.stop()
    got = set(result.received)
    report("fragment-home", run, result, held=len(held), held_redelivered=len(held & got),
           seconds=f"{time.monotonic() - started:.1f}")
    assert result.corrupt == [] and result.consumer_errors == [], (result.corrupt, result.consumer_errors)
    assert any(final.get("error") for final in finals), "the producers were cut off mid-stream"
    lost = result.accepted_ids - got
    assert not lost, f"{len(lost)} accepted messages lost, e.g. {sorted(lost)[:5]}"
    assert held <= got, "messages held unsettled by the stealer's consumer were not redelivered"
    assert got <= run.expected
