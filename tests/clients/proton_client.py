"""proton-python command-line client with the same contract as tests/js/*.js.

    python proton_client.py send --url U --address A --count N [--prefix P] [--presettled]
                                 [--durable] [--report-accepted] [--report-sent] [--rate R]
                                 [--sizes S1,S2,...] [--priorities N]
                                 [--username U --password P] [--timeout-ms T]
                                 [--failover]
    python proton_client.py receive --url U --address A --count N [--credit C]
                                 [--idle-ms I] [--timeout-ms T] [--hold] [--dynamic]
                                 [--check-body] [--summary] [--failover]
    python proton_client.py drain --url U --address A [--credit C] [--take N] [--browse]
                                 [--timeout-ms T]

send prints one JSON line {"sent", "accepted", "released", "rejected", "modified", "error"};
with --report-accepted it first prints {"accepted_id": id} as each outcome arrives, with
--report-sent {"sent_id": id} as each message is handed to the link.
--rate R sends at most R messages per second (on average since the start).
--durable sets the header's durable field and asks for a durable target terminus.
--sizes S1,S2,...: message SEQ has a binary body (a data section) of sizes[SEQ % len]
bytes instead of the string "message SEQ".
--priorities N: message SEQ has the header's priority SEQ % N (0-9).
receive prints {"id", "producer", "seq", "delivery_count", "size"} per message (size: the
body's bytes, a string's in UTF-8; null for other bodies), then
{"done": true, "received": n, "error": null}. With --hold it accepts nothing:
it prints each message and then waits (to be killed by a test). --check-body
checks every message against what send makes of its id (body "message SEQ", or the go-amqp
test client's "message SEQ from PREFIX"; id "PREFIX-SEQ"; with --sizes, SEQ's zeros as send
made them): a mismatch prints {"bad_body": ...}
and exits 4 at once.
--summary prints no line per message (long runs): the final line adds "seen",
{producer: base64(zlib(bytes))} where byte SEQ counts the deliveries of SEQ.
drain attaches a receiver (--browse: source distribution-mode copy), grants --credit C
(0 allowed) once the peer attached, receives and accepts --take N messages, then drains
(receiver.drain(0): a flow with drain set and the credit left) and waits for the sender's
flow that answers it: the first flow for the link after the drain that leaves it no
credit. It prints {"drained": true, "drain_ms": F, "received": N, "error": null}, drain_ms
from the drain request to that flow; unanswered by --timeout-ms: "drained": false and a
"timeout" error.
--failover (send, receive): --url is a comma-separated list; when the connection is lost
(the node died: a transport error, or a close with amqp:connection:forced) the client prints
{"event": "disconnected", "url"} and connects to the next URL of the list (round robin,
every 0.1 s), where it attaches its link again and prints {"event": "reconnected", "url"}.
A sender sends again, first and in their order, the messages it had sent and not seen
settled (each printed {"resent_id": id} with --report-sent): at-least-once, as a broker
client's failover does; the ids sent again are in "resent" of the final line. A link or
connection ended with another error still ends the client.
Exit codes: 0 ok, 2 AMQP error, 3 timeout, 4 corrupt message.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import time
import zlib

from proton import Message, Terminus
from proton.handlers import MessagingHandler
from proton.reactor import Container, Copy, LinkOption


def emit(obj) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def error_of(endpoint) -> dict | None:
    cond = endpoint.remote_condition if endpoint is not None else None
    if cond is None:
        return None
    return {"condition": cond.name, "description": cond.description}


class Base(MessagingHandler):
    def __init__(self, args, **kw) -> None:
        super().__init__(**kw)
        self.args = args
        self.error: dict | None = None
        self.exit_code = 0
        self.conn = None
        failover = getattr(args, "failover", False)
        self.urls = args.url.split(",") if failover else [args.url]
        self.failover = failover
        self.url_index = 0
        self.reconnecting = False
        self.lost_count = 0  # connections lost (--failover)

    def connect(self, event):
        self.open_connection(event.container)
        if self.args.timeout_ms:
            event.container.schedule(self.args.timeout_ms / 1000.0, self)

    def open_connection(self, container):
        kw = {"reconnect": False, "sasl_enabled": True, "allow_insecure_mechs": True}
        if self.args.username:
            kw.update(user=self.args.username, password=self.args.password,
                      allowed_mechs="PLAIN")
        else:
            kw["allowed_mechs"] = "ANONYMOUS"
        self.conn = container.connect(self.urls[self.url_index], **kw)

    def connection_lost(self, connection) -> bool:
        """--failover: the connection is gone; go on at the next URL. False: not failing over
        (not asked, finished or failed)."""
        if not self.failover or self.exit_code or self.finished():
            return False
        if connection != self.conn:
            return True  # a late event of a connection given up already
        if not self.reconnecting:
            self.reconnecting = True
            self.lost_count += 1
            emit({"event": "disconnected", "url": self.urls[self.url_index]})
            self.links_lost()
            self.container.schedule(0.1, Reconnect(self))
        return True

    def reconnect(self):
        self.reconnecting = False
        if self.exit_code or self.finished():
            return
        self.url_index = (self.url_index + 1) % len(self.urls)
        self.open_connection(self.container)
        self.start_link(None)

    def on_connection_opened(self, event):
        if self.lost_count and event.connection == self.conn:
            emit({"event": "reconnected", "url": self.urls[self.url_index]})

    def links_lost(self):
        """The link died with its connection (a sender keeps what it must send again)."""

    def on_timer_task(self, event):
        if self.exit_code == 0 and not self.finished():
            self.fail({"condition": "timeout", "description": "deadline passed"}, 3)

    def finished(self) -> bool:
        return False

    def fail(self, error, code=2):
        if self.error is None:
            self.error = error
            self.exit_code = code
        if self.conn is not None:
            self.conn.close()
        self.stop_container()

    def stop_container(self):
        self.container.stop()

    def on_start(self, event):
        self.container = event.container
        self.connect(event)
        self.start_link(event)

    def on_link_error(self, event):
        self.fail(error_of(event.link) or {"condition": "link-closed", "description": ""})

    def on_session_error(self, event):
        self.fail(error_of(event.session) or {"condition": "session-closed", "description": ""})

    def on_connection_error(self, event):
        if self.connection_lost(event.connection):
            return
        self.fail(error_of(event.connection) or {"condition": "connection-closed", "description": ""})

    def on_transport_error(self, event):
        if self.connection_lost(event.connection):
            return
        cond = event.transport.condition
        self.fail({"condition": cond.name if cond else "disconnected",
                   "description": cond.description if cond else ""})

    def on_disconnected(self, event):
        self.connection_lost(event.connection)  # closed with no error at all

    def on_link_remote_close(self, event):
        if event.link.remote_condition:
            self.on_link_error(event)


class Reconnect:
    """--failover: connect to the next URL a moment after the connection was lost."""

    def __init__(self, client: Base):
        self.client = client

    def on_timer_task(self, event):
        self.client.reconnect()


class DurableTarget(LinkOption):
    """Ask for a durable node (e.g. RabbitMQ declares a durable queue)."""

    def apply(self, link):
        link.target.durability = Terminus.DELIVERIES
        link.target.expiry_policy = Terminus.EXPIRE_NEVER


class Sender(Base):
    def __init__(self, args):
        super().__init__(args, auto_settle=True)
        self.sent = 0
        self.outcomes = {"accepted": 0, "released": 0, "rejected": 0, "modified": 0}
        self.ids = {}  # delivery tag -> message id, for --report-accepted
        self.unsettled = {}  # delivery tag -> message (--failover: sent again on the next link)
        self.resend: list = []
        self.resent = 0
        self.started = time.monotonic()
        self.rate_timer = None

    def start_link(self, event):
        opts = []
        if self.args.presettled:
            from proton.reactor import AtMostOnce
            opts.append(AtMostOnce())
        if self.args.durable:
            opts.append(DurableTarget())
        self.sender = self.container.create_sender(self.conn, self.args.address, options=opts or None)

    def links_lost(self):
        # what was sent and not seen settled goes again first, in its order (at-least-once);
        # the old link's delivery tags are gone with it
        self.resend = list(self.unsettled.values()) + self.resend
        self.unsettled.clear()
        self.ids.clear()

    def allowed(self) -> int:
        """How many may have been sent by now (--rate), at most --count."""
        if not self.args.rate:
            return self.args.count
        due = int((time.monotonic() - self.started) * self.args.rate) + 1
        return min(self.args.count, due)

    def on_sendable(self, event):
        self.send_some(event.sender)

    def send_some(self, sender):
        if sender != self.sender or self.reconnecting:
            return  # a link lost with its connection (--failover)
        while sender.credit and self.resend:
            message = self.resend.pop(0)
            self.track(sender.send(message), message)
            if self.args.report_sent:
                emit({"resent_id": message.id})
            self.resent += 1
        limit = self.allowed()
        while sender.credit and self.sent < limit:
            seq = self.sent
            message = Message(
                id=f"{self.args.prefix}-{seq}",
                body=f"message {seq}",
                properties={"producer": self.args.prefix, "seq": seq},
                durable=self.args.durable,
            )
            if self.args.sizes:
                message.body = bytes(self.args.sizes[seq % len(self.args.sizes)])
                message.inferred = True  # bytes as a data section, not an amqp-value
            if self.args.priorities:
                message.priority = seq % self.args.priorities
            self.track(sender.send(message), message)
            if self.args.report_sent:
                emit({"sent_id": message.id})
            self.sent += 1
        if self.sent < self.args.count and sender.credit and self.rate_timer is None:
            self.rate_timer = self.container.schedule(0.02, RateTimer(self, sender))
        if self.args.presettled and self.sent >= self.args.count:
            self.outcomes["accepted"] = self.sent
            self.conn.close()

    def track(self, delivery, message) -> None:
        if self.args.report_accepted:
            self.ids[delivery.tag] = message.id
        if self.failover:
            self.unsettled[delivery.tag] = message

    def on_settled(self, event):
        self.unsettled.pop(event.delivery.tag, None)

    def on_delivery(self, event):
        # an outcome, settled or not, ends the message's journey (not sent again)
        if event.delivery.link.is_sender and event.delivery.remote_state:
            self.unsettled.pop(event.delivery.tag, None)

    def settled_count(self):
        return sum(self.outcomes.values())

    def finished(self):
        return self.settled_count() >= self.args.count

    def on_accepted(self, event):
        self.outcomes["accepted"] += 1
        if self.args.report_accepted:
            emit({"accepted_id": self.ids.pop(event.delivery.tag, None)})
        self._maybe_done()

    def on_rejected(self, event):
        self.outcomes["rejected"] += 1
        self._maybe_done()

    def on_released(self, event):
        key = "modified" if event.delivery.remote_state == event.delivery.MODIFIED else "released"
        self.outcomes[key] += 1
        self._maybe_done()

    def _maybe_done(self):
        if self.finished():
            self.conn.close()

    def on_connection_closed(self, event):
        self.stop_container()

    def result(self):
        result = {"sent": self.sent, **self.outcomes, "error": self.error}
        if self.failover:
            result.update(resent=self.resent, failovers=self.lost_count)
        return result


class Receiver(Base):
    def __init__(self, args):
        super().__init__(args, prefetch=0, auto_accept=False)
        self.received = 0
        self.seen: dict[str, bytearray] = {}  # --summary: producer -> deliveries per seq
        self.idle_timer = None

    def start_link(self, event):
        if self.args.dynamic:
            self.receiver = self.container.create_receiver(self.conn, None, dynamic=True)
        else:
            self.receiver = self.container.create_receiver(self.conn, self.args.address)
        self.receiver.flow(self.credit_wanted())
        self.arm_idle(self.container)

    def on_link_opened(self, event):
        if self.args.dynamic and event.receiver is not None:
            emit({"dynamic_address": event.receiver.remote_source.address})

    def credit_wanted(self):
        if not self.args.count:
            return self.args.credit
        return max(0, min(self.args.credit, self.args.count - self.received))

    def arm_idle(self, container):
        if self.args.idle_ms:
            if self.idle_timer is not None:
                self.idle_timer.cancel()
            self.idle_timer = container.schedule(self.args.idle_ms / 1000.0, IdleTimer(self))

    def on_message(self, event):
        message = event.message
        props = message.properties or {}
        if self.args.check_body:
            # this client's body, or the go-amqp test client's (tests/clients/goamqp)
            seq, producer = props.get("seq"), props.get("producer")
            want_bodies = (f"message {seq}", f"message {seq} from {producer}")
            if self.args.sizes and seq is not None:  # send's --sizes: zeros of that size
                want_bodies = (bytes(self.args.sizes[seq % len(self.args.sizes)]),)
            if message.body not in want_bodies or message.id != f"{producer}-{seq}":
                emit({"bad_body": {"id": message.id, "body": repr(message.body)[:200],
                                   "properties": repr(props)[:200]}})
                self.fail({"condition": "corrupt-message",
                           "description": f"{message.id!r}: body {message.body!r:.80}"}, 4)
                return
        if self.args.summary:
            self.count_seen(props.get("producer"), props.get("seq"))
        else:
            emit({"id": message.id, "producer": props.get("producer"), "seq": props.get("seq"),
                  "delivery_count": message.delivery_count, "size": body_size(message.body)})
        self.received += 1
        if self.args.hold:
            return
        self.accept(event.delivery)
        self.arm_idle(event.container)
        if self.args.count and self.received >= self.args.count:
            self.receiver.close()
            self.conn.close()
            return
        if self.receiver.credit <= self.args.credit // 2:
            missing = self.credit_wanted() - self.receiver.credit
            if missing > 0:
                self.receiver.flow(missing)

    def count_seen(self, producer, seq) -> None:
        if not isinstance(seq, int) or seq < 0:
            return
        seen = self.seen.setdefault(str(producer), bytearray())
        if seq >= len(seen):
            seen.extend(bytes(max(seq + 1 - len(seen), len(seen))))
        seen[seq] = min(255, seen[seq] + 1)

    def finished(self):
        return bool(self.args.count) and self.received >= self.args.count

    def on_connection_closed(self, event):
        self.stop_container()

    def result(self):
        result = {"done": self.error is None, "received": self.received, "error": self.error}
        if self.args.summary:
            result["seen"] = {name: base64.b64encode(zlib.compress(bytes(seen))).decode()
                              for name, seen in self.seen.items()}
        return result


def body_size(body) -> int | None:
    if isinstance(body, str):
        return len(body.encode())
    if isinstance(body, (bytes, bytearray, memoryview)):
        return len(body)
    return None


class Drainer(Base):
    """drain: credit, --take messages, then a drain request answered by the sender's flow."""

    def __init__(self, args):
        super().__init__(args, prefetch=0, auto_accept=False)
        self.received = 0
        self.drain_started: float | None = None
        self.drain_ms: float | None = None

    def start_link(self, event):
        options = [Copy()] if self.args.browse else None
        self.receiver = event.container.create_receiver(self.conn, self.args.address,
                                                        options=options)

    def on_link_opened(self, event):
        if event.link != self.receiver or self.drain_started is not None:
            return
        if self.args.credit:
            self.receiver.flow(self.args.credit)
        if self.args.take == 0:
            self.start_drain()

    def on_message(self, event):
        if self.drain_started is not None:
            return  # came for the credit the drain used up: not taken
        self.accept(event.delivery)
        self.received += 1
        if self.received >= self.args.take:
            self.start_drain()

    def start_drain(self):
        self.drain_started = time.monotonic()
        self.receiver.drain(0)  # drain set, the credit left unchanged

    def on_link_flow(self, event):
        if (event.link == self.receiver and self.drain_started is not None
                and self.drain_ms is None and self.receiver.credit == 0):
            self.drain_ms = (time.monotonic() - self.drain_started) * 1000.0
            self.conn.close()

    def finished(self):
        return self.drain_ms is not None

    def on_connection_closed(self, event):
        self.stop_container()

    def result(self):
        return {"drained": self.drain_ms is not None and self.error is None,
                "drain_ms": self.drain_ms, "received": self.received, "error": self.error}


class RateTimer:
    """--rate: send what became due since the last call."""

    def __init__(self, sender: Sender, link):
        self.sender = sender
        self.link = link

    def on_timer_task(self, event):
        self.sender.rate_timer = None
        if self.link.state & self.link.LOCAL_ACTIVE and self.sender.exit_code == 0 and \
                self.link == self.sender.sender:
            self.sender.send_some(self.link)


class IdleTimer:
    def __init__(self, receiver: Receiver):
        self.receiver = receiver

    def on_timer_task(self, event):
        if self.receiver.idle_timer is not None and self.receiver.conn is not None:
            self.receiver.conn.close()


def sizes_of(text: str) -> list[int]:
    """--sizes: comma-separated byte counts."""
    sizes = [int(field) for field in text.split(",")]
    if not sizes or min(sizes) < 0:
        raise argparse.ArgumentTypeError("byte counts >= 0")
    return sizes


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["send", "receive", "drain"])
    parser.add_argument("--url", required=True)
    parser.add_argument("--address")
    parser.add_argument("--count", type=int, default=0)
    parser.add_argument("--prefix", default="proton")
    parser.add_argument("--presettled", action="store_true")
    parser.add_argument("--durable", action="store_true")
    parser.add_argument("--report-accepted", action="store_true")
    parser.add_argument("--report-sent", action="store_true")
    parser.add_argument("--rate", type=float, default=0)
    parser.add_argument("--check-body", action="store_true")
    parser.add_argument("--summary", action="store_true")
    parser.add_argument("--username")
    parser.add_argument("--password")
    parser.add_argument("--timeout-ms", type=int, default=30000)
    parser.add_argument("--credit", type=int, default=100)
    parser.add_argument("--idle-ms", type=int, default=0)
    parser.add_argument("--hold", action="store_true")
    parser.add_argument("--dynamic", action="store_true")
    parser.add_argument("--sizes", type=sizes_of, default=None)
    parser.add_argument("--priorities", type=int, default=0)
    parser.add_argument("--take", type=int, default=0)
    parser.add_argument("--browse", action="store_true")
    parser.add_argument("--failover", action="store_true")
    args = parser.parse_args()
    handler = {"send": Sender, "receive": Receiver, "drain": Drainer}[args.mode](args)
    Container(handler).run()
    emit(handler.result())
    return handler.exit_code


if __name__ == "__main__":
    sys.exit(main())
