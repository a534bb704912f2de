"""Address patterns: compile once, match on every link attach.

A pattern is a list of words separated by ``.`` or ``/`` (the two
separators are interchangeable, in patterns and in addresses). A leading
``/`` produces an empty first word, so ``/queue/*`` has the words
``["", "queue", "*"]`` and matches ``/queue/foo`` but not ``queue/foo``.

* ``*`` matches exactly one non-empty word;
* ``#`` matches zero or more words (any text, including separators);
* a pattern without wildcards is compared as an exact string.

Each wildcard yields one capture: the word for ``*``; for ``#`` the
matched words joined with the separators exactly as they appeared in the
address (``""`` when it matched zero words).

``compile_pattern`` turns a pattern into an anchored regular expression
(``*`` -> ``([^./]+)``; ``#`` -> an optional group that also swallows one
adjacent separator, so ``orders.#`` matches ``orders``). Compiled patterns
are cached. ``pattern_covers(a, b)`` decides whether every address matched
by ``b`` is matched by ``a`` with a memoised walk over the two word lists.
"""

from __future__ import annotations

import re
from functools import lru_cache

from .errors import RuleError

STAR = "*"
HASH = "#"
_SEP = "[./]"
_SPLIT = re.compile(_SEP)

__all__ = ["Pattern", "compile_pattern", "pattern_covers", "split_words"]


def split_words(text: str) -> list[str]:
    """Split an address or pattern into words on ``.`` and ``/``."""
    return _SPLIT.split(text)


class Pattern:
    """A compiled pattern. Immutable; use :func:`compile_pattern`."""

    __slots__ = ("text", "words", "wildcards", "_regex")

    def __init__(self, text: str) -> None:
        if not isinstance(text, str):
            raise RuleError("match", f"pattern must be a string, got {type(text).__name__}")
        if not text:
            raise RuleError("match", "pattern must not be empty")
        words = tuple(split_words(text))
        for word in words:
            if word not in (STAR, HASH) and (STAR in word or HASH in word):
                raise RuleError(
                    "match",
                    f"invalid pattern {text!r}: word {word!r} mixes a wildcard with "
                    "other characters ('*' and '#' must stand alone between separators)",
                )
        wildcards = sum(1 for w in words if w in (STAR, HASH))
        object.__setattr__(self, "text", text)
        object.__setattr__(self, "words", words)
        object.__setattr__(self, "wildcards", wildcards)
        object.__setattr__(
            self, "_regex", re.compile(_regex_for(words), re.DOTALL) if wildcards else None
        )

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Pattern is immutable")

    @property
    def is_exact(self) -> bool:
        """True when the pattern has no wildcard (plain string comparison)."""
        return self._regex is None

    def match(self, address: str) -> tuple[str, ...] | None:
        """Return the captures if ``address`` matches, else ``None``."""
        regex = self._regex
        if regex is None:
            return () if address == self.text else None
        m = regex.fullmatch(address)
        if m is None:
            return None
        return tuple(g or "" for g in m.groups())

    def __repr__(self) -> str:
        return f"Pattern({self.text!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Pattern) and other.text == self.text

    def __hash__(self) -> int:
        return hash(("Pattern", self.text))


def _word_regex(word: str) -> str:
    return "([^./]+)" if word == STAR else re.escape(word)


def _regex_for(words: tuple[str, ...]) -> str:
    """Build the regex body for a wildcard pattern (one group per wildcard).

    Every word after the first owns the separator in front of it; a ``#``
    there is ``(?:SEP(.*))?`` so that matching zero words also drops the
    separator. A leading run of ``#`` owns the separator *after* it instead:
    ``(?:(.*)SEP)?`` followed by the first non-``#`` word. Extra ``#`` in a
    run only ever capture ``""`` (any split of the run is a valid match).
    """
    n = len(words)
    lead = 0
    while lead < n and words[lead] == HASH:
        lead += 1
    if lead == n:  # only '#': anything at all
        return "(.*)" + "()" * (n - 1)
    parts: list[str] = []
    if lead:
        parts.append(f"(?:(.*){_SEP})?" + "()" * (lead - 1))
    parts.append(_word_regex(words[lead]))
    for word in words[lead + 1 :]:
        if word == HASH:
            parts.append(f"(?:{_SEP}(.*))?")
        else:
            parts.append(_SEP + _word_regex(word))
    return "".join(parts)


@lru_cache(maxsize=4096)
def compile_pattern(text: str) -> Pattern:
    """Compile ``text``; raises :class:`RuleError` (field ``match``) if invalid."""
    return Pattern(text)


def _as_pattern(p: str | Pattern) -> Pattern:
    return p if isinstance(p, Pattern) else compile_pattern(p)


def pattern_covers(a: str | Pattern, b: str | Pattern) -> bool:
    """True when every address matched by pattern ``b`` is matched by ``a``.

    Used to find rules shadowed by an earlier rule. Exact for word patterns:
    ``#`` in ``a`` may absorb any run of ``b``'s words (including ``*`` and
    ``#``); ``*`` in ``a`` absorbs one non-empty literal word or a ``*`` of
    ``b`` but never a ``#``; literal words must be equal. Exact whenever the
    patterns have no empty word after the first (``a..b``, ``a.``); with
    such words it may miss a cover, never invent one (errs towards "not
    shadowed").
    """
    pa, pb = _as_pattern(a), _as_pattern(b)
    if pb.is_exact:
        return pa.match(pb.text) is not None
    if pa.is_exact:
        return False  # b matches infinitely many addresses, a only one
    wa, wb = pa.words, pb.words
    la, lb = len(wa), len(wb)
    memo: dict[tuple[int, int], bool] = {}

    def covers(i: int, j: int) -> bool:
        key = (i, j)
        hit = memo.get(key)
        if hit is not None:
            return hit
        if i == la:
            result = j == lb
        else:
            x = wa[i]
            if x == HASH:
                result = covers(i + 1, j) or (j < lb and covers(i, j + 1))
            elif j == lb:
                result = False
            else:
                y = wb[j]
                if x == STAR:
                    ok = y == STAR or (y != HASH and y != "")
                else:
                    ok = x == y
                result = ok and covers(i + 1, j + 1)
        memo[key] = result
        return result

    return covers(0, 0)
