"""The fragments service: serves addresses whose rule is of kind ``fragmented``.

It plugs into the node through the ``fedgate.services`` entry point (the node
package never imports this one): at construction it registers itself, through the node's
declared extension interface, as the handler of the ``fragmented`` kind
(``node.serve_kind``) and as the ``fragments`` view the admin API reads
(``node.add_view``). It keeps one ``FragmentGroup`` per logical queue (address)
and follows rule changes: a group picks up new members, draining marks and
preference order at its next attach or when the routing table changes.
A name ``<queue>@<member>`` (a dead member's fragment a backup serves, rule
``replicas`` > 1) is that plain local queue, even when a rule's pattern matches it.
"""

from __future__ import annotations

import logging

from proxy.broker.handler import LinkRefused
from routing.replication import replicas_of

from .group import FragmentGroup

log = logging.getLogger("fedgate.fragments")


class FragmentService:
    selective = True  # consumers may have selectors: served locally, stolen with them

    def __init__(self, node) -> None:
        self.node = node
        self.groups: dict[str, FragmentGroup] = {}
        node.serve_kind("fragmented", self)
        node.add_view("fragments", self.describe)
        node.routing.subscribe(self._rules_changed)

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        for group in self.groups.values():
            group.close()

    def attach(self, client, link, decision) -> None:
        if self._adopted(decision.address):
            self._attach_adopted(client, link, decision.address)
            return
        group = self.group_for(decision)
        group.attach(client, link)

    def _adopted(self, address: str) -> bool:
        """``<queue>@<member>``: a dead member's fragment that a backup serves in its stead
        (rule ``replicas`` > 1, fragments.replicas), whatever rule matched the name itself."""
        base, at, member = address.rpartition("@")
        if not at or not base:
            return False
        rule = self.node.routing.resolve(base).rule
        return (rule is not None and rule.kind == "fragmented" and replicas_of(rule) > 1
                and member in {m.key for m in rule.fragments})

    def _attach_adopted(self, client, link, address: str) -> None:
        """An adopted fragment is a plain local queue where it is served (stealers of every
        node take from it as from its member before), refused where it is not; a rule whose
        pattern matches its name too (``jobs.*``) must not make it a fragmented queue of its
        own, which would serve that queue under a second replicated resource."""
        queue = self.node.queues.get(address)
        if queue is None:
            raise LinkRefused("amqp:not-found", f"{address!r}: that fragment is not served here "
                                                "(it moved)")
        if link.is_sender:
            client.attach_queue_consumer(link, queue)
        else:
            client.attach_queue_producer(link, queue)

    def group_for(self, decision) -> FragmentGroup:
        group = self.groups.get(decision.address)
        if group is None:
            group = FragmentGroup(self, decision.address, decision)
            self.groups[decision.address] = group
        elif group.rule is not decision.rule:
            group.update(decision)
        return group

    def _rules_changed(self, old, new, version) -> None:
        for address, group in list(self.groups.items()):
            decision = new.resolve(address)
            if decision.kind == "fragmented":
                group.update(decision)
            else:
                log.info("fragment group %s: no longer fragmented (%s)", address, decision.reason)
                group.close()
                del self.groups[address]

    def describe(self) -> list[dict]:
        return [group.describe() for group in self.groups.values()]
