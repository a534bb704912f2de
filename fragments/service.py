"""The fragments service: serves addresses whose rule is of kind ``fragmented``.

It plugs into the node through the ``fedgate.services`` entry point (the node
package never imports this one): at construction it registers itself, through the node's
declared extension interface, as the handler of the ``fragmented`` kind
(``node.serve_kind``) and as the ``fragments`` view the admin API reads
(``node.add_view``). It keeps one ``FragmentGroup`` per logical queue (address)
and follows rule changes: a group picks up new members, draining marks and
preference order at its next attach or when the routing table changes.
"""

from __future__ import annotations

import logging

from .group import FragmentGroup

log = logging.getLogger("fedgate.fragments")


class FragmentService:
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
        group = self.group_for(decision)
        group.attach(client, link)

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
