"""Marking node-to-node fragment links (AMQP 1.0 §3.5.3/§3.5.4 terminus capabilities).

A link a node opens to a peer's fragment carries the capability
``fedgate:fragment`` on its source (stealing) or target (enqueueing). The
serving node then answers only from its own fragment and never re-steals or
re-routes for that link, so requests cannot loop around the group.
"""

from __future__ import annotations

from proton import Data, symbol

FRAGMENT = "fedgate:fragment"


def mark(terminus) -> None:
    data = terminus.capabilities
    data.clear()
    data.put_array(False, Data.SYMBOL)
    data.enter()
    data.put_symbol(symbol(FRAGMENT))
    data.exit()


def is_marked(terminus) -> bool:
    data = terminus.capabilities
    data.rewind()
    if data.next() is None:
        return False
    value = data.get_object()
    items = getattr(value, "elements", None)
    if items is None:
        items = value if isinstance(value, (list, tuple)) else (value,)
    return any(str(item) == FRAGMENT for item in items)
