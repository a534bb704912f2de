"""Which messages the journal keeps, and the broker's small calls into it.

A message is journaled when its queue is durable (``[queues] durable`` or
``[[queue]] durable``) *and* the producer asked for durability: the AMQP
header section's ``durable`` field is true (AMQP 1.0 §3.2.1). The header, when
present, is the first section of the encoded message, so a look at the first
bytes is enough; the message is never decoded:

    0x00 0x53 0x70        described type, descriptor smallulong 0x70 (header)
                          (or 0x00 0x80 + ulong 0x70, the long descriptor form)
    0xc0 size count | 0xd0 size32 count32 | 0x45 (empty list)
    first field           0x41 true | 0x56 0x01 boolean true; anything else: not durable

Producer-side waiting lives in ``QueueProducer`` (``proxy.broker``); this
module has the decisions, the dequeue / dead-letter bookkeeping, and the
node's start-up: ``open_journal`` + ``restore`` refill queues before listening.
"""

from __future__ import annotations

from pathlib import Path

from proxy.journal.journal import Journal
from proxy.queues import journal_restore, local
from proxy.queues.local import LocalQueue, StoredMessage

_HEADER = b"\x00\x53\x70"
_HEADER_LONG = b"\x00\x80" + (0x70).to_bytes(8, "big")
_LIST8 = 0xC0
_LIST32 = 0xD0
_TRUE = 0x41
_BOOLEAN = 0x56


def header_durable(payload: bytes) -> bool:
    """True when the message's header section says durable=true."""
    if payload[:3] == _HEADER:
        pos = 3
    elif payload[:10] == _HEADER_LONG:
        pos = 10
    else:
        return False
    try:
        code = payload[pos]
        if code == _LIST8:
            count = payload[pos + 2]
            first = pos + 3
        elif code == _LIST32:
            count = int.from_bytes(payload[pos + 5:pos + 9], "big")
            first = pos + 9
        else:
            return False  # list0 (no fields) or not a list
        if count == 0:
            return False
        field = payload[first]
        return field == _TRUE or (field == _BOOLEAN and payload[first + 1] == 1)
    except IndexError:
        return False


def wants_journal(queue: LocalQueue, payload: bytes) -> bool:
    return queue.durable and header_durable(payload)


def dequeued(journal: Journal | None, message: StoredMessage) -> None:
    """The message left its queue for good (accepted, rejected): journal that."""
    if message.journal_id and journal is not None:
        journal.dequeue(message.journal_id)


def purged(journal: Journal | None, queue: LocalQueue) -> None:
    """Every message waiting in ``queue`` is about to be purged: journal each dequeue, the
    journal ids of its runs from memory (no record read; docs/paging_purge.md)."""
    if journal is not None:
        dequeue = journal.dequeue
        for journal_id, _ in queue.waiting_names():
            if journal_id:
                dequeue(journal_id)


def dead_lettered(journal: Journal | None, target: LocalQueue, message: StoredMessage) -> None:
    """A dead-lettered copy going into ``target``: journal it if that queue keeps it.

    Called before the original's dequeue is journaled, so a crash in between
    leaves the message in both queues, never in neither.
    """
    if journal is not None and journal.error is None and wants_journal(target, message.payload):
        message.journal_id, _ = journal.enqueue(target.name, message.payload)


def open_journal(directory, settings, *, wanted: bool) -> Journal | None:
    """The node's journal (not opened yet: ``Journal.open``); None when no queue is or was durable."""
    directory = Path(directory)
    if not wanted and not any(directory.glob("*.seg")):
        return None
    return Journal(directory, fsync=settings.fsync, segment_size=settings.segment_size,
                   batch_delay=settings.batch_delay)


def restore(recovered, registry, options, pages=None) -> int:
    """Put recovered messages back into their queues (declared even if auto-create is off).

    A message whose body recovery left in the journal (``Journal.open``'s ``body_budget``)
    comes back paged: its ``payload`` is a page of ``pages`` (``JournalPages``), read back
    from the journal when consumers near it (docs/paging.md); its header's fields come from
    recovery's scan when it kept them (``journal_restore.open_options``)."""
    count = 0
    for name, messages in recovered.queues.items():
        queue = registry.declare(name, **options(name))
        plain = type(queue).enqueue is LocalQueue.enqueue
        start = journal_restore.run_start(queue, messages, pages) if plain else None
        for index, (message_id, payload) in enumerate(messages):
            if index == start:  # the rest as journal runs, if the head allows
                done = journal_restore.into_runs(queue, name, messages, start, pages,
                                                 local.monotonic())
                if done is not None:
                    count += done
                    break
            if type(payload) is not bytes:  # None, or its header's fields (journal_restore)
                page = pages.page(name, message_id) if pages is not None else None
                if page is None:  # not live (cannot happen) or no pages: nothing to restore
                    continue
                known = journal_restore.header(payload) if plain else None
                message = StoredMessage(page, journal_id=message_id, page=page)
                if known is None:  # its body read for its header
                    queue.enqueue(message)
                else:  # nothing read
                    queue.enqueue(message, header=known)
            else:
                queue.enqueue(StoredMessage(payload, journal_id=message_id))
            count += 1
    return count
