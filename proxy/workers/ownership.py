"""Which worker of a node owns a queue: pure logic, no I/O.

How this works
--------------
A node with ``[node] workers = N`` runs N worker processes behind one listener
(``proxy.workers.supervisor``). A local queue must stay one FIFO wherever its
clients land, so each one has exactly one owner. The supervisor decides it the
first time any worker asks about the name (``OwnerTable``, issue #45): the
worker that owns the fewest queues, its ketama ring owner (uhashring, the ring
fragmented queues use for their members) when that one is among the fewest.
Each worker asks once per name, over a channel of its own, and keeps the answer
(``QueueOwners``); the ring alone spread 16 queues over 16 workers 4, 3, 2, 2,
... and left 7 with none. A link attached on another worker is forwarded to the owner as a proxy
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
  any other node every worker reaches the members itself: no forwarding;
* fragmented queues with replicated fragments (rule ``replicas`` > 1, issue
  #45): owned as a replicated queue is, by the queue's name (``replicated_fragments``):
  the owner worker alone serves the queue on this node (one fragment, this node's, as
  a single process), keeps every copy of its fragments here (``fragment/<queue>/<m>``,
  its claims, its replication links) and serves the adopted ``<queue>@<m>``; the
  other workers forward every link of it there (docs/replication.md, "On every core").

Placement (issue #36, ``proxy.amqp.first_attach``): a connection whose first
attach names a local queue is handed to the queue's owner, so its messages
cross nothing; one whose first attach names a fragmented queue goes where its
role is missing (``balanced_worker``): a producer to a worker whose consumers
of that queue outnumber its producers, a consumer to one with more producers
than consumers, so a consumer's own fragment is fed and it seldom steals.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import orjson
from uhashring import HashRing

from routing.replication import replicas_of


def temp_prefix(node_id: str, worker: int) -> str:
    """The name prefix of the temporary queues worker ``worker`` makes."""
    return f"tmp.{node_id}.w{worker}."


def replicated_fragments(resolve, decision, address: str) -> str | None:
    """The fragmented queue with replicated fragments (rule ``replicas`` > 1) that ``address``
    belongs to: itself, or the queue of an adopted fragment ``<queue>@<member>`` (a dead
    member's fragment a backup serves, fragments.replicas) whatever rule matches that name;
    None: not one. ``resolve``: the routing table's, ``decision``: its answer for ``address``."""
    base, at, member = address.rpartition("@")
    if at and base:
        inner = resolve(base)
        rule = inner.rule
        if inner.kind == "fragmented" and rule is not None and replicas_of(rule) > 1 and \
                member in {m.key for m in rule.fragments}:
            return base
    rule = decision.rule
    if decision.kind == "fragmented" and rule is not None and replicas_of(rule) > 1:
        return address
    return None


MAX_ASSIGNED = 200_000  # names the table records; beyond, new names go by the ring alone

# What a queue weighs in the table's count (``OwnerTable.owner``): one whose clients the
# owner serves (its first use was a client's attach) twice what a backup copy weighs (first
# used by its primary's replication link: it only applies batches), the measured ratio of
# their cost on 16 cores (bench/README.md, issue #45).
SERVED, BACKUP = 2, 1


def ring_of(workers: int) -> HashRing | None:
    return HashRing(nodes=[f"w{k}" for k in range(workers)]) if workers > 1 else None


@dataclass
class QueueOwners:
    """A worker's view of ownership: the supervisor's table (``ask``, answered once per name
    and kept), the ring where there is no supervisor to ask (tests, ``ask`` None)."""

    node_id: str
    workers: int
    ask: Callable[[str], int] | None = None  # the supervisor's answer for a name (OwnerTable)
    _ring: HashRing | None = field(default=None, init=False, repr=False)
    _temp: str = field(default="", init=False, repr=False)
    _known: dict = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"workers must be at least 1, not {self.workers}")
        self._ring = ring_of(self.workers)
        self._temp = f"tmp.{self.node_id}.w"

    def ring_owner(self, address: str) -> int:
        return int(self._ring.get_node(address)[1:]) if self._ring is not None else 0

    def owner(self, address: str, weight: int = SERVED) -> int:
        """The worker that holds local (or replicated) queue ``address``; ``weight``: what it
        weighs if this is the name's first use on the node (``BACKUP``: a replication link)."""
        if self._ring is None:
            return 0
        if address.startswith(self._temp):
            digits, dot, _ = address[len(self._temp):].partition(".")
            if dot and digits.isdigit() and int(digits) < self.workers:
                return int(digits)
        if self.ask is None:
            return self.ring_owner(address)
        owner = self._known.get(address)
        if owner is None:
            owner = self.ask(address) if weight == SERVED else self.ask(address, weight=weight)
            if len(self._known) < MAX_ASSIGNED:
                self._known[address] = owner
        return owner

    def claim(self, address: str) -> int:
        """This worker's journal brought ``address`` back: the supervisor records it as this
        worker's unless another owns it already; the owner it names, kept."""
        owner = self._known[address] = self.ask(address, claim=True)
        return owner

    def owner_of_kind(self, kind: str, address: str, weight: int = SERVED) -> int | None:
        """The worker that serves an address routed as ``kind`` (a local or a replicated queue:
        its owner, issue #45: each copy of a replicated queue on this node, its claim in etcd
        and its replication links are that worker's); None: any worker (its own
        links: proxy rules have upstream connections in every worker, fragmented queues a
        fragment or their own links to the members)."""
        if kind in ("local", "replicated"):
            return self.owner(address, weight)
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


class OwnerTable:
    """The supervisor's table of owners (issue #45): a name seen for the first time goes to the
    worker with the fewest queues of its weight (a queue whose clients it serves weighs
    ``SERVED``, a backup copy ``BACKUP``), then the least weight in all, then its ring owner
    when that one is among them; so N queues of one weight on W workers are never more than
    one apart, and 8 served queues and 8 backups on 8 workers are one of each, where the ring alone put 4 of 16
    queues on one worker of 16 and none on 7. Kept in ``path`` (a JSON line per name), so a
    node started again with as many workers finds its durable queues' journals where their
    owner is; a worker's recovered queues are claimed for it (``owner(name, claim=K)``).
    Beyond ``MAX_ASSIGNED`` names, new ones go by the ring and are not recorded."""

    def __init__(self, workers: int, path=None) -> None:
        self.workers = workers
        self.ring = ring_of(workers)
        self.assigned: dict[str, int] = {}
        self.load = [0] * workers  # the weight of each worker's queues
        self.kinds: dict[int, list[int]] = {}  # weight -> how many queues of it each worker has
        self.path = path
        self._file = None
        if path is not None:
            self._load(path)
            self._file = open(path, "ab")

    def _load(self, path) -> None:
        try:
            lines = open(path, "rb").read().splitlines()
        except FileNotFoundError:
            return
        for line in lines:
            try:
                name, owner = orjson.loads(line)
            except (orjson.JSONDecodeError, ValueError, TypeError):
                continue  # a line cut short by a crash
            if isinstance(name, str) and isinstance(owner, int) and 0 <= owner < self.workers:
                counts = self.kinds.setdefault(SERVED, [0] * self.workers)
                if name in self.assigned:  # weights are not kept: each counts as SERVED
                    self.load[self.assigned[name]] -= SERVED
                    counts[self.assigned[name]] -= 1
                self.load[owner] += SERVED
                counts[owner] += 1
                self.assigned[name] = owner

    def ring_owner(self, name: str) -> int:
        return int(self.ring.get_node(name)[1:]) if self.ring is not None else 0

    def owner(self, name: str, claim: int | None = None, weight: int = SERVED) -> int:
        owner = self.assigned.get(name)
        if owner is not None:
            return owner
        if claim is not None:
            owner = claim
        elif len(self.assigned) >= MAX_ASSIGNED:
            return self.ring_owner(name)
        else:
            # the fewest queues of this weight, then the least weight in all, then the ring's
            same = self.kinds.setdefault(weight, [0] * self.workers)
            least = min(range(self.workers), key=lambda k: (same[k], self.load[k]))
            preferred = self.ring_owner(name)
            owner = preferred if (same[preferred], self.load[preferred]) == (
                same[least], self.load[least]) else least
        self.assigned[name] = owner
        self.load[owner] += weight
        self.kinds.setdefault(weight, [0] * self.workers)[owner] += 1
        if self._file is not None:
            self._file.write(orjson.dumps([name, owner]) + b"\n")
            self._file.flush()  # in the OS's hands: a crash of the node keeps it
        return owner

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


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
