"""Local queues and the client links on them.

Owns: ``local`` (a queue: FIFO, competing consumers, depth, ttl), ``message``
(``StoredMessage``), ``runs`` (a FIFO queue's paged messages as runs on disk),
``level_runs`` (a priority queue's: runs per level), ``store`` (``PriorityStore``),
``registry`` (all the queues of a node), ``memory`` (``MemoryUse``: their bytes against ``[limits] max_memory``),
``endpoints`` (``QueueProducer``, ``QueueConsumer``), ``browsers`` (distribution-mode copy),
``durable`` and ``durable_hold`` (journaling of durable messages), ``journal_pages``
(recovered durable bodies left in the journal, read back by location). May import:
``proxy.amqp``, ``proxy.journal``, ``proxy.paging``, ``proxy.metrics``.
"""
