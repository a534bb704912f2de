"""A replicated queue's messages that this node's journal brought back, before anyone claims it
(docs/paging-restart.md, "A replicated queue's recovered backlog").

How this works
--------------
At start the journal refills the node's queues (``proxy.queues.durable.restore``); a
replicated address's queue is taken apart by the replication service before it listens
(``ReplicatedAddress.recovered``): its messages are kept, in order, as a copy of unknown
freshness, used only if this node wins the claim. With paging on, recovery left the bodies
beyond half the budget in the journal (journal runs, or a journal page each): ``take`` keeps
them there. A journal run is turned back into messages paged one by one (``JournalRun.unrun``:
a ``PAGED`` journal page each, nothing read, its hold on the segment passed to the page), and
the messages leave the local queue *without* their pages dying, their bytes no longer counted
by it. So the node restarts within its budget; each page pins its journal segment (the
journal's compaction leaves it alone) until the page dies.

* ``claim_with``: this node claims the queue; the messages go into its ``ReplicatedQueue``
  (``restore``: counted as paged there, nothing read: priority and expiry were set at
  restore); the pages then die as any paged message's do (settled, expired, purged).
* ``let_go``: this node is a backup (or its recovered copy is stale): each page dies (its
  pin released; ``JournalPages.live`` falls by one each), and with ``dequeue`` each message's
  journal record is dequeued (it must not come back at the next restart).

Only the event loop calls these.
"""

from __future__ import annotations

from collections import deque

from proxy.paging.store import DEAD, READING, Page


def take(node, queue) -> list:
    """``queue``'s waiting messages, in order, out of it; bodies left where they are."""
    pager = getattr(node, "pager", None)
    messages = queue.messages
    if hasattr(messages, "unrun"):  # journal (or page-store) runs: messages paged one by one
        messages.unrun()
    held = list(queue.messages)
    scheduled = list(queue.scheduled.in_order(pager))  # in memory until their time, as before
    if pager is not None:
        for message in scheduled:
            pager.load_now(queue, message)
    memory = queue.memory
    size = 0
    for message in held:
        page = message.page
        if pager is not None and page is not None and page.state == READING:
            pager.load_now(queue, message)  # a read-ahead under way: finished here
        payload = message.payload
        size += len(payload)
        if type(payload) is Page:  # on disk only: no longer paged here
            queue.paged_bytes -= payload.size
            queue.paged_count -= 1
            memory.paged -= payload.size
    queue.messages = deque()
    queue._released(size)
    queue.purge()  # what is left: the scheduled ones (read above: in memory)
    return held + scheduled


def claim_with(queue, messages) -> None:
    """This node claims: ``messages`` (``take``'s) into its ``ReplicatedQueue``, in order."""
    for message in messages:
        if type(message.payload) is Page:  # priority and expiry known: nothing read
            queue.restore(message, header=(0, message.priority))
        else:
            queue.restore(message)


def let_go(node, messages, *, dequeue: bool) -> None:
    """``messages`` are not wanted here: their journal pages die (pins released); with
    ``dequeue`` their journal records are dequeued too."""
    pager = getattr(node, "pager", None)
    journal = node.broker.journal
    for message in messages:
        page = message.page
        if pager is not None and page is not None and page.state != DEAD:
            message.page = None  # not counted by any queue since ``take``
            pager.store.dead(page)
        if dequeue and journal is not None and message.journal_id:
            journal.dequeue(message.journal_id)
