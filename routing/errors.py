"""Exceptions raised by the routing package.

Every configuration problem is a ``RuleError`` carrying a ``field`` path
(e.g. ``rules[2].upstream.pool_size``) and a human readable ``detail``.
Whole-rule-set validation gathers every problem it finds and raises one
``RuleValidationError`` holding the list, so an operator sees all mistakes
in a single pass. ``VersionConflict`` signals a lost compare-and-swap on
the routing table.
"""

from __future__ import annotations

from collections.abc import Iterable


class RoutingError(Exception):
    """Base class for every error raised by ``routing``."""


class RuleError(RoutingError, ValueError):
    """One problem with one field of the routing configuration."""

    def __init__(self, field: str, detail: str) -> None:
        self.field = field
        self.detail = detail
        super().__init__(f"{field}: {detail}")

    def with_prefix(self, prefix: str) -> "RuleError":
        """Return a copy whose field path is re-rooted under ``prefix``."""
        return RuleError(f"{prefix}.{self.field}" if self.field else prefix, self.detail)

    def __repr__(self) -> str:
        return f"RuleError({self.field!r}, {self.detail!r})"

    def __reduce__(self):
        return (RuleError, (self.field, self.detail))


class RuleValidationError(RuleError):
    """Several problems found while validating a whole rule set."""

    def __init__(self, problems: Iterable[RuleError]) -> None:
        self.problems: list[RuleError] = list(problems)
        n = len(self.problems)
        lines = "\n".join(f"  - {p.field}: {p.detail}" for p in self.problems)
        summary = f"{n} problem{'s' if n != 1 else ''} in routing rules"
        RoutingError.__init__(self, f"{summary}:\n{lines}" if lines else summary)
        self.field = "rules"
        self.detail = summary

    def __str__(self) -> str:
        return self.args[0]

    def __repr__(self) -> str:
        return f"RuleValidationError({self.problems!r})"

    def __reduce__(self):
        return (RuleValidationError, (self.problems,))

    @property
    def fields(self) -> list[str]:
        """Field paths of all problems, in the order they were found."""
        return [p.field for p in self.problems]


class VersionConflict(RoutingError):
    """``RoutingTable.replace`` was given a stale ``expected_version``."""

    def __init__(self, expected: int, actual: int) -> None:
        self.expected = expected
        self.actual = actual
        super().__init__(
            f"routing table version conflict: expected {expected}, current is {actual}"
        )

    def __reduce__(self):
        return (VersionConflict, (self.expected, self.actual))
