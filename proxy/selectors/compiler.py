"""Closures that evaluate a parsed selector, built once per selector.

Every node of a parsed selector becomes a function ``f(lookup) -> value``
where ``lookup(name)`` gives an identifier's value (``str``, ``int``,
``float``, ``bool`` or ``None``). Conditions return ``True``, ``False`` or
``None`` (SQL's unknown). The common shapes (an identifier against a literal:
``color = 'red'``, ``JMSPriority > 4``, ``a BETWEEN 1 AND 9``, ``a IN (...)``,
``a LIKE 'x%'``) get closures of their own that call ``lookup`` directly and
test the value's type with one ``is``; nothing walks a tree per message.

Type rules (docs/selectors.md): numbers compare with numbers (int and float
alike); strings with strings (= and <>, and, as in Artemis, < <= > >=
between two string values); booleans with booleans (= and <>). Any other
pairing is FALSE (and so ``<>`` of two different types is TRUE, as in
Artemis). NULL anywhere in a comparison or arithmetic gives unknown;
arithmetic on a non-number, and division by zero, give unknown.
"""

from __future__ import annotations

import math
import operator
import re

CONST, IDENT, EXPR = "const", "ident", "expr"
NUM, STR, BOOL, NULL, ANY = "number", "string", "boolean", "NULL", "value"


class Node:
    """One parsed (sub)expression: its closure and what the parser checks types with."""

    __slots__ = ("fn", "kind", "type", "position", "value", "name", "depth")

    def __init__(self, fn, kind: str, type_: str, position: int, *, value=None, name=None,
                 depth: int = 1) -> None:
        self.fn = fn
        self.kind = kind
        self.type = type_
        self.position = position
        self.value = value
        self.name = name
        self.depth = depth


def constant(value, type_: str, position: int) -> Node:
    return Node(lambda lookup: value, CONST, type_, position, value=value)


def identifier(name: str, position: int) -> Node:
    return Node(lambda lookup: lookup(name), IDENT, ANY, position, name=name)


def derived(fn, type_: str, position: int, *parts: Node) -> Node:
    """A node computed from ``parts``; folded to a constant when they all are."""
    if all(part.kind == CONST for part in parts):
        return constant(fn(None), type_, position)
    return Node(fn, EXPR, type_, position, depth=1 + max(part.depth for part in parts))


# -- logic -----------------------------------------------------------------------------


def condition(node: Node):
    """The node as a condition: an identifier holding a boolean counts; any other value is FALSE."""
    if node.kind == IDENT:
        name = node.name

        def cast(lookup):
            value = lookup(name)
            return value if value is None or value.__class__ is bool else False
        return cast
    return node.fn


def conjunction(fns: list):
    """AND of conditions: FALSE wins, then unknown."""
    if len(fns) == 2:
        first, second = fns

        def and2(lookup):
            a = first(lookup)
            if a is False:
                return False
            b = second(lookup)
            if b is False:
                return False
            return None if a is None or b is None else True
        return and2

    def and_n(lookup):
        unknown = False
        for fn in fns:
            result = fn(lookup)
            if result is False:
                return False
            if result is None:
                unknown = True
        return None if unknown else True
    return and_n


def disjunction(fns: list):
    """OR of conditions: TRUE wins, then unknown."""
    if len(fns) == 2:
        first, second = fns

        def or2(lookup):
            a = first(lookup)
            if a is True:
                return True
            b = second(lookup)
            if b is True:
                return True
            return None if a is None or b is None else False
        return or2

    def or_n(lookup):
        unknown = False
        for fn in fns:
            result = fn(lookup)
            if result is True:
                return True
            if result is None:
                unknown = True
        return None if unknown else False
    return or_n


def negation(fn):
    def not_(lookup):
        result = fn(lookup)
        return None if result is None else not result
    return not_


# -- comparison ------------------------------------------------------------------------

_ORDER = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}
_FLIPPED = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "=": "=", "<>": "<>"}


def _equal(a, b):
    if a is None or b is None:
        return None
    ta, tb = a.__class__, b.__class__
    if ta is tb or ((ta is int or ta is float) and (tb is int or tb is float)):
        return a == b
    return False


def _ordered(a, b) -> bool:
    """Whether < and friends apply: two numbers, or two strings (an Artemis extension)."""
    ta, tb = a.__class__, b.__class__
    if ta is tb:
        return ta is not bool
    return (ta is int or ta is float) and (tb is int or tb is float)


def comparison(op: str, left: Node, right: Node):
    """The closure for ``left op right``, op one of = <> < <= > >=."""
    if left.kind == CONST and right.kind == IDENT:
        left, right, op = right, left, _FLIPPED[op]
    if left.kind == IDENT and right.kind == CONST and right.value is not None:
        return _identifier_against_constant(op, left.name, right.value)
    lf, rf = left.fn, right.fn
    if op == "=":
        return lambda lookup: _equal(lf(lookup), rf(lookup))
    if op == "<>":
        def not_equal(lookup):
            result = _equal(lf(lookup), rf(lookup))
            return None if result is None else not result
        return not_equal
    compare = _ORDER[op]

    def ordering(lookup):
        a = lf(lookup)
        if a is None:
            return None
        b = rf(lookup)
        if b is None:
            return None
        return compare(a, b) if _ordered(a, b) else False
    return ordering


def _identifier_against_constant(op: str, name: str, c):
    kind = c.__class__
    if op in ("=", "<>"):
        equal = op == "="
        if kind is bool:  # True/False are singletons: identity is equality, and excludes 1 and 0
            if equal:
                return lambda lookup: None if (v := lookup(name)) is None else v is c
            return lambda lookup: None if (v := lookup(name)) is None else v is not c
        if kind is str:  # a str never equals a number or a boolean
            if equal:
                return lambda lookup: None if (v := lookup(name)) is None else v == c
            return lambda lookup: None if (v := lookup(name)) is None else v != c
        # a number: True == 1 in Python, so booleans are ruled out by type
        if equal:
            return lambda lookup: (None if (v := lookup(name)) is None
                                   else v == c and v.__class__ is not bool)
        return lambda lookup: (None if (v := lookup(name)) is None
                               else v != c or v.__class__ is bool)
    compare = _ORDER[op]
    if kind is str:
        def string_order(lookup):
            v = lookup(name)
            if v is None:
                return None
            return compare(v, c) if v.__class__ is str else False
        return string_order

    def number_order(lookup):
        v = lookup(name)
        if v is None:
            return None
        t = v.__class__
        return compare(v, c) if t is int or t is float else False
    return number_order


def between(value: Node, low: Node, high: Node, negated: bool):
    """``value BETWEEN low AND high``: ``value >= low AND value <= high``.

    NOT BETWEEN is ``value < low OR value > high`` (JMS 2.0 §3.8.1.1).
    """
    if value.kind == IDENT and low.kind == CONST and high.kind == CONST:
        name, lo, hi = value.name, low.value, high.value

        def between_constants(lookup):
            v = lookup(name)
            if v is None:
                return None
            t = v.__class__
            if t is int or t is float:
                return (v < lo or v > hi) if negated else lo <= v <= hi
            return False
        return between_constants
    if negated:
        return disjunction([comparison("<", value, low), comparison(">", value, high)])
    return conjunction([comparison(">=", value, low), comparison("<=", value, high)])


def is_null(value: Node, negated: bool):
    if value.kind == IDENT:
        name = value.name
        if negated:
            return lambda lookup: lookup(name) is not None
        return lambda lookup: lookup(name) is None
    fn = value.fn
    if negated:
        return lambda lookup: fn(lookup) is not None
    return lambda lookup: fn(lookup) is None


def membership(name: str, values: frozenset, negated: bool):
    """``name [NOT] IN (...)``: unknown when the value is NULL or not a string (as Artemis)."""
    if negated:
        def not_in(lookup):
            v = lookup(name)
            return None if v.__class__ is not str else v not in values
        return not_in

    def in_(lookup):
        v = lookup(name)
        return None if v.__class__ is not str else v in values
    return in_


def like(value: Node, matcher, negated: bool):
    """``value [NOT] LIKE pattern``: unknown for NULL, FALSE for a non-string (as Artemis)."""
    fn = value.fn

    def like_(lookup):
        v = fn(lookup)
        if v is None:
            return None
        if v.__class__ is not str:
            return negated
        return matcher(v) is not negated
    return like_


# -- arithmetic ------------------------------------------------------------------------


def _divide(a, b):
    return None if b == 0 else a / b


def _remainder(a, b):  # Artemis's %: Java's double remainder, which has the dividend's sign
    return None if b == 0 else math.fmod(a, b)


_ARITHMETIC = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": _divide,
               "%": _remainder}


def arithmetic(op: str, left: Node, right: Node):
    """``left op right`` on numbers; unknown for NULL, non-numbers, x / 0 and overflow.

    Division is always true division (7 / 2 = 3.5), and % the remainder of
    floating-point division (7 % 2 = 1.0, -7 % 2 = -1.0), as in Artemis.
    """
    compute = _ARITHMETIC[op]
    lf, rf = left.fn, right.fn

    def arithmetic_(lookup):
        a = lf(lookup)
        t = a.__class__
        if t is not int and t is not float:
            return None
        b = rf(lookup)
        t = b.__class__
        if t is not int and t is not float:
            return None
        try:
            return compute(a, b)
        except (OverflowError, ZeroDivisionError):
            return None
    return arithmetic_


def sign(op: str, operand: Node):
    """Unary + or -: the number (negated for -), unknown for anything else."""
    fn = operand.fn
    negate = op == "-"

    def sign_(lookup):
        v = fn(lookup)
        t = v.__class__
        if t is not int and t is not float:
            return None
        return -v if negate else v
    return sign_


# -- LIKE patterns ---------------------------------------------------------------------


def like_matcher(pattern: str, escape: str | None):
    """A function ``str -> bool`` for a LIKE pattern (% any run, _ one character).

    The escape character escapes the next character only when that is %, _ or
    the escape character itself; anywhere else it stands for itself (as
    Artemis reads it). Matching never backtracks: the pattern is split at its
    %s, the first and last pieces are anchored, and each middle piece is found
    leftmost in turn, so a pattern like '%a%a%a%b' costs linear time.
    """
    pieces: list[list[str | None]] = [[]]  # None stands for _
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == escape and i + 1 < n and pattern[i + 1] in ("%", "_", escape):
            pieces[-1].append(pattern[i + 1])
            i += 2
            continue
        if c == "%":
            pieces.append([])
        elif c == "_":
            pieces[-1].append(None)
        else:
            pieces[-1].append(c)
        i += 1
    if not any(None in piece for piece in pieces):  # only %: string methods do it
        texts = ["".join(piece) for piece in pieces]
        if len(texts) == 1:
            return texts[0].__eq__
        if len(texts) == 2:
            head, tail = texts
            least = len(head) + len(tail)
            return lambda s: len(s) >= least and s.startswith(head) and s.endswith(tail)
        if len(texts) == 3 and not texts[0] and not texts[2]:
            middle = texts[1]
            return lambda s: middle in s
    finders = [_piece(piece) for piece in pieces]
    if len(finders) == 1:
        only_length, only_at, _ = finders[0]
        return lambda s: len(s) == only_length and only_at(s, 0)
    first_length, first_at, _ = finders[0]
    last_length, last_at, _ = finders[-1]
    middle = [(length, find) for length, _, find in finders[1:-1] if length]
    fixed = first_length + last_length

    def match(s: str) -> bool:
        end = len(s) - last_length
        if end < first_length or not first_at(s, 0) or not last_at(s, end):
            return False
        position = first_length
        for length, find in middle:
            found = find(s, position, end)
            if found < 0:
                return False
            position = found + length
        return True

    if not middle and not fixed:
        return lambda s: True
    return match


def _piece(piece: list):
    """(length, at(s, i) -> bool, find(s, start, end) -> index or -1) for one %-free piece."""
    length = len(piece)
    if None not in piece:
        text = "".join(piece)
        return (length, lambda s, i: s.startswith(text, i),
                lambda s, start, end: s.find(text, start, end))
    regex = re.compile("".join("." if c is None else re.escape(c) for c in piece), re.DOTALL)
    match = regex.match

    def find(s, start, end):
        found = regex.search(s, start, end)
        return -1 if found is None else found.start()
    return length, lambda s, i: match(s, i) is not None, find
