"""The node's transactions: the settings, every connection's table, the timeout check, counters.

How this works
--------------
``Transactions`` is one per node, built by the broker. A client's first
coordinator link (``attach``) gives its ``ClientHandler`` a
``ConnectionTransactions`` (``proxy.transactions.coordinator``) and the link a
``Coordinator`` endpoint. Txn-ids are ``txn:<n>``, ``n`` counting up over the
node's life (unique on every connection of the node, as a txn-id must be on
its connection, §4.3).

Timeouts: while any transaction is open a timer runs every
``CHECK_PERIOD`` seconds (at most a quarter of ``transaction_timeout``); a
transaction open longer than ``transaction_timeout`` is rolled back and its
coordinator link ends with ``amqp:transaction:timeout``; a commit that has
waited that long (for the journal, a primary, a queue's barrier) ends the
same way, its outcome unknown to the client: no wait is unbounded. The clock is the
event loop's (a playbook's virtual one); without a running loop (the
in-memory harness) there is no timer and ``tick(now)`` is called by hand.

Counters (``stats``) and ``describe`` feed the admin API and ``/metrics``.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass

from proxy.transactions.coordinator import ConnectionTransactions, Coordinator
from proxy.transactions.transaction import TxnState

CHECK_PERIOD = 1.0


@dataclass
class TransactionStats:
    declared: int = 0
    committed: int = 0
    rolled_back: int = 0
    timed_out: int = 0  # rolled back by transaction_timeout (also counted in rolled_back)
    unknown: int = 0  # commits whose outcome the client could not be told (coordinator link ended)
    refused: int = 0  # declares refused (limit, distributed transactions)


class Transactions:
    def __init__(self, broker, *, max_per_connection: int = 64, timeout: float = 60.0) -> None:
        self.broker = broker
        self.max_per_connection = max_per_connection  # 0: no limit
        self.timeout = timeout  # 0: never
        self.tables: set[ConnectionTransactions] = set()
        self.stats = TransactionStats()
        self.open = 0
        self._ids = itertools.count(1)
        self._timer = None

    def attach(self, handler, link) -> Coordinator:
        """A client's coordinator link (§4.2): answered with our coordinator."""
        table = handler.transactions
        if table is None:
            table = handler.transactions = ConnectionTransactions(self, handler)
            self.tables.add(table)
        return Coordinator(handler, link, table)

    def new_id(self) -> bytes:
        return f"txn:{next(self._ids)}".encode()

    # -- the clock ----------------------------------------------------------------------------
    @staticmethod
    def _loop():
        try:
            return asyncio.get_running_loop()
        except RuntimeError:  # no loop: the in-memory harness
            return None

    def now(self) -> float:
        loop = self._loop()
        return loop.time() if loop is not None else time.monotonic()

    def call_later(self, delay: float, callback):
        loop = self._loop()
        return loop.call_later(delay, callback) if loop is not None else None

    # -- open and closed ----------------------------------------------------------------------
    def opened(self) -> None:
        self.open += 1
        self.stats.declared += 1
        if self._timer is None and self.timeout:
            self._timer = self.call_later(min(CHECK_PERIOD, self.timeout / 4), self._check)

    def closed(self, txn, outcome: str) -> None:
        self.open -= 1
        setattr(self.stats, outcome, getattr(self.stats, outcome) + 1)

    def _check(self) -> None:
        self._timer = None
        self.tick(self.now())
        self.broker.run_pending()
        if self.open and self.timeout:
            self._timer = self.call_later(min(CHECK_PERIOD, self.timeout / 4), self._check)

    def tick(self, now: float) -> None:
        """Roll back every transaction open longer than ``transaction_timeout``; give up on a
        commit that has waited that long (its outcome is then unknown to the client)."""
        if not self.timeout:
            return
        for table in list(self.tables):
            for txn in [t for t in table.txns.values() if now - t.started > self.timeout]:
                if txn.open:
                    table.timed_out(txn)
                elif txn.state is TxnState.COMMITTING:
                    table.commit_stalled(txn)

    # -- views --------------------------------------------------------------------------------
    def held(self) -> tuple[int, int]:
        """(messages, bytes) held by open transactions, node-wide."""
        messages = held = 0
        for table in self.tables:
            for txn in table.txns.values():
                messages += txn.messages
                held += txn.held_bytes
        return messages, held

    def describe(self) -> dict:
        messages, held = self.held()
        return {"open": self.open, "messages_held": messages, "bytes_held": held,
                "max_transactions_per_connection": self.max_per_connection,
                "transaction_timeout": self.timeout, **vars(self.stats)}
