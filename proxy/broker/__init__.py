"""The embedded broker: client connections' events routed to queues, proxy links and exchanges.

Owns: ``broker`` (node-wide state and the per-input cycle), ``handler`` (one
client connection: sessions, attach routing and refusals, flow, deliveries),
``relay`` (the anonymous relay: each message to its ``to``), ``operations`` (an
operator's peek, purge, delete, move and resend on a local queue). May import every
room below it: ``proxy.exchanges``, ``proxy.links``, ``proxy.queues``,
``proxy.upstream``, ``proxy.amqp``, ``proxy.metrics``.
"""
