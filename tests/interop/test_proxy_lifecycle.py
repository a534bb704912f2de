"""Proxy link lifecycle against real primaries (RabbitMQ 3.10 and 4.0, Artemis).

* a remote that disappears under a proxied consumer: the client's link is
  detached with the primary's condition (directly, or found by the idle
  re-check when the primary says nothing);
* ``mirror_auto_delete``: one upstream consumer shared by the clients, attached
  with the first and detached with the last, so an auto-delete queue on the
  primary goes away when the last client does.

Each runs against RabbitMQ 3.10 and 4.0 where the behaviour exists on both;
the exchange re-check is RabbitMQ 3.x only (its test says why).
"""

from __future__ import annotations

import brokers
import pytest
from exchange_support import (  # noqa: F401 (rabbit, any_rabbit: fixtures)
    ADMIN,
    Rabbit,
    admin_get,
    any_rabbit,
    rabbit,
    rabbit_bound_queues,
    tag,
    upstream_members,
    wait_for,
)


def consumers(rabbit: Rabbit) -> dict[str, int]:
    """Queue name -> consumer count on ``rabbit``'s broker (3.10 or 4.0)."""
    out = rabbit.ctl("list_queues", "name", "consumers", "--no-table-headers")
    return {name: int(count) for name, _, count in (line.rpartition("\t")
                                                     for line in out.splitlines()) if name}


@pytest.fixture
def rabbits():
    """``rabbits(3)`` / ``rabbits(4)``: the helper for RabbitMQ 3.10 or 4.0, cleaned up after."""
    made: dict[int, Rabbit] = {}

    def get(version: int) -> Rabbit:
        if version not in made:
            helper = Rabbit(version)
            helper.url = brokers.ensure_rabbitmq() if version == 3 else brokers.ensure_rabbitmq4()
            made[version] = helper
        return made[version]

    yield get
    for helper in made.values():
        helper.cleanup()


def test_deleted_exchange_found_by_the_idle_recheck(rabbit, start_node, clients):
    """RabbitMQ says nothing to a subscriber when its exchange is deleted: only the re-check sees it.

    RabbitMQ 3.x only: there an ``/exchange/X/KEY`` source is a subscription queue the
    broker makes and keeps quiet about. RabbitMQ 4 attaches receivers to queues only
    (``/queues/NAME``), and a queue deleted under a consumer is told at once
    (``amqp:resource-deleted``, the next test), so there is nothing for a re-check to find.
    """
    exchange = rabbit.exchange(f"fgr-{tag()}")
    node = start_node({"admin": ADMIN, "rules": [
        {"name": "checked", "match": "chk.*.*", "kind": "proxy", "primary": rabbit.url,
         "remote": "/exchange/{1}/{2}", "upstream": {"recheck_interval": 1.0}},
        {"name": "unchecked", "match": "raw.*.*", "kind": "proxy", "primary": rabbit.url,
         "remote": "/exchange/{1}/{2}", "upstream": {"recheck_interval": 0}},
    ]})
    checked = clients("proton", "receive", node.url, address=f"chk.{exchange}.a", count=1,
                      timeout_ms=20000)
    unchecked = clients("proton", "receive", node.url, address=f"raw.{exchange}.b", count=1,
                        timeout_ms=9000)
    for key in ("a", "b"):  # both subscriptions exist on RabbitMQ (queues kept for cleanup)
        rabbit.queues += wait_for(lambda key=key: rabbit_bound_queues(exchange, key), 15,
                                  f"subscription {key}")
    wait_for(lambda: sum(p.get("rechecks", 0) for p in admin_get(node, "/api/v1/upstreams")
                         .get("upstreams", [])) >= 1, 10, "a first re-check that finds it alive")
    rabbit.delete_exchange(exchange)
    assert checked.finish(timeout=30)[-1]["error"]["condition"] == "amqp:not-found"
    assert unchecked.finish(timeout=30)[-1]["error"]["condition"] == "timeout"  # never told


@pytest.mark.parametrize("broker", ["rabbitmq", "rabbitmq4", "artemis"])
def test_deleted_queue_detaches_the_client_with_the_primarys_condition(broker, rabbits, start_node,
                                                                       clients):
    name = f"fgd-{tag()}"
    if broker.startswith("rabbitmq"):
        rabbit = rabbits(3 if broker == "rabbitmq" else 4)
        rabbit.queue(name)
        primary, remote = rabbit.url, rabbit.queue_address("{1}")

        def delete():
            rabbit.delete_queue(name)

        def consumed():
            return consumers(rabbit).get(name) == 1

        # RabbitMQ 3.10 drops the whole connection, and the re-attach is refused;
        # RabbitMQ 4.0 detaches the consumer's link with its own condition
        expected = "amqp:not-found" if broker == "rabbitmq" else "amqp:resource-deleted"
    else:
        primary = brokers.ensure_artemis()
        name = f"strict.{name}"  # not auto-created again by the re-attach
        brokers.artemis_create_queue(name)
        remote = "{1}"

        def delete():
            brokers.artemis_delete_queue(name)

        def consumed():
            return brokers.artemis_manage(f"queue.{name}", "getConsumerCount") == 1

        expected = "amqp:resource-deleted"
    node = start_node({"rules": [{"name": "dq", "match": "dq.#", "kind": "proxy", "primary": primary,
                                  "remote": remote, "upstream": {"heartbeat": 2.0}}]})
    client = clients("rhea", "receive", node.url, address=f"dq.{name}", count=1, timeout_ms=30000)
    wait_for(consumed, 15, f"the proxied consumer on {broker}")
    delete()
    assert client.finish(timeout=40)[-1]["error"]["condition"] == expected


def shared_links(node) -> int:
    return sum(1 for link in admin_get(node, "/api/v1/links")["links"]
               if link["role"] == "SharedConsumer")


def test_mirror_auto_delete_shares_one_upstream_consumer_for_its_clients(any_rabbit, start_node,
                                                                         clients):
    rabbit = any_rabbit
    t = tag()
    shared, plain = f"fga-{t}", f"fgp-{t}"
    rabbit.queue(shared, bind=("amq.topic", f"ad{t}"), auto_delete=True)
    rabbit.queue(plain, bind=("amq.topic", f"ad{t}"))
    node = start_node({"admin": ADMIN, "rules": [
        {"name": "mirror", "match": "mirror.*", "kind": "proxy", "primary": rabbit.url,
         "remote": rabbit.queue_address("{1}"), "mirror_auto_delete": True},
        {"name": "plain", "match": "plain.*", "kind": "proxy", "primary": rabbit.url,
         "remote": rabbit.queue_address("{1}")},
    ]})
    receive = dict(count=0, credit=10, idle_ms=60000, timeout_ms=60000)
    first, second = (clients("proton", "receive", node.url, address=f"mirror.{shared}", **receive)
                     for _ in range(2))
    others = [clients("proton", "receive", node.url, address=f"plain.{plain}", **receive)
              for _ in range(2)]
    wait_for(lambda: shared_links(node) == 2, 15, "both shared clients attached")
    wait_for(lambda: consumers(rabbit).get(plain) == 2, 15, "two per-link consumers (no mirror)")
    assert consumers(rabbit)[shared] == 1  # two clients, one upstream consumer

    items = [(f"m{i}", f"ad{t}") for i in range(20)]
    assert set(rabbit.publish("amq.topic", items).values()) == {("accepted", None)}
    got = []
    readers = [first, second]
    while len(got) < 20:  # the clients share the work (each message once)
        for reader in readers:
            try:
                got.append(reader.readline(timeout=0.5)["id"])
            except TimeoutError:
                pass
            if len(got) >= 20:
                break
        assert len(got) <= 20
    assert sorted(got) == sorted(i for i, _ in items)

    first.kill()
    wait_for(lambda: shared_links(node) == 1, 15, "the first client gone on the node")
    assert consumers(rabbit).get(shared) == 1  # still consumed: still there
    second.kill()
    wait_for(lambda: shared not in consumers(rabbit), 15,
             "RabbitMQ to delete the auto-delete queue after the last client left")
    # only the per-link consumers remain, on the receiving side of the pool
    assert [(m["role"], m["links"]) for m in upstream_members(node) if m["links"]] == [("receive", 2)]
    for other in others:
        other.kill()
