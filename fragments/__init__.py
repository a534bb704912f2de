"""Fragmented shared queues: one logical queue split across nodes, with stealing.

Modules: ``capability`` (marking node-to-node fragment links), ``steal`` (one
peer fragment to steal from), ``selective`` (stealing for consumers with JMS
selectors), ``group`` (one logical queue on this node),
``service`` (the plug-in that serves the ``fragmented`` kind).
"""

from .service import FragmentService


def service(node) -> FragmentService:
    """``fedgate.services`` entry point."""
    return FragmentService(node)
