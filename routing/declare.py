"""``upstream.declare`` of a proxy rule: what to declare on a RabbitMQ 4 primary.

Parsed like the rest of a rule (``routing.rules``): ``parse_declare`` returns the
value or every problem found, each a :class:`RuleError` with its field path.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import RuleError

QUEUE_TYPES = ("classic", "quorum", "stream")


@dataclass(frozen=True)
class QueueDeclare:
    """What a proxy rule declares on a RabbitMQ 4 primary before it uses a ``/queues/``
    address (``upstream.declare``): the queue's type, durability and arguments."""

    type: str = "classic"
    durable: bool = True
    arguments: tuple[tuple[str, Any], ...] = ()  # x-arguments, as sorted pairs (hashable)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type, "durable": self.durable}
        if self.arguments:
            out["arguments"] = dict(self.arguments)
        return out


def parse_declare(d: object, p: str) -> tuple[QueueDeclare | None, list[RuleError]]:
    if d is True:
        return QueueDeclare(), []
    if not isinstance(d, Mapping):
        return None, [RuleError(p, f"expected a table (type, durable, arguments) or true, got {type(d).__name__}")]
    problems = [RuleError(f"{p}.{k}", "unknown key (allowed: type, durable, arguments)")
                for k in d if k not in ("type", "durable", "arguments")]
    kind = d.get("type", "classic")
    if kind not in QUEUE_TYPES:
        problems.append(RuleError(f"{p}.type", f"one of {', '.join(QUEUE_TYPES)}, got {kind!r}"))
    durable = d.get("durable", True)
    if not isinstance(durable, bool):
        problems.append(RuleError(f"{p}.durable", f"expected true or false, got {durable!r}"))
    arguments = d.get("arguments", {})
    if not isinstance(arguments, Mapping) or not all(isinstance(k, str) for k in arguments):
        problems.append(RuleError(f"{p}.arguments", "expected a table of x-arguments"))
    elif "x-queue-type" in arguments:
        problems.append(RuleError(f"{p}.arguments", "give the queue type as declare.type"))
    else:
        for key, value in arguments.items():
            if not isinstance(value, (str, int, float, bool)):
                problems.append(RuleError(f"{p}.arguments.{key}", "expected a string, number or boolean"))
    if problems:
        return None, problems
    return QueueDeclare(kind, durable, tuple(sorted(arguments.items()))), []
