"""Existing links after a rules change: keep them, or detach with amqp:link:redirect.

When the routing table is swapped (admin API, cluster sync), new attaches follow
the new rules at once. A link attached before the change keeps its route unless
the rule that routed it (or, for addresses that had no rule, the rule that now
matches) says ``on_change = "redirect"``: then the link is detached with
``amqp:link:redirect`` (AMQP 1.0 §2.8.17, link error conditions), whose info
names the address to re-attach to. The client re-attaches to the same address
on the same node and gets the new route. Dynamic (temporary) nodes are never
redirected.
"""

from __future__ import annotations

import logging

from proton import symbol

from routing import changed_addresses_policy

log = logging.getLogger("fedgate.routing")

REDIRECT = "amqp:link:redirect"


def client_address(link) -> str | None:
    terminus = link.remote_source if link.is_sender else link.remote_target
    if terminus.dynamic:
        return None
    return terminus.address


def apply_rules_change(broker, old, new) -> int:
    """Detach every client link whose route changed under a ``redirect`` policy."""
    redirected = 0
    policies: dict[str, str] = {}
    for handler in list(broker.handlers.values()):
        for endpoint in list(handler.links.values()):
            link = endpoint.link
            address = client_address(link)
            if address is None:
                continue
            policy = policies.get(address)
            if policy is None:
                policy = policies[address] = changed_addresses_policy(old, new, address)
            if policy != "redirect":
                continue
            handler.close_link(link, REDIRECT, f"routing for {address!r} changed; attach again",
                               {symbol("address"): address})
            redirected += 1
    if redirected:
        log.info("rules changed: %d link(s) redirected", redirected)
        broker.run_pending()
    return redirected
