"""Every drain request is answered (issue #33), by go-amqp's and proton's measure.

A receiver's drain (AMQP 1.0 §2.6.7) asks the sender to use up the link's
credit and send its flow state back; go-amqp's ``DrainCredit`` waits for that
flow, and a drain left unanswered wedges the client. The node must answer on
every kind of sending link it has, also at link-credit 0, where proton (the
node's engine) would say nothing by itself and Artemis, behind a proxy rule,
says nothing either.

Each case is one client process (``tests/clients/goamqp`` ``drain``,
``tests/clients/proton_client.py`` ``drain``) that attaches, grants credit,
takes (accepts) some messages and then drains, timing the drain from its
request to the answering flow:

* credit 0 on an empty queue;
* credit 10 with 3 messages waiting: all 3 taken, then the 7 left drained;
* credit 5 with 5 waiting: all taken, so the credit is already 0 through transfers.

go-amqp always drains with link-credit 0 in its flow (it revokes what is
left); proton keeps the credit left (7 in the second case), so between them
both the node's paths, "credit left, nothing to send" and "no credit", are
taken on every link kind: a local queue's consumer and browser (distribution
mode copy), a proxy link to another fedgate node and to Artemis, a consumer on
a fragmented queue (messages on its own fragment, and on the other node's, so
its drain goes on to the peer), and a link forwarded between the workers of a
`workers = 2` node. Each must be answered within ``DRAIN_MS``.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Callable

import brokers
import pytest
from admin_client import ADMIN
from fragment_cluster import start_cluster
from node_group import (
    NodeGroup,
    authenticated_workers,
    owned_by,
    pin_worker,
    workers_of_new_connections,
)
from proton import Message
from proton.utils import BlockingConnection

DRAIN_MS = 100.0  # the client's own measure, request to answer
WORKERS = 2
CLIENT_DEADLINE_MS = 5000  # an unanswered drain ends the client (exit 3) after this

# (credit granted, messages waiting, messages taken before the drain)
CASES = {
    "credit-0-empty": (0, 0, 0),
    "credit-10-3-taken": (10, 3, 3),
    "credit-5-all-taken": (5, 5, 5),
}


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    nodes = NodeGroup(tmp_path_factory.mktemp("drains"))
    yield nodes
    nodes.stop()


def fill(url: str, address: str, count: int, **connect) -> None:
    """``count`` messages on ``address``, each settled by the node before the next."""
    if not count:
        return
    connection = BlockingConnection(url, timeout=10, **connect)
    try:
        sender = connection.create_sender(address)
        for n in range(count):
            sender.send(Message(id=f"d-{n}", body=f"drain case message {n}"))
    finally:
        connection.close()


@dataclass
class Link:
    """Where the drain client attaches, and how its messages get there first."""

    url: str
    address: str
    fill: Callable[[int], None]
    browse: bool = False
    after: list = field(default_factory=list)  # checks once the client is done


def queue_link(group: NodeGroup, browse: bool = False) -> Link:
    node = group.once("local", lambda g: g.start(name="local"))
    address = f"drain.{uuid.uuid4().hex[:8]}"
    return Link(node.url, address, lambda n: fill(node.url, address, n), browse=browse)


def proxy_fedgate_link(group: NodeGroup) -> Link:
    def make(g):
        primary = g.start(name="primary")
        proxy = g.start({"peers": {"primary": primary.url}, "rules": [
            {"name": "drains", "match": "drain.#", "kind": "proxy", "primary": "primary"}]},
            name="proxy")
        return primary, proxy
    primary, proxy = group.once("proxy-fedgate", make)
    address = f"drain.{uuid.uuid4().hex[:8]}"  # the same address on the primary
    return Link(proxy.url, address, lambda n: fill(primary.url, address, n))


def proxy_artemis_link(group: NodeGroup) -> Link:
    artemis = brokers.ensure_artemis()
    proxy = group.once("proxy-artemis", lambda g: g.start({"rules": [
        {"name": "artemis", "match": "art.*", "kind": "proxy", "primary": artemis,
         "remote": "{1}"}]}, name="proxy-artemis"))
    queue = f"fg-drain-{uuid.uuid4().hex[:8]}"
    return Link(proxy.url, f"art.{queue}",
                lambda n: fill(artemis, queue, n, allowed_mechs="ANONYMOUS"))


def fragment_link(group: NodeGroup, steal: bool) -> Link:
    nodes = group.once("fragments", lambda g: start_cluster(g.start, ("fa", "fb")))
    address = f"work.drain.{uuid.uuid4().hex[:8]}"
    # the messages on fa's fragment; the consumer on fa, or on fb whose fragment is empty
    client = nodes["fb" if steal else "fa"]
    return Link(client.url, address, lambda n: fill(nodes["fa"].url, address, n))


def forwarded_link(group: NodeGroup) -> Link:
    node = group.once("workers", lambda g: g.start(
        {"node": {"workers": WORKERS}, "admin": ADMIN}, name="workers"))
    pin, pinned = pin_worker(node)  # the drain client lands on the other worker
    address = owned_by(node, WORKERS, pinned, f"drain-{uuid.uuid4().hex[:8]}")
    seen = len(authenticated_workers(node))

    def send(n: int) -> None:
        sender = pin.create_sender(address)
        for i in range(n):
            sender.send(Message(id=f"d-{i}", body=f"drain case message {i}"))

    def forwarded() -> None:
        try:
            # the client was served by the worker that does not own the queue
            assert workers_of_new_connections(node, seen) == [1 - pinned]
        finally:
            pin.close()

    return Link(node.url, address, send, after=[forwarded])


LINKS = {
    "queue": lambda g: queue_link(g),
    "browser": lambda g: queue_link(g, browse=True),
    "proxy-fedgate": proxy_fedgate_link,
    "proxy-artemis": proxy_artemis_link,
    "fragment-own": lambda g: fragment_link(g, steal=False),
    "fragment-peer": lambda g: fragment_link(g, steal=True),
    "forwarded-between-workers": forwarded_link,
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("library", ["go", "proton"])
@pytest.mark.parametrize("kind", list(LINKS))
def test_a_drain_is_answered(group, clients, kind, library, case):
    credit, waiting, take = CASES[case]
    link = LINKS[kind](group)
    try:
        link.fill(waiting)
        lines = clients(library, "drain", link.url, address=link.address, credit=credit,
                        take=take, browse=link.browse,
                        timeout_ms=CLIENT_DEADLINE_MS).finish(timeout=CLIENT_DEADLINE_MS / 1000 + 10)
    finally:
        for check in link.after:
            check()
    result = lines[-1]
    assert result["error"] is None, result  # "timeout": the drain went unanswered
    assert result["drained"] is True and result["received"] == take, result
    print(f"{kind} {library} {case}: drain answered in {result['drain_ms']:.2f} ms")  # pytest -s
    assert result["drain_ms"] < DRAIN_MS, f"drain answered after {result['drain_ms']:.1f} ms"


@pytest.mark.parametrize("library", ["go", "proton"])
def test_the_clients_report_a_drain_left_unanswered(clients, library):
    """Artemis itself does not answer a drain at credit 0: both clients say so by name."""
    artemis = brokers.ensure_artemis()
    lines = clients(library, "drain", artemis, address=f"fg-drain-{uuid.uuid4().hex[:8]}",
                    credit=0, timeout_ms=1000).finish(timeout=15)
    result = lines[-1]
    assert result["drained"] is False and result["drain_ms"] is None, result
    assert result["error"]["condition"] == "timeout", result
