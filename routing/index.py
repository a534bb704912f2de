"""Prefix index: find the wildcard rules that could match an address.

Every wildcard pattern starts with zero or more literal words before its
first ``*``/``#`` (``/exchange/orders/#`` -> ``["", "exchange", "orders"]``).
Rules are stored in a trie keyed by that literal prefix. For an address,
walking its words down the trie collects exactly the rules whose prefix
agrees with the address; only those can match, and they are returned in
rule order so first-match-wins is preserved. The same walk over a
pattern's own literal prefix finds the earlier rules that could cover it.
"""

from __future__ import annotations

from .patterns import HASH, STAR, split_words
from .rules import Rule

__all__ = ["PrefixIndex", "literal_prefix"]


def literal_prefix(words: tuple[str, ...] | list[str]) -> list[str]:
    """The words before the first wildcard."""
    out = []
    for w in words:
        if w == STAR or w == HASH:
            break
        out.append(w)
    return out


class _Node:
    __slots__ = ("children", "entries")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.entries: list[tuple[int, Rule]] = []


class PrefixIndex:
    """Trie of ``(rule_index, rule)`` keyed by literal prefix words."""

    __slots__ = ("_root",)

    def __init__(self, entries: list[tuple[int, Rule]] = ()) -> None:
        self._root = _Node()
        for i, rule in entries:
            self.add(i, rule)

    def add(self, index: int, rule: Rule) -> None:
        node = self._root
        for w in literal_prefix(rule.pattern.words):
            nxt = node.children.get(w)
            if nxt is None:
                nxt = node.children[w] = _Node()
            node = nxt
        node.entries.append((index, rule))

    def candidates(self, words: list[str] | tuple[str, ...]) -> list[tuple[int, Rule]]:
        """Entries whose literal prefix is a prefix of ``words``, by index."""
        node = self._root
        found = list(node.entries)
        for w in words:
            node = node.children.get(w)
            if node is None:
                break
            found.extend(node.entries)
        found.sort(key=_first)
        return found

    def candidates_for_address(self, address: str) -> list[tuple[int, Rule]]:
        return self.candidates(split_words(address))


def _first(entry: tuple[int, Rule]) -> int:
    return entry[0]
