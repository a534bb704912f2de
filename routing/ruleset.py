"""An immutable, validated, ordered set of rules and its resolver.

``RuleSet.build`` parses every rule, then checks the set as a whole
(duplicate names, unknown peers, rules shadowed by an earlier rule) and
raises one ``RuleValidationError`` listing *all* problems.

``resolve`` is first-match-wins. To stay fast with many rules, exact
patterns live in a dict (address -> first rule index) and only wildcard
rules placed *before* that index are tried, each a precompiled regex.
Because a RuleSet never changes, decisions are memoised per address in a
small bounded dict.

Cluster membership (issue #34) enters through two arguments of ``build``:
``members`` (the live members, id -> draining) expands ``fragments = "*"``
into one member per live node, draining ones listed in ``draining``; the set
keeps the rules as written for ``to_list`` and resolves with the expanded
ones. ``open_peers`` (a cluster on etcd, where peers come and go) lets a rule
name a peer that is not live now: ``peer_url`` is then None for it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import Any

from .decision import DEFAULT_REASON, Decision
from .errors import RuleError, RuleValidationError
from .index import PrefixIndex, literal_prefix
from .patterns import pattern_covers
from .rules import FragmentMember, Rule, is_amqp_url, parse_rule

__all__ = ["RuleSet"]

_CACHE_SIZE = 4096


class RuleSet:
    """Validated rules + peers; build with :meth:`RuleSet.build`."""

    __slots__ = ("_rules", "_written", "_every", "_members", "_peers", "_node_id", "_exact",
                 "_index", "_cache")

    def __init__(
        self,
        rules: Iterable[Rule] = (),
        peers: Mapping[str, str] | None = None,
        node_id: str | None = None,
        members: Mapping[str, bool] | None = None,
    ) -> None:
        """Assemble without whole-set validation; prefer :meth:`build`."""
        rules = tuple(rules)
        for r in rules:
            if not isinstance(r, Rule):
                raise TypeError(f"expected Rule, got {type(r).__name__}")
        self._written: tuple[Rule, ...] = rules
        self._every = frozenset(r.name for r in rules if r.every_member)
        if members is None:
            members = dict.fromkeys([node_id, *(peers or {})] if node_id else list(peers or {}), False)
        self._members: Mapping[str, bool] = MappingProxyType(dict(members))
        rules = tuple(expand_every_member(r, self._members) if r.every_member else r for r in rules)
        self._rules: tuple[Rule, ...] = rules
        self._peers: Mapping[str, str] = MappingProxyType(dict(peers or {}))
        self._node_id = node_id
        exact: dict[str, int] = {}
        wild: list[tuple[int, Rule]] = []
        for i, r in enumerate(rules):
            if r.pattern.is_exact:
                exact.setdefault(r.match, i)
            else:
                wild.append((i, r))
        self._exact = exact
        self._index = PrefixIndex(wild)
        self._cache: dict[str, Decision] = {}

    # ------------------------------------------------------------------ build

    @classmethod
    def build(
        cls,
        rules: Iterable[Mapping[str, Any] | Rule],
        *,
        peers: Mapping[str, str] | None = None,
        node_id: str | None = None,
        members: Mapping[str, bool] | None = None,
        open_peers: bool = False,
    ) -> "RuleSet":
        """Validate everything; raise ``RuleValidationError`` with all problems.

        ``members``: live cluster members (id -> draining) for ``fragments = "*"``
        (default: this node and every peer, none draining); ``open_peers``: a peer id
        that is not in ``peers`` is no error (peers come from the cluster's members).
        """
        peers = dict(peers or {})
        problems = _peer_problems(peers)
        parsed: list[Rule | None] = []
        for i, item in enumerate(rules):
            if isinstance(item, Rule):
                parsed.append(item)
                continue
            rule, rule_problems = parse_rule(item, index=i)
            problems += rule_problems
            parsed.append(rule)
        problems += _cross_rule_problems(parsed, peers, node_id, open_peers)
        if problems:
            raise RuleValidationError(problems)
        return cls(parsed, peers, node_id, members)  # type: ignore[arg-type]

    @classmethod
    def empty(
        cls, *, peers: Mapping[str, str] | None = None, node_id: str | None = None
    ) -> "RuleSet":
        """No rules: every address resolves to the local default."""
        return cls.build([], peers=peers, node_id=node_id)

    # -------------------------------------------------------------- accessors

    @property
    def rules(self) -> tuple[Rule, ...]:
        return self._rules

    @property
    def peers(self) -> Mapping[str, str]:
        return self._peers

    @property
    def every_member_rules(self) -> frozenset[str]:
        """Names of the rules written with ``fragments = "*"``."""
        return self._every

    @property
    def members(self) -> Mapping[str, bool]:
        """The live members ``fragments = "*"`` was expanded with (id -> draining)."""
        return self._members

    @property
    def node_id(self) -> str | None:
        return self._node_id

    def __len__(self) -> int:
        return len(self._rules)

    def __iter__(self):
        return iter(self._rules)

    def __repr__(self) -> str:
        return f"RuleSet({[r.name for r in self._rules]!r}, node_id={self._node_id!r})"

    def get(self, name: str) -> Rule | None:
        """The rule called ``name``, if any."""
        for r in self._rules:
            if r.name == name:
                return r
        return None

    def peer_url(self, ref: str | None) -> str | None:
        """A URL stays a URL, a peer id becomes its URL, else ``None``."""
        if ref is None:
            return None
        if is_amqp_url(ref):
            return ref
        return self._peers.get(ref)

    def to_list(self) -> list[dict[str, Any]]:
        """The rules as written, as JSON-serialisable dicts (input for ``build``)."""
        return [r.to_dict() for r in self._written]

    # ---------------------------------------------------------------- resolve

    def resolve(self, address: str) -> Decision:
        """First matching rule wins; no match -> local default decision."""
        hit = self._cache.get(address) if isinstance(address, str) else None
        if hit is not None:
            return hit
        if not isinstance(address, str) or not address:
            raise RuleError("address", f"address must be a non-empty string, got {address!r}")
        decision = self._resolve(address)
        cache = self._cache
        if len(cache) >= _CACHE_SIZE:
            cache.clear()
        cache[address] = decision
        return decision

    def _resolve(self, address: str) -> Decision:
        limit = self._exact.get(address, len(self._rules))
        for i, rule in self._index.candidates_for_address(address):
            if i > limit:
                break
            captures = rule.pattern.match(address)
            if captures is not None:
                return self._decide(rule, address, captures)
        if limit < len(self._rules):
            return self._decide(self._rules[limit], address, ())
        return Decision(kind="local", rule=None, address=address, reason=DEFAULT_REASON)

    def _decide(self, rule: Rule, address: str, captures: tuple[str, ...]) -> Decision:
        remote = None
        if rule.kind in ("proxy", "fragmented"):
            remote = rule.expand_remote(address, captures)
        return Decision(
            kind=rule.kind,
            rule=rule,
            address=address,
            remote_address=remote,
            primary=rule.primary,
            primary_url=self.peer_url(rule.primary),
            captures=captures,
            reason=f"matched rule {rule.name!r} (pattern {rule.match!r})",
        )


def _peer_problems(peers: Mapping[str, str]) -> list[RuleError]:
    problems = []
    for pid, url in peers.items():
        if not isinstance(pid, str) or not pid:
            problems.append(RuleError("peers", f"peer id must be a non-empty string, got {pid!r}"))
        elif not is_amqp_url(url):
            problems.append(
                RuleError(f"peers.{pid}", f"{url!r} is not a valid amqp:// or amqps:// URL")
            )
    return problems


def expand_every_member(rule: Rule, members: Mapping[str, bool]) -> Rule:
    """``fragments = "*"``: one fragment per live member (sorted ids); members marked
    draining join the rule's own ``draining``, unless every member would be draining."""
    ids = sorted(members)
    draining = [d for d in rule.draining if d in members]
    draining += [m for m in ids if members[m] and m not in draining]
    if len(draining) >= len(ids):
        draining = []  # nobody left to take the messages: every fragment keeps serving
    return replace(rule, fragments=tuple(FragmentMember(peer=m) for m in ids),
                   draining=tuple(draining), prefer=tuple(p for p in rule.prefer if p in members),
                   every_member=False)


def _cross_rule_problems(
    parsed: list[Rule | None], peers: Mapping[str, str], node_id: str | None,
    open_peers: bool = False,
) -> list[RuleError]:
    """Duplicate names, unknown peers, shadowed rules (``None`` = invalid rule)."""
    problems: list[RuleError] = []
    first_by_name: dict[str, int] = {}
    index = PrefixIndex(
        [(i, r) for i, r in enumerate(parsed) if r is not None and not r.pattern.is_exact]
    )
    exact_seen: dict[str, tuple[int, Rule]] = {}
    for i, rule in enumerate(parsed):
        if rule is None:
            continue
        p = f"rules[{i}]"

        def add(field: str, detail: str) -> None:
            problems.append(RuleError(f"{p}.{field}", detail))

        if rule.name in first_by_name:
            j = first_by_name[rule.name]
            add("name", f"duplicate rule name {rule.name!r} (first used by rules[{j}])")
        else:
            first_by_name[rule.name] = i

        primary = rule.primary
        if primary is not None and not is_amqp_url(primary):
            if primary not in peers and open_peers:
                if primary == node_id and rule.kind == "proxy":
                    add("primary", f"{primary!r} is this node: a proxy to itself would loop")
                # else a cluster member that may join later (peer_url is None until then)
            elif primary not in peers:
                add(
                    "primary",
                    f"unknown peer {primary!r} (not a URL nor a key of peers{_known(peers)})",
                )
            elif primary == node_id and rule.kind == "proxy":
                add("primary", f"{primary!r} is this node: a proxy to itself would loop")

        for k, member in enumerate(rule.fragments):
            if member.peer is not None and member.peer != node_id and member.peer not in peers \
                    and not open_peers:
                add(
                    f"fragments[{k}]",
                    f"unknown peer {member.peer!r} (not this node's id {node_id!r} "
                    f"nor a key of peers{_known(peers)})",
                )

        shadow = _first_cover(i, rule, exact_seen, index)
        if shadow is not None:
            j, earlier = shadow
            add(
                "match",
                f"rule {rule.name!r} can never match: pattern {rule.match!r} is covered by "
                f"earlier rule {earlier.name!r} (rules[{j}], pattern {earlier.match!r})",
            )
        if rule.pattern.is_exact:
            exact_seen.setdefault(rule.match, (i, rule))
    return problems


def _first_cover(
    i: int, rule: Rule, exact_seen: dict[str, tuple[int, Rule]], index: PrefixIndex
) -> tuple[int, Rule] | None:
    """The first rule before ``i`` whose pattern covers ``rule``'s, if any.

    Only rules whose literal prefix agrees with ``rule``'s can cover it, so
    the prefix index narrows the pairwise ``pattern_covers`` checks.
    """
    pattern = rule.pattern
    best = exact_seen.get(rule.match) if pattern.is_exact else None
    for j, earlier in index.candidates(literal_prefix(pattern.words)):
        if j >= i or (best is not None and j >= best[0]):
            break
        if pattern_covers(earlier.pattern, pattern):
            return j, earlier
    return best


def _known(peers: Mapping[str, str]) -> str:
    return f": {', '.join(sorted(peers))}" if peers else "; no peers configured"
