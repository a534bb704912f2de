"""Local exchanges: bindings, routing a message to queues and remote destinations.

Owns: ``exchange`` (exchanges and their fan-out), ``remote_bindings``
(subscriptions on a primary's exchange), ``subscriptions`` (topic subscriptions of
this node's exchanges), ``across_workers`` (those subscriptions on a node with
workers), ``declared`` (exchanges and bindings declared at run time, applied over the
configuration's). May import: ``proxy.links``, ``proxy.upstream``, ``proxy.queues``,
``proxy.amqp``, ``proxy.selectors``, ``routing``.
"""
