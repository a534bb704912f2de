"""Local queues and the client links on them.

Owns: ``local`` (a queue: FIFO, competing consumers, depth, ttl), ``endpoints``
(``QueueProducer``, ``QueueConsumer``), ``browsers`` (distribution-mode copy),
``durable`` and ``durable_hold`` (journaling of durable messages). May import:
``proxy.amqp``, ``proxy.journal``, ``proxy.metrics``.
"""
