"""A small blocking AMQP 1.0 client on proton's engine, for use inside Spark tasks.

How this works
--------------
``AmqpConnection`` owns one TCP socket and one proton ``Transport`` +
``Connection`` + ``Collector``. ``pump(timeout)`` moves bytes once (waiting
at most ``timeout`` seconds for the socket), ticks proton's timers
(heartbeats, §2.4.5) and hands every collected event to the ``on_event``
callback given to the constructor. Nothing runs in the background: the
caller's loop decides when to pump, so a producer can pace its sends and a
consumer can check its stop flag between pumps.

Every object is created by the task that uses it and closed in its
``finally``; none is ever pickled. A broken connection (socket error, peer
closed, transport error, connection closed by the peer) raises
``ConnectionLost`` from ``pump``: the caller decides whether to reconnect
(the producer's at-least-once resend is explicit and counted) or to fail
the task. A refused link attach raises ``LinkRefused`` with the peer's
error condition (``amqp:not-found``, ``amqp:unauthorized-access``,
``amqp:not-implemented`` ...).

URLs: ``amqp://[user:password@]host[:port]`` (SASL PLAIN when a user is
given, ANONYMOUS otherwise) and ``amqps://`` (TLS through proton's SSL
layer, verifying the peer name; ``ca`` names the trusted CA file).
"""

from __future__ import annotations

import select
import socket
import time
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

from proton import Collector, Connection, Endpoint, Event, SSL, SSLDomain, Transport

OPENED = Endpoint.LOCAL_ACTIVE | Endpoint.REMOTE_ACTIVE


class ConnectionLost(Exception):
    """The AMQP connection is gone; ``reason`` says how."""


class LinkRefused(Exception):
    """The peer refused or closed a link; ``condition`` is its AMQP error name."""

    def __init__(self, address: str, condition: str, description: str) -> None:
        super().__init__(f"link to {address!r} refused: {condition}: {description}")
        self.address = address
        self.condition = condition
        self.description = description


@dataclass(frozen=True)
class GatewayUrl:
    scheme: str
    host: str
    port: int
    user: str | None = None
    password: str | None = field(default=None, repr=False)

    @classmethod
    def parse(cls, url: str) -> "GatewayUrl":
        parts = urlsplit(url)
        if parts.scheme not in ("amqp", "amqps") or not parts.hostname:
            raise ValueError(f"not an amqp:// or amqps:// URL: {url!r}")
        port = parts.port or (5671 if parts.scheme == "amqps" else 5672)
        return cls(parts.scheme, parts.hostname, port,
                   unquote(parts.username) if parts.username else None,
                   unquote(parts.password) if parts.password else None)


class AmqpConnection:
    """One client connection; see the module docstring."""

    def __init__(self, url: str, container_id: str, on_event, *, ca: str | None = None,
                 idle_timeout: float = 10.0, connect_timeout: float = 5.0) -> None:
        self.url = url
        self.endpoint = GatewayUrl.parse(url)
        self.on_event = on_event
        self.sock = socket.create_connection((self.endpoint.host, self.endpoint.port),
                                             timeout=connect_timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.setblocking(False)
        self.transport = Transport()
        self.transport.max_frame_size = 65536
        self.transport.idle_timeout = idle_timeout
        sasl = self.transport.sasl()
        self.connection = Connection()
        self.connection.container = container_id
        self.connection.hostname = self.endpoint.host
        if self.endpoint.user:
            sasl.allowed_mechs("PLAIN")
            sasl.allow_insecure_mechs = True  # the URL's choice; amqps:// for TLS
            self.connection.user = self.endpoint.user
            self.connection.password = self.endpoint.password or ""
        else:
            sasl.allowed_mechs("ANONYMOUS")
        if self.endpoint.scheme == "amqps":
            domain = SSLDomain(SSLDomain.MODE_CLIENT)
            if ca:
                domain.set_trusted_ca_db(ca)
            domain.set_peer_authentication(SSLDomain.VERIFY_PEER_NAME)
            SSL(self.transport, domain).peer_hostname = self.endpoint.host
        self.collector = Collector()
        self.connection.collect(self.collector)
        self.transport.bind(self.connection)
        self.connection.open()
        self.session = self.connection.session()
        self.session.open()
        self.closed = False

    # -- links -----------------------------------------------------------------
    def sender(self, address: str, name: str, presettled: bool = False):
        link = self.session.sender(name)
        link.target.address = address
        if presettled:
            link.snd_settle_mode = link.SND_SETTLED
        link.open()
        return link

    def receiver(self, address: str, name: str, presettled: bool = False):
        link = self.session.receiver(name)
        link.source.address = address
        if presettled:
            link.snd_settle_mode = link.SND_SETTLED
        link.open()
        return link

    def wait_attached(self, links, timeout: float) -> None:
        """Pump until every link is attached by the peer; raise LinkRefused if one is not."""
        deadline = time.monotonic() + timeout
        while True:
            for link in links:
                self.check_link(link)
            if all(link.state & OPENED == OPENED for link in links):
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ConnectionLost(f"{self.url}: no attach answer within {timeout:.0f}s")
            self.pump(min(remaining, 0.1))

    def check_link(self, link) -> None:
        if link.state & Endpoint.REMOTE_CLOSED:
            condition = link.remote_condition
            address = link.target.address if link.is_sender else link.source.address
            raise LinkRefused(address, condition.name if condition else "detached",
                              (condition.description or "") if condition else "no error condition")

    @property
    def remote_container(self) -> str | None:
        return self.connection.remote_container

    # -- I/O -------------------------------------------------------------------
    def pump(self, timeout: float = 0.0) -> None:
        """Write what proton has, read what arrived (waiting <= timeout), dispatch events."""
        self._write()
        readable = select.select([self.sock], [], [], max(0.0, timeout))[0]
        if readable:
            self._read()
        self._dispatch()
        self.transport.tick(time.monotonic())
        self._dispatch()
        self._write()
        if self.transport.closed and not self.closed:
            raise ConnectionLost(f"{self.url}: {self._why()}")

    def _why(self) -> str:
        cond = self.transport.condition or self.connection.remote_condition
        return f"{cond.name}: {cond.description}" if cond else "connection closed"

    def _read(self) -> None:
        while True:
            capacity = self.transport.capacity()
            if capacity == 0:  # proton is full: let it process first
                self._dispatch()
                capacity = self.transport.capacity()
            if capacity <= 0:
                return
            want = min(capacity, 262144)
            try:
                data = self.sock.recv(want)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self.transport.close_tail()
                raise ConnectionLost(f"{self.url}: {exc}") from exc
            if not data:
                self.transport.close_tail()
                return
            self.transport.push(data)
            self._dispatch()
            if len(data) < want:
                return

    def _write(self) -> None:
        while True:
            pending = self.transport.pending()
            if pending <= 0:
                return
            try:
                sent = self.sock.send(self.transport.peek(pending))
            except (BlockingIOError, InterruptedError):
                select.select([], [self.sock], [], 0.05)
                continue
            except OSError as exc:
                self.transport.close_head()
                raise ConnectionLost(f"{self.url}: {exc}") from exc
            self.transport.pop(sent)

    def _dispatch(self) -> None:
        collector = self.collector
        while True:
            event = collector.peek()
            if event is None:
                return
            try:
                if event.type == Event.CONNECTION_REMOTE_CLOSE and not self.closed:
                    self.connection.close()
                else:
                    self.on_event(event)
            finally:
                collector.pop()

    def close(self, timeout: float = 2.0) -> None:
        """Close politely (bounded), then the socket; never raises."""
        if self.closed:
            return
        self.closed = True
        # events after this point are not handled: a message arriving now stays
        # unsettled, and the peer puts it back when the link goes (never lost)
        self.on_event = _ignore
        try:
            self.connection.close()
            deadline = time.monotonic() + timeout
            while not self.transport.closed and time.monotonic() < deadline:
                self.pump(0.05)
        except (ConnectionLost, OSError):
            pass
        finally:
            self.sock.close()


def _ignore(event) -> None:
    return None
