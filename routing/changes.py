"""What to do with an existing link when the rule set is replaced.

``changed_addresses_policy(old, new, address)`` resolves the address in
both rule sets. If both decisions route to the same place (same kind,
primary, primary URL and remote address) the answer is ``"same"``.
Otherwise it is the ``on_change`` of the rule that owned the link (the
OLD rule), falling back to the new rule's, then to ``"keep"``.
"""

from __future__ import annotations

from .ruleset import RuleSet

__all__ = ["changed_addresses_policy"]


def changed_addresses_policy(old: RuleSet, new: RuleSet, address: str) -> str:
    """Return ``"same"``, ``"keep"`` or ``"redirect"`` for ``address``."""
    before = old.resolve(address)
    after = new.resolve(address)
    if before.same_route(after):
        return "same"
    if before.rule is not None:
        return before.rule.on_change
    if after.rule is not None:
        return after.rule.on_change
    return "keep"
