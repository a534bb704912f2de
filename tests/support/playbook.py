"""Socket-free playbooks: real nodes, primaries and peers in one process, on a virtual clock.

How this works
--------------
``World`` builds every node with the factory ``fedgate serve`` uses
(``proxy.node.build_node``), on a ``proxy.net.memory.MemoryNetwork`` instead of
TCP. Clients are proton engines (``PlaybookClient``) on the same network. The
event loop is a ``VirtualClockLoop``: whenever nothing is ready to run, its
clock jumps to the next timer, so reconnect backoffs, heartbeats and retry
timers take no wall time and happen in the order they would.

A playbook is events in (a client attaches, grants credit, sends; the
network cuts a connection or loses a host), frames out: ``World.frames``
decodes every AMQP frame that crossed the network, by source and destination
host, so a test asserts what the gateway told the primary (``flow`` with
``link-credit`` 3, ``drain`` true) as well as what the client saw.

Every wait is ``World.until(predicate)``, bounded in virtual time; a test that
waits for something that never comes fails at once instead of hanging.
"""

from __future__ import annotations

import asyncio
import itertools
import selectors
import struct
import time
from dataclasses import dataclass, field
from typing import Callable

from proton import Collector, Connection, Data, Delivery, Event, Message, Terminus, Transport

from memory import put_selector
from proxy.config import settings as config_mod
from proxy.net.memory import MemoryNetwork
from proxy.node import build_node

START = 1000.0  # the virtual clock's reading at start
WALL_LIMIT = 10.0  # a playbook that runs longer than this in real time is a bug


# -- the virtual clock -----------------------------------------------------------------------
class _JumpingSelector(selectors.DefaultSelector):
    def __init__(self, loop: "VirtualClockLoop") -> None:
        super().__init__()
        self.loop = loop

    def select(self, timeout=None):
        events = super().select(0)
        if events:
            return events
        if timeout is None:
            raise RuntimeError("playbook stalled: nothing is ready and no timer is set")
        if timeout > 0:
            self.loop.now += timeout  # nothing to do until the next timer: go there
        return events


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """An event loop whose ``time()`` moves only when it would otherwise wait."""

    def __init__(self) -> None:
        self.now = START
        super().__init__(_JumpingSelector(self))

    def time(self) -> float:
        return self.now


def run(coro_fn: Callable, *args, wall_limit: float = WALL_LIMIT):
    """Run ``coro_fn(*args)`` on a fresh virtual-clock loop; fail past ``wall_limit`` real seconds
    (``WALL_LIMIT``; a playbook that moves a lot of messages may say more)."""
    loop = VirtualClockLoop()
    started = time.monotonic()
    try:
        return loop.run_until_complete(coro_fn(*args))
    finally:
        try:
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        finally:
            loop.close()
        assert time.monotonic() - started < wall_limit, "playbook took too long in real time"


# -- frames on the wire ------------------------------------------------------------------------
PERFORMATIVES = {
    0x10: ("open", ("container-id", "hostname", "max-frame-size", "channel-max", "idle-time-out",
                    "outgoing-locales", "incoming-locales", "offered-capabilities",
                    "desired-capabilities", "properties")),
    0x11: ("begin", ("remote-channel", "next-outgoing-id", "incoming-window", "outgoing-window",
                     "handle-max", "offered-capabilities", "desired-capabilities", "properties")),
    0x12: ("attach", ("name", "handle", "role", "snd-settle-mode", "rcv-settle-mode", "source",
                      "target", "unsettled", "incomplete-unsettled", "initial-delivery-count",
                      "max-message-size", "offered-capabilities", "desired-capabilities",
                      "properties")),
    0x13: ("flow", ("next-incoming-id", "incoming-window", "next-outgoing-id", "outgoing-window",
                    "handle", "delivery-count", "link-credit", "available", "drain", "echo",
                    "properties")),
    0x14: ("transfer", ("handle", "delivery-id", "delivery-tag", "message-format", "settled", "more",
                        "rcv-settle-mode", "state", "resume", "aborted", "batchable")),
    0x15: ("disposition", ("role", "first", "last", "settled", "state", "batchable")),
    0x16: ("detach", ("handle", "closed", "error")),
    0x17: ("end", ("error",)),
    0x18: ("close", ("error",)),
}


@dataclass
class Frame:
    source: str
    target: str
    name: str
    fields: dict
    pipe: int

    def __getitem__(self, key):
        return self.fields.get(key)

    @property
    def condition(self) -> str | None:
        """The error condition of a detach, end or close (§2.8.14), if any."""
        error = self.fields.get("error")
        if error is None:
            return None
        value = getattr(error, "value", error)
        return str(value[0]) if value else None


class FrameTap:
    """Cuts each direction of each pipe into AMQP frames and decodes their performatives."""

    def __init__(self) -> None:
        self.frames: list[Frame] = []
        self._buffers: dict[tuple, bytearray] = {}

    def __call__(self, pipe: int, source: str, target: str, data: bytes) -> None:
        key = (pipe, source)
        buffer = self._buffers.setdefault(key, bytearray())
        buffer += data
        while True:
            if buffer[:4] == b"AMQP":
                if len(buffer) < 8:
                    return
                del buffer[:8]  # a protocol header (§2.2, §5.3.1)
                continue
            if len(buffer) < 8:
                return
            size, doff, kind = struct.unpack(">IBB", buffer[:6])
            if len(buffer) < size:
                return
            body = bytes(buffer[doff * 4:size])
            del buffer[:size]
            if kind == 0 and body:  # an AMQP frame (SASL frames and heartbeats are not kept)
                self.frames.append(self._decode(pipe, source, target, body))

    @staticmethod
    def _decode(pipe: int, source: str, target: str, body: bytes) -> Frame:
        data = Data()
        data.decode(body)
        data.rewind()
        data.next()
        described = data.get_object()
        name, names = PERFORMATIVES.get(int(described.descriptor), (hex(described.descriptor), ()))
        values = list(described.value or [])
        return Frame(source, target, name, dict(zip(names, values)), pipe)


# -- a client --------------------------------------------------------------------------------------
@dataclass
class ClientLink:
    client: "PlaybookClient"
    link: object
    received: list = field(default_factory=list)  # (Message, Delivery) in arrival order
    outcomes: dict = field(default_factory=dict)  # sent Delivery -> terminal remote state

    @property
    def closed_with(self) -> str | None:
        """The condition the node detached this link with (None while attached)."""
        if not self.link.state & self.link.REMOTE_CLOSED:
            return None
        condition = self.link.remote_condition
        return condition.name if condition is not None else ""

    @property
    def credit(self) -> int:
        return self.link.credit

    def flow(self, credit: int) -> None:
        self.link.flow(credit)
        self.client.flush()

    def drain(self, credit: int) -> None:
        self.link.drain(credit)
        self.client.flush()

    def bodies(self) -> list:
        return [message.body for message, _ in self.received]

    def settle(self, outcome=Delivery.ACCEPTED, count: int | None = None) -> None:
        for _, delivery in [(m, d) for m, d in self.received if not d.settled][:count]:
            delivery.update(outcome)
            delivery.settle()
        self.client.flush()

    def send(self, body, *, message_id=None, flush: bool = True, properties=None) -> Delivery:
        """Send one message; ``flush=False`` leaves it for the next write (bursts in one write);
        ``properties``: its application properties."""
        delivery = self.link.delivery(str(next(self.client.tags)))
        self.link.send(Message(body=body, id=message_id, properties=properties).encode())
        self.link.advance()
        if flush:
            self.client.flush()
        return delivery

    def accepted(self) -> int:
        return sum(1 for state in self.outcomes.values() if state == Delivery.ACCEPTED)


class PlaybookClient(asyncio.Protocol):
    """A proton client connection on the memory network (no SASL, as a client may)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.transport_io = None
        self.connection = Connection()
        self.connection.container = name
        self.engine = Transport()
        self.engine.bind(self.connection)
        self.collector = Collector()
        self.connection.collect(self.collector)
        self.session = None
        self.links: dict = {}  # proton Link -> ClientLink
        self.tags = itertools.count(1)
        self.lost = False
        self.connection.open()

    # -- asyncio ------------------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport_io = transport
        self.flush()

    def data_received(self, data: bytes) -> None:
        view = memoryview(data)
        while view:  # proton takes what its input buffer has room for, then reads it
            room = self.engine.capacity()
            if room < 0:
                return  # its input is closed
            self.engine.push(view[:room].tobytes())
            view = view[room:]
            self._events()
        self.flush()

    def eof_received(self):
        self.engine.close_tail()
        self._events()
        return False

    def connection_lost(self, exc) -> None:
        self.lost = True

    def flush(self) -> None:
        if self.transport_io is None or self.lost:
            return
        # proton hands out at most its output buffer at a time: a large frame takes several
        while (pending := self.engine.pending()) > 0:
            out = self.engine.peek(pending)
            self.engine.pop(pending)
            self.transport_io.write(out)

    def _events(self) -> None:
        while (event := self.collector.peek()) is not None:
            if event.type == Event.DELIVERY:
                delivery = event.delivery
                link = delivery.link
                client_link = self.links.get(link)
                if link.is_receiver and delivery.readable and not delivery.partial:
                    message = Message()
                    message.decode(link.recv(delivery.pending))
                    link.advance()
                    if client_link is not None:
                        client_link.received.append((message, delivery))
                elif link.is_sender and delivery.remote_state and client_link is not None:
                    client_link.outcomes[delivery] = delivery.remote_state
                    delivery.settle()
            self.collector.pop()

    # -- links ----------------------------------------------------------------------------------
    def _session(self):
        if self.session is None:
            self.session = self.connection.session()
            self.session.open()
        return self.session

    def new_session(self):
        """Another session on this connection (links take it with ``session=``)."""
        session = self.connection.session()
        session.open()
        return session

    def receiver(self, address: str, *, credit: int = 0, session=None, browse: bool = False,
                 selector: str | None = None) -> ClientLink:
        """``browse``: a browser (source distribution-mode copy, §3.5.3); ``selector``: a JMS
        selector filter, as Qpid JMS sends it."""
        link = (session or self._session()).receiver(f"{self.name}-r{next(self.tags)}")
        link.source.address = address
        if browse:
            link.source.distribution_mode = Terminus.DIST_MODE_COPY
        if selector is not None:
            put_selector(link.source, selector, "jms-selector")
        link.open()
        if credit:
            link.flow(credit)
        self.links[link] = ClientLink(self, link)
        self.flush()
        return self.links[link]

    def sender(self, address: str, *, session=None) -> ClientLink:
        link = (session or self._session()).sender(f"{self.name}-s{next(self.tags)}")
        link.target.address = address
        link.open()
        self.links[link] = ClientLink(self, link)
        self.flush()
        return self.links[link]


class RawClient(asyncio.Protocol):
    """Bytes only: for hand-built frames (``tests/fuzz/frames.py``) a proper client never sends."""

    lost = False

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        pass  # what the node answers is read from the world's frames

    def eof_received(self):
        return False

    def connection_lost(self, exc) -> None:
        self.lost = True


AMQP_HEADER = b"AMQP\x00\x01\x00\x00"


# -- the world -------------------------------------------------------------------------------------
class World:
    """Nodes built by the real factory, clients, and the network between them."""

    def __init__(self, tmp_path, **network) -> None:
        """``network``: the memory network's settings (``socket_buffer``)."""
        self.tmp_path = tmp_path
        self.network = MemoryNetwork(**network)
        self.tap = FrameTap()
        self.network.taps.append(self.tap)
        self.nodes: dict = {}
        self.clients: list[PlaybookClient] = []

    async def node(self, name: str, *, etcd=None, **sections):
        """A node called ``name`` listening on ``name:5672`` (a host of the memory network);
        with ``etcd`` (``memory_etcd.MemoryEtcd``) its coordinator is on that etcd."""
        raw = {"node": {"id": name, "listen": f"{name}:5672",
                        "data_dir": str(self.tmp_path / name)},
               "admin": {"enabled": False}}
        for key, value in sections.items():
            if isinstance(value, dict) and isinstance(raw.get(key), dict):
                raw[key] = {**raw[key], **value}
            else:
                raw[key] = value
        coordinator = None
        if etcd is not None:
            from proxy.cluster.etcd import EtcdCoordinator

            store = etcd.client(name)
            coordinator = EtcdCoordinator(
                name="playbook", node_id=name, amqp=f"amqp://{name}:5672", admin=None, workers=1,
                version="test", store=store, endpoints=[store.endpoint],
                lease_ttl=float(raw.get("cluster", {}).get("lease_ttl", 3.0)),
                wall=lambda: asyncio.get_running_loop().time())
        node = build_node(config_mod.from_dict(raw), network=self.network.host(name),
                          services=("fragments", "replication"), coordinator=coordinator)
        await node.start()
        self.nodes[name] = node
        return node

    async def client(self, node: str, name: str | None = None) -> PlaybookClient:
        name = name or f"client{len(self.clients) + 1}"
        _, client = await self.network.host(name).connect(lambda: PlaybookClient(name), node, 5672)
        self.clients.append(client)
        await self.until(lambda: client.connection.state & Connection.REMOTE_ACTIVE)
        return client

    async def until(self, predicate: Callable[[], object], timeout: float = 30.0, what: str = ""):
        """Run the loop until ``predicate()`` is true; fail after ``timeout`` virtual seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not predicate():
            if loop.time() >= deadline:
                raise AssertionError(f"not reached within {timeout}s (virtual): {what or predicate}")
            await asyncio.sleep(0.001)
        return predicate()

    async def quiet(self, seconds: float = 0.5) -> None:
        """Let ``seconds`` of virtual time pass (every timer due in them fires)."""
        await asyncio.sleep(seconds)

    def frames(self, source: str, target: str, name: str | None = None) -> list[Frame]:
        return [f for f in self.tap.frames
                if f.source == source and f.target == target and (name is None or f.name == name)]

    async def close(self) -> None:
        for node in list(self.nodes.values()):
            await node.stop()
