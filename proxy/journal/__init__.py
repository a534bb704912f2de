"""Durable queues' append-only journal: record format, writer thread, recovery.

Owns: ``journal`` (segments, recovery, compaction, locations and pins),
``state`` (its bookkeeping records), ``format`` (records and their CRC),
``writer`` (group commit off the event loop). May import: nothing of ``proxy``.
"""
