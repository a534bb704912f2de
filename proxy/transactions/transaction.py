"""One transaction as data: its state, where its work goes, and the work it holds.

How this works
--------------
A ``Transaction`` is declared on a client's coordinator link (§4.3) and lives
until it is discharged, its coordinator link or connection ends, or it is
older than ``transaction_timeout``. Its ``state`` changes only by the moves in
``TXN_TRANSITIONS`` (a move not written there raises):

    ACTIVE --work that cannot be part of it--> FAILED (rollback only)
      |  \\                                        |
      |   '--discharge fail=false--> COMMITTING --+--> COMMITTED
      |                                 |           '--> ROLLED_BACK (journal error, the primary
      '--discharge fail=true, link or connection gone, timeout--> ROLLED_BACK   refused the commit)

Its ``home`` is where all of its work goes, fixed by the first piece of work:
``LOCAL`` (this node's queues, exchanges, temporary queues, its own fragment)
or an ``UpstreamHome`` (one connection to one primary, when the transaction is
forwarded: ``proxy.transactions.forward``). Work for another home makes the
transaction ``FAILED`` with the reason, which the commit's answer repeats.

Local work is held here until the commit (``proxy.transactions.local``):

* ``postings``: messages sent to local queues, ``(queues, payload)`` (an
  exchange's posting lists every local queue bound to it for the message),
  not visible to consumers; their bytes count against ``[limits]
  max_memory`` while held;
* ``retirements``: messages the client acquired and settled in the
  transaction (§4.4.2): still out with the client as far as the queue knows,
  their outcome applied at commit, back to the queue (delivery-count raised)
  at rollback.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class TxnState(enum.StrEnum):
    ACTIVE = "active"
    FAILED = "failed"  # a part of it could not be done: it can only be rolled back
    COMMITTING = "committing"  # waiting for the journal, the primary or the replicas
    COMMITTED = "committed"
    ROLLED_BACK = "rolled-back"


TXN_TRANSITIONS: dict[TxnState, frozenset[TxnState]] = {
    TxnState.ACTIVE: frozenset({TxnState.FAILED, TxnState.COMMITTING, TxnState.ROLLED_BACK}),
    TxnState.FAILED: frozenset({TxnState.ROLLED_BACK}),
    TxnState.COMMITTING: frozenset({TxnState.COMMITTED, TxnState.ROLLED_BACK}),
    TxnState.COMMITTED: frozenset(),
    TxnState.ROLLED_BACK: frozenset(),
}
OPEN = (TxnState.ACTIVE, TxnState.FAILED)  # may still be discharged or time out


class TxnStateError(RuntimeError):
    """A transaction was asked to make a move ``TXN_TRANSITIONS`` does not allow."""


LOCAL = "local"  # a home: this node's own queues


@dataclass(slots=True)
class Retirement:
    """A message of a local queue the client settled in the transaction (§4.4.2)."""

    queue: object  # LocalQueue
    message: object  # StoredMessage, still counted as unacked by its queue
    state: object  # wire.TxnState: the outcome that applies at commit
    consumer_id: int
    delivery: object = None  # the client's delivery when it left it unsettled (held)
    endpoint: object = None  # the consumer endpoint of ``delivery``


@dataclass(eq=False)
class Transaction:
    txn_id: bytes
    coordinator: object  # the Coordinator endpoint (client link) that declared it
    started: float  # the node's clock when declared (when its commit began, once COMMITTING)
    state: TxnState = TxnState.ACTIVE
    home: object = None  # None until its first work; LOCAL or an UpstreamHome
    failure: str | None = None  # why it can only be rolled back (FAILED)
    postings: list = field(default_factory=list)  # (queues, payload)
    retirements: list = field(default_factory=list)
    held_bytes: int = 0  # bytes of postings, counted in the node's MemoryUse
    # the hot path (proxy.transactions.coordinator.post): the encoded state of its transfers
    # (its key in the connection's table) and the fields of their answer, built once
    key: bytes | None = None
    answer: object = None
    forwarded: int = 0  # messages sent or settled through the primary (a forwarded one)
    # forwarded: the primary's txn-id once declared there, and the work and discharge that
    # wait for it (callables run in order once the primary answered)
    upstream_id: bytes | None = None
    waiting: list = field(default_factory=list)
    # forwarded transfers the primary has not answered yet, and what waits for them all (the
    # discharge: the primary must have every transfer before it commits)
    unanswered: int = 0
    when_answered: list = field(default_factory=list)
    committed: object = None  # COMMITTING: the callback that answers the commit, once

    def move(self, state: TxnState) -> None:
        if state not in TXN_TRANSITIONS[self.state]:
            raise TxnStateError(f"transaction {self.txn_id!r}: {self.state} -> {state}")
        self.state = state

    @property
    def open(self) -> bool:
        return self.state in OPEN

    @property
    def messages(self) -> int:
        """Messages it holds: posted (each once) and retired, and those it forwarded."""
        return len(self.postings) + len(self.retirements) + self.forwarded

    def fail(self, reason: str) -> None:
        """Work that cannot be part of it: it can only roll back now (the first reason is kept;
        a commit under way when forwarded work fails learns it from ``failure``)."""
        if self.state is TxnState.ACTIVE:
            self.move(TxnState.FAILED)
        if self.failure is None and self.state in (TxnState.FAILED, TxnState.COMMITTING):
            self.failure = reason

    def describe(self, now: float) -> dict:
        home = self.home
        return {
            "id": self.txn_id.decode("latin-1"),
            "age_s": round(now - self.started, 3),
            "state": self.state.value,
            "messages": self.messages,
            "bytes_held": self.held_bytes,
            "home": None if home is None else home if home == LOCAL else home.describe(),
            "failure": self.failure,
        }
