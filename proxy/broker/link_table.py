"""A client connection's table of links, mirrored into the node-wide one.

The shared event pump (``proxy.amqp.engine.SharedEventPump``) hands each
delivery to its endpoint by link pointer, over every client connection of the
node; each connection keeps its own table too (its links end with it).
"""

from __future__ import annotations


class LinkTable(dict):
    """A client connection's links (link pointer -> endpoint).

    Every change is mirrored into the node-wide table through which the shared
    event pump hands each delivery to its endpoint (engine.SharedEventPump).
    """

    __slots__ = ("_all",)

    def __init__(self, all_links: dict) -> None:
        super().__init__()
        self._all = all_links

    def __setitem__(self, ptr, endpoint) -> None:
        super().__setitem__(ptr, endpoint)
        self._all[ptr] = endpoint

    def __delitem__(self, ptr) -> None:
        super().__delitem__(ptr)
        self._all.pop(ptr, None)

    def pop(self, ptr, *default):
        self._all.pop(ptr, None)
        return super().pop(ptr, *default)

    def clear(self) -> None:
        for ptr in self:
            self._all.pop(ptr, None)
        super().clear()

    def _unsupported(self, *args, **kwargs):
        raise TypeError("LinkTable changes only by [ptr] = endpoint, pop, del and clear")

    update = setdefault = popitem = __ior__ = _unsupported
