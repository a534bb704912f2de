"""``parse(text) -> Selector``: the JMS 2.0 selector grammar, checked and compiled once.

Precedence, loosest first (SQL's; docs/selectors.md)::

    selector   := or EOF
    or         := and (OR and)*
    and        := not (AND not)*
    not        := NOT not | equality
    equality   := comparison (('=' | '<>') comparison | IS [NOT] NULL)*
    comparison := additive (('<' | '<=' | '>' | '>=') additive
                            | [NOT] BETWEEN additive AND additive
                            | [NOT] LIKE string [ESCAPE string]
                            | [NOT] IN '(' string (',' string)* ')')*
    additive   := multiplicative (('+' | '-') multiplicative)*
    multiplicative := unary (('*' | '/' | '%') unary)*
    unary      := ('+' | '-') unary | primary
    primary    := literal | identifier | '(' or ')'

Mistakes that no message could make true are refused here rather than
evaluated to FALSE forever: a number or string where a condition belongs
(``3 + 5``), ``x = NULL`` (IS NULL is meant), a string or boolean literal
with < > <= >= or BETWEEN, arithmetic on a string or boolean literal, two
literals of different types compared, IN after anything but an identifier.
"""

from __future__ import annotations

from . import compiler as c
from .fields import MessageView, normalize, wanted_properties
from .lexer import END, IDENT, KEYWORD, NUM, OP, STR, SelectorError, Token, tokenize, unexpected

MAX_NESTING = 50  # parentheses, NOT and signs inside each other (the parser recurses on them)
MAX_DEPTH = 100  # levels of the compiled expression (evaluation recurses on them)

_ARTICLE = {c.NUM: "a number", c.STR: "a string", c.BOOL: "a boolean", c.NULL: "NULL",
            c.ANY: "a value"}
_ORDERING = ("<", "<=", ">", ">=")


class Selector:
    """A parsed selector: evaluate it against encoded messages or any name -> value lookup.

    ``text`` is the selector as given; ``names`` the identifiers it reads
    (a caller can tell from them which sections it needs); ``selects_all`` is
    true for an empty selector, which JMS defines as selecting every message.
    """

    __slots__ = ("text", "names", "selects_all", "_condition", "_wanted")

    def __init__(self, text: str, condition, names: frozenset[str], selects_all: bool) -> None:
        self.text = text
        self.names = names
        self.selects_all = selects_all
        self._condition = condition
        self._wanted = wanted_properties(names)

    def matches(self, payload: bytes) -> bool:
        """Whether the encoded message is selected: only when the selector is TRUE for it.

        Never raises: a malformed message, or a section of it, reads as absent.
        """
        if self.selects_all:
            return True
        try:
            return self._condition(MessageView(payload, self._wanted).lookup) is True
        except Exception:  # noqa: BLE001 - whatever the message holds, it is just not selected
            return False

    def evaluate(self, lookup) -> bool | None:
        """TRUE, FALSE or None (unknown), reading identifiers with ``lookup(name)``.

        ``lookup`` returns the value or None; a value other than a string,
        number or boolean counts as NULL.
        """
        return self._condition(lambda name: normalize(lookup(name)))

    def __repr__(self) -> str:
        return f"Selector({self.text!r})"


def _select_all(lookup) -> bool:
    return True


def parse(text: str) -> Selector:
    """Parse and compile ``text``; raises ``SelectorError`` (a ValueError) with ``position``.

    An empty selector (only white space or comments) selects everything:
    the Selector returned has ``selects_all`` true and no names.
    """
    parser = _Parser(text)
    if parser.peek().kind == END:
        return Selector(text, _select_all, frozenset(), True)
    condition = parser.selector()
    return Selector(text, condition, frozenset(parser.names), False)


class _Parser:
    def __init__(self, text: str) -> None:
        if not isinstance(text, str):
            raise TypeError(f"a selector is a str, not {type(text).__name__}")
        self.tokens = tokenize(text)
        self.index = 0
        self.names: set[str] = set()
        self.nesting = 0

    # -- tokens --------------------------------------------------------------------

    def peek(self, ahead: int = 0) -> Token:
        return self.tokens[min(self.index + ahead, len(self.tokens) - 1)]

    def take(self) -> Token:
        token = self.tokens[self.index]
        if token.kind != END:
            self.index += 1
        return token

    def at(self, kind: str, *values) -> bool:
        token = self.tokens[self.index]
        return token.kind == kind and token.value in values

    def expect_keyword(self, word: str, expected: str) -> Token:
        token = self.take()
        if token.kind != KEYWORD or token.value != word:
            raise unexpected(token, expected)
        return token

    def enter(self, token: Token) -> None:
        self.nesting += 1
        if self.nesting > MAX_NESTING:
            raise SelectorError(f"selector nests too deeply at position {token.position}",
                                token.position)

    def make(self, fn, type_: str, position: int, *parts: c.Node) -> c.Node:
        node = c.derived(fn, type_, position, *parts)
        if node.depth > MAX_DEPTH:
            raise SelectorError(f"selector is too deeply nested at position {position}", position)
        return node

    # -- grammar -------------------------------------------------------------------

    def selector(self):
        node = self.or_()
        token = self.peek()
        if token.kind != END:
            raise unexpected(token, "an operator or the end of the selector")
        return self.condition(node)

    def or_(self) -> c.Node:
        return self._logic("OR", self.and_, c.disjunction)

    def and_(self) -> c.Node:
        return self._logic("AND", self.not_, c.conjunction)

    def _logic(self, word: str, operand, combine) -> c.Node:
        first = operand()
        if not self.at(KEYWORD, word):
            return first
        parts = [first]
        while self.at(KEYWORD, word):
            self.take()
            parts.append(operand())
        return self.make(combine([self.condition(part) for part in parts]), c.BOOL,
                         first.position, *parts)

    def not_(self) -> c.Node:
        if not self.at(KEYWORD, "NOT"):
            return self.equality()
        token = self.take()
        self.enter(token)
        operand = self.not_()
        self.nesting -= 1
        return self.make(c.negation(self.condition(operand)), c.BOOL, token.position, operand)

    def equality(self) -> c.Node:
        left = self.comparison()
        while True:
            token = self.peek()
            if token.kind == OP and token.value in ("=", "<>"):
                self.take()
                right = self.comparison()
                self.check_equality(token, left, right)
                left = self.make(c.comparison(token.value, left, right), c.BOOL, left.position,
                                 left, right)
            elif token.kind == KEYWORD and token.value == "IS":
                self.take()
                negated = self.at(KEYWORD, "NOT")
                if negated:
                    self.take()
                self.expect_keyword("NULL", "NOT NULL or NULL after IS" if not negated
                                    else "NULL after IS NOT")
                left = self.make(c.is_null(left, negated), c.BOOL, left.position, left)
            else:
                return left

    def comparison(self) -> c.Node:
        left = self.additive()
        while True:
            token = self.peek()
            if token.kind == OP and token.value in _ORDERING:
                self.take()
                right = self.additive()
                for operand in (left, right):
                    self.check_ordered(token.text, operand)
                left = self.make(c.comparison(token.value, left, right), c.BOOL, left.position,
                                 left, right)
                continue
            after = self.peek(1)
            negated = (token.kind == KEYWORD and token.value == "NOT" and after.kind == KEYWORD
                       and after.value in ("BETWEEN", "LIKE", "IN"))
            if negated:
                self.take()
                token = self.peek()
            if token.kind != KEYWORD or token.value not in ("BETWEEN", "LIKE", "IN"):
                return left
            self.take()
            if token.value == "BETWEEN":
                left = self.between(left, negated)
            elif token.value == "LIKE":
                left = self.like(left, negated)
            else:
                left = self.in_(token, left, negated)

    def between(self, value: c.Node, negated: bool) -> c.Node:
        low = self.additive()
        self.expect_keyword("AND", "AND between the bounds of BETWEEN")
        high = self.additive()
        for operand in (value, low, high):
            self.check_ordered("BETWEEN", operand)
        return self.make(c.between(value, low, high, negated), c.BOOL, value.position,
                         value, low, high)

    def like(self, value: c.Node, negated: bool) -> c.Node:
        if value.type not in (c.STR, c.ANY):
            raise SelectorError(f"LIKE needs a string but found {_ARTICLE[value.type]} at position "
                                f"{value.position}", value.position)
        pattern = self.take()
        if pattern.kind != STR:
            raise unexpected(pattern, "a string pattern after LIKE")
        escape = None
        if self.at(KEYWORD, "ESCAPE"):
            self.take()
            token = self.take()
            if token.kind != STR:
                raise unexpected(token, "a one-character string after ESCAPE")
            if len(token.value) != 1:
                raise SelectorError(f"ESCAPE needs exactly one character, found {token.text} at "
                                    f"position {token.position}", token.position)
            escape = token.value
        matcher = c.like_matcher(pattern.value, escape)
        return self.make(c.like(value, matcher, negated), c.BOOL, value.position, value)

    def in_(self, keyword: Token, value: c.Node, negated: bool) -> c.Node:
        if value.kind != c.IDENT:
            raise SelectorError(f"IN needs an identifier on its left at position {value.position}",
                                value.position)
        token = self.take()
        if token.kind != OP or token.value != "(":
            raise unexpected(token, "'(' and a list of strings after IN")
        values = set()
        while True:
            token = self.take()
            if token.kind != STR:
                raise unexpected(token, "a string literal in the IN list")
            values.add(token.value)
            token = self.take()
            if token.kind == OP and token.value == ")":
                break
            if token.kind != OP or token.value != ",":
                raise unexpected(token, "',' or ')' in the IN list")
        return self.make(c.membership(value.name, frozenset(values), negated), c.BOOL,
                         value.position, value)

    def additive(self) -> c.Node:
        return self._arithmetic(("+", "-"), self.multiplicative)

    def multiplicative(self) -> c.Node:
        return self._arithmetic(("*", "/", "%"), self.unary)

    def _arithmetic(self, ops: tuple, operand) -> c.Node:
        left = operand()
        while self.at(OP, *ops):
            token = self.take()
            right = operand()
            for side in (left, right):
                self.check_number(token, side)
            left = self.make(c.arithmetic(token.value, left, right), c.NUM, left.position,
                             left, right)
        return left

    def unary(self) -> c.Node:
        if not self.at(OP, "+", "-"):
            return self.primary()
        token = self.take()
        self.enter(token)
        operand = self.unary()
        self.nesting -= 1
        self.check_number(token, operand)
        return self.make(c.sign(token.value, operand), c.NUM, token.position, operand)

    def primary(self) -> c.Node:
        token = self.take()
        kind = token.kind
        if kind == STR:
            return c.constant(token.value, c.STR, token.position)
        if kind == NUM:
            return c.constant(token.value, c.NUM, token.position)
        if kind == IDENT:
            self.names.add(token.value)
            return c.identifier(token.value, token.position)
        if kind == KEYWORD and token.value in ("TRUE", "FALSE"):
            return c.constant(token.value == "TRUE", c.BOOL, token.position)
        if kind == KEYWORD and token.value == "NULL":
            return c.constant(None, c.NULL, token.position)
        if kind == OP and token.value == "(":
            self.enter(token)
            node = self.or_()
            self.nesting -= 1
            close = self.take()
            if close.kind != OP or close.value != ")":
                raise unexpected(close, f"')' to close the '(' at position {token.position}")
            return node
        raise unexpected(token, "an operand")

    # -- checks --------------------------------------------------------------------

    def condition(self, node: c.Node):
        if node.type in (c.NUM, c.STR):
            raise SelectorError(f"expected a condition but found {_ARTICLE[node.type]} at position "
                                f"{node.position}", node.position)
        return c.condition(node)

    @staticmethod
    def check_equality(op: Token, left: c.Node, right: c.Node) -> None:
        for side in (left, right):
            if side.type == c.NULL:
                raise SelectorError(f"NULL can't be compared with '{op.text}' at position "
                                    f"{side.position} (use IS NULL or IS NOT NULL)", side.position)
        if c.ANY not in (left.type, right.type) and left.type != right.type:
            raise SelectorError(f"{_ARTICLE[left.type]} can't be compared with "
                                f"{_ARTICLE[right.type]} at position {op.position}", op.position)

    @staticmethod
    def check_ordered(what: str, node: c.Node) -> None:
        if node.type == c.NULL:
            raise SelectorError(f"NULL can't be compared with '{what}' at position {node.position} "
                                "(use IS NULL or IS NOT NULL)", node.position)
        if node.type in (c.STR, c.BOOL):
            article = _ARTICLE[node.type]
            raise SelectorError(f"{article} can't be compared with '{what}' at position "
                                f"{node.position} ({article[2:]}s only support = and <>)",
                                node.position)

    @staticmethod
    def check_number(op: Token, node: c.Node) -> None:
        if node.type in (c.STR, c.BOOL):
            raise SelectorError(f"'{op.text}' needs numbers but found {_ARTICLE[node.type]} at "
                                f"position {node.position}", node.position)
