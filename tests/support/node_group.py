"""Node processes shared by one test module, and where a `workers = 2` node serves a client.

A module whose tests each use their own queue names starts its nodes once
(``NodeGroup``, the ``start_node`` fixture's module-wide counterpart), so a
parametrized matrix pays for each node once.

A node with workers passes each new connection to the worker with the fewest
(``proxy.workers``); a queue lives on the worker that owns its name
(``proxy.workers.ownership``). ``pin_worker`` holds one connection open and
says which worker serves it: a queue owned by that worker is then remote to
the next connection, whose links to it are forwarded between the workers.
``workers_of_new_connections`` reads from the node's log which worker served
each connection since a given point, so a test can check it covered the case
it meant to.
"""

from __future__ import annotations

import re
from pathlib import Path

from admin_client import admin, wait_for
from conftest import NodeProcess
from proton.utils import BlockingConnection
from proxy.workers.ownership import QueueOwners

_AUTHENTICATED = re.compile(r" w(\d+) fedgate\.node: connection from [\d.]+:\d+ authenticated")


class NodeGroup:
    """Nodes started on first use and stopped together (each name once)."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.nodes: list[NodeProcess] = []
        self.made: dict[str, object] = {}

    def start(self, config: dict | None = None, name: str = "n1") -> NodeProcess:
        node = NodeProcess(self.workdir, config, name).start()
        self.nodes.append(node)
        return node

    def once(self, key: str, make):
        """``make(self)``'s result, made on the first call for ``key``."""
        if key not in self.made:
            self.made[key] = make(self)
        return self.made[key]

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


def authenticated_workers(node: NodeProcess) -> list[int]:
    """The worker of each client connection the node authenticated, oldest first."""
    return [int(w) for w in _AUTHENTICATED.findall(node.log_path.read_text())]


def workers_of_new_connections(node: NodeProcess, since: int) -> list[int]:
    return authenticated_workers(node)[since:]


def owned_by(node, workers: int, worker: int, prefix: str) -> str:
    """A queue name that ``worker`` owns on ``node`` (a NodeProcess: its admin API's resolve
    names the owner, the supervisor deciding it for a new name; issue #45), or on a fresh node
    of ``workers`` workers when ``node`` is its id (the first names used get their ring owner)."""
    if isinstance(node, str):
        owners = QueueOwners(node, workers)
        return next(f"{prefix}-{i}" for i in range(10_000) if owners.owner(f"{prefix}-{i}") == worker)
    for i in range(10_000):
        name = f"{prefix}-{i}"
        if admin(node, f"/api/v1/resolve?address={name}").get("worker") == worker:
            return name
    raise AssertionError(f"no queue name of worker {worker} found")


def open_connections(node: NodeProcess) -> int:
    """Client connections open on the node, over all workers (the admin API)."""
    return admin(node, "/api/v1/connections")["count"]


def wait_connections(node: NodeProcess, count: int, timeout: float = 10.0) -> None:
    wait_for(lambda: open_connections(node) == count, timeout, f"{count} connections open")


def pin_worker(node: NodeProcess) -> tuple[BlockingConnection, int]:
    """A connection held open, alone on the node, and the worker serving it."""
    wait_connections(node, 0)
    before = len(authenticated_workers(node))
    connection = BlockingConnection(node.url, timeout=10)
    (worker,) = wait_for(lambda: workers_of_new_connections(node, before), 5,
                         "the pinned connection in the log")
    return connection, worker
