"""Operators' work on one local queue: peek, purge, delete, and messages taken out to be sent
elsewhere (move, resend). The admin API's queue operations (docs/operations.md) call these.

How this works
--------------
Everything acts on a ``LocalQueue`` of this node (a local queue, this node's fragment of a
fragmented queue, or a replicated queue on its primary) through the calls a consumer's
outcomes make, so the journal and a replicated queue's backups hear of it as they would of
a consumer's work:

* ``peek``: the first waiting messages, decoded (header, properties, application
  properties, annotations, a body preview); nothing changes.
* ``purge``: every waiting message out (their journal records dequeued first); messages out
  with consumers stay theirs. A replicated queue reports each one gone to its backups.
* ``delete``: refused (``Refused``) while the queue has consumers or messages unless
  forced; forced, its links are detached with ``amqp:resource-deleted``, their unsettled
  messages come back and everything is purged.
* ``take``/``settle``: a move is a consumer that delivers to another address. ``take``
  hands the chosen waiting messages out as dispatch would (``unacked``, ``on_acquired``:
  a replicated queue's backups mark them acquired); ``settle`` is the outcome once the
  target answered: accepted (dequeued, journaled) or released (back at the head). So a
  message is removed only after its copy is accepted at the target (at-least-once: a crash
  in between leaves it in both places, never in neither).
* ``send``: one message to an address with its outcome, as the anonymous relay routes it
  (an exchange, a local queue journaled first, a proxied address); a replicated queue whose
  primary is this node answers once its in-sync copies hold the message (``commit_barrier``).
  An exchange no binding of which takes the message refuses it (``amqp:not-found``): an
  exchange accepts and drops such a message from a client, a move must not lose it.
"""

from __future__ import annotations

import logging
import time
from collections import deque

from cproton import PN_ACCEPTED, PN_REJECTED
from proton import Condition, Message

from proxy.amqp.message_subject import read_subject
from proxy.exchanges.exchange import NOT_FOUND, NOT_IMPLEMENTED, Fanin, at_depth_limit
from proxy.paging.store import Page
from proxy.queues import durable as journal_queues
from proxy.queues import selective

log = logging.getLogger("fedgate.operations")

RESOURCE_DELETED = "amqp:resource-deleted"
PREVIEW = 256  # characters of a body shown by peek
DEAD_LETTER_KEYS = ("x-opt-dead-letter-address", "x-opt-dead-letter-reason", "x-opt-dead-letter-time")


class Refused(Exception):
    """An operation the queue's state does not allow (the reason in the text)."""


# -- reading ----------------------------------------------------------------------------
def _plain(value):
    """A decoded AMQP value as JSON can carry it."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "replace")
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def decode(payload: bytes) -> Message | None:
    message = Message()
    try:
        message.decode(payload)
    except Exception:  # a producer's odd encoding: shown as raw bytes
        return None
    return message


def describe(queue, stored) -> dict:
    payload = queue.body(stored)
    item = {"seq": stored.seq, "size": len(payload), "priority": stored.priority,
            "attempts": stored.attempts, "durable_record": bool(stored.journal_id)}
    if stored.expires_at:
        item["expires_in_s"] = round(max(0.0, stored.expires_at - time.monotonic()), 3)
    message = decode(payload)
    if message is None:
        item["undecodable"] = True
        item["body"] = payload[:PREVIEW].hex()
        return item
    body = message.body
    text = body.decode("utf-8", "replace") if isinstance(body, (bytes, bytearray, memoryview)) \
        else repr(body) if not isinstance(body, str) else body
    item.update({
        "header": {"durable": message.durable, "priority": message.priority,
                   "ttl": message.ttl, "first_acquirer": message.first_acquirer,
                   "delivery_count": message.delivery_count},
        "delivery_count": message.delivery_count,
        "properties": {k: _plain(v) for k, v in (
            ("message_id", message.id), ("user_id", message.user_id or None),
            ("to", message.address), ("subject", message.subject),
            ("reply_to", message.reply_to), ("correlation_id", message.correlation_id),
            ("content_type", message.content_type),
            ("content_encoding", message.content_encoding),
            ("creation_time", message.creation_time or None),
            ("group_id", message.group_id)) if v is not None},
        "application_properties": _plain(message.properties or {}),
        "annotations": _plain(message.annotations or {}),
        "body": text[:PREVIEW],
        "body_truncated": len(text) > PREVIEW,
        "body_type": type(body).__name__,
    })
    return item


def peek(queue, count: int) -> list[dict]:
    """The first ``count`` waiting messages (ready, then scheduled), decoded; none taken."""
    out = []
    now = time.monotonic()
    for stored in queue.waiting():
        if stored.expires_at and stored.expires_at <= now:
            continue
        out.append(describe(queue, stored))
        if len(out) >= count:
            break
    return out


def dead_letter_origin(payload: bytes) -> str | None:
    """The queue a dead-lettered copy came from (its ``x-opt-dead-letter-address``)."""
    message = decode(payload)
    if message is None or not message.annotations:
        return None
    origin = message.annotations.get("x-opt-dead-letter-address")
    return str(origin) if origin else None


def without_dead_letter_marks(payload: bytes) -> bytes:
    """``payload`` with the dead-letter annotations taken off (resent to its queue)."""
    message = decode(payload)
    if message is None or not message.annotations:
        return payload
    kept = {k: v for k, v in message.annotations.items() if str(k) not in DEAD_LETTER_KEYS}
    message.annotations = kept or None
    return bytes(message.encode())


# -- changing ---------------------------------------------------------------------------
def purge(broker, queue) -> int:
    """Every waiting message out (journaled as dequeued); how many."""
    journal_queues.purged(broker.journal, queue)  # (nothing read: docs/paging_purge.md)
    count = queue.purge()
    broker.dirty_queues.add(queue)
    broker.run_pending()
    if count:
        log.info("queue %s: %d messages purged by an operator", queue.name, count)
    return count


def links_of(queue) -> list:
    """The client links on ``queue`` (consumers, producers, browsers) with a connection."""
    return [e for e in (*queue.consumers, *queue.producers, *queue.browsers)
            if getattr(e, "handler", None) is not None and getattr(e, "link", None) is not None]


def delete(broker, queue, *, force: bool) -> dict:
    """Take ``queue`` off the node; refused while it has links or messages unless ``force``."""
    links = links_of(queue)
    held = queue.depth + queue.scheduled.total + queue.unacked
    if not force and (queue.consumers or held):
        raise Refused(f"queue {queue.name!r} has {len(queue.consumers)} consumers and {held} "
                      "messages (waiting or unsettled): purge it and detach them, or force")
    for endpoint in links:
        endpoint.handler.close_link(endpoint.link, RESOURCE_DELETED,
                                    f"queue {queue.name!r} deleted by an operator")
    purged = purge(broker, queue)
    broker.queues.delete(queue.name)
    broker.dirty_queues.discard(queue)
    log.warning("queue %s deleted by an operator (%d messages, %d links closed)", queue.name,
                purged, len(links))
    return {"name": queue.name, "deleted": True, "purged": purged, "links_closed": len(links)}


def take(queue, count: int, *, selector=None, where=None) -> list:
    """Up to ``count`` ready messages (selected by ``selector`` and ``where(payload)``), handed
    out as dispatch does; each must come back through ``settle``."""
    now = time.monotonic()
    chosen = []
    if hasattr(queue.messages, "unrun"):  # runs on disk: message objects needed (docs/paging.md)
        queue.messages.unrun()
    for stored in queue.messages:
        if stored.expires_at and stored.expires_at <= now:
            continue
        if selector is not None or where is not None:
            payload = queue.body(stored)
            if selector is not None and not selector.matches(payload):
                continue
            if where is not None and not where(payload):
                continue
        chosen.append(stored)
        if len(chosen) >= count:
            break
    if not chosen:
        return []
    if type(queue.messages) is deque:
        ids = {id(m) for m in chosen}
        queue.messages = deque(m for m in queue.messages if id(m) not in ids)
    else:
        for stored in chosen:
            queue.messages.remove(stored)
    acquired = queue.on_acquired
    for stored in chosen:
        if queue.selective:
            selective.taken(queue, stored)
        if type(stored.payload) is Page:
            queue.memory.pager.load_now(queue, stored)
        if stored.page is not None:
            queue._handed_out(stored.page)
        queue.unacked += 1
        if acquired is not None:
            acquired(stored)
    return chosen


def settle(broker, queue, stored, accepted: bool) -> None:
    """A taken message's outcome: gone for good (accepted at its target) or back at the head."""
    if accepted:
        queue.settled_accepted(stored)
        journal_queues.dequeued(broker.journal, stored)
    else:
        queue.settled_released(stored)
    broker.dirty_queues.add(queue)


class _Answer:
    """Stands for the producer a ``Fanin`` settles: hands the outcome to ``done``."""

    def __init__(self, done) -> None:
        self.done = done

    def settle(self, fanin: Fanin) -> None:
        if fanin.rejected is not None:
            self.done(PN_REJECTED, fanin.rejected)
        else:
            self.done(None if fanin.released else PN_ACCEPTED, None)


def send(broker, address: str, payload: bytes, done) -> None:
    """``payload`` to ``address``; ``done(state, condition)`` once it is there (state
    ``PN_ACCEPTED``), refused (``PN_REJECTED`` and why) or not taken (None: try later)."""
    exchanges = broker.exchanges
    fanin = Fanin(_Answer(done), None)
    exchange = exchanges.get(address)
    if exchange is not None:
        subject = None if exchange.type == "fanout" else read_subject(payload)
        if not exchange.route(subject) and not exchanges.topic_subscriptions.route(address, payload):
            # an exchange accepts and drops what no binding takes: a move must not
            done(PN_REJECTED, Condition(NOT_FOUND, f"exchange {address!r} has no binding for "
                                                   "this message"))
            return
        exchanges.publish(exchange, payload, fanin, release_when_full=True)
        return
    fanin.remaining = 1
    queue = broker.queues.get(address)
    if queue is not None and queue.replica_set is not None:  # replicated, this node its primary
        _store_replicated(broker, queue, payload, fanin)
        return
    if queue is not None and broker.resolve(address).kind == "fragmented":  # this node's fragment
        exchanges.store(queue, payload, fanin)
        broker.run_pending()
        return
    kind, target = exchanges.destination(address, "addresses cannot take an operator's messages")
    if kind == "refused":
        if target.name == NOT_IMPLEMENTED and broker.resolve(address).kind == "replicated":
            target = Condition(NOT_IMPLEMENTED, f"{address!r} is a replicated queue whose "
                               "primary is another node: send there through that node")
        fanin.done(PN_REJECTED, target)
    elif kind == "local":
        if at_depth_limit(target):
            fanin.done(None)  # its max_depth: not taken now (back at the source)
        else:
            exchanges.store(target, payload, fanin)  # max_bytes reject-publish: refused
    else:
        upstream, remote = target
        exchanges.destinations.get(upstream, remote).send(payload, fanin.done)
    broker.run_pending()


def _store_replicated(broker, queue, payload: bytes, fanin: Fanin) -> None:
    def stored(state, condition=None) -> None:
        barrier = queue.commit_barrier
        if state != PN_ACCEPTED or barrier is None:
            fanin.done(state, condition)
        else:  # accepted once the in-sync copies hold it
            barrier(lambda: fanin.done(PN_ACCEPTED))

    inner = Fanin(_Answer(stored), None)
    inner.remaining = 1
    broker.exchanges.store(queue, payload, inner)
    broker.run_pending()
