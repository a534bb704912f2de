"""Regressions found by the fuzzer, and containment of unexpected errors.

Each case once produced a traceback (or a connection left open) in a live node:
a non-UTF-8 string in a SASL frame, a non-UTF-8 link address, and a client
that half-closes in the middle of a frame. Containment: an exception in one
connection's event handling closes that connection with amqp:internal-error,
logs the traceback, and leaves the node serving everyone else.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
import threading
import time

import pytest
from conftest import free_port
from dmz_support import condition_of
from fuzz.frames import (
    AMQP_HEADER,
    SASL_ANONYMOUS,
    SASL_HEADER,
    SASL_INIT,
    attach_frame,
    begin_frame,
    binary,
    frame,
    open_frame,
    performative,
    sasl_frame,
    string,
    symbol,
)
from proton import Connection, Data, Message, Transport
from proton.utils import BlockingConnection

pytestmark = pytest.mark.dmz  # the DMZ gateway's tests: pytest -m dmz


def exchange(port: int, payload: bytes, timeout: float = 5.0) -> tuple[bytes, float]:
    """Send, half-close, read until the node closes; (reply, seconds)."""
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(payload)
        sock.shutdown(socket.SHUT_WR)
        reply = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            except socket.timeout:
                raise AssertionError(f"node did not close within {timeout}s") from None
            if not chunk:
                break
            reply += chunk
    return reply, time.monotonic() - start


def performatives(reply: bytes, wanted: tuple[int, ...]) -> list[tuple[int, list]]:
    """The AMQP frames of a reply with these descriptors, decoded with proton's codec."""
    data = reply[reply.index(AMQP_HEADER) + 8:]
    out = []
    while len(data) >= 8:
        size, doff = struct.unpack_from(">IB", data)
        body, data = data[doff * 4 : size], data[size:]
        if body:
            decoded = Data()
            decoded.decode(body)
            decoded.rewind()
            decoded.next()
            decoded.enter()
            decoded.next()
            code = int(decoded.get_object())
            if code in wanted:
                decoded.exit()
                value = decoded.get_object()
                out.append((code, list(value.value)))
    return out


def amqp_reply(reply: bytes) -> Connection:
    """Feed the AMQP part of a reply to a proton client transport; return its connection."""
    transport, conn = Transport(), Connection()
    transport.bind(conn)
    transport.push(reply[reply.index(AMQP_HEADER):])
    return conn


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    from conftest import NodeProcess

    node = NodeProcess(tmp_path_factory.mktemp("robust"), {"limits": {"handshake_timeout": 2.0}}).start()
    yield node
    node.stop()


def test_sasl_frame_with_a_non_utf8_string_is_a_protocol_error(node):
    bad_init = sasl_frame(SASL_INIT, [symbol("ANONYMOUS"), binary(b""), string(b"\xff\xfe")])
    reply, elapsed = exchange(node.port, SASL_HEADER + bad_init)
    assert reply.startswith(SASL_HEADER) and elapsed < 2  # mechanisms, then closed at once
    node.wait_log("undecodable SASL frame")


def test_attach_with_a_non_utf8_address_is_refused_as_invalid_field(node):
    stream = (SASL_HEADER + SASL_ANONYMOUS + AMQP_HEADER + open_frame() + begin_frame()
              + attach_frame("bad", 0, True, b"\xc3\x28"))  # type: ignore[arg-type]
    reply, _ = exchange(node.port, stream)
    detaches = [fields for code, fields in performatives(reply, (0x16,))]
    assert len(detaches) == 1
    error = detaches[0][2]  # detach: handle, closed, error
    assert error.value[0] == "amqp:invalid-field"


def test_half_close_inside_a_frame_is_closed_with_framing_error(node):
    partial = frame(performative(0x13, [b"\x43"] * 4))[:-3]  # a flow frame, cut short
    stream = SASL_HEADER + SASL_ANONYMOUS + AMQP_HEADER + open_frame() + partial
    reply, elapsed = exchange(node.port, stream)
    assert elapsed < 2  # not left open until the idle timeout
    assert amqp_reply(reply).remote_condition.name == "amqp:connection:framing-error"


def test_node_log_has_no_traceback(node):
    assert node.alive()
    assert "Traceback" not in node.log_path.read_text()


# -- containment, with an authorize hook that fails on one address ----------------------
class InProcessNode:
    """A Node on its own asyncio loop in a thread, so a test can give it a faulty hook."""

    def __init__(self, tmp_path, authorize) -> None:
        from proxy.config import settings as config_mod
        from proxy.node import Node

        self.port = free_port()
        config = config_mod.from_dict({"node": {"listen": f"127.0.0.1:{self.port}",
                                                "data_dir": str(tmp_path / "data")}})
        self.loop = asyncio.new_event_loop()
        self.node = Node(config)
        self.node.broker.authorize = authorize
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.node.start(), self.loop).result(10)
        self.url = f"amqp://127.0.0.1:{self.port}"

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.node.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def test_an_exception_in_one_connection_closes_only_that_connection(tmp_path, caplog):
    def authorize(identity, address, direction):
        if address == "boom":
            raise RuntimeError("a bug in an authorization hook")
        return True

    server = InProcessNode(tmp_path, authorize)
    try:
        bystander = BlockingConnection(server.url, timeout=10)
        receiver = bystander.create_receiver("q", credit=10)
        victim = BlockingConnection(server.url, timeout=10)
        with caplog.at_level(logging.ERROR, logger="fedgate.server"):
            with pytest.raises(Exception) as info:
                victim.create_sender("boom")
        assert condition_of(info.value) == "amqp:internal-error"
        assert any("internal error" in r.message and r.exc_info for r in caplog.records)
        assert "a bug in an authorization hook" in caplog.text
        sender = bystander.create_sender("q")
        sender.send(Message(body="still here"))
        assert receiver.receive(timeout=5).body == "still here"
        receiver.accept()
        again = BlockingConnection(server.url, timeout=10)  # new connections are served too
        again.create_sender("q").send(Message(body="new"))
        again.close()
        bystander.close()
    finally:
        server.stop()
