"""Proxy link lifecycle against real primaries (RabbitMQ 3.10, Artemis).

* a remote that disappears under a proxied consumer: the client's link is
  detached with the primary's condition (directly, or found by the idle
  re-check when the primary says nothing);
* ``mirror_auto_delete``: one upstream consumer shared by the clients, attached
  with the first and detached with the last, so an auto-delete queue on the
  primary goes away when the last client does.
"""

from __future__ import annotations

import brokers
import pytest
from exchange_support import (  # noqa: F401 (rabbit: a fixture)
    ADMIN,
    admin_get,
    rabbit,
    rabbit_bound_queues,
    rabbit_queues,
    send_subjects,
    tag,
    upstream_members,
    wait_for,
)


def test_deleted_exchange_found_by_the_idle_recheck(rabbit, start_node, clients):
    """RabbitMQ says nothing to a subscriber when its exchange is deleted: only the re-check sees it."""
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


@pytest.mark.parametrize("broker", ["rabbitmq", "artemis"])
def test_deleted_queue_detaches_the_client_with_the_primarys_condition(broker, rabbit, start_node,
                                                                       clients):
    name = f"fgd-{tag()}"
    if broker == "rabbitmq":
        rabbit.queue(name)
        primary, remote, delete = rabbit.url, "/amq/queue/{1}", lambda: rabbit.delete_queue(name)
        # RabbitMQ 3.10 drops the whole connection; the re-attach is refused
        expected = "amqp:not-found"
    else:
        primary = brokers.ensure_artemis()
        name = f"strict.{name}"  # not auto-created again by the re-attach
        brokers.artemis_create_queue(name)
        remote, delete = "{1}", lambda: brokers.artemis_delete_queue(name)
        expected = "amqp:resource-deleted"
    node = start_node({"rules": [{"name": "dq", "match": "dq.#", "kind": "proxy", "primary": primary,
                                  "remote": remote, "upstream": {"heartbeat": 2.0}}]})
    client = clients("rhea", "receive", node.url, address=f"dq.{name}", count=1, timeout_ms=30000)
    if broker == "rabbitmq":
        wait_for(lambda: rabbit_queues().get(name) == 1, 15, "the proxied consumer on RabbitMQ")
    else:
        wait_for(lambda: brokers.artemis_manage(f"queue.{name}", "getConsumerCount") == 1, 15,
                 "the proxied consumer on Artemis")
    delete()
    assert client.finish(timeout=40)[-1]["error"]["condition"] == expected


def shared_links(node) -> int:
    return sum(1 for link in admin_get(node, "/api/v1/links")["links"]
               if link["role"] == "SharedConsumer")


def test_mirror_auto_delete_shares_one_upstream_consumer_for_its_clients(rabbit, start_node,
                                                                         clients):
    t = tag()
    shared, plain = f"fga-{t}", f"fgp-{t}"
    rabbit.queue(shared, bind=("amq.topic", f"ad{t}"), auto_delete=True)
    rabbit.queue(plain, bind=("amq.topic", f"ad{t}"))
    node = start_node({"admin": ADMIN, "rules": [
        {"name": "mirror", "match": "mirror.*", "kind": "proxy", "primary": rabbit.url,
         "remote": "/amq/queue/{1}", "mirror_auto_delete": True},
        {"name": "plain", "match": "plain.*", "kind": "proxy", "primary": rabbit.url,
         "remote": "/amq/queue/{1}"},
    ]})
    receive = dict(count=0, credit=10, idle_ms=60000, timeout_ms=60000)
    first, second = (clients("proton", "receive", node.url, address=f"mirror.{shared}", **receive)
                     for _ in range(2))
    others = [clients("proton", "receive", node.url, address=f"plain.{plain}", **receive)
              for _ in range(2)]
    wait_for(lambda: shared_links(node) == 2, 15, "both shared clients attached")
    wait_for(lambda: rabbit_queues().get(plain) == 2, 15, "two per-link consumers (no mirror)")
    assert rabbit_queues()[shared] == 1  # two clients, one upstream consumer

    items = [(f"m{i}", f"ad{t}") for i in range(20)]
    assert set(send_subjects(rabbit.url, "/exchange/amq.topic", items).values()) == {("accepted", None)}
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
    assert rabbit_queues().get(shared) == 1  # still consumed: still there
    second.kill()
    wait_for(lambda: shared not in rabbit_queues(), 15,
             "RabbitMQ to delete the auto-delete queue after the last client left")
    # only the per-link consumers remain, on the receiving side of the pool
    assert [(m["role"], m["links"]) for m in upstream_members(node) if m["links"]] == [("receive", 2)]
    for other in others:
        other.kill()
