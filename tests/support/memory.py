"""In-memory AMQP peers for protocol tests: bytes pumped between proton transports.

A ``Harness`` holds one broker (the same classes a node uses) and any number
of ``Client``s. Each client is a real proton client transport; the server side
is a real ``ServerConnection``. ``pump()`` moves bytes both ways until nothing
moves. No sockets, no threads, no sleeps: tests are deterministic.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from proton import (
    Collector,
    Connection,
    Delivery,
    Event,
    Message,
    Terminus,
    Transport,
    symbol,
)

from proxy.amqp.connection import ConnectionSettings, ServerConnection
from proxy.auth.mechanisms import Authenticator
from proxy.auth.users import UsersFile
from proxy.broker.broker import Broker
from proxy.broker.handler import ClientHandler
from proxy.queues.registry import QueueRegistry
from routing import RoutingTable, RuleSet


@dataclass
class Received:
    delivery: Delivery
    message: Message
    raw: bytes


def put_selector(source, selector: str, name: str = "selector") -> None:
    """A JMS selector filter on ``source`` (§3.5.8), as Qpid JMS and proton's Selector send it."""
    data = source.filter
    data.put_map()
    data.enter()
    data.put_symbol(symbol(name))
    data.put_described()
    data.enter()
    data.put_symbol(symbol("apache.org:selector-filter:string"))
    data.put_string(selector)
    data.exit()
    data.exit()


class Client:
    """A proton client connection driven in memory."""

    def __init__(self, harness: "Harness", *, sasl_mechs: str | None = "ANONYMOUS",
                 user: str | None = None, password: str | None = None,
                 container: str | None = None) -> None:
        self.harness = harness
        self.transport = Transport()
        self.connection = Connection()
        self.collector = Collector()
        self.connection.collect(self.collector)
        self.connection.container = container or f"client-{next(harness.ids)}"
        self.connection.hostname = "fedgate"
        if user is not None:
            self.connection.user = user
            self.connection.password = password
        if sasl_mechs:
            sasl = self.transport.sasl()
            sasl.allowed_mechs(sasl_mechs)
            sasl.allow_insecure_mechs = True
        self.transport.bind(self.connection)
        self.handler = ClientHandler(harness.broker, peer="memory")
        self.server = ServerConnection(harness.settings, harness.authenticator, self.handler, harness.now)
        self.session = None
        self.inbox: dict[object, list[Received]] = {}
        self.backlog = b""  # node output the client transport had no room for yet
        self.events: list[tuple] = []
        self.tags = itertools.count(1)
        self.connection.open()
        harness.clients.append(self)

    # -- links ----------------------------------------------------------------
    def _session(self):
        if self.session is None:
            self.session = self.connection.session()
            self.session.open()
        return self.session

    def sender(self, address: str | None, *, presettled: bool = False, dynamic: bool = False,
               name: str | None = None):
        link = self._session().sender(name or f"s{next(self.tags)}")
        if dynamic:
            link.target.dynamic = True
        else:
            link.target.address = address
        if presettled:
            link.snd_settle_mode = link.SND_SETTLED
        link.open()
        self.harness.pump()
        return link

    def receiver(self, address: str | None, *, credit: int = 0, dynamic: bool = False,
                 presettled: bool = False, name: str | None = None, browse: bool = False,
                 selector: str | None = None, filters: dict | None = None):
        link = self._session().receiver(name or f"r{next(self.tags)}")
        if dynamic:
            link.source.dynamic = True
        else:
            link.source.address = address
        if browse:
            link.source.distribution_mode = Terminus.DIST_MODE_COPY
        if selector is not None:  # as Qpid JMS and proton's Selector() send it
            put_selector(link.source, selector)
        if filters is not None:
            link.source.filter.put_dict(filters)
        if presettled:
            link.snd_settle_mode = link.SND_SETTLED
        link.open()
        self.inbox[link] = []
        if credit:
            link.flow(credit)
        self.harness.pump()
        return link

    def send(self, link, message: Message | bytes, *, settle: bool = False) -> Delivery:
        delivery = link.delivery(str(next(self.tags)))
        link.send(message.encode() if isinstance(message, Message) else message)
        link.advance()
        if settle or link.snd_settle_mode == link.SND_SETTLED:
            delivery.settle()
        return delivery

    def received(self, link) -> list[Received]:
        items = self.inbox.get(link, [])
        self.inbox[link] = []
        return items

    # -- event processing -----------------------------------------------------
    def process(self) -> None:
        while True:
            event = self.collector.peek()
            if event is None:
                break
            etype = event.type
            if etype == Event.DELIVERY:
                delivery = event.delivery
                link = delivery.link
                if (link.is_receiver and delivery.readable and not delivery.partial
                        and link.current == delivery):
                    data = bytes(link.recv(delivery.pending))
                    link.advance()
                    message = Message()
                    message.decode(data)
                    self.inbox.setdefault(link, []).append(Received(delivery, message, data))
            self.events.append((etype, event.context))
            self.collector.pop()


class Harness:
    def __init__(self, *, rules: list | None = None, auto_create: bool = True,
                 max_depth: int = 0, dead_letter: str | None = None, credit_window: int = 100,
                 mechanisms: tuple[str, ...] = ("ANONYMOUS",), users: UsersFile | None = None,
                 max_frame_size: int = 65536, sasl_required: bool = False,
                 max_message_size: int = 0) -> None:
        self.ids = itertools.count(1)
        self.now = 0.0
        self.routing = RoutingTable(RuleSet.build(rules or []))
        self.queues = QueueRegistry(
            auto_create=auto_create,
            defaults=lambda name: {"max_depth": max_depth, "dead_letter": dead_letter},
        )
        self.broker = Broker(node_id="t", queues=self.queues, resolve=self.routing.resolve,
                             credit_window=credit_window, max_message_size=max_message_size)
        self.authenticator = Authenticator(users)
        self.settings = ConnectionSettings(
            container_id="t", sasl_mechanisms=mechanisms, sasl_required=sasl_required,
            max_frame_size=max_frame_size,
        )
        self.clients: list[Client] = []

    def client(self, **kwargs) -> Client:
        client = Client(self, **kwargs)
        self.pump()
        return client

    def drop(self, client: Client) -> None:
        """The client's socket is lost, as ``AmqpProtocol.connection_lost`` sees it."""
        client.server.input_closed()
        client.handler.release_all()
        self.clients.remove(client)
        self.broker.run_pending()

    def pump(self, rounds: int = 1000) -> None:
        for _ in range(rounds):
            moved = False
            for client in self.clients:
                moved |= self._move(client)
            self.broker.run_pending()
            for client in self.clients:
                moved |= self._move_back(client)
                client.process()
            if not moved:
                return
        raise AssertionError("pump did not settle")

    def _move(self, client: Client) -> bool:
        pending = client.transport.pending()
        if pending <= 0:
            return False
        data = bytes(client.transport.peek(pending))
        client.transport.pop(pending)
        client.server.receive(data)
        return True

    def _move_back(self, client: Client) -> bool:
        server = client.server
        server.process()
        out = client.backlog + server.take_output()
        if not out:
            return False
        room = client.transport.capacity()
        if room <= 0:
            client.backlog = out
            return False
        client.transport.push(out[:room])
        client.backlog = out[room:]
        return True
