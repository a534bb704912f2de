"""Connections to primaries: pools, their members, primaries' quirks, suspects.

Owns: ``pool`` (one pool per primary, the registry), ``member`` (one upstream
connection: reconnect, paced attaches, link events routed to owners),
``connection`` (the sans-I/O client connection), ``target`` (URL and options),
``probe`` (does a remote source still exist), ``primaries`` (what a primary
known by its open frame cannot do), ``suspects`` (deliveries re-sent alone),
``owner`` (what every owner of an upstream link shares). May import:
``proxy.amqp``, ``proxy.net``, ``routing``.
"""
