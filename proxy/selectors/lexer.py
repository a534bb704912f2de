"""Tokens of a JMS selector (JMS 2.0 §3.8.1.1), and the error every selector problem raises.

Tokens: string literals ('it''s'), numbers (exact: 12, 12L, 0x1F, 017;
approximate: 1.5, .5, 7., 1E3, 2.5e-3, 1.5F, 2D), identifiers (a Java
identifier that is not a keyword; case-sensitive; Artemis's quoted form
"any-name" too), the keywords (NULL TRUE FALSE NOT AND OR BETWEEN LIKE IN IS
ESCAPE, any case) and the operators = <> < <= > >= + - * / ( ) , (and
Artemis's remainder, %). Comments
(-- to the end of the line, /* ... */) count as white space, as in Artemis.
"""

from __future__ import annotations

import re
from typing import NamedTuple


class SelectorError(ValueError):
    """A selector that cannot be parsed; ``position`` is the 0-based offset of the culprit."""

    def __init__(self, message: str, position: int) -> None:
        super().__init__(message)
        self.position = position


STR, NUM, IDENT, KEYWORD, OP, END = "string", "number", "identifier", "keyword", "operator", "end"

KEYWORDS = frozenset(("NULL", "TRUE", "FALSE", "NOT", "AND", "OR", "BETWEEN", "LIKE", "IN", "IS",
                      "ESCAPE"))


class Token(NamedTuple):
    kind: str
    value: object  # str (literal text, name, upper-case keyword, operator), int or float
    position: int
    text: str  # as written


def describe(token: Token) -> str:
    """The token as an error message names it."""
    if token.kind == END:
        return "end of selector"
    if token.kind == STR:
        return f"string {token.text}"
    return f"'{token.text}'"


def unexpected(token: Token, expected: str | None = None) -> SelectorError:
    message = f"unexpected {describe(token)} at position {token.position}"
    if expected:
        message += f" (expected {expected})"
    return SelectorError(message, token.position)


_WHITE = " \t\n\r\f"
_OPERATORS = ("<>", "<=", ">=", "<", ">", "=", "+", "-", "*", "/", "%", "(", ")", ",")
_NUMBER = re.compile(r"""
      0[xX][0-9a-fA-F]+[lL]?                                    # hex
    | (?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[fFdD]?    # with a decimal point
    | [0-9]+[eE][+-]?[0-9]+[fFdD]?                              # with an exponent
    | [0-9]+[fFdD]                                              # approximate by its suffix
    | [0-9]+[lL]?                                               # exact
""", re.VERBOSE)
_APPROXIMATE = frozenset(".eEfFdD")


def _is_start(c: str) -> bool:
    return c.isalpha() or c == "_" or c == "$"


def _is_part(c: str) -> bool:
    return c.isalnum() or c == "_" or c == "$"


def tokenize(text: str) -> list[Token]:
    """All tokens of ``text``, ending with an END token at ``len(text)``."""
    tokens: list[Token] = []
    append = tokens.append
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in _WHITE:
            i += 1
        elif c == "-" and text.startswith("--", i):
            end = min((j for j in (text.find("\n", i), text.find("\r", i)) if j >= 0), default=n)
            i = end
        elif c == "/" and text.startswith("/*", i):
            end = text.find("*/", i + 2)
            if end < 0:
                raise SelectorError(f"unterminated comment starting at position {i}", i)
            i = end + 2
        elif c == "'":
            i = _quoted(text, i, "'", STR, append)
        elif c == '"':
            i = _quoted(text, i, '"', IDENT, append)
        elif c.isdigit() or (c == "." and i + 1 < n and text[i + 1].isdigit()):
            i = _number(text, i, append)
        elif _is_start(c):
            j = i + 1
            while j < n and _is_part(text[j]):
                j += 1
            word = text[i:j]
            upper = word.upper()
            if upper in KEYWORDS:
                append(Token(KEYWORD, upper, i, word))
            else:
                append(Token(IDENT, word, i, word))
            i = j
        else:
            for op in _OPERATORS:
                if text.startswith(op, i):
                    append(Token(OP, op, i, op))
                    i += len(op)
                    break
            else:
                if text.startswith("!=", i):
                    raise SelectorError(
                        f"unexpected '!=' at position {i} (use <> for 'not equal')", i)
                shown = c if c.isprintable() else repr(c)[1:-1]
                raise SelectorError(f"unexpected character '{shown}' at position {i}", i)
    append(Token(END, None, n, ""))
    return tokens


def _quoted(text: str, start: int, quote: str, kind: str, append) -> int:
    """A 'string' or "quoted identifier" at ``start`` (a doubled quote stands for one)."""
    parts = []
    i = start + 1
    while True:
        end = text.find(quote, i)
        if end < 0:
            what = "string" if kind == STR else "quoted identifier"
            raise SelectorError(f"unterminated {what} starting at position {start}", start)
        parts.append(text[i:end])
        if text.startswith(quote, end + 1):
            parts.append(quote)
            i = end + 2
        else:
            break
    value = "".join(parts)
    if kind == IDENT and not value:
        raise SelectorError(f"empty quoted identifier at position {start}", start)
    append(Token(kind, value, start, text[start:end + 1]))
    return end + 1


def _number(text: str, start: int, append) -> int:
    match = _NUMBER.match(text, start)
    end = match.end() if match else start
    n = len(text)
    if not match or (end < n and (_is_part(text[end]) or text[end] == ".")):
        bad_end = end
        while bad_end < n and (_is_part(text[bad_end]) or text[bad_end] == "."):
            bad_end += 1
        raise SelectorError(f"invalid number '{text[start:bad_end]}' at position {start}", start)
    word = text[start:end]
    if word[:2] in ("0x", "0X"):
        value: object = int(word[2:].rstrip("lL"), 16)
    elif _APPROXIMATE.intersection(word) and word[-1] not in "lL":
        value = float(word.rstrip("fFdD"))
    else:
        digits = word.rstrip("lL")
        if len(digits) > 1 and digits[0] == "0":
            if not all("0" <= d <= "7" for d in digits):
                raise SelectorError(f"invalid octal number '{word}' at position {start}", start)
            value = int(digits, 8)
        else:
            value = int(digits)
    append(Token(NUM, value, start, word))
    return end
