"""Fragmented shared queues across real node processes: enqueue, steal, settle, drain."""

from __future__ import annotations

import collections
import time

import pytest
from blocking_checks import accepted_ids, large_bodies, receive_messages, select, send_messages
from fragment_cluster import admin, cpu_seconds, fragments, start_cluster
from proton import Message, Timeout
from proton.reactor import Selector
from proton.utils import BlockingConnection


def ids_of(lines):
    return [line["id"] for line in lines if "id" in line]


def assert_producer_order(lines) -> None:
    """For one consumer: every producer's sequence numbers arrive increasing."""
    last: dict = {}
    for line in lines:
        if "id" not in line:
            continue
        producer, seq = line["producer"], line["seq"]
        assert seq > last.get(producer, -1), f"{producer} out of order at {seq}"
        last[producer] = seq


def test_producers_on_two_nodes_consumers_on_a_third(start_node, clients):
    nodes = start_cluster(start_node)
    consumers = [clients(kind, "receive", nodes["n3"].url, address="work.orders", count=0,
                         credit=50, idle_ms=3000, timeout_ms=90000) for kind in ("proton", "rhea")]
    producers = [clients("proton", "send", nodes[n].url, address="work.orders", count=1000,
                         prefix=f"{n}p", timeout_ms=90000) for n in ("n1", "n2")]
    for producer in producers:
        (result,) = producer.finish(timeout=120)
        assert result["accepted"] == 1000, str(result)
    outputs = [c.finish(timeout=120) for c in consumers]
    got = [i for lines in outputs for i in ids_of(lines)]
    assert set(got) == {f"{n}p-{i}" for n in ("n1", "n2") for i in range(1000)}
    assert [i for i, c in collections.Counter(got).items() if c > 1] == []
    for lines in outputs:
        assert_producer_order(lines)
    (n3,) = fragments(nodes["n3"])
    assert n3["stolen_in"] >= 2000 and n3["enqueued"] == 0


def test_producers_on_one_node_every_consumer_gets_work(start_node, clients):
    nodes = start_cluster(start_node)
    consumers = {n: clients("rhea", "receive", nodes[n].url, address="work.jobs", count=0,
                            credit=10, idle_ms=3000, timeout_ms=90000) for n in nodes}
    producers = [clients("proton", "send", nodes["n1"].url, address="work.jobs", count=1500,
                         prefix=f"p{i}", timeout_ms=90000) for i in range(2)]
    for producer in producers:
        assert producer.finish(timeout=120)[-1]["accepted"] == 1500
    per_node = {n: ids_of(c.finish(timeout=120)) for n, c in consumers.items()}
    got = [i for ids in per_node.values() for i in ids]
    assert sorted(got) == sorted(f"p{p}-{i}" for p in range(2) for i in range(1500))
    assert all(per_node[n] for n in nodes), {n: len(v) for n, v in per_node.items()}


def test_stealing_node_killed_its_unsettled_messages_return_home(start_node, clients):
    nodes = start_cluster(start_node, names=("n1", "n2"))
    (sent,) = clients("rhea", "send", nodes["n1"].url, address="work.k", count=50, prefix="k").finish()
    assert sent["accepted"] == 50
    holder = clients("proton", "receive", nodes["n2"].url, address="work.k", credit=10, hold=True)
    stolen = {holder.readline()["id"] for _ in range(10)}  # stolen from n1, unsettled on n2
    nodes["n2"].kill()  # SIGKILL the stealing node
    lines = clients("rhea", "receive", nodes["n1"].url, address="work.k", count=50,
                    timeout_ms=30000).finish()
    got = ids_of(lines)
    assert sorted(got) == sorted(f"k-{i}" for i in range(50)) and stolen <= set(got)


def test_drain_a_fragment_under_load_loses_nothing(start_node, clients):
    nodes = start_cluster(start_node)
    consumers = [clients("rhea", "receive", nodes[n].url, address="work.drain", count=0,
                         credit=20, idle_ms=4000, timeout_ms=120000) for n in ("n1", "n2")]
    producer = clients("proton", "send", nodes["n3"].url, address="work.drain", count=3000,
                       prefix="before", timeout_ms=120000)
    (result,) = producer.finish(timeout=150)
    assert result["accepted"] == 3000
    # drain n3 on every node: no new enqueues there, its backlog is stolen by n1/n2
    for node in nodes.values():
        rules = admin(node, "/api/v1/rules")
        changed = [dict(r, draining=["n3"]) if r["name"] == "work" else r for r in rules["rules"]]
        admin(node, "/api/v1/rules", method="PUT", body={"rules": changed})
    (late,) = clients("proton", "send", nodes["n3"].url, address="work.drain", count=200,
                      prefix="after", timeout_ms=60000).finish(timeout=90)
    assert late["accepted"] == 200
    got = [i for c in consumers for i in ids_of(c.finish(timeout=150))]
    expected = {f"before-{i}" for i in range(3000)} | {f"after-{i}" for i in range(200)}
    assert set(got) == expected and len(got) == len(expected)
    (n3,) = fragments(nodes["n3"])
    assert n3["removed"] and n3["depth"] == 0
    assert n3["forwarded_producers"] >= 1  # the late producer went to another member


def test_idle_group_uses_almost_no_cpu(start_node, clients):
    nodes = start_cluster(start_node)
    waiting = [clients("rhea", "receive", node.url, address="work.idle", count=1, credit=10,
                       timeout_ms=40000) for node in nodes.values()]
    time.sleep(2.0)  # let attaches settle before measuring
    before = {n: cpu_seconds(node.proc.pid) for n, node in nodes.items()}
    time.sleep(6.0)  # the measurement window itself (CPU time is counted in 10 ms ticks)
    used = {n: cpu_seconds(node.proc.pid) - before[n] for n, node in nodes.items()}
    assert all(seconds / 6.0 < 0.01 for seconds in used.values()), used
    assert all(w.proc.poll() is None for w in waiting)  # consumers were attached all along


@pytest.mark.parametrize("broker", ["rabbitmq", "rabbitmq4"])
def test_group_with_a_remote_fragment_on_rabbitmq(start_node, clients, broker):
    import uuid

    import brokers

    queue = f"fg-frag-{uuid.uuid4().hex[:8]}"
    if broker == "rabbitmq":  # address v1: /queue/NAME declares the queue
        remote = {"url": brokers.ensure_rabbitmq(), "address": f"/queue/{queue}"}
        count = brokers.rabbitmq_queue_count
    else:  # address v2: the queue must exist
        brokers.rabbitmq4_declare_queue(queue)
        remote = {"url": brokers.ensure_rabbitmq4(), "address": f"/queues/{queue}"}
        count = brokers.rabbitmq4_queue_count
    nodes = start_cluster(start_node, names=("n1", "n2", "n3"),
                          members=["n1", "n2", remote])
    # producers on n3 (no fragment there): hashed over n1, n2 and RabbitMQ
    conn = BlockingConnection(nodes["n3"].url, timeout=20)
    try:
        for p in range(30):
            sender = conn.create_sender("work.remote", name=f"producer-{p}")
            for i in range(10):
                sender.send(Message(id=f"r{p}-{i}", body="x", properties={"producer": f"r{p}", "seq": i}))
    finally:
        conn.close()
    assert count(queue) > 0  # some producers landed on RabbitMQ
    lines = clients("rhea", "receive", nodes["n1"].url, address="work.remote", count=300,
                    timeout_ms=60000).finish(timeout=90)
    got = ids_of(lines)
    expected = {f"r{p}-{i}" for p in range(30) for i in range(10)}
    assert set(got) == expected, (f"lost {sorted(expected - set(got))}, "
                                  f"dups {collections.Counter(got).most_common(2)}, "
                                  f"left in rabbit {count(queue)}")
    assert len(got) == len(expected), collections.Counter(got).most_common(3)
    assert count(queue) == 0


def test_fragment_less_node_forwards_producers_and_consumes_from_the_nearest(start_node, clients):
    nodes = start_cluster(start_node, names=("n1", "n2", "n3"), members=["n1", "n2"],
                          rule={"prefer": ["n2"]})
    (sent,) = clients("proton", "send", nodes["n3"].url, address="work.edge", count=300,
                      prefix="e").finish()
    assert sent["accepted"] == 300
    lines = clients("rhea", "receive", nodes["n3"].url, address="work.edge", count=300,
                    timeout_ms=30000).finish()
    assert sorted(ids_of(lines)) == sorted(f"e-{i}" for i in range(300))
    assert_producer_order(lines)
    (edge,) = fragments(nodes["n3"])
    assert edge["local"] is None and edge["forwarded_producers"] == 1


def test_adding_a_member_moves_only_some_producers():
    """Ketama ring: a new fragment takes new producers without reshuffling the rest."""
    from uhashring import HashRing

    producers = [f"container-{i}/link" for i in range(2000)]
    before = HashRing(nodes=["n1", "n2", "n3"])
    after = HashRing(nodes=["n1", "n2", "n3", "n4"])
    moved = [p for p in producers if before.get_node(p) != after.get_node(p)]
    assert all(after.get_node(p) == "n4" for p in moved)  # only to the new member
    assert 0.1 < len(moved) / len(producers) < 0.45  # about a quarter, not a reshuffle


def test_producers_and_consumers_on_every_node_keep_producer_order(start_node, clients):
    """Stealing while local messages also arrive: a stolen message that finds no
    credit waits locally instead of going back behind its producer's later ones."""
    nodes = start_cluster(start_node, names=("n1", "n2"))
    consumers = [clients(kind, "receive", nodes[n].url, address="work.mixed", count=0, credit=2,
                         idle_ms=3000, timeout_ms=90000)
                 for n in ("n1", "n2") for kind in ("proton", "rhea")]
    producers = [clients("proton", "send", nodes[n].url, address="work.mixed", count=1500,
                         prefix=f"{n}m", timeout_ms=90000) for n in ("n1", "n2")]
    for producer in producers:
        assert producer.finish(timeout=120)[-1]["accepted"] == 1500
    outputs = [c.finish(timeout=120) for c in consumers]
    got = [i for lines in outputs for i in ids_of(lines)]
    assert sorted(got) == sorted(f"{n}m-{i}" for n in ("n1", "n2") for i in range(1500))
    for lines in outputs:
        assert_producer_order(lines)


def test_large_messages_are_stolen_whole(start_node):
    # multi-frame messages crossing from one fragment's node to a consumer on another
    nodes = start_cluster(start_node, names=("n1", "n2"))
    bodies = large_bodies()
    send_messages(nodes["n1"].url, "work.large",
                  [Message(id=f"l{i}", body=body) for i, body in enumerate(bodies)])
    depths = {name: sum(f["depth"] for f in fragments(node)) for name, node in nodes.items()}
    assert sorted(depths.values()) == [0, len(bodies)]  # one producer, one fragment
    (thief,) = [name for name, depth in depths.items() if depth == 0]
    got = receive_messages(nodes[thief].url, "work.large", len(bodies))
    assert sorted(m.id for m in got) == [f"l{i}" for i in range(len(bodies))]
    assert sorted(bytes(m.body) for m in got) == sorted(bodies)
    assert sum(f["stolen_in"] for f in fragments(nodes[thief])) == len(bodies)


def test_a_selector_on_a_fragmented_queue_takes_what_it_selects_from_every_member(start_node):
    """python-qpid-proton's Selector on n1: its reds come from n1's fragment and are stolen
    from n2's and n3's, each once; what it does not select stays in place, and a plain
    consumer takes it after (docs/fragments.md, "Selectors")."""
    nodes = start_cluster(start_node)
    colours = {}
    for name, node in nodes.items():
        batch = {f"{name}-{i}": ("red", "blue", "green")[i % 3] for i in range(30)}
        send_messages(node.url, "work.sel", [Message(id=mid, body="x", properties={"colour": c})
                                             for mid, c in batch.items()])
        colours.update(batch)
    red = sorted(mid for mid, colour in colours.items() if colour == "red")
    got = select(nodes["n1"].url, "work.sel", "colour = 'red'", len(red))
    assert sorted(got) == red, collections.Counter(got).most_common(3)
    conn = BlockingConnection(nodes["n1"].url, timeout=20)
    try:  # nothing more is red: a second selective receiver gets nothing in 2 s
        receiver = conn.create_receiver("work.sel", credit=10, options=Selector("colour = 'red'"))
        with pytest.raises(Timeout):
            receiver.receive(timeout=2)
    finally:
        conn.close()
    waiting = {name: sum(f["depth"] for f in fragments(node)) for name, node in nodes.items()}
    assert waiting == {name: 20 for name in nodes}, waiting  # the blues and greens, in place
    rest = accepted_ids(nodes["n1"].url, "work.sel", 60)
    assert sorted(rest) == sorted(set(colours) - set(red))


def test_a_selector_on_a_node_with_workers_steals_from_the_other_workers(start_node):
    """One node with two workers, a fragmented queue of its own (a fragment per worker): a
    consumer with a selector on one worker gets what it selects from both fragments."""
    from fragment_cluster import TOKEN

    node = start_node({"node": {"workers": 2}, "admin": {"tokens": [{"token": TOKEN, "role": "admin"}]},
                       "rules": [{"name": "work", "match": "work.#", "kind": "fragmented",
                                  "fragments": ["n1"]}]})
    connections, colours = [], {}
    for side in ("x", "y"):  # the second connection lands on the other worker
        conn = BlockingConnection(node.url, timeout=20)
        conn.create_receiver(None, dynamic=True)  # not placed by its first attach
        sender = conn.create_sender("work.wsel")
        for i in range(12):
            colour = ("red", "blue", "green")[i % 3]
            sender.send(Message(id=f"{side}-{i}", body="x", properties={"colour": colour}))
            colours[f"{side}-{i}"] = colour
        connections.append(conn)
    depths = sorted(f["depth"] for f in fragments(node))
    assert depths == [12, 12], depths  # one fragment per worker, each with its producer's
    red = sorted(mid for mid, colour in colours.items() if colour == "red")
    assert sorted(select(node.url, "work.wsel", "colour = 'red'", len(red))) == red
    for conn in connections:
        conn.close()
    assert sorted(f["depth"] for f in fragments(node)) == [8, 8]  # the rest in place


def test_a_selector_on_another_node_reaches_every_worker_of_a_member(start_node):
    """n1 runs two workers (a fragment each), n2 one process: a consumer with a selector on n2
    steals with it from n1, whose worker it lands on steals from its sibling for it."""
    from conftest import free_port
    from fragment_cluster import TOKEN

    ports = {name: free_port() for name in ("n1", "n2")}
    rule = {"name": "work", "match": "work.#", "kind": "fragmented", "fragments": ["n1", "n2"]}
    nodes = {name: start_node({
        "node": {"listen": f"127.0.0.1:{ports[name]}", "workers": 2 if name == "n1" else 1},
        "admin": {"tokens": [{"token": TOKEN, "role": "admin"}]},
        "peers": {peer: f"amqp://127.0.0.1:{port}" for peer, port in ports.items() if peer != name},
        "rules": [rule]}, name=name) for name in ports}
    connections, colours = [], {}
    for side in ("x", "y"):  # on n1's two workers
        conn = BlockingConnection(nodes["n1"].url, timeout=20)
        conn.create_receiver(None, dynamic=True)  # not placed by its first attach
        sender = conn.create_sender("work.xsel")
        for i in range(12):
            colour = ("red", "blue", "green")[i % 3]
            sender.send(Message(id=f"{side}-{i}", body="x", properties={"colour": colour}))
            colours[f"{side}-{i}"] = colour
        connections.append(conn)
    assert sorted(f["depth"] for f in fragments(nodes["n1"])) == [12, 12]
    red = sorted(mid for mid, colour in colours.items() if colour == "red")
    assert sorted(select(nodes["n2"].url, "work.xsel", "colour = 'red'", len(red))) == red
    for conn in connections:
        conn.close()
    assert sorted(f["depth"] for f in fragments(nodes["n1"])) == [8, 8]  # the rest in place
