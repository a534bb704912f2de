"""A large message never wedges a connection (issue #33), with every client library.

One fixed mix, 10 MB, 1 MB, 500 KB, 1 B (numbered ids, sent in that order on
one link), is sent by each client library of the suite (proton Python, rhea,
Qpid JMS, go-amqp) and received by the same library with credit of at least
10, so the node sends the 10 MB delivery and the next ones back to back on
one connection: the case that lost bytes mid-frame and left the connection
paused for ever. Each library's mix goes through a local queue, through a
proxy rule to another fedgate node, and through a node with `workers = 2`
where the queue belongs to the other worker than the client's (sender and
receiver both forwarded between the workers). Every id must come once, in
order, with its body's size; the receiver reads until it has been idle for a
while, so a duplicate would be counted. Every wait is bounded.
"""

from __future__ import annotations

import collections
import shutil
import subprocess
import time
import uuid

import pytest
from admin_client import ADMIN
from conftest import TESTS, ClientProcess, require
from node_group import (
    NodeGroup,
    authenticated_workers,
    owned_by,
    pin_worker,
    wait_connections,
    workers_of_new_connections,
)

MIX = [10_000_000, 1_000_000, 500_000, 1]
SIZES = ",".join(map(str, MIX))
MAX_MESSAGE_SIZE = 16 * 1024 * 1024  # [limits] max_message_size: the 10 MB one fits
WORKERS = 2
IDLE_MS = 1500  # a receiver stops once nothing came for this long (after the last id)
DEADLINE_S = 30  # the whole mix, sent and received, through any of the paths

JMS = TESTS / "jms" / "target"
JAVA = shutil.which("java")


class JmsProcess(ClientProcess):
    """``fedgate.JmsClient COMMAND ARGS...`` (tests/jms, built by .ci/install/jms.sh)."""

    def __init__(self, *args) -> None:
        require(JAVA is not None, "java")
        require((JMS / "classes" / "fedgate" / "JmsClient.class").is_file(),
                "the Qpid JMS test client (bash .ci/install/jms.sh)")
        self.cmd = [JAVA, "-cp", f"{JMS / 'classes'}:{JMS / 'lib'}/*", "fedgate.JmsClient",
                    *map(str, args)]
        self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, bufsize=0)
        self._pending = b""


@pytest.fixture
def jms():
    started: list[JmsProcess] = []

    def run(*args) -> JmsProcess:
        process = JmsProcess(*args)
        started.append(process)
        return process

    yield run
    for process in started:
        process.kill()


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    nodes = NodeGroup(tmp_path_factory.mktemp("large-mix"))
    yield nodes
    nodes.stop()


LIMITS = {"limits": {"max_message_size": MAX_MESSAGE_SIZE}}


def local_node(group: NodeGroup):
    return group.once("local", lambda g: g.start(LIMITS, name="local"))


def proxy_node(group: NodeGroup):
    """A proxy whose rule `big.#` goes to another fedgate node (the same address there)."""
    def make(g):
        primary = g.start(LIMITS, name="primary")
        return g.start({**LIMITS, "peers": {"primary": primary.url}, "rules": [
            {"name": "big", "match": "big.#", "kind": "proxy", "primary": "primary"}]},
            name="proxy")
    return group.once("proxy", make)


def workers_node(group: NodeGroup):
    return group.once("workers", lambda g: g.start(
        {**LIMITS, "node": {"workers": WORKERS}, "admin": ADMIN}, name="workers"))


# -- each library's sender and receiver ------------------------------------------------

def send_mix(library: str, clients, jms, url: str, address: str, prefix: str) -> None:
    if library == "jms":  # send URL QUEUE COUNT PREFIX PAUSE_AFTER TTL_MS SIZES
        result = jms("send", url, address, len(MIX), prefix, 0, 0, SIZES).finish(
            timeout=DEADLINE_S)[-1]
        assert "error" not in result and result["sent"] == len(MIX), result
        return
    (result,) = clients(library, "send", url, address=address, count=len(MIX), prefix=prefix,
                        sizes=SIZES, timeout_ms=DEADLINE_S * 1000).finish(timeout=DEADLINE_S + 10)
    assert result["error"] is None, result
    assert result["sent"] == len(MIX) and result["accepted"] == len(MIX), result


def receive_mix(library: str, clients, jms, url: str, address: str) -> list[tuple[str, int]]:
    """(id, body size) of everything that came, in arrival order, until idle."""
    if library == "jms":  # receive URL QUEUE COUNT(0: any) IDLE_MS; prefetch 1000 (credit)
        result = jms("receive", url, address, 0, IDLE_MS).finish(timeout=DEADLINE_S)[-1]
        assert "error" not in result, result
        return list(zip(result["ids"], result["sizes"]))
    options = {"max_message_size": 11_000_000} if library == "go" else {}  # its own limit
    lines = clients(library, "receive", url, address=address, count=0, credit=10,
                    idle_ms=IDLE_MS, timeout_ms=DEADLINE_S * 1000,
                    **options).finish(timeout=DEADLINE_S + 10)
    assert lines[-1]["error"] is None, lines[-1]
    got = [(line["id"], line["size"]) for line in lines if "id" in line]
    assert lines[-1]["received"] == len(got)
    return got


def check_mix(got: list[tuple[str, int]], prefix: str) -> None:
    ids = [i for i, _ in got]
    duplicates = sorted(i for i, n in collections.Counter(ids).items() if n > 1)
    assert duplicates == [], f"duplicates: {duplicates}"
    missing = [f"{prefix}-{n}" for n in range(len(MIX)) if f"{prefix}-{n}" not in ids]
    assert missing == [], f"missing: {missing}"
    assert got == [(f"{prefix}-{n}", size) for n, size in enumerate(MIX)]  # in order, whole


LIBRARIES = ["proton", "rhea", "jms", "go"]


# -- the three paths -----------------------------------------------------------------------

@pytest.mark.parametrize("library", LIBRARIES)
def test_the_mix_through_a_local_queue(group, clients, jms, library):
    node = local_node(group)
    prefix = f"{library}-local"
    address = f"big.{library}.{uuid.uuid4().hex[:8]}"
    started = time.monotonic()
    send_mix(library, clients, jms, node.url, address, prefix)
    check_mix(receive_mix(library, clients, jms, node.url, address), prefix)
    assert time.monotonic() - started < DEADLINE_S


@pytest.mark.parametrize("library", LIBRARIES)
def test_the_mix_through_a_proxy_rule_to_another_fedgate_node(group, clients, jms, library):
    proxy = proxy_node(group)
    prefix = f"{library}-proxy"
    address = f"big.{library}.{uuid.uuid4().hex[:8]}"
    started = time.monotonic()
    send_mix(library, clients, jms, proxy.url, address, prefix)
    check_mix(receive_mix(library, clients, jms, proxy.url, address), prefix)
    assert time.monotonic() - started < DEADLINE_S


@pytest.mark.parametrize("library", LIBRARIES)
def test_the_mix_between_two_workers(group, clients, jms, library):
    node = workers_node(group)
    pin, pinned = pin_worker(node)  # the other clients land on the other worker
    try:
        address = owned_by(node, WORKERS, pinned, f"big-{library}")  # the pinned one's
        prefix = f"{library}-workers"
        started = time.monotonic()
        seen = len(authenticated_workers(node))
        send_mix(library, clients, jms, node.url, address, prefix)
        wait_connections(node, 1)  # the sender's connection is gone: one worker has fewer
        got = receive_mix(library, clients, jms, node.url, address)
        # sender and receiver were each served by the worker that does not own the queue
        assert workers_of_new_connections(node, seen) == [1 - pinned, 1 - pinned]
        check_mix(got, prefix)
        assert time.monotonic() - started < DEADLINE_S
    finally:
        pin.close()
