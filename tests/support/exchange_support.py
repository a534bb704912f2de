"""Helpers for the exchange and proxy-lifecycle tests: subject-carrying clients, RabbitMQ set-up.

* ``send_subjects(url, address, items)`` sends ``(id, subject)`` messages in
  one proton connection and returns each message's outcome and condition
  (``{"id": ("accepted", None)}``, ``("rejected", "amqp:not-found")`` ...).
* ``receive_ids(url, address)`` drains an address until it stays quiet.
* ``Rabbit`` declares exchanges, queues and bindings over AMQP 0-9-1 (pika) on
  RabbitMQ 3.10 or 4.0 (``any_rabbit`` runs a test against both): 3.10's AMQP 1.0
  plugin cannot declare them, and ``rabbitmqctl`` cannot either. Everything a test declares is deleted by ``cleanup()``,
  including the subscription queues RabbitMQ 3.10 makes for
  ``/exchange/X/KEY`` sources (it never deletes them itself).
* ``admin_get(node, path)`` reads the node's admin API.

Every wait is bounded.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid

import pytest
from admin_client import ADMIN, ADMIN_TOKEN, admin_get, upstream_members, wait_for
from brokers import RABBITMQ_PORT
from proton import Message
from proton.handlers import MessagingHandler
from proton.reactor import Container
from proton.utils import BlockingConnection

__all__ = ["ADMIN", "ADMIN_TOKEN", "admin_get", "upstream_members", "wait_for"]


class _Sender(MessagingHandler):
    def __init__(self, url: str, address: str, items, timeout: float) -> None:
        super().__init__(auto_settle=True)
        self.url, self.address, self.items, self.timeout = url, address, list(items), timeout
        self.next = 0
        self.by_tag: dict = {}
        self.outcomes: dict = {}
        self.error = None

    def on_start(self, event):
        self.conn = event.container.connect(self.url, allowed_mechs="ANONYMOUS", reconnect=False)
        event.container.create_sender(self.conn, self.address)
        self.timer = event.container.schedule(self.timeout, self)

    def on_timer_task(self, event):
        self.error = self.error or "timeout"
        self.conn.close()

    def on_sendable(self, event):
        while event.sender.credit and self.next < len(self.items):
            message_id, subject, *to = self.items[self.next]  # to: for the anonymous relay
            delivery = event.sender.send(Message(id=message_id, subject=subject,
                                                 address=to[0] if to else None,
                                                 body=f"body of {message_id}"))
            self.by_tag[delivery.tag] = message_id
            self.next += 1

    def _record(self, event, outcome: str) -> None:
        condition = event.delivery.remote.condition
        self.outcomes[self.by_tag.pop(event.delivery.tag)] = (outcome, condition.name if condition else None)
        if len(self.outcomes) == len(self.items):
            self.timer.cancel()
            self.conn.close()

    def on_accepted(self, event):
        self._record(event, "accepted")

    def on_rejected(self, event):
        self._record(event, "rejected")

    def on_released(self, event):
        self._record(event, "released" if event.delivery.remote_state == event.delivery.RELEASED
                     else "modified")

    def on_link_error(self, event):
        condition = event.link.remote_condition
        self.error = condition.name if condition else "link error"
        self.timer.cancel()
        self.conn.close()

    def on_transport_error(self, event):
        self.error = self.error or "transport error"


def send_subjects(url: str, address: str, items, timeout: float = 30.0) -> dict:
    """Send ``(id, subject)`` or ``(id, subject, to)`` messages (``address`` None: the
    anonymous relay); returns {id: (outcome, condition)} (+ "error" key on failure)."""
    handler = _Sender(url, address, items, timeout)
    Container(handler).run()
    result = dict(handler.outcomes)
    if handler.error:
        result["error"] = handler.error
    return result


def receive_ids(url: str, address: str, *, quiet: float = 1.5, timeout: float = 30.0,
                credit: int = 100) -> list[str]:
    """Message ids received from ``address`` (accepted) until nothing came for ``quiet`` s."""
    conn = BlockingConnection(url, timeout=10, allowed_mechs="ANONYMOUS")
    ids = []
    deadline = time.monotonic() + timeout
    try:
        receiver = conn.create_receiver(address, credit=credit)
        while time.monotonic() < deadline:
            try:
                message = receiver.receive(timeout=quiet)
            except Exception:  # proton's Timeout: quiet long enough
                break
            ids.append(message.id)
            receiver.accept()
    finally:
        conn.close()
    return ids


# -- RabbitMQ over AMQP 0-9-1 ----------------------------------------------------
def rabbitmqctl(*args: str) -> str:
    env = dict(os.environ, ERL_EPMD_ADDRESS="127.0.0.1")
    proc = subprocess.run(["rabbitmqctl", "-n", "rabbit@localhost", "-q", *args],
                          capture_output=True, text=True, env=env, timeout=30,
                          stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise RuntimeError(f"rabbitmqctl {' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout


def rabbit_queues() -> dict[str, int]:
    """Queue name -> consumer count."""
    out = rabbitmqctl("list_queues", "name", "consumers", "--no-table-headers")
    queues = {}
    for line in out.splitlines():
        name, _, consumers = line.rpartition("\t")
        if name:
            queues[name] = int(consumers)
    return queues


def rabbit_bound_queues(source: str, key: str) -> list[str]:
    out = rabbitmqctl("list_bindings", "source_name", "routing_key", "destination_name",
                      "--no-table-headers")
    return [line.split("\t")[2] for line in out.splitlines()
            if line.split("\t")[:2] == [source, key]]


class Rabbit:
    """Declarations over short-lived AMQP 0-9-1 connections (no idle connection to time out).

    ``version`` 3 is RabbitMQ 3.10 (AMQP 1.0 plugin, address v1), 4 is RabbitMQ 4.0
    (address v2: ``/queues/NAME``, ``/exchanges/NAME``; receivers only on queues).
    """

    def __init__(self, version: int = 3) -> None:
        import brokers

        self.version = version
        self.port = brokers.RABBITMQ_PORT if version == 3 else brokers.RABBITMQ4_PORT
        self.exchanges: list[str] = []
        self.queues: list[str] = []
        self.subscriptions: list[tuple[str, str]] = []  # (exchange, key) of /exchange/ sources

    # -- addresses -----------------------------------------------------------
    def queue_address(self, name: str) -> str:
        return f"/amq/queue/{name}" if self.version == 3 else f"/queues/{name}"

    def exchange_address(self, name: str) -> str:
        """The exchange as a target (3.10 routes on the message's subject; 4.0 routes with an
        empty key: measured on 4.0.5, a subject is not used as the routing key)."""
        return f"/exchange/{name}" if self.version == 3 else f"/exchanges/{name}"

    def routed_address(self, name: str) -> str:
        """A target that routes on the subject: on 4.0 the key goes into the address, which a
        node's ``upstream_fanout`` expands per message (``{subject}``)."""
        return f"/exchange/{name}" if self.version == 3 else f"/exchanges/{name}/{{subject}}"

    def publish(self, exchange: str, items) -> dict:
        """``send_subjects`` to ``exchange`` routed on each item's subject: one link on 3.10,
        one per routing key (``/exchanges/X/KEY``) on 4.0."""
        if self.version == 3:
            return send_subjects(self.url, self.exchange_address(exchange), items)
        outcomes: dict = {}
        for subject in dict.fromkeys(subject for _, subject in items):
            outcomes.update(send_subjects(self.url, f"/exchanges/{exchange}/{subject}",
                                          [item for item in items if item[1] == subject]))
        return outcomes

    # -- management ----------------------------------------------------------
    def ctl(self, *args: str) -> str:
        import brokers

        return rabbitmqctl(*args) if self.version == 3 else brokers.rabbitmq4_ctl(*args)

    def bound_queues(self, source: str, key: str) -> list[str]:
        out = self.ctl("list_bindings", "source_name", "routing_key", "destination_name",
                       "--no-table-headers")
        return [line.split("\t")[2] for line in out.splitlines()
                if line.split("\t")[:2] == [source, key]]

    def _do(self, operation) -> None:
        import pika

        connection = pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", self.port, blocked_connection_timeout=10, socket_timeout=10))
        try:
            operation(connection.channel())
        finally:
            connection.close()

    def exchange(self, name: str, kind: str = "topic") -> str:
        self._do(lambda ch: ch.exchange_declare(name, kind, durable=False, auto_delete=False))
        self.exchanges.append(name)
        return name

    def queue(self, name: str, *, bind: tuple[str, str] | None = None, auto_delete=False) -> str:
        def declare(ch):
            ch.queue_declare(name, durable=False, auto_delete=auto_delete)
            if bind is not None:
                ch.queue_bind(name, bind[0], bind[1])

        self._do(declare)
        self.queues.append(name)
        return name

    def delete_exchange(self, name: str) -> None:
        self._do(lambda ch: ch.exchange_delete(name))

    def delete_queue(self, name: str) -> None:
        self._do(lambda ch: ch.queue_delete(name))

    def subscription(self, exchange: str, key: str) -> None:
        """Remember an /exchange/X/KEY source: its queue is deleted in cleanup()."""
        self.subscriptions.append((exchange, key))

    def cleanup(self) -> None:
        doomed = [q for exchange, key in self.subscriptions
                  for q in self.bound_queues(exchange, key) if q.startswith("amq.gen-")]

        def delete(ch):
            for queue in doomed + self.queues:
                ch.queue_delete(queue)
            for exchange in self.exchanges:
                ch.exchange_delete(exchange)

        self._do(delete)


def _rabbit(version: int):
    import brokers

    url = brokers.ensure_rabbitmq() if version == 3 else brokers.ensure_rabbitmq4()
    helper = Rabbit(version)
    helper.url = url
    return helper


@pytest.fixture
def rabbit():
    """The RabbitMQ 3.10 test helper; whatever a test declared on the broker is removed after."""
    helper = _rabbit(3)
    yield helper
    helper.cleanup()


@pytest.fixture(params=[3, 4], ids=["rabbitmq", "rabbitmq4"])
def any_rabbit(request):
    """``rabbit`` for RabbitMQ 3.10 and again for RabbitMQ 4.0."""
    helper = _rabbit(request.param)
    yield helper
    helper.cleanup()


def tag() -> str:
    """A short unique suffix for names on a shared broker."""
    return uuid.uuid4().hex[:8]
