"""proxy.tcp_server: the lean plain-TCP transport keeps asyncio's protocol contract.

Real sockets on 127.0.0.1 in one event loop; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import socket

import pytest

from proxy.net.tcp_server import TcpServer

TIMEOUT = 10.0


class Recorder(asyncio.Protocol):
    """Records the callbacks; optional behaviour on input and end of input."""

    def __init__(self, *, reply_on_eof: bytes = b"", keep_open_on_eof: bool = True) -> None:
        self.transport = None
        self.data = bytearray()
        self.calls: list[str] = []
        self.lost = asyncio.get_running_loop().create_future()
        self.eof = asyncio.Event()
        self.reply_on_eof = reply_on_eof
        self.keep_open_on_eof = keep_open_on_eof

    def connection_made(self, transport) -> None:
        self.calls.append("made")
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.data += data

    def eof_received(self) -> bool:
        self.calls.append("eof")
        self.eof.set()
        if self.reply_on_eof:
            self.transport.write(self.reply_on_eof)
            self.transport.close()
        return self.keep_open_on_eof

    def pause_writing(self) -> None:
        self.calls.append("pause")

    def resume_writing(self) -> None:
        self.calls.append("resume")

    def connection_lost(self, exc) -> None:
        self.calls.append("lost")
        if not self.lost.done():
            self.lost.set_result(exc)


async def serve(**protocol_options):
    protocols: list[Recorder] = []
    accepted = asyncio.Queue()

    def factory():
        protocol = Recorder(**protocol_options)
        protocols.append(protocol)
        accepted.put_nowait(protocol)
        return protocol

    server = await TcpServer.start(factory, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], accepted


async def read_all(reader: asyncio.StreamReader) -> bytes:
    return await asyncio.wait_for(reader.read(), TIMEOUT)


def test_input_end_of_input_and_a_reply_written_after_it():
    async def main():
        server, port, accepted = await serve(reply_on_eof=b"bye")
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        protocol = await asyncio.wait_for(accepted.get(), TIMEOUT)
        assert protocol.transport.get_extra_info("peername") == writer.get_extra_info("sockname")
        writer.write(b"hello " * 1000)
        await writer.drain()
        writer.write_eof()  # half-close: the server still writes its reply, then closes
        assert await read_all(reader) == b"bye"
        assert await asyncio.wait_for(protocol.lost, TIMEOUT) is None
        assert bytes(protocol.data) == b"hello " * 1000
        assert protocol.calls == ["made", "eof", "lost"]
        writer.close()
        server.close()

    asyncio.run(main())


def test_a_slow_reader_pauses_the_writer_and_gets_every_byte_in_order():
    async def main():
        server, port, accepted = await serve()
        sock = socket.create_connection(("127.0.0.1", port))
        protocol = await asyncio.wait_for(accepted.get(), TIMEOUT)
        protocol.transport.set_write_buffer_limits(high=64 * 1024)
        payload = bytes(range(256)) * 4096 * 16  # 16 MB, more than the socket buffers hold
        for offset in range(0, len(payload), 65536):
            protocol.transport.write(payload[offset:offset + 65536])
        assert "pause" in protocol.calls and protocol.transport.get_write_buffer_size() > 0
        protocol.transport.close()  # after the buffer is written

        loop = asyncio.get_running_loop()
        sock.setblocking(False)
        received = bytearray()
        while True:
            chunk = await asyncio.wait_for(loop.sock_recv(sock, 1 << 20), TIMEOUT)
            if not chunk:
                break
            received += chunk
        assert bytes(received) == payload
        assert await asyncio.wait_for(protocol.lost, TIMEOUT) is None
        assert protocol.calls.count("pause") == 1 and protocol.calls.count("resume") == 1
        assert protocol.calls[-1] == "lost" and protocol.calls.count("lost") == 1
        sock.close()
        server.close()

    asyncio.run(main())


def test_what_the_protocol_writes_from_resume_writing_is_sent_whole():
    """Issue #33: a write made from resume_writing once the kernel had taken the whole
    buffer was dropped with it, and the transport stayed paused for good."""
    async def main():
        server, port, accepted = await serve()
        sock = socket.create_connection(("127.0.0.1", port))
        protocol = await asyncio.wait_for(accepted.get(), TIMEOUT)
        transport = protocol.transport
        transport.set_write_buffer_limits(high=64 * 1024)
        payloads = [bytes([n]) * (3_000_000 + n) for n in range(1, 6)]  # each several MB
        waiting = list(payloads)
        paused = []

        def write_on() -> None:  # as a node does: what waited goes out once writing resumes
            while waiting and not paused:
                transport.write(waiting.pop(0))
            if not waiting and not paused:
                transport.close()

        protocol.pause_writing = lambda: paused.append(True)
        protocol.resume_writing = lambda: (paused.clear(), write_on())
        write_on()
        assert paused, "the first payload filled the socket"
        loop = asyncio.get_running_loop()
        sock.setblocking(False)
        received = bytearray()
        while True:
            chunk = await asyncio.wait_for(loop.sock_recv(sock, 1 << 20), TIMEOUT)
            if not chunk:
                break
            received += chunk
        assert bytes(received) == b"".join(payloads)
        assert await asyncio.wait_for(protocol.lost, TIMEOUT) is None
        sock.close()
        server.close()

    asyncio.run(main())


def test_abort_and_a_peer_reset_each_end_with_one_connection_lost():
    async def main():
        server, port, accepted = await serve()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        protocol = await asyncio.wait_for(accepted.get(), TIMEOUT)
        protocol.transport.abort()
        protocol.transport.abort()
        assert await asyncio.wait_for(protocol.lost, TIMEOUT) is None
        assert await read_all(reader) == b""  # the client sees the end
        writer.close()

        sock = socket.create_connection(("127.0.0.1", port))
        protocol = await asyncio.wait_for(accepted.get(), TIMEOUT)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        sock.close()  # linger 0: the peer resets the connection
        exc = await asyncio.wait_for(protocol.lost, TIMEOUT)
        for _ in range(3):  # writes after the reset fail quietly into the same end
            protocol.transport.write(b"x" * 100000)
            await asyncio.sleep(0.01)
        assert protocol.calls.count("lost") == 1
        assert exc is None or isinstance(exc, OSError)
        server.close()
        assert server.epoll is None  # the last connection gone after close: the epoll set too

    asyncio.run(main())


def test_starting_on_a_port_in_use_raises_and_leaves_no_socket_behind():
    async def main():
        server, port, _ = await serve()
        with pytest.raises(OSError):
            await TcpServer.start(lambda: None, "127.0.0.1", port)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)  # the first still serves
        writer.close()
        server.close()

    asyncio.run(main())
