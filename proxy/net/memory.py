"""Nodes, primaries and peers in one process, joined by in-memory pipes.

How this works
--------------
``MemoryNetwork`` stands in for the sockets between hosts. Each node gets the
view of one host (``network.host("b")``), which has the ``serve`` and
``connect`` of ``proxy.net.network.TcpNetwork``: a listener is a protocol
factory registered under ``(host, port)``; a connect to it makes a pipe of two
``MemoryTransport``s, one per protocol, with asyncio's callback contract
(``connection_made`` once, ``data_received`` per write, ``eof_received`` and
``connection_lost`` exactly once per side). Bytes written are delivered to the
other side by ``loop.call_soon``, so they arrive in order and only when the
loop runs: the same interleaving real sockets give, without their timing.
Each side writes through the TCP transport's ``WriteBuffer`` into a stand-in
for the kernel's socket buffer (``socket_buffer`` bytes unread per direction):
a reader that pauses reading backs the pipe up as TCP does, the writer's
buffer grows, and it gets ``pause_writing`` past its high-water mark and
``resume_writing`` once the reader has read enough for its buffer to fall to
the low-water mark.

What the network can do to them, as tests need it:

* ``cut(a, b)``: every connection between hosts a and b is reset (both sides
  see ``connection_lost``);
* ``partition(a, b)`` / ``heal(a, b)``: bytes between a and b are dropped
  silently (heartbeats must notice, §2.4.5);
* ``kill(a)``: host a is gone: its connections reset, its listeners removed,
  and connects to or from it refused until ``revive(a)``.

``taps`` are called with ``(pipe id, source host, destination host, bytes)``
for every delivered chunk (frame decoding is the tap's business). ``busy``
sums, per host, the CPU time its protocols spent handling what arrived (what a
node process would spend on it, less the system calls): ``bench/proxy_hop.py``
reads it.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import defaultdict, deque
from time import thread_time
from typing import Callable

from proxy.net.write_buffer import WriteBuffer


# what a socket's kernel buffer holds unread, per direction (the memory network's stand-in)
SOCKET_BUFFER = 256 * 1024


class MemoryTransport(asyncio.Transport):
    """One side of a pipe: writes go to the other side's protocol.

    Writes go through the same ``WriteBuffer`` as the node's TCP transport, in
    front of a stand-in for the kernel's socket buffer: a side has
    ``network.socket_buffer`` bytes of room for what it sent and the peer has
    not read yet (on the way, or waiting while the peer's reading is paused);
    what does not fit waits in the ``WriteBuffer`` until the peer reads, as on a
    socket, with ``pause_writing`` / ``resume_writing`` past its water marks.
    """

    def __init__(self, network: "MemoryNetwork", pipe: "Pipe", host: str, peer_host: str,
                 peer_port: int) -> None:
        super().__init__()
        self._network = network
        self._pipe = pipe
        self._host = host
        self._peername = (peer_host, peer_port)
        self.peer: MemoryTransport | None = None
        self.protocol = None
        self._closing = False
        self._lost = False
        self._paused = False
        self._delayed: deque = deque()  # written, carried with the pair's latency (in order)
        self._waiting: list[bytes] = []  # arrived while reading was paused
        self._out: WriteBuffer | None = None  # set with the protocol (attach)
        self._in_kernel = 0  # bytes this side sent that the peer has not read yet
        self._writable_soon = False  # a writability callback is scheduled

    def attach(self, protocol) -> None:
        self.protocol = protocol
        self._out = WriteBuffer(self._send, protocol)

    # -- asyncio.Transport ------------------------------------------------------------
    def get_extra_info(self, name, default=None):
        return {"peername": self._peername, "sockname": (self._host, 0)}.get(name, default)

    def set_write_buffer_limits(self, high=None, low=None) -> None:
        self._out.set_limits(high, low)

    def get_write_buffer_size(self) -> int:
        return self._out.waiting

    @property
    def bytes_sent(self) -> int:
        return self._out.sent

    def is_closing(self) -> bool:
        return self._closing or self._lost

    def can_write_eof(self) -> bool:
        return False

    def pause_reading(self) -> None:
        self._paused = True

    def resume_reading(self) -> None:
        self._paused = False
        while self._waiting and not self._paused:
            data = self._waiting.pop(0)
            if self._lost:
                return
            self.protocol.data_received(data)
            self.peer._taken(len(data))

    def is_reading(self) -> bool:
        return not self._paused

    def write(self, data) -> None:
        if self._closing or self._lost or not data:
            return
        self._out.write(data)

    def close(self) -> None:
        """Close once what was written has arrived: the peer reads its end of input."""
        if self._closing or self._lost:
            return
        self._closing = True
        if not self._out.waiting:
            self._network._loop().call_soon(self._network._close_pipe, self._pipe, self)

    def abort(self) -> None:
        if self._lost:
            return
        self._closing = True
        self._network._reset_pipe(self._pipe)

    # -- the stand-in for the kernel -------------------------------------------------------
    def _send(self, data) -> int:
        room = self._network.socket_buffer - self._in_kernel
        if room <= 0 or self._lost:
            return 0
        chunk = bytes(memoryview(data)[:room])
        self._in_kernel += len(chunk)
        self._network._carry(self, chunk)
        return len(chunk)

    def _taken(self, size: int) -> None:
        """The peer read (or the network dropped) ``size`` bytes this side sent."""
        self._in_kernel -= size
        if self._out is not None and self._out.waiting and not self._writable_soon and not self._lost:
            self._writable_soon = True  # as epoll reports writability: on a later pass
            self._network._loop().call_soon(self._on_writable)

    def _on_writable(self) -> None:
        self._writable_soon = False
        if self._lost:
            return
        self._out.writable()
        if self._closing and not self._out.waiting and not self._lost:
            self._network._loop().call_soon(self._network._close_pipe, self._pipe, self)

    # -- the network's side --------------------------------------------------------------
    def _arrive(self, data: bytes) -> None:
        if self._lost:
            return
        if self._paused:
            self._waiting.append(data)  # in the kernel's buffer: the sender's room stays used
            return
        self.protocol.data_received(data)
        self.peer._taken(len(data))

    def _eof(self) -> None:
        if not self._lost:
            self.protocol.eof_received()

    def _connection_lost(self, exc) -> None:
        if self._lost:
            return
        self._lost = True
        self._closing = True
        if self._out is not None:
            self._out.drop()
        self.protocol.connection_lost(exc)


class Pipe:
    """A connection between two hosts: ``client`` connected to ``server``."""

    def __init__(self, pipe_id: int, client_host: str, server_host: str) -> None:
        self.id = pipe_id
        self.client_host = client_host
        self.server_host = server_host
        self.client: MemoryTransport | None = None
        self.server: MemoryTransport | None = None
        self.done = False
        self.reset = False  # reset: what was in flight is lost, as on a real reset

    def joins(self, a: str, b: str) -> bool:
        return {self.client_host, self.server_host} == {a, b}


class MemoryListener:
    def __init__(self, network: "MemoryNetwork", address: tuple[str, int]) -> None:
        self.network = network
        self.address = address

    def close(self) -> None:
        self.network.listeners.pop(self.address, None)

    async def wait_closed(self) -> None:
        return None


class MemoryHost:
    """The network as one host sees it (what a node is built with)."""

    def __init__(self, network: "MemoryNetwork", name: str) -> None:
        self.network = network
        self.name = name

    async def serve(self, factory, host, port, *, ssl_context=None, handshake_timeout=None):
        return self.network._listen(self.name, factory, port)

    async def connect(self, factory, host, port, *, ssl_context=None, server_hostname=None):
        return self.network._connect(self.name, factory, host, port)


class MemoryNetwork:
    def __init__(self, *, socket_buffer: int = SOCKET_BUFFER) -> None:
        self.socket_buffer = socket_buffer  # per side: what the stand-in kernel holds unread
        self.listeners: dict[tuple[str, int], Callable] = {}
        self.pipes: list[Pipe] = []
        self.taps: list[Callable[[int, str, str, bytes], None]] = []
        self.dead: set[str] = set()
        self._killed: dict = {}  # listeners of killed hosts, for revive
        self.partitions: set[frozenset] = set()
        self.deaf: set[tuple[str, str]] = set()  # (a, b): a hears nothing back on links it opened to b
        self.latency: dict[frozenset, float] = {}  # a pair of hosts -> seconds each write takes
        self.in_flight = 0  # chunks written, not yet delivered
        self.busy: dict[str, float] = defaultdict(float)  # host -> seconds handling input
        self._ids = itertools.count(1)
        self._ports = itertools.count(40000)

    def host(self, name: str) -> MemoryHost:
        return MemoryHost(self, name)

    # -- what tests do to the network ---------------------------------------------------------
    def cut(self, a: str, b: str) -> int:
        """Reset every connection between hosts a and b; returns how many."""
        cut = [p for p in self.pipes if p.joins(a, b)]
        for pipe in cut:
            self._reset_pipe(pipe)
        return len(cut)

    def partition(self, a: str, b: str) -> None:
        self.partitions.add(frozenset((a, b)))

    def heal(self, a: str, b: str) -> None:
        self.partitions.discard(frozenset((a, b)))
        self.deaf.discard((a, b))

    def deafen(self, a: str, b: str) -> None:
        """A one-way partition: on the connections host a opened to host b, what a sends
        arrives and what b sends is dropped (connections b opened to a are untouched)."""
        self.deaf.add((a, b))

    def slow(self, a: str, b: str, seconds: float) -> None:
        """Every write between hosts a and b arrives ``seconds`` later (0: at once), in order."""
        if seconds:
            self.latency[frozenset((a, b))] = seconds
        else:
            self.latency.pop(frozenset((a, b)), None)

    def kill(self, name: str) -> None:
        """Host ``name`` is gone: connections reset, listeners removed, connects refused."""
        self.dead.add(name)
        for address in [a for a in self.listeners if a[0] == name]:
            self._killed[address] = self.listeners.pop(address)
        for pipe in [p for p in self.pipes if name in (p.client_host, p.server_host)]:
            self._reset_pipe(pipe)

    def revive(self, name: str) -> None:
        """Host ``name`` is reachable again, with the listeners it had (a network healed)."""
        self.dead.discard(name)
        for address in [a for a in self._killed if a[0] == name]:
            self.listeners[address] = self._killed.pop(address)

    def reboot(self, name: str) -> None:
        """Host ``name`` is reachable again as a new machine: none of the listeners it had (a
        node started again there listens anew)."""
        self.dead.discard(name)
        for address in [a for a in self._killed if a[0] == name]:
            del self._killed[address]

    def connections(self, a: str, b: str) -> int:
        return sum(1 for p in self.pipes if p.joins(a, b))

    # -- hosts' side --------------------------------------------------------------------------
    @staticmethod
    def _loop() -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()

    def _listen(self, host: str, factory, port: int):
        port = port or next(self._ports)
        address = (host, port)
        if address in self.listeners:
            raise OSError(98, f"address in use: {host}:{port}")
        self.listeners[address] = factory
        return MemoryListener(self, address), address

    def _connect(self, client_host: str, factory, host: str, port: int):
        listener = self.listeners.get((host, port))
        if listener is None or client_host in self.dead or host in self.dead:
            raise ConnectionRefusedError(111, f"connection refused: {host}:{port}")
        pipe = Pipe(next(self._ids), client_host, host)
        pipe.client = MemoryTransport(self, pipe, client_host, host, port)
        pipe.server = MemoryTransport(self, pipe, host, client_host, pipe.id)
        pipe.client.peer, pipe.server.peer = pipe.server, pipe.client
        self.pipes.append(pipe)
        server_protocol = listener()
        client_protocol = factory()
        pipe.server.attach(server_protocol)
        pipe.client.attach(client_protocol)
        server_protocol.connection_made(pipe.server)
        client_protocol.connection_made(pipe.client)
        return pipe.client, client_protocol

    def _carry(self, sender: MemoryTransport, data: bytes) -> None:
        pipe = sender._pipe
        source = sender._host
        target = pipe.server_host if sender is pipe.client else pipe.client_host
        if frozenset((source, target)) in self.partitions or (
                sender is pipe.server and (pipe.client_host, source) in self.deaf):
            self._loop().call_soon(sender._taken, len(data))
            return  # dropped on the floor
        self.in_flight += 1
        delay = self.latency.get(frozenset((source, target))) if self.latency else None
        if delay:  # in order: timers due at the same instant may fire in any order
            sender._delayed.append(data)
            self._loop().call_later(delay, self._deliver_delayed, sender, pipe, source, target)
        else:
            self._loop().call_soon(self._deliver, sender.peer, pipe, source, target, data)

    def _deliver_delayed(self, sender: MemoryTransport, pipe: Pipe, source: str, target: str) -> None:
        self._deliver(sender.peer, pipe, source, target, sender._delayed.popleft())

    def _deliver(self, receiver: MemoryTransport, pipe: Pipe, source: str, target: str,
                 data: bytes) -> None:
        self.in_flight -= 1
        if receiver._lost or pipe.reset:
            return
        for tap in self.taps:
            tap(pipe.id, source, target, data)
        started = thread_time()
        receiver._arrive(data)
        self.busy[target] += thread_time() - started

    def _close_pipe(self, pipe: Pipe, closer: MemoryTransport) -> None:
        """An orderly close: written bytes came first (FIFO); the peer reads end of input."""
        if pipe.done:
            return
        closer.peer._eof()
        self._finish(pipe, None)

    def _reset_pipe(self, pipe: Pipe) -> None:
        if pipe.done:
            return
        pipe.reset = True
        self._finish(pipe, ConnectionResetError(104, "connection reset"))

    def _finish(self, pipe: Pipe, exc) -> None:
        pipe.done = True
        if pipe in self.pipes:
            self.pipes.remove(pipe)
        loop = self._loop()
        for side in (pipe.client, pipe.server):
            side._closing = True
            loop.call_soon(side._connection_lost, exc)
