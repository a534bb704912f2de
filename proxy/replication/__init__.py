"""Replicated queues and fragments (issue #35): a primary and backups per queue, failover.

Owns: the replication events and their batches (``events``), the states of a copy
(``states``), the primary's side of the protocol (``primary``: rids, a stream per
backup, delayed completion, the in-sync set), each backup node's silence over all of a
node's queues (``backup_silence``), a backup's copy (``replica``), the replicated local
queue (``queue``). docs/replication.md has the design.

The service (``service``, with the per-address logic in ``address``, who may claim a queue
whose owner is gone in ``eligible``, the client links
waiting for an owner in ``parked``, and the links' glue in ``links`` and ``copies``) plugs into the node through the
``fedgate.services`` entry point, as fragments do.

May import: every ``proxy`` room below ``proxy.node`` (the broker's client handler,
queues, upstream pools, links, the cluster coordinator).
"""


def plugin(node):
    """``fedgate.services`` entry point (``service`` is the module of the same name)."""
    from .service import ReplicationService

    return ReplicationService(node)
