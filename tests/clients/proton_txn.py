"""proton-python transactions client (proton.reactor's Transaction API) for fedgate's tests.

    python proton_txn.py send --url U --address A --count N [--batch B] [--abort]
                              [--durable] [--hold] [--timeout-ms T]
    python proton_txn.py receive --url U --address A --count N [--abort] [--timeout-ms T]

send: N messages in transactions of B (default N): each transaction is declared, its messages
sent with ``Transaction.send`` (id "t<k>-<i>", property "txn" k), then committed (or aborted
with --abort) once all of them are answered. Prints {"committed": k} or {"aborted": k} as each
discharge is answered, then {"done": true, "committed": c, "aborted": a, "error": null}.
--hold: after the first transaction's messages are answered, prints {"holding": k} and waits
with it open (to be killed by a test). --durable sets the header's durable field.
--eager: proton's own examples' shape (tx_send.py) and a new user's: each transaction's
messages are sent as soon as it is declared, whether or not the link has credit yet (proton
queues them), and committed (or aborted) at once, not after their outcomes; the connection
closes once every outcome came. Prints {"refused": [condition names]} if any was refused.
receive: one transaction; N messages received and accepted in it (``Transaction.accept``,
left unsettled until the discharge, as proton does by default), then committed (or aborted).
Prints {"received": [ids], "delivery_counts": [...], "outcome": "committed" | "aborted"}.
A refused declare, commit or message prints {"error": ...} and exits 2; no end within
--timeout-ms exits 3.
"""

from __future__ import annotations

import argparse
import json
import sys

from proton import Message
from proton.handlers import MessagingHandler, TransactionHandler
from proton.reactor import Container


def emit(**fields) -> None:
    print(json.dumps(fields), flush=True)


class Sender(MessagingHandler, TransactionHandler):
    def __init__(self, opts) -> None:
        super().__init__()
        self.opts = opts
        self.batch = opts.batch or opts.count
        self.txn = None
        self.sender = None
        self.conn = None
        self.number = 0  # transactions declared
        self.sent = 0
        self.answered = 0  # of the current transaction
        self.in_txn = 0
        self.committed = self.aborted = 0
        self.discharged = self.outcomes = 0  # (--eager) discharges answered, transfers answered
        self.refused: list = []
        self.code = 0

    def on_start(self, event) -> None:
        self.conn = event.container.connect(self.opts.url)
        self.sender = event.container.create_sender(self.conn, self.opts.address)
        event.container.schedule(self.opts.timeout_ms / 1000.0, self)
        self.declare(event.container)

    def declare(self, container) -> None:
        self.number += 1
        self.in_txn = self.answered = 0
        container.declare_transaction(self.conn, handler=self)

    def on_timer_task(self, event) -> None:
        emit(error="timeout", committed=self.committed, aborted=self.aborted)
        self.code = 3
        event.container.stop()

    def on_transaction_declared(self, event) -> None:
        self.txn = event.transaction
        self.fill()

    def on_sendable(self, event) -> None:
        self.fill()

    def fill(self) -> None:
        while (self.txn is not None and (self.opts.eager or self.sender.credit > 0)
               and self.in_txn < self.batch and self.sent < self.opts.count):
            message = Message(id=f"t{self.number}-{self.in_txn}", body=f"t{self.number}-{self.in_txn}",
                              properties={"txn": self.number}, durable=self.opts.durable)
            self.txn.send(self.sender, message)
            self.sent += 1
            self.in_txn += 1
        if self.opts.eager and self.txn is not None and self.in_txn:
            txn, self.txn = self.txn, None
            txn.abort() if self.opts.abort else txn.commit()

    def on_settled(self, event) -> None:  # a transactional transfer answered
        if event.link.name != self.sender.name:
            return
        state = event.delivery.remote_state
        if self.opts.eager:
            self.outcomes += 1
            if state not in (0x34, event.delivery.ACCEPTED):
                condition = event.delivery.remote.condition
                self.refused.append(condition.name if condition else str(state))
            self.finish_eager(event)
            return
        if state not in (0x34, event.delivery.ACCEPTED):
            condition = event.delivery.remote.condition
            emit(error=f"message refused: {state} {condition.name if condition else ''}: "
                       f"{condition.description if condition else ''}")
            self.code = 2
            event.container.stop()
            return
        self.answered += 1
        if self.answered == self.in_txn and (self.in_txn == self.batch or self.sent == self.opts.count):
            if self.opts.hold:
                emit(holding=self.number)
                return
            self.txn.abort() if self.opts.abort else self.txn.commit()

    def on_transaction_committed(self, event) -> None:
        self.committed += 1
        emit(committed=self.number)
        self.next(event)

    def on_transaction_aborted(self, event) -> None:
        self.aborted += 1
        emit(aborted=self.number)
        self.next(event)

    def finish_eager(self, event) -> None:
        if self.discharged == self.number and self.outcomes == self.sent and self.sent == self.opts.count:
            if self.refused:
                emit(refused=self.refused)
            emit(done=True, committed=self.committed, aborted=self.aborted, error=None)
            event.connection.close()
            event.container.stop()

    def next(self, event) -> None:
        self.txn = None
        self.discharged += 1
        if self.opts.eager:
            if self.sent < self.opts.count:
                self.declare(event.container)
            else:
                self.finish_eager(event)
            return
        if self.sent < self.opts.count:
            self.declare(event.container)
        else:
            emit(done=True, committed=self.committed, aborted=self.aborted, error=None)
            event.connection.close()
            event.container.stop()

    def on_transaction_declare_failed(self, event) -> None:
        self.fail(event, "declare refused")

    def on_transaction_commit_failed(self, event) -> None:
        self.fail(event, "commit refused")

    def fail(self, event, what: str) -> None:
        condition = event.delivery.remote.condition
        emit(error=f"{what}: {condition.name if condition else ''}: "
                   f"{condition.description if condition else ''}", committed=self.committed)
        self.code = 2
        event.container.stop()

    def on_link_error(self, event) -> None:
        condition = event.link.remote_condition
        emit(error=f"link error: {condition.name}: {condition.description}")
        self.code = 2
        event.container.stop()


class Receiver(MessagingHandler, TransactionHandler):
    def __init__(self, opts) -> None:
        super().__init__(prefetch=0, auto_accept=False)
        self.opts = opts
        self.txn = None
        self.receiver = None
        self.received: list = []
        self.counts: list = []
        self.code = 0

    def on_start(self, event) -> None:
        conn = event.container.connect(self.opts.url)
        self.receiver = event.container.create_receiver(conn, self.opts.address)
        event.container.declare_transaction(conn, handler=self)
        event.container.schedule(self.opts.timeout_ms / 1000.0, self)

    def on_timer_task(self, event) -> None:
        emit(error="timeout", received=self.received)
        self.code = 3
        event.container.stop()

    def on_transaction_declared(self, event) -> None:
        self.txn = event.transaction
        self.receiver.flow(self.opts.count)

    def on_message(self, event) -> None:
        self.received.append(event.message.id)
        self.counts.append(event.message.delivery_count)
        self.txn.accept(event.delivery)
        if len(self.received) == self.opts.count:
            self.txn.abort() if self.opts.abort else self.txn.commit()

    def on_transaction_committed(self, event) -> None:
        self.finish(event, "committed")

    def on_transaction_aborted(self, event) -> None:
        self.finish(event, "aborted")

    def finish(self, event, outcome: str) -> None:
        emit(received=self.received, delivery_counts=self.counts, outcome=outcome, error=None)
        event.connection.close()
        event.container.stop()

    def on_transaction_commit_failed(self, event) -> None:
        condition = event.delivery.remote.condition
        emit(error=f"commit refused: {condition.name if condition else ''}", received=self.received)
        self.code = 2
        event.container.stop()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("send", "receive"))
    parser.add_argument("--url", required=True)
    parser.add_argument("--address", required=True)
    parser.add_argument("--count", type=int, default=1)
    parser.add_argument("--batch", type=int, default=0)
    parser.add_argument("--abort", action="store_true")
    parser.add_argument("--durable", action="store_true")
    parser.add_argument("--hold", action="store_true")
    parser.add_argument("--eager", action="store_true")
    parser.add_argument("--timeout-ms", type=int, default=30000)
    opts = parser.parse_args()
    handler = Sender(opts) if opts.mode == "send" else Receiver(opts)
    Container(handler).run()
    return handler.code


if __name__ == "__main__":
    sys.exit(main())
