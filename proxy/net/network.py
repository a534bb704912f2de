"""Where a node's bytes travel: real sockets (``TcpNetwork``) or in-process pipes.

A node is built with a network (``proxy.node.Node(config, network=...)``); its
listener calls ``serve`` and every upstream connection (``proxy.upstream``)
calls ``connect``. Both take asyncio protocol factories and give the protocols
asyncio-style transports, so the AMQP code above never knows which network it
is on. ``TcpNetwork`` is the default; ``proxy.net.memory.MemoryNetwork`` wires
nodes, primaries and peers in one process for socket-free tests.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Callable, Protocol

from proxy.net.tcp_server import TcpServer


class Listener(Protocol):
    def close(self) -> None: ...

    async def wait_closed(self) -> None: ...


class Network(Protocol):
    async def serve(self, factory: Callable, host: str, port: int, *,
                    ssl_context: ssl.SSLContext | None = None,
                    handshake_timeout: float | None = None) -> tuple[Listener, tuple[str, int]]:
        """Listen on host:port; returns the listener and the address bound."""

    async def connect(self, factory: Callable, host: str, port: int, *,
                      ssl_context: ssl.SSLContext | None = None,
                      server_hostname: str | None = None) -> tuple[object, object]:
        """Connect to host:port; returns (transport, protocol). Raises OSError when refused."""


class TcpNetwork:
    """Real sockets: the lean plain-TCP listener, asyncio's for TLS, asyncio connects.

    A TLS listener accepts plain TCP: the protocol admits the connection (its
    limits) and only then starts TLS on it (``loop.start_tls``, as
    ``proxy.server.AmqpProtocol`` does), so no TLS work is spent on a connection
    the limits refuse.
    """

    async def serve(self, factory, host, port, *, ssl_context=None, handshake_timeout=None):
        if ssl_context is None:  # lean transports: most of a concentrator's memory is per client
            server = await TcpServer.start(factory, host, port, backlog=4096)
        else:  # asyncio's transport, which start_tls can upgrade
            server = await asyncio.get_running_loop().create_server(
                factory, host, port, reuse_address=True, backlog=4096)
        sockname = server.sockets[0].getsockname()
        return server, (sockname[0], sockname[1])

    async def connect(self, factory, host, port, *, ssl_context=None, server_hostname=None):
        return await asyncio.get_running_loop().create_connection(
            factory, host, port, ssl=ssl_context, server_hostname=server_hostname)

    async def serve_unix(self, factory, path: str):
        """Listen on a Unix socket (a node's workers reach each other there)."""
        server = await TcpServer.start_unix(factory, path)
        return server, path

    async def connect_unix(self, factory, path: str):
        return await asyncio.get_running_loop().create_unix_connection(factory, path)
