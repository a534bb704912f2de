"""Dispatch with consumers that have selectors (docs/queue-semantics.md, "Selectors").

A consumer with a selector (``consumer.selector``, ``proxy.selectors``) keeps its own
``PriorityStore`` (``consumer.matched``) of the queue's ready messages it selects:
references, in delivery order. A message is evaluated once per selective consumer when
it becomes ready (``offered``) and the whole queue once when such a consumer attaches
(``added``). Dispatch then gives each consumer with credit the first message it may
have: the head of its own store, or of the queue for a consumer without a selector. A
message taken leaves the queue's store and every selective consumer's (``taken``).
No delivery scans the queue.

A queue is in this mode only while it has selective consumers; ``LocalQueue.dispatch``
uses its plain loop otherwise.
"""

from __future__ import annotations

from time import monotonic

from proxy.queues.store import PriorityStore


def added(queue, consumer) -> None:
    store = PriorityStore()
    selector = consumer.selector
    for message in queue.messages:
        if selector.matches(queue.body(message)):  # a paged one is read, and stays paged
            store.append(message)
    consumer.matched = store
    queue.selective.append(consumer)


def removed(queue, consumer) -> None:
    queue.selective.remove(consumer)
    consumer.matched = None


def offered(queue, message, *, head: bool) -> None:
    """``message`` became ready (at the tail, or back at the head)."""
    payload = queue.body(message)
    for consumer in queue.selective:
        if consumer.selector.matches(payload):
            if head:
                consumer.matched.appendleft(message)
            else:
                consumer.matched.append(message)


def taken(queue, message) -> None:
    """``message`` left the ready place (delivered, dropped, expired)."""
    for consumer in queue.selective:
        consumer.matched.remove(message)


def dispatch(queue) -> int:
    """Each consumer with credit, in turn, takes the first message it may have; until no
    consumer can take one. Standby consumers (fragments' stealers) only when no ordinary
    consumer took anything in a round."""
    messages = queue.messages
    acquired = queue.on_acquired
    consumers = queue.consumers
    sent = 0
    while messages:
        progress = False
        count = len(consumers)
        start = queue._next
        for offset in range(count):
            index = (start + offset) % count
            if index >= len(consumers):
                continue
            consumer = consumers[index]
            if consumer.credit <= 0:
                continue
            message = _take_for(queue, consumer)
            if message is None:
                continue
            queue._next = (index + 1) % max(1, len(consumers))
            queue.unacked += 1
            sent += 1
            progress = True
            if acquired is not None:
                acquired(message)
            consumer.deliver(message)
        if not progress:
            for consumer in queue.standby_consumers:
                if consumer.credit > 0:
                    message = _take_for(queue, consumer)
                    if message is not None:
                        queue.delivered_to_standby += 1
                        queue.unacked += 1
                        sent += 1
                        progress = True
                        if acquired is not None:
                            acquired(message)
                        consumer.deliver(message)
                        break
        if not progress:
            break
    queue.stats.delivered += sent
    return sent


def _take_for(queue, consumer):
    """The first ready message ``consumer`` may have, taken out of every store; expired
    ones met on the way are taken out too (into ``queue.expired``)."""
    selector = getattr(consumer, "selector", None)
    store = consumer.matched if selector is not None else queue.messages
    consumer_id = consumer.consumer_id
    while True:
        message = store.first(consumer_id)
        if message is None:
            return None
        queue.messages.remove(message)
        taken(queue, message)
        if message.page is not None:  # its body back in memory now (docs/paging.md)
            queue.memory.pager.load_now(queue, message)
            queue._handed_out(message.page)
        if message.expires_at and message.expires_at <= monotonic():
            queue._left(message)
            queue.stats.expired += 1
            queue.expired.append(message)
            continue
        return message
