"""The nemesis's clients: python-qpid-proton Container clients with reconnect, writing a history.

    python client.py produce --urls U1,U2,U3 --address A --process P --run R
                             [--rate 40] [--seconds S] [--grace G] [--durable]
    python client.py consume --urls U1,U2,U3 --address A --process P [--credit 50]

Each prints its history on stdout, one JSON object per line, in the shape of Jepsen's
operations: ``{"process", "type": "invoke" | "ok" | "fail" | "info", "f": "enqueue" |
"dequeue", "value", "time"}`` (wall-clock seconds), and events of its own
(``{"process", "event": "disconnected" | "reconnected" | "link-closed", ...}``).

These clients do what an application does with proton's Container and a list of URLs,
and nothing more: the Container reconnects when the connection is lost (``reconnect``,
the next URL of the list) and opens again the links it had; a **link the server ended is
not attached again** (``link-closed`` is recorded, and that client stops sending or
receiving: what a node must never leave a client with). A producer sends again, on the new
connection, the messages that had no outcome when the connection was lost (at-least-once,
as the issue's measured client does); their operation stays the same one.

produce: values ``R-P-<n>`` at ``--rate`` per second for ``--seconds``; an invocation per value,
``ok`` when accepted, ``fail`` when rejected or released (no resend), ``info`` for those
without an outcome after ``--grace`` seconds more (it ends as soon as every one has one). consume: records a message when it
arrives (``ok`` dequeue), then accepts it; runs until SIGTERM, then prints ``{"done": true}``.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time

from proton import Message
from proton.handlers import MessagingHandler
from proton.reactor import Backoff, Container


def emit(**fields) -> None:
    fields["time"] = round(time.time(), 6)
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


# seconds of silence after which a client leaves its node for the next URL (proton advertises
# half of it: the node sends an empty frame at least every 0.75 s)
IDLE_TIMEOUT = 3.0


class Client(MessagingHandler):
    def __init__(self, opts, **kw) -> None:
        super().__init__(**kw)
        self.opts = opts
        self.process = opts.process
        self.conn = None
        self.link = None
        self.link_closed = False
        self.up = False

    def connect(self, container) -> None:
        # heartbeats (docs/nemesis.md, finding 21): a node paused, or cut off from its
        # clients, is left after IDLE_TIMEOUT s of silence, as a client of any broker does
        self.conn = container.connect(urls=self.opts.urls.split(","), heartbeat=IDLE_TIMEOUT,
                                      reconnect=Backoff(initial=0.1, factor=2, max_delay=1.0))

    def on_connection_opened(self, event) -> None:
        if not self.up:
            self.up = True
            emit(process=self.process, event="reconnected", url=event.connection.connected_address)

    def on_disconnected(self, event) -> None:
        if self.up:
            self.up = False
            emit(process=self.process, event="disconnected")
        self.lost()

    def lost(self) -> None:
        pass

    def on_link_remote_close(self, event) -> None:
        condition = event.link.remote_condition
        if self.up and not event.connection.state & event.connection.REMOTE_CLOSED:
            self.link_closed = True
            emit(process=self.process, event="link-closed",
                 condition=condition.name if condition else None,
                 description=condition.description if condition else None)

    def on_connection_remote_close(self, event) -> None:
        condition = event.connection.remote_condition
        emit(process=self.process, event="connection-closed",
             condition=condition.name if condition else None)

    on_link_error = on_session_error = on_connection_error = lambda self, event: None


class Producer(Client):
    def __init__(self, opts) -> None:
        super().__init__(opts)
        self.next = 0
        self.started = None
        self.inflight: dict = {}  # delivery -> value
        self.resend: list = []  # values with no outcome when the connection was lost
        self.open: dict = {}  # value -> invoke time (no outcome yet)
        self.done_sending = False

    def on_start(self, event) -> None:
        self.connect(event.container)
        self.link = event.container.create_sender(self.conn, self.opts.address)
        self.started = time.time()
        event.container.schedule(0.0, self)

    def lost(self) -> None:
        # proton forgets the deliveries of a lost connection: sent again on the next one
        values = sorted(self.inflight.values(), key=lambda v: int(v.rsplit("-", 1)[1]))
        self.inflight.clear()
        self.resend = values + [v for v in self.resend if v not in values]

    def on_timer_task(self, event) -> None:
        now = time.time()
        elapsed = now - self.started
        if elapsed >= self.opts.seconds + self.opts.grace or (
                elapsed >= self.opts.seconds and not self.open and not self.resend):
            for value in list(self.open):
                emit(process=self.process, type="info", f="enqueue", value=value)
            emit(process=self.process, done=True, link_closed=self.link_closed)
            event.container.stop()
            return
        self.send_some(now)
        event.container.schedule(0.01, self)

    def send_some(self, now: float) -> None:
        link = self.link
        if self.link_closed or not self.up or link is None:
            return
        while self.resend and link.credit > 0:
            self._send(self.resend.pop(0))
        if now - self.started >= self.opts.seconds:
            return
        due = int((now - self.started) * self.opts.rate) + 1
        while self.next < due and link.credit > 0 and not self.resend:
            value = f"{self.opts.run}-{self.process}-{self.next}"
            self.next += 1
            self.open[value] = now
            emit(process=self.process, type="invoke", f="enqueue", value=value)
            self._send(value)

    def _send(self, value: str) -> None:
        message = Message(id=value, body=value, durable=self.opts.durable)
        delivery = self.link.send(message)
        self.inflight[delivery] = value

    def on_sendable(self, event) -> None:
        self.send_some(time.time())

    def on_settled(self, event) -> None:
        value = self.inflight.pop(event.delivery, None)
        if value is None or value not in self.open:
            return
        state = event.delivery.remote_state
        del self.open[value]
        if state == event.delivery.ACCEPTED:
            emit(process=self.process, type="ok", f="enqueue", value=value)
        else:
            condition = event.delivery.remote.condition
            emit(process=self.process, type="fail", f="enqueue", value=value, state=str(state),
                 condition=condition.name if condition else None)


class Consumer(Client):
    def __init__(self, opts) -> None:
        super().__init__(opts, prefetch=opts.credit, auto_accept=False)
        self.stopping = False

    def on_start(self, event) -> None:
        self.connect(event.container)
        self.link = event.container.create_receiver(self.conn, self.opts.address)
        event.container.schedule(0.2, self)

    def on_message(self, event) -> None:
        body = event.message.body  # the value (a JMS producer's text; proton's and rhea's too)
        value = body if isinstance(body, str) else event.message.id
        emit(process=self.process, type="invoke", f="dequeue", value=None)
        emit(process=self.process, type="ok", f="dequeue", value=value,
             delivery_count=event.message.delivery_count)
        self.accept(event.delivery)

    def on_timer_task(self, event) -> None:
        if self.stopping:
            emit(process=self.process, done=True, link_closed=self.link_closed)
            event.container.stop()
            return
        event.container.schedule(0.2, self)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("produce", "consume"))
    parser.add_argument("--urls", required=True)
    parser.add_argument("--address", required=True)
    parser.add_argument("--process", required=True)
    parser.add_argument("--run", default="r")
    parser.add_argument("--rate", type=float, default=40.0)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--grace", type=float, default=15.0)
    parser.add_argument("--credit", type=int, default=50)
    parser.add_argument("--durable", action="store_true")
    opts = parser.parse_args()
    handler = Producer(opts) if opts.mode == "produce" else Consumer(opts)
    if opts.mode == "consume":
        signal.signal(signal.SIGTERM, lambda *_: setattr(handler, "stopping", True))
    Container(handler).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
