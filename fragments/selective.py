"""Stealing for local consumers with JMS selectors (docs/fragments.md, "Selectors").

How this works
--------------
A consumer with a selector (``consumer.selector``, ``proxy.selectors``) on a member node is
served from the local fragment first, as every consumer is: the local queue keeps the
messages it selects (``proxy.queues.selective``). When it holds none and the consumer has
credit, the group steals for it: one ``Stealer`` per (member, selector text) whose link's
source carries the selector (``apache.org:selector-filter:string``), so the peer hands out
only what it selects (it serves the link as a selective standby consumer of its fragment,
after its own consumers) and answers the drain when it has no more of those. A message no
consumer selects is stolen by nobody: it waits in its fragment.

* **Who takes a stolen message** (``taker``): a local consumer with credit that may have it,
  one without a selector or whose selector selects it (a plain stealer's message too, once
  selective consumers are attached: it must not reach a consumer that did not select it).
* **Held.** A stolen message that finds no taker (local messages took the credit meanwhile)
  waits here in the group's ``held`` line, as plain ones do; it does not stop other
  selectors' steals, only its own selector's. When no local consumer may take it any more
  (they detached), it is released at home, delivery-count unchanged.
* **Stealers** of a selector no local consumer has any more are closed; their in-flight
  messages go home (``Stealer.close``). Third-party fragments (RabbitMQ) are not stolen from
  with a selector: they apply none.
* **Workers.** Sibling workers are members like any other. Another node's stealer with a
  selector (a standby consumer of this worker's fragment) is served from the siblings too, as
  a plain one is (``fragments.group``): stealers with its selector to the siblings are made
  as soon as it is attached, what it lacks is asked of them only, its drain is held while
  they may bring something (``holds_drain``), and what they bring goes to it (``for_peer``).
"""

from __future__ import annotations

from collections import deque

from proxy.config import compat

from .steal import Stealer


def lacks_selectors(group, key: str) -> bool:
    """The member's node announced no ``fragment-selectors`` (0.5.0: it refuses a consumer
    with a selector on a fragmented queue): nothing is stolen from it with a selector, and
    selective consumers on other nodes get its fragment's messages once it is upgraded
    (docs/upgrades.md). A sibling worker, or a node of unknown release (static), has it."""
    peer = getattr(group.members.get(key), "peer", None)
    coordinator = getattr(group.node, "coordinator", None)
    if peer is None or coordinator is None:
        return False
    return bool(compat.cluster_lacks("fragment-selectors",
                                     [m for m in coordinator.members() if m.id == peer]))


def taker(queue, message):
    """A consumer of ``queue`` with credit that may have ``message``, round-robin; None."""
    consumers = queue.consumers
    count = len(consumers)
    payload = message.payload
    excluded = message.excluded
    start = queue._next
    for offset in range(count):
        index = (start + offset) % count
        consumer = consumers[index]
        if consumer.credit <= 0 or consumer.consumer_id in excluded:
            continue
        selector = getattr(consumer, "selector", None)
        if selector is None or selector.matches(payload):
            queue._next = (index + 1) % count
            return consumer
    return None


def selector_of(message):
    """The selector text of the stealer that brought ``message``; None: a plain stealer."""
    selector = message.origin[0].selector
    return None if selector is None else selector.text


class SelectiveSteals:
    def __init__(self, group) -> None:
        self.group = group
        self.stealers: dict[tuple[str, str], Stealer] = {}  # (member, selector text)
        self.tried: dict[str, set[str]] = {}  # selector text -> members that had nothing

    def plain_held(self) -> bool:
        """Whether a plain stealer's message waits for credit (plain stealing stops then)."""
        return any(selector_of(m) is None for m in self.group.held)

    def deliver_held(self) -> None:
        """Held messages, in order, to any consumer that may take each (selectors: the
        first held message may be for a consumer without credit while later ones are not)."""
        group = self.group
        kept = deque()
        for message in group.held:
            consumer = group.consumer_with_credit(message)
            if consumer is None:
                kept.append(message)
            else:
                consumer.deliver(message)
        group.held = kept

    def evaluate(self) -> None:
        group = self.group
        queue = group.queue
        # selector text -> [selector, credit local consumers lack, credit other nodes' lack]
        wants: dict[str, list] = {}
        for consumer, peer in self._selective(queue):
            selector = consumer.selector
            entry = wants.setdefault(selector.text, [selector, 0, 0])
            if peer:  # its stealers to the siblings made now: its next drain waits for them
                self._ensure(selector.text, selector, siblings_only=True)
            if consumer.credit > 0 and not consumer.matched:  # nothing here it selects
                entry[2 if peer else 1] += consumer.credit
        self._give_back_unwanted(queue, wants)
        for key in [key for key in self.stealers if key[1] not in wants]:
            self.stealers.pop(key).close()
            self.tried.pop(key[1], None)
        waiting = {selector_of(m) for m in group.held}
        for text, (selector, local, peers) in wants.items():
            if text in waiting or not local + peers:  # what we stole has no credit yet
                continue
            stealers = self._ensure(text, selector)
            if not local:  # for other nodes' stealers: from the sibling workers only
                stealers = [s for s in stealers if s.member_key in group.siblings]
            outstanding = sum(s.outstanding for s in stealers)
            tried = self.tried.setdefault(text, set())
            candidates = [s for s in stealers
                          if s.ready and not s.requested and s.member_key not in tried]
            if local + peers - outstanding <= 0:
                continue
            if not candidates:
                group._schedule_retry()
                continue
            victim = max(candidates, key=lambda s: s.available or 0)
            tried.add(victim.member_key)
            victim.request((local + peers if victim.member_key in group.siblings else local)
                           - outstanding)

    def _selective(self, queue):
        """(consumer, from another node) for each consumer with a selector this group serves:
        local ones, and with workers other nodes' stealers (served from the siblings too)."""
        for consumer in queue.consumers:
            if getattr(consumer, "selector", None) is not None:
                yield consumer, False
        if self.group.siblings:
            for consumer in queue.standby_consumers:
                if consumer.selector is not None and not consumer.handler.trusted:
                    yield consumer, True

    def peers_wait(self) -> bool:
        """Whether another node's selective stealer is attached here (with workers)."""
        return any(peer for _, peer in self._selective(self.group.queue))

    def for_peer(self, message):
        """Another node's selective stealer with credit that selects ``message`` (from a
        sibling); None."""
        for consumer, peer in self._selective(self.group.queue):
            if peer and consumer.credit > 0 and consumer.selector.matches(message.payload):
                return consumer
        return None

    def holds_drain(self, consumer) -> bool:
        """Another node's selective stealer: its drain waits while the siblings may have
        messages it selects (asked, or not yet asked)."""
        text = consumer.selector.text
        if any(selector_of(m) == text for m in self.group.held):
            return True
        tried = self.tried.get(text, set())
        for key in self.group.siblings:
            stealer = self.stealers.get((key, text))
            if stealer is not None and stealer.ready and (stealer.requested or key not in tried):
                return True
        return False

    def _give_back_unwanted(self, queue, texts) -> None:
        """Held messages of a selector no consumer here has any more (``texts``), and that no
        other consumer may take: released at home (delivery-count unchanged)."""
        group = self.group
        if not group.held:
            return
        kept = deque()
        for message in group.held:
            text = selector_of(message)
            if text is not None and text not in texts and taker(queue, message) is None:
                stealer, home_delivery = message.origin
                stealer.give_back(home_delivery)
                group.stats.returned += 1
            else:
                kept.append(message)
        group.held = kept

    def _ensure(self, text: str, selector, siblings_only: bool = False) -> list[Stealer]:
        group = self.group
        found = []
        for key in group.members:
            if key == group.local_key or (siblings_only and key not in group.siblings):
                continue
            stealer = self.stealers.get((key, text))
            if stealer is None:
                url, address, peer = group.target(key)
                if url is None or not peer:  # gone, or a third-party broker (no selectors)
                    continue
                if lacks_selectors(group, key):  # a 0.5.0 member refuses such a link
                    continue
                upstream = group.node.upstreams.for_url(url, group.rule.upstream)
                stealer = Stealer(group, key, upstream, address, selector=selector)
                self.stealers[(key, text)] = stealer
            found.append(stealer)
        return found

    def finished(self, stealer: Stealer, received: int) -> None:
        if received:
            self.tried.pop(stealer.selector.text, None)

    def forget(self, member: str | None = None, *, refused: bool = False) -> None:
        """Stealers of ``member`` (None: every member) closed, or only those refused."""
        for key in list(self.stealers):
            stealer = self.stealers[key]
            if (member is None or key[0] == member) and (not refused or stealer.refused):
                self.stealers.pop(key).close()
                if member is not None:
                    self.tried.get(key[1], set()).discard(member)

    def update(self, members) -> None:
        for key in [key for key in self.stealers if key[0] not in members]:
            self.stealers.pop(key).close()

    def describe(self) -> list[dict]:
        return [dict(s.describe(), selector=key[1]) for key, s in self.stealers.items()]
