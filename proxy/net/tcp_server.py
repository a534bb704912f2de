"""Plain-TCP listener with a lean per-connection transport.

How this works
--------------
asyncio's socket transport costs about 1.4 KB of Python objects per
connection (the transport and its ``__dict__``, an extra-info dict, a weak
registry entry, a waiter future, ...). A concentrator holding 10,000 mostly
idle clients pays that 10,000 times, so plain-TCP listeners use this module;
TLS listeners keep asyncio's SSL transport.

``TcpServer`` binds the listening sockets and registers them with the event
loop's selector (``loop.add_reader``); each readable event accepts what is
waiting. Accepted sockets are kept as bare file descriptors in the server's
own ``epoll`` set, whose descriptor is itself one reader of the event loop:
per connection that is one dict entry instead of asyncio's handle, selector
key and socket object. Level-triggered: a socket is polled for input while we
read it and for output while bytes wait to be written, and not at all in
between (an unwatched hang-up would otherwise be reported on every poll).

An accepted socket gets a protocol from the factory and a
``SocketTransport``, which implements the part of ``asyncio.Transport`` that
``proxy.net.engine_protocol.EngineProtocol`` uses, with asyncio's callback contract:

* ``connection_made(transport)`` once, then ``data_received(bytes)`` per read;
* end of input: ``eof_received()``; if it returns true the socket stays open
  for writing (our close frames) until ``close()``;
* ``pause_reading()`` / ``resume_reading()``: input is not read meanwhile
  (the kernel's buffer fills, and TCP slows the peer down);
* ``write(data)`` sends at once and buffers what the kernel did not take,
  then waits for writability; past the high-water mark the protocol gets
  ``pause_writing()``, below the low-water mark ``resume_writing()``;
* ``close()`` closes once the buffer is written, ``abort()`` at once; either
  way ``connection_lost(exc)`` follows from the loop, exactly once.

When accepting fails for lack of file descriptors (or memory), the listener
stops reading its socket for a second instead of spinning, as asyncio does.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import select
import socket

from proxy.net.write_buffer import WriteBuffer

log = logging.getLogger("fedgate.tcp")

READ_SIZE = 256 * 1024  # as asyncio's transports
ACCEPT_BATCH = 128  # connections accepted per readable event, so reads are not starved
ACCEPT_RETRY = 1.0  # seconds to wait after EMFILE/ENFILE/ENOBUFS/ENOMEM
_RESOURCE_ERRORS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


class SocketTransport:
    """One accepted, non-blocking TCP socket (a bare descriptor) driving an asyncio-style protocol."""

    __slots__ = ("_server", "_fd", "_protocol", "_out", "_closing", "_lost", "_reading",
                 "_read_paused", "_mask")

    def __init__(self, server: "TcpServer", fd: int, protocol) -> None:
        self._server = server
        self._fd = fd
        self._protocol = protocol
        self._out = WriteBuffer(self._send, protocol)  # what the kernel has not taken yet
        self._closing = False
        self._lost = False
        self._reading = True  # until end of input or close
        self._read_paused = False  # pause_reading: the protocol cannot take input now
        self._mask = 0  # what the epoll set watches for this descriptor
        server.transports[fd] = self

    def start(self) -> None:
        self._protocol.connection_made(self)
        self._watch()

    # -- asyncio.Transport, the part our protocols use -------------------------------
    def get_extra_info(self, name: str, default=None):
        if name not in ("peername", "sockname") or self._lost:
            return default
        sock = socket.socket(fileno=self._fd)  # a view of our descriptor, detached below
        try:
            return sock.getpeername() if name == "peername" else sock.getsockname()
        except OSError:
            return default
        finally:
            sock.detach()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._out.set_limits(high, low)

    def get_write_buffer_size(self) -> int:
        return self._out.waiting

    def fileno(self) -> int:
        """The socket's descriptor (a worker hands it to another: proxy.workers.worker)."""
        return self._fd

    @property
    def bytes_sent(self) -> int:
        """Bytes the kernel took from this transport, in all."""
        return self._out.sent

    def is_closing(self) -> bool:
        return self._closing

    def pause_reading(self) -> None:
        self._read_paused = True
        self._watch()

    def resume_reading(self) -> None:
        if self._read_paused:
            self._read_paused = False
            self._watch()

    def is_reading(self) -> bool:
        return self._reading and not self._read_paused and not self._closing

    def write(self, data) -> None:
        if self._closing or not data:
            return
        out = self._out
        waited = out.waiting
        try:
            out.write(data)
        except OSError as exc:
            self._force_close(exc)
            return
        if not waited and out.waiting:
            self._watch()  # for writability

    def _send(self, data) -> int:
        try:
            return os.write(self._fd, data)
        except (BlockingIOError, InterruptedError):
            return 0

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        self._reading = False
        self._watch()
        if not self._out.waiting:
            self._server.loop.call_soon(self._connection_lost, None)

    def abort(self) -> None:
        self._force_close(None)

    # -- readiness (TcpServer._poll) ---------------------------------------------------
    def _ready(self, events: int) -> None:
        # a hang-up or error is reported whatever we asked for: the read or the
        # write it wakes fails or sees the end, which closes the transport
        if self._out.waiting and events & (select.EPOLLOUT | select.EPOLLERR | select.EPOLLHUP):
            self._write_ready()
        if self._reading and not self._read_paused and events & (select.EPOLLIN | select.EPOLLERR |
                                                                 select.EPOLLHUP):
            self._read_ready()

    def _read_ready(self) -> None:
        try:
            data = os.read(self._fd, READ_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._force_close(exc)
            return
        if data:
            self._protocol.data_received(data)
            return
        self._reading = False
        self._watch()
        if not self._protocol.eof_received():
            self.close()

    def _write_ready(self) -> None:
        try:
            self._out.writable()  # resume_writing may write again from inside (WriteBuffer)
        except OSError as exc:
            self._force_close(exc)
            return
        if self._lost:
            return
        self._watch()
        if self._closing and not self._out.waiting:
            self._connection_lost(None)

    def _watch(self) -> None:
        """Tell the epoll set what we wait for now: input while reading, output while buffered."""
        if self._lost:
            return
        reading = self._reading and not self._read_paused
        mask = (select.EPOLLIN if reading else 0) | (select.EPOLLOUT if self._out.waiting else 0)
        if mask == self._mask:
            return
        epoll = self._server.epoll
        if not self._mask:
            epoll.register(self._fd, mask)
        elif mask:
            epoll.modify(self._fd, mask)
        else:
            epoll.unregister(self._fd)
        self._mask = mask

    # -- teardown --------------------------------------------------------------------------
    def _force_close(self, exc: Exception | None) -> None:
        if self._lost:
            return
        self._out.drop()
        self._closing = True
        self._reading = False
        self._watch()
        self._server.loop.call_soon(self._connection_lost, exc)  # runs once (_lost)

    def _connection_lost(self, exc: Exception | None) -> None:
        if self._lost:
            return
        self._out.drop()
        self._reading = False
        self._watch()
        self._lost = True
        server = self._server
        if server.transports.get(self._fd) is self:
            del server.transports[self._fd]
        try:
            self._protocol.connection_lost(exc)
        finally:
            os.close(self._fd)
            self._protocol = None
            server.release_epoll_if_done()


class TcpServer:
    """Listening sockets for ``host:port`` feeding ``SocketTransport``s (see module note)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, protocol_factory, sockets: list) -> None:
        self.loop = loop
        self._factory = protocol_factory
        self.sockets = sockets
        self.epoll = select.epoll()
        self.transports: dict[int, SocketTransport] = {}  # descriptor -> its transport
        self._closed = False
        loop.add_reader(self.epoll.fileno(), self._poll)
        for sock in sockets:
            loop.add_reader(sock.fileno(), self._accept, sock)

    @classmethod
    async def start(cls, protocol_factory, host: str, port: int, *, backlog: int = 4096) -> "TcpServer":
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                       flags=socket.AI_PASSIVE)
        sockets = []
        try:
            for family, type_, proto, _, address in dict.fromkeys(
                    (i[0], i[1], i[2], None, i[4]) for i in infos):
                sock = socket.socket(family, type_, proto)
                sockets.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.bind(address)
                sock.listen(backlog)
                sock.setblocking(False)
        except OSError:
            for sock in sockets:
                sock.close()
            raise
        return cls(loop, protocol_factory, sockets)

    @classmethod
    async def start_unix(cls, protocol_factory, path: str, *, backlog: int = 4096) -> "TcpServer":
        """Listen on a Unix socket at ``path`` (replacing a stale one)."""
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(path)
            sock.listen(backlog)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        return cls(asyncio.get_running_loop(), protocol_factory, [sock])

    @classmethod
    def without_listener(cls, protocol_factory) -> "TcpServer":
        """No listening socket: connections come through ``adopt`` only."""
        return cls(asyncio.get_running_loop(), protocol_factory, [])

    def _accept(self, listener: socket.socket) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                sock, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as exc:
                if exc.errno not in _RESOURCE_ERRORS:
                    raise
                log.error("listener %s: cannot accept (%s); pausing %.0fs",
                          listener.getsockname(), exc, ACCEPT_RETRY)
                self.loop.remove_reader(listener.fileno())
                self.loop.call_later(ACCEPT_RETRY, self._resume, listener)
                return
            self.adopt(sock)

    def adopt(self, sock: socket.socket, factory=None) -> None:
        """Serve an accepted socket (ours, or one a node's supervisor accepted and passed
        on, ``proxy.workers``) with a protocol from ``factory`` (default: the listener's)."""
        sock.setblocking(False)
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        fd = sock.detach()  # from here on a bare descriptor (module note)
        try:
            protocol = (factory or self._factory)()
        except Exception:
            log.exception("no protocol for an accepted connection; closing it")
            os.close(fd)
            return
        transport = SocketTransport(self, fd, protocol)
        try:
            transport.start()
        except Exception:
            log.exception("setting up an accepted connection failed; closing it")
            transport.abort()  # connection_lost follows, then the descriptor is closed

    def _poll(self) -> None:
        transports = self.transports
        for fd, events in self.epoll.poll(0, 1024):
            transport = transports.get(fd)
            if transport is not None:
                transport._ready(events)

    def _resume(self, listener: socket.socket) -> None:
        if not self._closed:
            self.loop.add_reader(listener.fileno(), self._accept, listener)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for sock in self.sockets:
            self.loop.remove_reader(sock.fileno())
            sock.close()
        self.release_epoll_if_done()  # accepted connections live on until the node closes them

    def release_epoll_if_done(self) -> None:
        """Closed and no connection left: the epoll set goes too."""
        if self._closed and not self.transports and self.epoll is not None:
            self.loop.remove_reader(self.epoll.fileno())
            self.epoll.close()
            self.epoll = None

    async def wait_closed(self) -> None:
        return None
