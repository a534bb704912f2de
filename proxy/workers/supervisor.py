"""The supervisor of a node with ``[node] workers = N``: one listener, N worker processes.

How this works
--------------
``fedgate serve`` with more than one worker runs this instead of a node. It
binds the node's ``listen`` address, starts N worker processes (``fedgate
_worker``, each a full ``proxy.node.Node`` told which worker it is, see
``proxy.workers.worker``) and waits until each says it is ready. Then it
accepts: every connection is checked against the node-wide limits
(``max_connections``, ``max_connections_per_ip``) and passed, as a file
descriptor, to the worker that has the fewest connections; refused ones are
closed at once, as a single-process node does. A worker may hand a connection
on once it has read its first attach (placement: ``proxy.workers.worker``);
the supervisor passes it and moves its counts. Workers report closed
connections and authenticated users back, so the counts are the node's, and
the supervisor tells every worker when a user reaches or leaves
``max_connections_per_user``.

Supervision: a worker that exits is started again (after 1 s, doubling up to
30 s while it keeps dying within a minute of its start); its clients were
disconnected and reconnect to the others, the others' clients see nothing.
SIGTERM or SIGINT stop the accepting, pass SIGTERM to every worker (each drains
as a single node does) and wait for them, killing what is left after
``STOP_TIMEOUT``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import socket
import sys
from dataclasses import dataclass, field

import orjson

from proxy.config.compat import SUPERVISOR_VERSION
from proxy.config.settings import Config
from proxy.config.version import version as release_version
from proxy.workers.ownership import BACKUP, SERVED, OwnerTable, balanced_worker
from proxy.workers.worker import MAX_HANDOVER

log = logging.getLogger("fedgate.supervisor")

READY_TIMEOUT = 60.0  # seconds for a worker to start (durable queues recover first)
STOP_TIMEOUT = 15.0  # seconds for the workers to drain on SIGTERM
RESTART_DELAY = 1.0
RESTART_DELAY_MAX = 30.0
STABLE_AFTER = 60.0  # a worker up this long is healthy again: its next restart waits RESTART_DELAY
ACCEPT_BATCH = 128


@dataclass
class WorkerProcess:
    index: int
    channel: socket.socket | None = None
    owner_channel: socket.socket | None = None  # its questions about queues' owners
    process: asyncio.subprocess.Process | None = None
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    per_ip: dict[str, int] = field(default_factory=dict)  # its open client connections
    per_user: dict[str, int] = field(default_factory=dict)  # its authenticated connections
    connections: int = 0
    started: float = 0.0
    restart_delay: float = RESTART_DELAY
    restarts: int = 0
    # its topic subscriptions, as it announced them (``s``): name -> entry; told to the others
    subscriptions: dict[str, dict] = field(default_factory=dict)


class Supervisor:
    def __init__(self, config: Config, count: int, worker_args: list[str]) -> None:
        self.config = config
        self.count = count
        self.worker_args = worker_args  # the command-line overrides every worker gets
        self.workers = [WorkerProcess(k) for k in range(count)]
        self.per_ip: dict[str, int] = {}
        self.per_user: dict[str, int] = {}
        # fragmented queues' placement: group -> worker -> [consumers, producers] placed there
        self.balance: dict[str, dict[int, list[int]]] = {}
        self.listeners: list[socket.socket] = []
        self.address: tuple[str, int] | None = None
        self.stopping = False
        self.loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task] = set()
        # worker 0 asks the other workers' admin apps (admin_api.workers) with this token
        self.admin_token = secrets.token_urlsafe(32)
        self.owners: OwnerTable | None = None  # every queue's owner worker (start)

    # -- start and stop ------------------------------------------------------------
    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        host, port = self.config.listen
        self._bind(host, port)
        data_dir = os.path.abspath(self.config.node.data_dir)
        os.makedirs(os.path.join(data_dir, "workers"), mode=0o700, exist_ok=True)
        self.owners = OwnerTable(self.count, os.path.join(data_dir, "workers", "owners"))
        for worker in self.workers:
            await self._spawn(worker)
        try:
            await asyncio.wait_for(asyncio.gather(*(w.ready.wait() for w in self.workers)),
                                   READY_TIMEOUT)
        except asyncio.TimeoutError:
            late = [w.index for w in self.workers if not w.ready.is_set()]
            raise RuntimeError(f"workers {late} did not start within {READY_TIMEOUT:.0f}s") from None
        for sock in self.listeners:
            self.loop.add_reader(sock.fileno(), self._accept, sock)

    def _bind(self, host: str, port: int) -> None:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        for family, type_, proto, _, address in dict.fromkeys((i[0], i[1], i[2], None, i[4]) for i in infos):
            sock = socket.socket(family, type_, proto)
            self.listeners.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(4096)
            sock.setblocking(False)
            if port == 0:  # the other families listen on the port the first one got
                port = sock.getsockname()[1]
        self.address = self.listeners[0].getsockname()[:2]

    @property
    def url(self) -> str:
        host, port = self.address
        scheme = "amqps" if self.config.tls is not None else "amqp"
        host = f"[{host}]" if ":" in host else host
        return f"{scheme}://{host}:{port}"

    async def _spawn(self, worker: WorkerProcess) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        asked, asking = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        host, port = self.address
        args = [sys.executable, "-m", "proxy", "_worker", "--index", str(worker.index),
                "--count", str(self.count), "--channel-fd", str(theirs.fileno()),
                "--owners-fd", str(asking.fileno()),
                "--listen", f"[{host}]:{port}" if ":" in host else f"{host}:{port}",
                *self.worker_args]
        try:
            worker.process = await asyncio.create_subprocess_exec(
                *args, pass_fds=(theirs.fileno(), asking.fileno()),
                env={**os.environ, "FEDGATE_WORKER_TOKEN": self.admin_token,
                     # a worker runs only under a supervisor of its own release (the worker
                     # channels are not versioned: docs/upgrades.md)
                     SUPERVISOR_VERSION: release_version()})
        finally:
            theirs.close()
            asking.close()
        asked.setblocking(False)
        worker.owner_channel = asked
        self.loop.add_reader(asked.fileno(), self._answer_owner, worker)
        ours.setblocking(False)
        worker.channel = ours
        worker.ready.clear()
        worker.started = self.loop.time()
        self.loop.add_reader(ours.fileno(), self._read, worker)
        self._track(self.loop.create_task(self._watch(worker, worker.process)))
        log.info("worker %d started (pid %d)", worker.index, worker.process.pid)

    def _track(self, task: asyncio.Task) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def stop(self) -> None:
        self.stopping = True
        for sock in self.listeners:
            self.loop.remove_reader(sock.fileno())
            sock.close()
        running = [w.process for w in self.workers if w.process and w.process.returncode is None]
        for process in running:
            process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.gather(*(p.wait() for p in running)), STOP_TIMEOUT)
        except asyncio.TimeoutError:
            for process in running:
                if process.returncode is None:
                    log.error("worker pid %d did not stop within %.0fs; killing it",
                              process.pid, STOP_TIMEOUT)
                    process.kill()
            await asyncio.gather(*(p.wait() for p in running))
        for worker in self.workers:
            self._close_channel(worker)

    # -- supervision ---------------------------------------------------------------
    async def _watch(self, worker: WorkerProcess, process) -> None:
        code = await process.wait()
        if self.stopping or worker.process is not process:
            return
        self._close_channel(worker)
        self._forget(worker)
        up_for = self.loop.time() - worker.started
        if up_for > STABLE_AFTER:
            worker.restart_delay = RESTART_DELAY
        delay = worker.restart_delay
        worker.restart_delay = min(RESTART_DELAY_MAX, delay * 2)
        log.error("worker %d (pid %d) exited with %s after %.0fs; starting it again in %.0fs",
                  worker.index, process.pid, code, up_for, delay)
        await asyncio.sleep(delay)
        if not self.stopping:
            worker.restarts += 1
            await self._spawn(worker)

    def _answer_owner(self, worker: WorkerProcess) -> None:
        """``Q<name>``: the owner of queue ``name`` (decided now if nobody asked before;
        ``B<name>``: the same, first used as a backup copy, which weighs less);
        ``K<name>``: the same, this worker's if nobody has it yet (its journal brought it
        back). Answered ``A<worker>``."""
        channel = worker.owner_channel
        while channel is not None:
            try:
                question = channel.recv(MAX_HANDOVER)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                question = b""
            if not question:  # the worker is gone; _watch starts it again
                self.loop.remove_reader(channel.fileno())
                return
            name = question[1:].decode("utf-8", "replace")
            claim = worker.index if question[:1] == b"K" else None
            owner = self.owners.owner(name, claim=claim,
                                      weight=BACKUP if question[:1] == b"B" else SERVED)
            if claim is not None and owner != claim:
                log.error("worker %d brought queue %r back from its journal, but worker %d owns "
                          "it: those messages stay in worker %d's journal", worker.index, name,
                          owner, worker.index)
            try:
                channel.send(b"A%d " % owner + question[1:])  # names what it answers
            except OSError as exc:
                log.error("worker %d: owner of %r not answered (%s)", worker.index, name, exc)

    def _close_channel(self, worker: WorkerProcess) -> None:
        if worker.owner_channel is not None:
            with contextlib.suppress(ValueError, OSError):
                self.loop.remove_reader(worker.owner_channel.fileno())
            worker.owner_channel.close()
            worker.owner_channel = None
        if worker.channel is not None:
            self.loop.remove_reader(worker.channel.fileno())
            worker.channel.close()
            worker.channel = None

    def _forget(self, worker: WorkerProcess) -> None:
        """A worker is gone and its connections with it."""
        for ip, n in worker.per_ip.items():
            self._count(self.per_ip, ip, -n)
        for user, n in worker.per_user.items():
            self._user_count(user, -n)
        worker.per_ip.clear()
        worker.per_user.clear()
        worker.connections = 0
        for name, entry in list(worker.subscriptions.items()):
            if not entry.get("durable"):  # gone with the process; durable ones come back with it
                del worker.subscriptions[name]
                self._tell_others(worker, b"S" + orjson.dumps([worker.index, "-", entry]))
        for group in list(self.balance):
            counts = self.balance[group]
            counts.pop(worker.index, None)
            if not counts:
                del self.balance[group]

    # -- accepting -----------------------------------------------------------------
    def _accept(self, listener: socket.socket) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                sock, peer = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as exc:
                log.error("cannot accept (%s); pausing 1s", exc)
                self.loop.remove_reader(listener.fileno())
                self.loop.call_later(1.0, self._resume, listener)
                return
            try:
                self._pass(sock, str(peer[0]), f"{peer[0]}:{peer[1]}")
            finally:
                sock.close()  # the worker has its own descriptor now (or it was refused)

    def _resume(self, listener: socket.socket) -> None:
        if not self.stopping:
            self.loop.add_reader(listener.fileno(), self._accept, listener)

    def _refuse(self, peer: str, reason: str) -> None:
        # worded as a single-process node says it
        where = " before TLS" if self.config.tls is not None else ""
        log.warning("connection from %s refused%s: %s", peer, where, reason)

    def _pass(self, sock: socket.socket, ip: str, peer: str) -> None:
        limits = self.config.limits
        total = sum(w.connections for w in self.workers)
        if limits.max_connections and total >= limits.max_connections:
            self._refuse(peer, f"connection limit {limits.max_connections} reached")
            return
        count = self.per_ip.get(ip, 0)
        if limits.max_connections_per_ip and count >= limits.max_connections_per_ip:
            self._refuse(peer, f"{count} connections from {ip} (max_connections_per_ip)")
            return
        alive = [w for w in self.workers if w.channel is not None and w.ready.is_set()]
        if not alive:
            self._refuse(peer, "no worker running")
            return
        worker = min(alive, key=lambda w: w.connections)
        try:
            socket.send_fds(worker.channel, [b"C" + ip.encode()], [sock.fileno()])
        except OSError as exc:
            log.error("passing a connection to worker %d failed (%s); closing it", worker.index, exc)
            return
        worker.connections += 1
        self._count(worker.per_ip, ip, 1)
        self._count(self.per_ip, ip, 1)

    # -- what the workers say --------------------------------------------------------
    def _read(self, worker: WorkerProcess) -> None:
        channel = worker.channel
        while channel is not None:
            try:
                message, fds, _, _ = socket.recv_fds(channel, MAX_HANDOVER, 4)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                message, fds = b"", []
            if not message:  # the worker is gone; _watch restarts it
                for fd in fds:
                    os.close(fd)
                self.loop.remove_reader(channel.fileno())
                return
            if message[:1] == b"H" and fds:
                for extra in fds[1:]:
                    os.close(extra)
                self._hand_over(worker, message[1:], fds[0])
                continue
            for fd in fds:
                os.close(fd)
            tag, text = message[:1], message[1:].decode("utf-8", "replace")
            if tag == b"R":
                worker.ready.set()
                log.info("worker %d ready", worker.index)
                self._tell_subscriptions(worker)
            elif tag == b"s":
                self._subscription(worker, message[1:])
            elif tag == b"c":
                if worker.per_ip.get(text):
                    worker.connections -= 1
                    self._count(worker.per_ip, text, -1)
                    self._count(self.per_ip, text, -1)
            elif tag == b"u":
                self._count(worker.per_user, text, 1)
                self._user_count(text, 1)
            elif tag == b"x":
                try:
                    group, role = orjson.loads(message[1:])
                    self._count_balance(str(group), worker.index, int(role), -1)
                except (orjson.JSONDecodeError, TypeError, ValueError, IndexError) as exc:
                    log.error("worker %d: a balance message that does not read (%r)", worker.index, exc)
            elif tag == b"v":
                if worker.per_user.get(text):
                    self._count(worker.per_user, text, -1)
                    self._user_count(text, -1)

    def _hand_over(self, source: WorkerProcess, payload: bytes, fd: int) -> None:
        """Worker ``source`` hands a connection to another (placement, proxy.workers.worker):
        its counts move with it; back to ``source`` if the other is not running."""
        try:
            head = orjson.loads(payload.partition(b"\0")[0])
            ip, user, counted = str(head["ip"]), str(head.get("user", "")), bool(head.get("counted"))
            balance = head.get("balance")
            if balance is not None:  # a fragmented queue's: the worker that lacks the role
                group, role = str(balance[0]), int(balance[1])
                alive = [w.index for w in self.workers if w.channel is not None and w.ready.is_set()]
                target = self.workers[balanced_worker(self.balance.get(group, {}), source.index,
                                                      role, alive)]
            else:
                target = self.workers[int(head["to"])]
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, ValueError) as exc:
            log.error("worker %d: a hand-over without a valid head (%r); connection closed",
                      source.index, exc)
            os.close(fd)
            return
        try:
            if target.channel is None or not target.ready.is_set():
                target = source
            for destination in ((target, source) if target is not source else (source,)):
                try:
                    socket.send_fds(destination.channel, [b"M" + payload], [fd])
                except (OSError, AttributeError) as exc:  # AttributeError: its channel is gone
                    log.error("passing a handed-over connection to worker %d failed (%s)",
                              destination.index, exc)
                    continue
                if balance is not None:
                    self._count_balance(group, destination.index, role, 1)
                if destination is not source and source.per_ip.get(ip):
                    source.connections -= 1
                    destination.connections += 1
                    self._count(source.per_ip, ip, -1)
                    self._count(destination.per_ip, ip, 1)
                    if counted and source.per_user.get(user):
                        self._count(source.per_user, user, -1)
                        self._count(destination.per_user, user, 1)
                return
            # nobody took it: the client is disconnected, as when its worker dies
            if source.per_ip.get(ip):
                source.connections -= 1
                self._count(source.per_ip, ip, -1)
                self._count(self.per_ip, ip, -1)
            if counted and source.per_user.get(user):
                self._count(source.per_user, user, -1)
                self._user_count(user, -1)
        finally:
            os.close(fd)

    def _count_balance(self, group: str, worker: int, role: int, delta: int) -> None:
        counts = self.balance.setdefault(group, {})
        placed = counts.setdefault(worker, [0, 0])
        placed[role] = max(0, placed[role] + delta)
        if placed == [0, 0]:
            del counts[worker]
            if not counts:
                del self.balance[group]

    @staticmethod
    def _count(counts: dict[str, int], key: str, delta: int) -> None:
        n = counts.get(key, 0) + delta
        if n > 0:
            counts[key] = n
        else:
            counts.pop(key, None)

    def _user_count(self, user: str, delta: int) -> None:
        limit = self.config.limits.max_connections_per_user
        before = self.per_user.get(user, 0)
        self._count(self.per_user, user, delta)
        after = self.per_user.get(user, 0)
        if not limit:
            return
        if before < limit <= after:
            self._tell_all(b"F" + user.encode())
        elif after < limit <= before:
            self._tell_all(b"f" + user.encode())

    # -- topic subscriptions: every worker knows where each one is (proxy.exchanges) -----------
    def _subscription(self, worker: WorkerProcess, payload: bytes) -> None:
        """``s[op, entry]``: worker made ("+") or removed ("-") a subscription; the others hear
        ``S[worker, op, entry]``."""
        try:
            op, entry = orjson.loads(payload)
            name = entry["name"]
        except (orjson.JSONDecodeError, TypeError, ValueError, KeyError) as exc:
            log.error("worker %d: a subscription message that does not read (%r)", worker.index, exc)
            return
        if op == "+":
            worker.subscriptions[name] = entry
        else:
            worker.subscriptions.pop(name, None)
        self._tell_others(worker, b"S" + orjson.dumps([worker.index, op, entry]))

    def _tell_subscriptions(self, worker: WorkerProcess) -> None:
        """A worker (re)started: every other worker's subscriptions, one message each."""
        for other in self.workers:
            if other is worker or worker.channel is None:
                continue
            for entry in other.subscriptions.values():
                try:
                    worker.channel.send(b"S" + orjson.dumps([other.index, "+", entry]))
                except OSError as exc:
                    log.error("telling worker %d the subscriptions failed: %s", worker.index, exc)
                    return

    def _tell_others(self, source: WorkerProcess, message: bytes) -> None:
        for worker in self.workers:
            if worker is not source and worker.channel is not None:
                try:
                    worker.channel.send(message)
                except OSError as exc:
                    log.error("telling worker %d failed: %s", worker.index, exc)

    def _tell_all(self, message: bytes) -> None:
        for worker in self.workers:
            if worker.channel is not None:
                try:
                    worker.channel.send(message)
                except OSError as exc:
                    log.error("telling worker %d failed: %s", worker.index, exc)

    def describe(self) -> list[dict]:
        return [{"worker": w.index, "pid": w.process.pid if w.process else None,
                 "connections": w.connections, "restarts": w.restarts,
                 "ready": w.ready.is_set()} for w in self.workers]


async def run(config: Config, count: int, worker_args: list[str]) -> int:
    supervisor = Supervisor(config, count, worker_args)
    try:
        await supervisor.start()
        print(f"fedgate node {config.node.id} listening on {supervisor.url} "
              f"({count} workers)", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        log.info("signal received, stopping %d workers", count)
    finally:
        await supervisor.stop()
    return 0

