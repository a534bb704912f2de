"""Replicated queues and fragments (issue #35): a primary and backups per queue, failover.

Owns: the replication events and their batches (``events``), the states of a copy
(``states``), the primary's side of the protocol (``primary``: rids, a stream per
backup, delayed completion, the in-sync set), a backup's copy (``replica``), the
replicated local queue (``queue``). docs/replication.md has the design.

May import: ``proxy.queues``, ``proxy.amqp`` (and the rooms below them).
"""
