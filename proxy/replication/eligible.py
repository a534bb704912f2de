"""Who may claim a replicated queue whose owner is gone (docs/replication.md, failover).

The ISR record in etcd (``replication/<resource>``: ``primary``, ``isr``) names the copies that
hold everything accepted. A node named there claims the queue if it holds its copy: a backup
in sync and told so (the ``S`` event), or what its journal brought back. A node named there
without a copy (started again, not durable) steps out of the record, so that when nobody named
holds one, the queue is made again (every copy lost).

One case in between (docs/nemesis.md, finding 18): a backup that caught up (its catch-up's end
came) and whose link ended with its connection before the ``S`` came. The primary writes the
record, then tells the backup; killed in between, the record names a backup that was never
told. Its copy holds what the catch-up sent and the live events after it: it lacks at most
what the primary accepted in the last moment without waiting for it (accepted on the word of
the other in-sync copies, or alone as ``min_in_sync = 1`` allows). Stepping out threw all of
it away. Such an *unconfirmed* copy now waits ``UNCONFIRMED_WAIT`` for a copy that was told
(one claims at once when the owner goes), then claims with what it holds, provided the record
names no other backup (one that was told may be down and come back with everything: the
queue waits for it, as it always did). Not for a durable queue: its old primary's journal
holds what it accepted alone, and the queue waits for it to come back, as before.

Who may do what, when the owner is gone:
* told (ready), or journal-recovered, and named: claims at once;
* unconfirmed, named, no other backup named: claims after ``UNCONFIRMED_WAIT``;
* named without a copy (or unconfirmed with another backup named): steps out;
* not named: never claims (the preferred node makes a queue nobody holds).
"""

from __future__ import annotations

import asyncio
import json
import logging

log = logging.getLogger("fedgate.replication")

UNCONFIRMED_WAIT = 1.0  # seconds an unconfirmed copy leaves to copies that were told


def named(record: dict, node_id: str) -> bool:
    return record.get("primary") == node_id or node_id in record.get("isr", ())


def holds_copy(entry) -> bool:
    """A copy that holds what was accepted: in sync, or brought back by the journal."""
    return (entry.backup is not None and entry.backup.ready) or entry.recovered_messages is not None


def unconfirmed_wait(entry, record: dict) -> float | None:
    """Seconds before this node's unconfirmed copy may claim (0: now), or None when it may
    not (no such copy, or the record names another backup)."""
    backup = entry.backup
    if backup is None or backup.unconfirmed_at is None or entry.settings.durable:
        return None  # durable: the old primary's journal may hold more; the queue waits for it
    if any(n != entry.node_id for n in record.get("isr", ())):
        return None
    now = asyncio.get_running_loop().time()
    if backup.unconfirmed_seen is None:  # the owner is first seen gone now
        backup.unconfirmed_seen = now
        log.warning("queue %s: the primary named this copy in sync and never told it; it "
                    "claims in %.1f s unless a copy that was told does", entry.wire,
                    UNCONFIRMED_WAIT)
    return max(0.0, backup.unconfirmed_seen + UNCONFIRMED_WAIT - now)


def eligible(entry, record: dict | None) -> bool:
    """May this node claim the queue now?"""
    if record is None or (not record.get("primary") and not record.get("isr")):
        # never claimed, or every copy named is gone: its preferred node makes it
        return entry._preferred() == entry.node_id
    if asyncio.get_running_loop().time() < entry._aside_until:
        return False  # stood aside: a backup of the in-sync set claims first
    if not named(record, entry.node_id):
        return False
    return holds_copy(entry) or unconfirmed_wait(entry, record) == 0.0


async def step_out(entry, record_bytes: bytes, record: dict):
    """Take this node out of the record (it holds no copy); the record as it is then."""
    changed = dict(record)
    if changed.get("primary") == entry.node_id:
        changed["primary"] = None
    changed["isr"] = [n for n in changed.get("isr", ()) if n != entry.node_id]
    body = json.dumps(changed).encode()
    service = entry.service
    if await service.coordinator.swap_state("replication/" + entry.resource, record_bytes, body):
        log.warning("queue %s: this node holds no copy any more; out of its record (%s)",
                    entry.wire, changed)
    return await service.read_record(entry.resource)
