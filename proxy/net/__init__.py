"""The byte plumbing: listening sockets and the asyncio side of a connection.

Owns: ``network`` (where a node listens and connects: ``TcpNetwork``),
``tcp_server`` (plain-TCP listener with a lean per-connection transport),
``memory`` (in-process pipes between hosts, for socket-free tests) and
``engine_protocol`` (moves bytes and timers for any sans-I/O connection
object). Knows nothing of AMQP. May import: nothing of ``proxy``.
"""
