"""Paging: message bodies on disk when the node's memory budget is used (docs/paging.md).

Owns: ``store`` (the page store: segment files under ``<data_dir>/paging``, one I/O thread,
``Page`` records and their states) and ``pager`` (the event loop's policy: which waiting
messages page out, which are read back ahead of consumers, the disk bounds). May import:
nothing of the project (queues are used through the attributes docs/paging.md names).
"""
