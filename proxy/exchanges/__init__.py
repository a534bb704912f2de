"""Local exchanges: bindings, routing a message to queues and remote destinations.

Owns: ``exchange`` (exchanges and their fan-out), ``remote_bindings``
(subscriptions on a primary's exchange). May import: ``proxy.links``,
``proxy.upstream``, ``proxy.queues``, ``proxy.amqp``, ``routing``.
"""
