"""HTTP admin API of a fedgate node (aiohttp): rules, inspection, health,
metrics, cluster-wide rules, queue operations and the audit log (``queue_ops``,
``audit``), exchanges, bindings, queues and ACL grants at run time (``wiring``,
``wiring_sync``, ``grants``, ``acl_api``), a web console, and the ``rules``/``status``/``queue``/``audit`` commands.

It plugs into the node through ``proxy.plugins`` entry points (``proxy``
never imports this package): ``service(node)`` for ``fedgate.services`` and
``admin_api.cli.register`` for ``fedgate.commands``.
"""

from __future__ import annotations


def service(node):
    """``fedgate.services`` factory: the admin API, or a no-op when disabled."""
    from .app import AdminService, DisabledService

    if not node.config.admin.enabled:
        return DisabledService(node)
    return AdminService(node)
