"""Which worker of a node owns a queue: pure logic, no I/O.

How this works
--------------
A node with ``[node] workers = N`` runs N worker processes behind one listener
(``proxy.workers.supervisor``). A local queue must stay one FIFO wherever its
clients land, so each one has exactly one owner: the worker whose ketama ring
(uhashring, the ring fragmented queues use for their members) maps the name to
it. A link attached on another worker is forwarded to the owner as a proxy
link to a peer node is (``proxy.workers.worker``).

Exceptions to the ring:

* a temporary queue belongs to the worker of the connection that made it: its
  name says which (``tmp.<node>.w<K>.<n>``), so a reply-to reaches it from any
  worker;
* exchanges and dead-letter queues need no exception: a bound queue, or a
  dead-letter queue, that another worker owns is reached through an internal
  sender to it (``proxy.exchanges``, ``Broker.dead_letter``);
* proxy rules: every worker has its own upstream connections, unless the rule's
  ``upstream.max_connections`` caps them for the node: then only the first
  workers connect, and the others' links go through them;
* replicated queues (issue #45) are owned as local queues are: the owner holds
  the copy, claims the queue in etcd under a lease of its own, pushes to the
  backups (as primary) or takes the primary's replication link (as backup);
* fragmented queues: on a member node every worker has a fragment
  (``fragments.group``: producers enqueue on their own worker, consumers steal
  from the other workers, then from other nodes, when theirs is empty), and on
  any other node every worker reaches the members itself: no forwarding.

Placement (issue #36, ``proxy.amqp.first_attach``): a connection whose first
attach names a local queue is handed to the queue's owner, so its messages
cross nothing; one whose first attach names a fragmented queue goes where its
role is missing (``balanced_worker``): a producer to a worker whose consumers
of that queue outnumber its producers, a consumer to one with more producers
than consumers, so a consumer's own fragment is fed and it seldom steals.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from uhashring import HashRing


def temp_prefix(node_id: str, worker: int) -> str:
    """The name prefix of the temporary queues worker ``worker`` makes."""
    return f"tmp.{node_id}.w{worker}."


@dataclass
class QueueOwners:
    node_id: str
    workers: int
    _ring: HashRing | None = field(default=None, init=False, repr=False)
    _temp: str = field(default="", init=False, repr=False)

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"workers must be at least 1, not {self.workers}")
        if self.workers > 1:
            self._ring = HashRing(nodes=[f"w{k}" for k in range(self.workers)])
        self._temp = f"tmp.{self.node_id}.w"

    def owner(self, address: str) -> int:
        """The worker that holds local queue ``address``."""
        if self._ring is None:
            return 0
        if address.startswith(self._temp):
            digits, dot, _ = address[len(self._temp):].partition(".")
            if dot and digits.isdigit() and int(digits) < self.workers:
                return int(digits)
        return int(self._ring.get_node(address)[1:])

    def owner_of_kind(self, kind: str, address: str) -> int | None:
        """The worker that serves an address routed as ``kind`` (a local or a replicated queue:
        its owner, issue #45: each copy of a replicated queue on this node, its claim in etcd
        and its replication links are that worker's); None: any worker (its own
        links: proxy rules have upstream connections in every worker, fragmented queues a
        fragment or their own links to the members)."""
        if kind in ("local", "replicated"):
            return self.owner(address)
        return None

    def upstream_owner(self, index: int, max_connections: int, per_worker: int) -> int | None:
        """Proxy rules: None when worker ``index`` connects to the primary itself; else the
        worker its links go through, so that no more than ``max_connections`` connections
        reach the primary from the whole node (``per_worker`` each: pool_size, times 2 when
        split by direction). 0: no cap."""
        if not max_connections or self.workers < 2:
            return None
        direct = max(1, max_connections // per_worker)
        return None if index < direct else index % direct


CONSUMER, PRODUCER = 0, 1  # a placed connection's role on its fragmented queue


def balanced_worker(counts: dict[int, list[int]], source: int, role: int, alive: list[int]) -> int:
    """Where a connection whose first attach is ``role`` on a fragmented queue belongs:
    the running worker whose placed connections of that queue most lack the role
    (``counts[worker] = [consumers, producers]``); ``source`` (where it is) unless
    another lacks it more."""
    other = PRODUCER if role == CONSUMER else CONSUMER

    def lack(worker: int) -> int:
        placed = counts.get(worker, (0, 0))
        return placed[other] - placed[role]

    best = max(alive, key=lack, default=source)
    if lack(best) <= 0 or (source in alive and lack(source) >= lack(best)):
        return source
    return best
