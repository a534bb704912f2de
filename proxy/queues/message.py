"""One stored message: its encoded bytes and the little state a queue tracks."""

from __future__ import annotations

from dataclasses import dataclass, field
from time import monotonic


@dataclass(slots=True)
class StoredMessage:
    """One message as stored: encoded bytes plus the little state we track."""

    payload: bytes
    # Consumers (by id) this message must not be offered to again
    # (modified with undeliverable-here, §3.4.5).
    excluded: frozenset[int] = frozenset()
    # Id of its ENQUEUE record in the journal (proxy.journal); 0 = not journaled.
    journal_id: int = 0
    # time.monotonic() when first stored: delivery latency is measured from here
    enqueued_at: float = field(default_factory=monotonic)
    # A message whose outcome another party settles: (that party, its token). Its
    # outcome goes to ``party.settle_at_home(token, state, client delivery)``, not to
    # a local queue (fragments: a message stolen from its home fragment).
    origin: tuple | None = None
    # Its place in the order of enqueues (set by LocalQueue.enqueue); browsers keep
    # the last one they were sent
    seq: int = 0
    # time.monotonic() after which it is expired (its header's ttl); 0 = never
    expires_at: float = 0.0
    # its replication id on a replicated queue (proxy.replication); 0 = not replicated
    rid: int = 0
    # the header's priority (0-9, set by LocalQueue.enqueue): higher first
    priority: int = 4
    # times it came back from a consumer (released, modified, orphaned): delivery_limit
    attempts: int = 0
    # its record in the page store (proxy.paging.store.Page), None: none; while the body is
    # on disk only, ``payload`` is that Page too (docs/paging.md)
    page: object = None
