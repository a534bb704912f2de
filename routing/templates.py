"""Remote-address templates such as ``/exchange/{1}/{2}`` or ``{address}``.

A template is parsed once with ``string.Formatter`` syntax into a list of
literal text and placeholders. Allowed placeholders: ``{address}`` (the
client's address) and ``{1}``, ``{2}``... (the pattern's wildcard
captures, 1-based). ``{{`` and ``}}`` produce literal braces. Anything
else (unknown names, ``{0}``, ``{}``, an index beyond the number of
wildcards, format specs or conversions, unbalanced braces) is a
:class:`RuleError` at parse time, so expansion itself cannot fail.
"""

from __future__ import annotations

from string import Formatter

from .errors import RuleError

__all__ = ["Template", "compile_template"]

_FORMATTER = Formatter()


class Template:
    """A parsed template; ``expand`` joins literals and substitutions."""

    __slots__ = ("text", "_parts", "max_index")

    def __init__(self, text: str, parts: tuple[str | int, ...], max_index: int) -> None:
        # str parts are literals, int parts are capture indexes (1-based),
        # 0 stands for {address}.
        self.text = text
        self._parts = parts
        self.max_index = max_index

    def expand(self, address: str, captures: tuple[str, ...] = ()) -> str:
        """Substitute ``address`` and ``captures`` into the template."""
        out = []
        for part in self._parts:
            if isinstance(part, str):
                out.append(part)
            elif part == 0:
                out.append(address)
            else:
                out.append(captures[part - 1])
        return "".join(out)

    def __repr__(self) -> str:
        return f"Template({self.text!r})"


def compile_template(text: str, wildcards: int | None, field: str = "remote") -> Template:
    """Parse ``text``; ``wildcards`` bounds ``{N}`` (None = don't check)."""
    if not isinstance(text, str):
        raise RuleError(field, f"expected a string, got {type(text).__name__}")
    if not text:
        raise RuleError(field, "template must not be empty")
    try:
        pieces = list(_FORMATTER.parse(text))
    except ValueError as exc:
        raise RuleError(field, f"bad template {text!r}: {exc}") from None
    parts: list[str | int] = []
    max_index = 0
    for literal, name, spec, conversion in pieces:
        if literal:
            parts.append(literal)
        if name is None:
            continue
        if spec or conversion:
            raise RuleError(
                field, f"placeholder {{{name}}} must not have a format spec or conversion"
            )
        if name == "address":
            parts.append(0)
            continue
        if name.isdigit() and name.isascii():
            index = int(name)
            if index < 1:
                raise RuleError(field, "capture placeholders start at {1}")
            if wildcards is not None and index > wildcards:
                raise RuleError(
                    field,
                    f"placeholder {{{index}}} refers to wildcard #{index} but the pattern "
                    f"has {wildcards} wildcard{'s' if wildcards != 1 else ''}",
                )
            max_index = max(max_index, index)
            parts.append(index)
            continue
        shown = "{" + name + "}" if name else "{}"
        raise RuleError(
            field, f"unknown placeholder {shown} (use {{address}} or {{1}}, {{2}}, ...)"
        )
    return Template(text, tuple(parts), max_index)
