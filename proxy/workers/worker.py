"""One worker process of a node: what it adds to a ``Node``.

How this works
--------------
The supervisor (``proxy.workers.supervisor``) accepts every client connection,
applies the node-wide limits (total, per source IP) and passes the socket to
the worker with the fewest connections, over a ``SOCK_SEQPACKET`` channel of
the worker's own (``SCM_RIGHTS``). The worker serves it exactly as if it had
accepted it (TLS, SASL, ACL, its links). Messages on the channel:

====================  ======================  ======================================
supervisor -> worker  ``C<ip>`` + descriptor  a client connection, admitted
                      ``M<handover>`` + desc.  a connection another worker began (below)
                      ``F<user>`` / ``f<user>``  the user is at / below its connection limit
                      ``S[worker, op, entry]``  a topic subscription another worker made
                                              (``+``) or removed (``-``); all of them at start
worker -> supervisor  ``c<ip>``               that connection closed
                      ``u<user>`` / ``v<user>``  a connection of that user authenticated / closed
                      ``H<handover>`` + desc.  hand this connection to another worker
                      ``x[group, role]``      a connection placed by that balance closed
                      ``s[op, entry]``        this worker made / removed a subscription
====================  ======================  ======================================

Placement (issue #36): a connection whose first attach names a local queue
another worker owns is handed to that worker before proton reads a frame of
it (``proxy.amqp.first_attach``), so a client's messages need not cross to the
owner one by one. ``<handover>`` is a JSON head (the worker it goes ``to``, the
client's ``ip``, the identity SASL established, whether the user is counted
against ``max_connections_per_user``, and in hex what the client was already
answered: our AMQP header, and our open and begin if it waited for them), a NUL
byte, and the frames the client sent after its AMQP header. The supervisor moves the connection's counts from
one worker to the other and passes it on (back to the sender if the target is
not running). For a fragmented queue the head says ``balance`` (the group and
the role, consumer or producer) instead of a worker, and the supervisor picks
one (``ownership.balanced_worker``), counting the connection there until the
worker serving it says ``x``.

Per-user limits: the supervisor counts each user's connections over all workers
and tells every worker when a user reaches ``max_connections_per_user``; a
worker refuses that user's next connections until it hears the count fell. Two
workers authenticating the same user in the same instant can each admit one
before the news arrives, so a user may briefly hold up to ``workers - 1``
connections over the limit.

Each worker also listens on a Unix socket of its own (``<data_dir>/workers/
worker-K.sock``) for links forwarded by the other workers. Routing here is the
node's routing plus ownership (``proxy.workers.ownership``): an attach to a
local queue another worker owns becomes a proxy link to that worker (one shared
upstream connection per worker pair, end-to-end settlement, bodies never
decoded), exactly as a proxy rule to a peer node. Proxy rules need no
forwarding: every worker has its own upstream connections. Connections on the
Unix socket are trusted (the ACL was applied where the client connected), carry
no SASL and have no link or session limit: one of them carries the links of
many clients.
"""

from __future__ import annotations

import array
import asyncio
import logging
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from routing import Decision, Rule, UpstreamOptions

from .ownership import SERVED, QueueOwners, replicated_fragments

log = logging.getLogger("fedgate.workers")

MAX_MESSAGE = 1024  # a channel message: a tag byte and an address or user name
OWNER_TIMEOUT = 5.0  # seconds for the supervisor to name a queue's owner
MAX_HANDOVER = 64 * 1024  # a hand-over message: its head and the frames held (first_attach.MAX_HELD)


def socket_dir(data_dir: Path) -> Path:
    return data_dir / "workers"


@dataclass
class WorkerContext:
    """What a node needs to know to run as worker ``index`` of ``count``."""

    index: int
    count: int
    data_dir: Path
    owners: QueueOwners
    channel: socket.socket | None = None  # to the supervisor; None: tests wire workers by hand
    # to the supervisor's table of owners: a question, its answer (ask_owner); blocking
    owner_channel: socket.socket | None = None
    admin_token: str = ""  # the other workers' admin sockets accept this one only (admin_api.workers)
    full_users: set[str] = field(default_factory=set)  # at max_connections_per_user node-wide
    # told (worker, op, entry) for each ``S`` message: another worker's topic subscriptions
    # (proxy.exchanges.subscriptions); None: nobody listens
    on_subscription: object = None
    _rules: dict[int, Rule] = field(default_factory=dict, repr=False)

    def socket_path(self, worker: int) -> str:
        return str(socket_dir(self.data_dir) / f"worker-{worker}.sock")

    def url(self, worker: int) -> str:
        return f"amqp+unix://{self.socket_path(worker)}"

    def ask_owner(self, name: str, claim: bool = False, weight: int = SERVED) -> int:
        """The supervisor's owner of queue ``name`` (``claim``: this worker's, unless it has one
        already: a queue its journal brought back; ``weight`` BACKUP: first used as a backup
        copy). Asked once per name (QueueOwners keeps the answer), blocking: the supervisor
        answers from memory, never waiting on a worker."""
        question = (b"K" if claim else b"Q" if weight == SERVED else b"B") + name.encode()
        try:
            self.owner_channel.settimeout(OWNER_TIMEOUT)
            self.owner_channel.send(question)
            while True:  # the answer names the question: one a timeout left behind is skipped
                answer = self.owner_channel.recv(MAX_HANDOVER)
                number, _, asked = answer[1:].partition(b" ")
                if answer[:1] != b"A":
                    raise OSError(f"answer {answer[:16]!r}")
                if asked == question[1:]:
                    return int(number)
        except (OSError, ValueError) as exc:
            # the supervisor is gone (this worker stops too) or stuck: the ring decides
            log.error("worker %d: the owner of %r not known from the supervisor (%s); the ring "
                      "decides", self.index, name, exc)
            return self.owners.ring_owner(name)

    def _rule(self, worker: int) -> Rule:
        rule = self._rules.get(worker)
        if rule is None:
            # a peer id, not a URL, as primary: the decision carries the socket's URL
            rule = Rule(name=f"worker-{worker}", match="#", kind="proxy", primary=f"worker-{worker}",
                        # no idle re-check: a probe attach would make the queue on its owner
                        upstream=UpstreamOptions(recheck_interval=0.0, split_directions=False))
            self._rules[worker] = rule
        return rule

    def resolver(self, resolve):
        """``resolve`` (the routing table's) with ownership: addresses another worker
        serves become proxy decisions to that worker."""
        owners, me = self.owners, self.index

        def resolve_here(address: str) -> Decision:
            decision = resolve(address)
            queue = replicated_fragments(resolve, decision, address)
            owner = owners.owner(queue) if queue is not None else \
                owners.owner_of_kind(decision.kind, address)
            if decision.kind == "proxy" and decision.rule is not None and decision.rule.upstream:
                upstream = decision.rule.upstream  # a node-wide cap on its connections
                owner = owners.upstream_owner(me, upstream.max_connections,
                                              upstream.connections_per_worker)
            if owner is None or owner == me:
                return decision
            return self.forward(owner, address, f"{decision.kind} queue on worker {owner} of "
                                                f"this node ({decision.reason})")

        return resolve_here

    def forward(self, owner: int, address: str, reason: str) -> Decision:
        """A proxy decision to worker ``owner`` of this node (its Unix socket)."""
        return Decision(kind="proxy", rule=self._rule(owner), address=address,
                        remote_address=address, primary=f"worker-{owner}",
                        primary_url=self.url(owner), reason=reason)

    # -- the supervisor's channel ------------------------------------------------
    def listen(self, adopt, adopt_handed=None) -> None:
        """Serve what the supervisor sends: ``adopt(sock)`` for each connection,
        ``adopt_handed(sock, head, frames)`` for each handed over by another worker."""
        if self.channel is None:
            return
        self.channel.setblocking(False)
        loop = asyncio.get_running_loop()
        loop.add_reader(self.channel.fileno(), self._read, adopt, adopt_handed)

    def hand_over(self, fd: int, head: dict, frames: bytes) -> bool:
        """Ask the supervisor to pass connection ``fd`` to worker ``head["to"]``."""
        if self.channel is None:
            return False
        message = b"H" + orjson.dumps(head) + b"\0" + frames
        if len(message) > MAX_HANDOVER:
            return False
        try:
            socket.send_fds(self.channel, [message], [fd])
        except OSError as exc:  # full or gone: the connection stays here
            log.info("worker %d: handing a connection to worker %s failed (%s)", self.index,
                     head.get("to"), exc)
            return False
        return True

    def _read(self, adopt, adopt_handed) -> None:
        while True:
            try:
                message, fds, _, _ = socket.recv_fds(self.channel, MAX_HANDOVER, 4)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.error("worker %d: channel to the supervisor failed (%s); stopping", self.index, exc)
                self._orphaned()
                return
            if not message and not fds:  # the supervisor is gone: so are we
                self._orphaned()
                return
            if message[:1] == b"M" and fds and adopt_handed is not None:
                self._adopt_handed(adopt_handed, message[1:], fds)
                continue
            tag, text = message[:1], message[1:].decode("utf-8", "replace")
            if tag == b"S":
                self._subscription_heard(message[1:])
                continue
            if tag == b"C" and fds:
                for extra in fds[1:]:
                    os.close(extra)
                sock = socket.socket(fileno=fds[0])
                try:
                    adopt(sock)
                except Exception:
                    log.exception("worker %d: serving a passed connection failed", self.index)
                    sock.close()
                    self.send(b"c", text)
            else:
                for fd in fds:
                    os.close(fd)
                if tag == b"F":
                    self.full_users.add(text)
                elif tag == b"f":
                    self.full_users.discard(text)

    def _adopt_handed(self, adopt_handed, payload: bytes, fds: list[int]) -> None:
        for extra in fds[1:]:
            os.close(extra)
        sock = socket.socket(fileno=fds[0])
        head, _, frames = payload.partition(b"\0")
        try:
            info = orjson.loads(head)
        except orjson.JSONDecodeError:
            log.error("worker %d: a hand-over message without its head; closing the connection",
                      self.index)
            sock.close()
            return
        try:
            adopt_handed(sock, info, frames)
        except Exception:
            log.exception("worker %d: serving a handed-over connection failed", self.index)
            sock.close()
            self.send(b"c", str(info.get("ip", "")))  # the supervisor counted it here
            if info.get("counted"):
                self.send(b"v", str(info.get("user", "")))
            if info.get("balance"):
                self.send_balance_left(info["balance"])

    def _subscription_heard(self, payload: bytes) -> None:
        try:
            worker, op, entry = orjson.loads(payload)
        except (orjson.JSONDecodeError, TypeError, ValueError) as exc:
            log.error("worker %d: a subscription message that does not read (%r)", self.index, exc)
            return
        if self.on_subscription is not None:
            self.on_subscription(int(worker), op, entry)

    def announce_subscription(self, op: str, entry: dict) -> None:
        """Tell the other workers (through the supervisor) of a subscription made or removed."""
        if self.channel is None:
            return
        try:
            self.channel.send(b"s" + orjson.dumps([op, entry]))
        except OSError as exc:
            log.error("worker %d: supervisor channel: subscription %r not told (%s)", self.index,
                      entry.get("name"), exc)

    def send_balance_left(self, balance: list) -> None:
        """A connection placed by a fragmented queue's balance closed: [group, role]."""
        if self.channel is None:
            return
        try:
            self.channel.send(b"x" + orjson.dumps(balance))
        except OSError as exc:
            log.error("worker %d: supervisor channel: balance of %r not told (%s)", self.index,
                      balance, exc)

    def _orphaned(self) -> None:
        loop = asyncio.get_running_loop()
        loop.remove_reader(self.channel.fileno())
        os.kill(os.getpid(), 15)  # SIGTERM: the node drains and stops

    def send(self, tag: bytes, text: str) -> None:
        if self.channel is None:
            return
        try:
            self.channel.send(tag + text.encode()[:MAX_MESSAGE - 1])
        except (BlockingIOError, InterruptedError):
            # the supervisor is not reading: the count drifts (logged) rather than block a worker
            log.error("worker %d: supervisor channel full; %r for %r not sent", self.index, tag, text)
        except OSError:
            pass  # the supervisor is gone; _read sees it
