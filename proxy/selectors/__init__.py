"""JMS message selectors: a consumer's source filter ``apache.org:selector-filter:string``.

Owns: ``parser`` (``parse(text) -> Selector``: the JMS 2.0 §3.8.1.1 grammar,
type checks, errors with positions), ``lexer`` (tokens and ``SelectorError``),
``compiler`` (the closures a selector is compiled to once, three-valued logic,
LIKE matching), ``fields`` (which part of an encoded AMQP message each
identifier reads: the JMS header names, application properties, message
annotations) and ``codec`` (just enough AMQP 1.0 decoding to read the sections
before the body, lazily). Pure logic: no I/O, no state between calls.
May import: the standard library (and ``proton`` for decoding, though the
sections are decoded by hand); nothing of ``proxy``. docs/selectors.md
describes the language and its costs.
"""

from .lexer import SelectorError
from .parser import Selector, parse

__all__ = ["Selector", "SelectorError", "parse"]
