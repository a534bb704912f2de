"""Each protocol header is answered on receipt (AMQP 1.0 §2.2, §5.2, §5.3), over real sockets.

A client may wait for the node's header before it sends anything else
(go-amqp does): the node must not hold its own header back until the first
frame arrives. For each layer combination (plain, SASL, TLS, TLS + SASL) a
socket sends one header alone and must read the answer within 1 s; with
SASL, the AMQP header sent alone after the SASL outcome is answered too.
"""

from __future__ import annotations

import socket
import ssl
import struct

import pytest

from proxy.auth.sasl import INIT, OUTCOME, SASL_HEADER, decode_body, encode_frame

AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
ANSWER_WITHIN = 1.0  # seconds


@pytest.fixture(scope="module")
def nodes(tmp_path_factory, certs):
    """One node per layer combination: {(tls, sasl_required): node}."""
    from conftest import NodeProcess

    workdir = tmp_path_factory.mktemp("headers")
    tls = {"cert": str(certs.server_cert), "key": str(certs.server_key)}
    started = {}
    try:
        for use_tls in (False, True):
            for sasl_required in (False, True):
                config = {"sasl": {"mechanisms": ["ANONYMOUS"], "require": sasl_required}}
                if use_tls:
                    config["tls"] = tls
                name = f"{'tls' if use_tls else 'tcp'}-{'sasl' if sasl_required else 'open'}"
                started[use_tls, sasl_required] = NodeProcess(workdir, config, name).start()
        yield started
    finally:
        for node in started.values():
            node.stop()


def connect(node, certs, use_tls: bool) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", node.port), timeout=5)
    if use_tls:
        context = ssl.create_default_context(cafile=str(certs.ca))
        sock = context.wrap_socket(sock, server_hostname="localhost")
    sock.settimeout(ANSWER_WITHIN)
    return sock


def read_exactly(sock: socket.socket, size: int) -> bytes:
    """``size`` bytes, each read bounded by the socket's 1 s timeout."""
    data = b""
    while len(data) < size:
        try:
            chunk = sock.recv(size - len(data))
        except socket.timeout:
            raise AssertionError(f"no answer within {ANSWER_WITHIN}s; got {data!r}") from None
        if not chunk:
            raise AssertionError(f"closed after {data!r}")
        data += chunk
    return data


def read_sasl_frame(sock: socket.socket) -> tuple[int, list]:
    size, doff = struct.unpack(">IB", read_exactly(sock, 5))
    body = read_exactly(sock, size - 5)
    return decode_body(body[doff * 4 - 5:])


def anonymous_init() -> bytes:
    """sasl-init with the mechanism ANONYMOUS (§5.3.3.2)."""
    return encode_frame(INIT, [("symbol", "ANONYMOUS"), ("binary", b"")])


LAYERS = [(False, False), (False, True), (True, False), (True, True)]
IDS = ["plain", "sasl", "tls", "tls+sasl"]


@pytest.mark.parametrize("use_tls, sasl_required", LAYERS, ids=IDS)
def test_sasl_header_alone_is_answered(nodes, certs, use_tls, sasl_required):
    with connect(nodes[use_tls, sasl_required], certs, use_tls) as sock:
        sock.sendall(SASL_HEADER)
        assert read_exactly(sock, 8) == SASL_HEADER
        code, _ = read_sasl_frame(sock)  # sasl-mechanisms follows at once (§5.3.2)
        assert code != OUTCOME


@pytest.mark.parametrize("use_tls, sasl_required", LAYERS, ids=IDS)
def test_amqp_header_alone_after_sasl_outcome_is_answered(nodes, certs, use_tls, sasl_required):
    with connect(nodes[use_tls, sasl_required], certs, use_tls) as sock:
        sock.sendall(SASL_HEADER)
        read_exactly(sock, 8)
        read_sasl_frame(sock)
        sock.sendall(anonymous_init())
        assert read_sasl_frame(sock) == (OUTCOME, [0])  # sasl-code ok
        sock.sendall(AMQP_HEADER)  # and nothing more until the node answers
        assert read_exactly(sock, 8) == AMQP_HEADER


@pytest.mark.parametrize("use_tls", [False, True], ids=["plain", "tls"])
def test_bare_amqp_header_alone_is_answered_when_sasl_is_optional(nodes, certs, use_tls):
    with connect(nodes[use_tls, False], certs, use_tls) as sock:
        sock.sendall(AMQP_HEADER)
        assert read_exactly(sock, 8) == AMQP_HEADER


@pytest.mark.parametrize("use_tls", [False, True], ids=["plain", "tls"])
def test_bare_amqp_header_is_refused_at_once_when_sasl_is_required(nodes, certs, use_tls):
    """§2.2: the header we do support comes back, then the socket closes."""
    with connect(nodes[use_tls, True], certs, use_tls) as sock:
        sock.sendall(AMQP_HEADER)
        assert read_exactly(sock, 8) == SASL_HEADER
        try:
            rest = sock.recv(64)
        except (ConnectionResetError, ssl.SSLError):
            rest = b""
        assert rest == b""


@pytest.mark.parametrize("use_tls", [False, True], ids=["plain", "tls"])
def test_oversized_first_frame_after_an_answered_header_gets_a_framing_error(nodes, certs, use_tls):
    """The first-frame guard stays: header answered, then open + close(framing-error)."""
    from proton import Connection, Transport

    with connect(nodes[use_tls, False], certs, use_tls) as sock:
        sock.sendall(AMQP_HEADER)
        reply = read_exactly(sock, 8)
        assert reply == AMQP_HEADER
        sock.sendall(struct.pack(">IBBH", 4000, 2, 0, 0) + b"\x00" * 64)
        sock.settimeout(5)
        while True:
            try:
                chunk = sock.recv(65536)
            except (ConnectionResetError, ssl.SSLError):
                break
            if not chunk:
                break
            reply += chunk
    transport, conn = Transport(), Connection()
    transport.bind(conn)
    transport.push(reply)
    assert conn.remote_condition.name == "amqp:connection:framing-error"
    assert "512" in conn.remote_condition.description
