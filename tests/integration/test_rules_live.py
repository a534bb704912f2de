"""Rules changed at runtime: existing links are kept or redirected per rule policy."""

from __future__ import annotations

from memory import Harness

from proxy.links.redirects import apply_rules_change
from routing import RuleSet


def swap(h: Harness, rules: list) -> None:
    old = h.routing.current
    new = RuleSet.build(rules)
    h.routing.replace(new)
    apply_rules_change(h.broker, old, new)
    h.pump()


def test_redirect_policy_detaches_with_link_redirect_and_keep_keeps():
    h = Harness(rules=[
        {"name": "moving", "match": "moving.#", "kind": "local", "on_change": "redirect"},
        {"name": "staying", "match": "staying.#", "kind": "local"},
    ])
    c = h.client()
    moving = c.receiver("moving.a", credit=5)
    staying = c.receiver("staying.a", credit=5)
    temp = c.receiver(None, dynamic=True, credit=5)
    swap(h, [{"name": "all-denied", "match": "#", "kind": "deny"}])
    assert moving.remote_condition.name == "amqp:link:redirect"
    assert moving.remote_condition.info["address"] == "moving.a"
    assert staying.remote_condition is None  # on_change = keep (the default)
    assert temp.remote_condition is None  # temporary nodes are never redirected
    again = c.receiver("moving.a", credit=1)  # re-attach: the new rules apply
    assert again.remote_condition.name == "amqp:unauthorized-access"


def test_unchanged_route_is_left_alone():
    rules = [{"name": "moving", "match": "moving.#", "kind": "local", "on_change": "redirect"}]
    h = Harness(rules=rules)
    c = h.client()
    link = c.receiver("moving.a", credit=5)
    swap(h, rules + [{"name": "other", "match": "other.#", "kind": "deny"}])
    assert link.remote_condition is None
