"""The outcome of resolving one address: what to do and why.

A ``Decision`` is an immutable value produced by ``RuleSet.resolve``. It
carries the matched rule (or ``None`` for the embedded default: a local
queue), the expanded remote address, the primary as configured and as a
URL, the wildcard captures and a human readable ``reason`` suitable for
logs and the admin API.
"""

from __future__ import annotations

from dataclasses import dataclass

from .rules import Rule

__all__ = ["Decision", "DEFAULT_REASON"]

DEFAULT_REASON = "no rule matched; local queue (embedded default)"


@dataclass(frozen=True)
class Decision:
    kind: str  # local | proxy | fragmented | deny
    rule: Rule | None  # None: no rule matched (default local decision)
    address: str  # the client's address
    remote_address: str | None = None  # expanded template (proxy/fragmented)
    primary: str | None = None  # as configured: URL or peer id
    primary_url: str | None = None  # peer id resolved through peers
    captures: tuple[str, ...] = ()
    reason: str = DEFAULT_REASON

    @property
    def rule_name(self) -> str | None:
        return self.rule.name if self.rule is not None else None

    def same_route(self, other: "Decision") -> bool:
        """True when both decisions send the address to the same place."""
        return (self.kind, self.primary, self.primary_url, self.remote_address) == (
            other.kind,
            other.primary,
            other.primary_url,
            other.remote_address,
        )

    def to_dict(self) -> dict:
        """JSON-serialisable summary (rule by name)."""
        return {
            "kind": self.kind,
            "rule": self.rule_name,
            "address": self.address,
            "remote_address": self.remote_address,
            "primary": self.primary,
            "primary_url": self.primary_url,
            "captures": list(self.captures),
            "reason": self.reason,
        }
