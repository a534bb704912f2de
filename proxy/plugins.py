"""Extension points, so that layers above ``proxy`` plug in without ``proxy`` importing them.

Imports flow one way (routing <- proxy/fragments <- admin_api, CLI). Packages
above the node register through entry points in ``pyproject.toml``:

``fedgate.services``
    ``factory(node) -> service``; the service has ``async start()`` and
    ``async stop()`` and runs in the node's event loop (the admin API).
``fedgate.commands``
    ``register(subparsers)``: adds ``fedgate`` sub-commands (``rules``, ``status``).
"""

from __future__ import annotations

import logging
from importlib.metadata import entry_points

log = logging.getLogger("fedgate.plugins")


def load(group: str, names=None) -> list:
    """The entry points of ``group``, by name; only those in ``names`` unless it is None."""
    loaded = []
    for entry in sorted(entry_points(group=group), key=lambda e: e.name):
        if names is None or entry.name in names:
            loaded.append(entry.load())
    return loaded
