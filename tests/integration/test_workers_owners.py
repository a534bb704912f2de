"""Which worker owns each queue of a node with workers (issue #45, ``proxy.workers.ownership``):
the supervisor decides at a name's first use, the worker with the fewest queues, and keeps the
table in ``<data_dir>/workers/owners``.

What a user would check: ``GET /api/v1/queues`` says which worker holds each queue; 16 queues
on 4 workers are 4 on each (the ring alone put 7, 4, 3 and 2 of these names on them); after a
restart of the node the same queues are on the same workers and their durable messages are
all there.
"""

from __future__ import annotations

import collections

from admin_client import ADMIN, admin
from proton import Message
from proton.utils import BlockingConnection

from proxy.workers.ownership import QueueOwners

WORKERS = 4
NAMES = [f"spread-{i}" for i in range(16)]


def owners_seen(node) -> dict[str, int]:
    body = admin(node, "/api/v1/queues")
    return {q["name"]: q["worker"] for q in body["queues"] if q["name"] in NAMES}


def test_sixteen_queues_on_four_workers_are_four_each_and_stay_there_after_a_restart(start_node):
    ring = collections.Counter(QueueOwners("n1", WORKERS).owner(n) for n in NAMES)
    assert max(ring.values()) >= 6, ring  # these names are badly spread by the ring alone
    node = start_node({"node": {"workers": WORKERS}, "queues": {"durable": True}, "admin": ADMIN})
    connection = BlockingConnection(node.url, timeout=10)
    try:
        for name in NAMES:
            sender = connection.create_sender(name)
            sender.send(Message(id=name, body=name, durable=True))
            sender.close()
    finally:
        connection.close()
    before = owners_seen(node)
    assert sorted(before) == sorted(NAMES)
    assert sorted(collections.Counter(before.values()).values()) == [4, 4, 4, 4], before
    assert node.stop() == 0
    node.start()
    connection = BlockingConnection(node.url, timeout=10)
    try:
        got = {}
        for name in NAMES:
            receiver = connection.create_receiver(name, credit=1)
            message = receiver.receive(timeout=10)
            receiver.accept()
            got[name] = message.id
            receiver.close()
    finally:
        connection.close()
    assert got == {name: name for name in NAMES}
    after = owners_seen(node)
    assert after == before
