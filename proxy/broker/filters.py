"""The filters a consumer's source may carry (§3.5.8): a JMS selector, applied by the queue;
any other refused (docs/queue-semantics.md)."""

from __future__ import annotations

from proton import Terminus

from proxy import selectors
from proxy.amqp.termini import filters, is_selector

NOT_IMPLEMENTED = "amqp:not-implemented"
INVALID_FIELD = "amqp:invalid-field"


class LinkRefused(Exception):
    """An attach answered with an error condition (the handler refuses the link)."""

    def __init__(self, condition: str, description: str) -> None:
        super().__init__(f"{condition}: {description}")
        self.condition = condition
        self.description = description


def selector_of(source: Terminus, what: str):
    """The JMS selector a consumer's source asks for (§3.5.8, docs/queue-semantics.md), or
    None. Queues apply no other filter: answering with one would claim it is applied, and
    the consumer would take messages it did not select (``amqp:not-implemented``). A
    selector that does not parse: ``amqp:invalid-field`` with where it went wrong."""
    found = filters(source)
    if not found:
        return None
    others = sorted(name for name, (descriptor, _) in found.items() if not is_selector(descriptor))
    if others:
        raise LinkRefused(NOT_IMPLEMENTED,
                          f"filters are not supported on a {what} ({', '.join(others)})")
    texts = [value for descriptor, value in found.values()]
    if len(texts) > 1:
        raise LinkRefused(INVALID_FIELD, "more than one selector filter")
    text = texts[0]
    if not isinstance(text, str):
        raise LinkRefused(INVALID_FIELD, "a selector filter's value must be a string")
    try:
        selector = selectors.parse(text)
    except selectors.SelectorError as exc:
        raise LinkRefused(INVALID_FIELD, f"selector {text!r}: {exc}") from None
    return None if selector.selects_all else selector
