"""Routing: map AMQP addresses to routing decisions (pure logic, stdlib only).

``patterns`` compiles ``*``/``#`` word patterns, ``templates`` parses
remote-address templates, ``rules`` defines and validates one rule,
``ruleset`` validates a whole set and resolves addresses (first match
wins), ``decision`` is the result value, ``table`` holds the live,
versioned rule set and notifies subscribers, ``changes`` tells what to do
with existing links after a swap.
"""

from .changes import changed_addresses_policy
from .decision import DEFAULT_REASON, Decision
from .errors import RoutingError, RuleError, RuleValidationError, VersionConflict
from .patterns import Pattern, compile_pattern, pattern_covers, split_words
from .rules import KINDS, ON_CHANGE, FragmentMember, QueueDeclare, Rule, UpstreamOptions, is_amqp_url
from .ruleset import RuleSet
from .table import RoutingTable, Snapshot
from .templates import Template, compile_template

__all__ = [
    "DEFAULT_REASON",
    "KINDS",
    "ON_CHANGE",
    "Decision",
    "FragmentMember",
    "Pattern",
    "RoutingError",
    "RoutingTable",
    "Rule",
    "RuleError",
    "RuleSet",
    "RuleValidationError",
    "Snapshot",
    "Template",
    "UpstreamOptions",
    "QueueDeclare",
    "VersionConflict",
    "changed_addresses_policy",
    "compile_pattern",
    "compile_template",
    "is_amqp_url",
    "pattern_covers",
    "split_words",
]
