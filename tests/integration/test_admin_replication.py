"""Replicated queues in the admin API, /metrics, and the CLI (issue #35).

In memory first (``playbook.World``: real nodes on the memory network, a virtual
clock): what ``/api/v1/queues``, ``resolve`` and ``/metrics`` say on the primary, a
backup and a node that only proxies; promote refused for a catching-up copy (409
with the reason) and forced. Then a static cluster of three ``fedgate serve``
processes: ``fedgate promote`` through one node's admin API makes a ready backup on
another the primary; the third node is told (its proxies go there), a client on it
receives from the new primary; ``fedgate queues`` prints the replicated table.
"""

from __future__ import annotations

import argparse
import re

import pytest
from admin_client import ADMIN_TOKEN, READ_TOKEN, TOKENS, http, wait_for
from conftest import free_port
from playbook import World, run
from proton import Delivery, Message
from proton.utils import BlockingConnection

from admin_api import cli, prometheus, replication
from admin_api.errors import ApiError
from admin_api.inspect_api import queues_doc
from proxy.config.version import version

pytestmark = pytest.mark.timeout(60)

RULE = {"name": "orders", "match": "orders.*", "kind": "replicated", "replicas": 2,
        "nodes": ["a", "b"]}
PEERS = {"a": "amqp://a:5672", "b": "amqp://b:5672", "c": "amqp://c:5672"}


def service(node):
    return replication.service_of(node)


def listed(node, name: str) -> dict:
    return next((q for q in queues_doc(node)["queues"] if q["name"] == name), {})


def role(node, name: str) -> str | None:
    return listed(node, name).get("role")


def samples(node) -> dict[str, float]:
    out = {}
    for line in prometheus.render(node).splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def test_queues_resolve_and_metrics_on_the_primary_a_backup_and_a_proxy(tmp_path):
    async def play():
        world = World(tmp_path)
        nodes = {n: await world.node(n, peers=PEERS, rules=[RULE]) for n in "abc"}
        producer = await world.client("c", "producer")  # on the node outside the replica set
        sender = producer.sender("orders.x")
        await world.until(lambda: sender.credit > 0, what="credit")
        for i in range(3):
            sender.send(f"m{i}", message_id=i)
        await world.until(lambda: sender.accepted() == 3, what="accepted")
        await world.until(lambda: listed(nodes["a"], "orders.x").get("replication", {})
                          .get("in_sync") == ["b"], what="b in sync")

        doc = queues_doc(nodes["a"])  # the primary: a local queue, and its replication
        (item,) = doc["queues"]
        assert doc["replicated"] == 1 and doc["depth"] == 3
        assert (item["name"], item["depth"], item["role"]) == ("orders.x", 3, "primary")
        assert "stats" in item and "max_depth" in item  # the local queue's fields as before
        r = item["replication"]
        assert (r["primary"], r["epoch"], r["placement"], r["failovers"]) == ("a", 1, ["a", "b"], 0)
        # the memory its stream holds: nothing waits, its tables may keep their size
        assert 0 <= r["backups"][0].pop("stream_bytes") < 4096
        assert r["backups"] == [{"node": "b", "state": "ready", "lag_messages": 0, "lag_ms": 0.0,
                                 "catchup_left": 0, "version": version()}]
        assert (r["in_sync_backups"], r["lag_messages"], r["waiting_acceptance"]) == (1, 0, 0)

        doc = queues_doc(nodes["b"])  # the backup: no local queue, its copy
        assert doc["depth"] == 0 and doc["replicated"] == 1
        (item,) = doc["queues"]
        assert item["role"] == "ready" and "depth" not in item
        r = item["replication"]
        assert (r["primary"], r["epoch"], r["copy"]["depth"], r["copy"]["in_sync"]) == ("a", 1, 3, True)

        item = listed(nodes["c"], "orders.x")  # a proxy: knows the replica set, not the owner
        assert item["role"] == "proxy" and item["replication"]["primary"] is None

        decision = nodes["c"].routing.resolve("orders.x")
        said = replication.owner(nodes["c"], "orders.x", decision)
        assert (said["primary"], said["primary_known"], said["preferred"]) == ("a", False, "a")
        said = replication.owner(nodes["b"], "orders.x", decision)
        assert (said["primary"], said["primary_known"], said["epoch"], said["role"]) == \
            ("a", True, 1, "ready")
        said = replication.owner(nodes["c"], "orders.y", nodes["c"].routing.resolve("orders.y"))
        assert said["primary_known"] is False and said["placement"] == ["a", "b"]
        assert "orders.y" not in [q["name"] for q in queues_doc(nodes["c"])["queues"]]

        on_a, on_b, on_c = (samples(nodes[n]) for n in "abc")
        assert on_a['fedgate_replication_role{queue="orders.x",role="primary"}'] == 1
        assert on_a['fedgate_replication_role{queue="orders.x",role="ready"}'] == 0
        assert on_a['fedgate_replication_epoch{queue="orders.x"}'] == 1
        assert on_a['fedgate_replication_in_sync_backups{queue="orders.x"}'] == 1
        assert on_a['fedgate_replication_backups{queue="orders.x",backup="b",state="ready"}'] == 1
        assert on_a['fedgate_replication_backup_lag_messages{queue="orders.x",backup="b"}'] == 0
        assert on_a['fedgate_replication_backup_lag_seconds{queue="orders.x",backup="b"}'] == 0
        assert on_a['fedgate_replication_waiting_acceptance{queue="orders.x"}'] == 0
        assert on_a['fedgate_replication_failovers_total{queue="orders.x"}'] == 0
        assert on_b['fedgate_replication_role{queue="orders.x",role="ready"}'] == 1
        assert on_b['fedgate_replication_copy_depth{queue="orders.x"}'] == 3
        assert on_c['fedgate_replication_role{queue="orders.x",role="proxy"}'] == 1
        assert not any(k.startswith("fedgate_replication_epoch") for k in on_c)  # none known
        await world.close()

    run(play)


def test_promote_is_refused_for_a_catching_up_copy_and_forced_on_request(tmp_path):
    """b joins while 2,000 messages wait on a; the link between them is cut silently in the
    middle of b's catch-up: promote on b answers 409 with the reason; force promotes it."""
    rule = {**RULE, "catchup_timeout": 60.0}

    async def play():
        world = World(tmp_path)
        await world.node("a", peers=PEERS, rules=[rule])
        producer = await world.client("a", "producer")
        sender = producer.sender("orders.x")
        sent = 0
        while sent < 2000:
            await world.until(lambda: sender.credit > 0, what="credit")
            while sender.credit > 0 and sent < 2000:
                sender.send(b"x" * 100, message_id=sent, flush=False)
                sent += 1
            producer.flush()
        await world.until(lambda: sender.accepted() == 2000, what="stored on a")

        def cut_mid_catchup(pipe, source, target, data) -> None:
            entry = service(world.nodes["b"]).addresses.get("orders.x") if "b" in world.nodes \
                else None
            if (source, target) == ("a", "b") and entry is not None and entry.backup is not None \
                    and entry.backup.image.depth and entry.backup.image.catching_up:
                world.network.partition("a", "b")
        world.network.taps.append(cut_mid_catchup)
        b = await world.node("b", peers=PEERS, rules=[rule])
        await world.until(lambda: role(b, "orders.x") == "catching-up", what="b catching up")
        copy = listed(b, "orders.x")["replication"]["copy"]
        assert copy["depth"] > 0 and not copy["in_sync"]

        with pytest.raises(ApiError) as refused:
            await replication.promote_queue(b, "orders.x", None, False, None)
        assert refused.value.status == 409 and refused.value.error == "promote_refused"
        assert "catching-up, not a ready backup" in refused.value.detail
        with pytest.raises(ApiError) as unknown:
            await replication.promote_queue(b, "jobs.x", "b", False, None)
        assert unknown.value.status == 404 and "not a replicated queue" in unknown.value.detail
        with pytest.raises(ApiError) as nobody:
            await replication.promote_queue(b, "orders.x", "z", False, None)
        assert nobody.value.status == 404 and nobody.value.field == "node"

        status, body = await replication.promote_queue(b, "orders.x", "b", True, None)
        assert status == 200 and body["forced"] and body["role"] == "primary"
        assert body["replication"]["epoch"] == 2 and body["replication"]["depth"] == copy["depth"]
        assert body["told"] == {}  # no admin URL known in memory: nobody to tell
        await world.close()

    run(play)


def test_learn_owner_moves_a_proxy_and_ignores_a_lower_epoch(tmp_path):
    async def play():
        world = World(tmp_path)
        c = await world.node("c", peers=PEERS, rules=[RULE])
        svc = service(c)
        assert svc.learn_owner("orders.x", "b", 4) is True
        r = listed(c, "orders.x")["replication"]
        assert (r["role"], r["primary"], r["epoch"]) == ("proxy", "b", 4)
        assert svc.learn_owner("orders.x", "a", 3) is False  # older news
        assert svc.learn_owner("orders.x", "c", 5) is False  # this node: only a claim says so
        assert svc.learn_owner("jobs.x", "b", 9) is False  # not replicated
        assert listed(c, "orders.x")["replication"]["primary"] == "b"
        assert svc.learn_owner("orders.x", "a", 5) is True
        r = listed(c, "orders.x")["replication"]
        assert (r["primary"], r["epoch"], r["failovers"]) == ("a", 5, 1)
        await world.close()

    run(play)


def test_after_a_promote_by_hand_the_old_primary_stays_a_backup(tmp_path):
    """A static cluster: b, a ready backup, is promoted; a (the preferred node) must become
    its backup, and a consumer on c receive the three accepted messages from b."""
    async def play():
        world = World(tmp_path)
        nodes = {n: await world.node(n, peers=PEERS, rules=[RULE]) for n in "abc"}
        producer = await world.client("c", "producer")
        sender = producer.sender("orders.x")
        await world.until(lambda: sender.credit > 0, what="credit")
        for i in range(3):
            sender.send(f"m{i}", message_id=i)
        await world.until(lambda: sender.accepted() == 3, what="accepted")
        await world.until(lambda: role(nodes["b"], "orders.x") == "ready", what="b ready")

        status, body = await replication.promote_queue(nodes["b"], "orders.x", "b", False, None)
        assert status == 200 and body["replication"]["epoch"] == 2
        service(nodes["c"]).learn_owner("orders.x", "b", 2)  # what b's push tells c over HTTP
        await world.quiet(2.0)
        assert role(nodes["b"], "orders.x") == "primary"
        assert role(nodes["a"], "orders.x") in ("catching-up", "ready")
        receiver = (await world.client("c", "consumer")).receiver("orders.x", credit=10)
        await world.until(lambda: len(receiver.received) == 3, timeout=10, what="3 from b")
        receiver.settle(Delivery.ACCEPTED)
        await world.close()

    run(play)


# -- a static cluster of fedgate processes ----------------------------------------------------
def cli_run(capsys, *argv: str) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser(prog="fedgate")
    cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(list(argv))
    code = args.func(args)
    out, err = capsys.readouterr()
    return code, out, err


def queue_view(node, name: str) -> dict:
    status, doc = http("GET", node.admin_url + "/api/v1/queues", token=READ_TOKEN)
    assert status == 200, doc
    return next((q for q in doc["queues"] if q["name"] == name), {})


def replication_of(node, name: str) -> dict:
    return queue_view(node, name).get("replication") or {}


@pytest.mark.parametrize("workers", [1, 2])
def test_promote_a_ready_backup_through_another_node_and_the_third_is_told(start_node, capsys,
                                                                          monkeypatch, workers):
    # with workers (issue #45) the queue is one worker's on each node: the admin API answers
    # for the node, and sends promote and resolve on to that worker
    ids = ("a", "b", "c")
    amqp = {n: free_port() for n in ids}
    admin = {n: free_port() for n in ids}
    peers = {n: f"amqp://127.0.0.1:{amqp[n]}" for n in ids}
    table = {n: f"http://127.0.0.1:{admin[n]}" for n in ids}
    nodes = {n: start_node({"node": {"listen": f"127.0.0.1:{amqp[n]}", "workers": workers},
                            "peers": {p: u for p, u in peers.items() if p != n},
                            "admin": {"listen": f"127.0.0.1:{admin[n]}", "tokens": TOKENS,
                                      "cluster": table},
                            "rules": [RULE]}, n) for n in ids}
    a, b, c = (nodes[n] for n in ids)

    sender = BlockingConnection(c.url, timeout=10)  # c proxies to a, the preferred node
    out = sender.create_sender("orders.x")
    for i in range(5):
        out.send(Message(id=i, body=f"m{i}"))
    sender.close()
    wait_for(lambda: replication_of(a, "orders.x").get("in_sync") == ["b"], timeout=10,
             what="b in sync on a")

    status, said = http("GET", c.admin_url + "/api/v1/resolve?address=orders.x", token=READ_TOKEN)
    assert status == 200 and said["primary"] == "a" and not said["replication"]["primary_known"]
    assert "preferred node" in said["reason"]
    status, said = http("GET", b.admin_url + "/api/v1/resolve?address=orders.x", token=READ_TOKEN)
    assert (said["primary"], said["replication"]["epoch"]) == ("a", 1)
    assert said["primary_url"] == peers["a"]

    status, text = http("GET", a.admin_url + "/metrics", token=READ_TOKEN)
    text = re.sub(r'worker="\d+",?', "", text)  # with workers each sample names its worker
    assert 'fedgate_replication_role{queue="orders.x",role="primary"} 1' in text
    assert 'fedgate_replication_backup_lag_messages{queue="orders.x",backup="b"} 0' in text

    monkeypatch.setenv("FEDGATE_TOKEN", ADMIN_TOKEN)
    code, printed, _ = cli_run(capsys, "queues", "--admin", a.admin_url)
    assert code == 0
    local, replicated = printed.split("\nreplicated queues\n")
    assert local.splitlines()[1].split()[:2] == ["orders.x", "5"]
    heading, row = replicated.splitlines()
    assert heading.split() == ["QUEUE", "ROLE", "PRIMARY", "EPOCH", "DEPTH", "BACKUPS", "IN_SYNC",
                               "LAG_MSGS", "LAG_MS", "FAILOVERS"]
    assert row.split() == ["orders.x", "primary", "a", "1", "5", "b:ready", "1/1", "0", "0", "0"]

    # refused: c holds no copy (409, the reason); a read token may not promote (403)
    status, refused = http("POST", a.admin_url + "/api/v1/queues/orders.x/promote", {"node": "c"})
    assert status == 409 and refused["error"] == "promote_refused"
    assert "no copy, not a ready backup" in refused["detail"]
    status, _ = http("POST", b.admin_url + "/api/v1/queues/orders.x/promote", {}, token=READ_TOKEN)
    assert status == 403
    status, error = http("POST", a.admin_url + "/api/v1/queues/jobs/promote", {"node": "b"})
    assert status == 404 and error["error"] == "not_replicated"

    # b, a ready backup, promoted through a's admin API (forwarded); it tells a and c
    code, printed, err = cli_run(capsys, "promote", "orders.x", "--node", "b", "--admin", a.admin_url)
    assert code == 0, err
    lines = printed.splitlines()
    assert lines[0] == "queue orders.x: primary b (epoch 2)"
    assert "  told c: learned" in lines
    assert any(line.startswith("  told a: ") for line in lines)  # learned, or ignored: see below
    # c, outside the replica set, sends its clients to b now (what b's push told it)
    r = replication_of(c, "orders.x")
    assert (r["role"], r["primary"], r["epoch"]) == ("proxy", "b", 2)
    status, said = http("GET", c.admin_url + "/api/v1/resolve?address=orders.x", token=READ_TOKEN)
    assert (said["primary"], said["primary_url"], said["replication"]["primary_known"]) == \
        ("b", peers["b"], True)
    # (a, the old primary, does not stay a backup of b yet: the known bug that
    # test_after_a_promote_by_hand_the_old_primary_stays_a_backup shows in memory)

    # unreachable: a node whose admin API is down answers 502 through the others
    c.stop()
    status, error = http("POST", a.admin_url + "/api/v1/queues/orders.x/promote", {"node": "c"})
    assert status == 502 and error["error"] == "node_unreachable" and table["c"] in error["detail"]
