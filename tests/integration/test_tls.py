"""TLS listener: TLS-only when [tls] is configured; optional client-certificate checks."""

from __future__ import annotations

import socket
import ssl
import time

import pytest

from proxy.auth.sasl import SASL_HEADER


def tls_hello(port: int, context: ssl.SSLContext) -> bytes:
    """TLS handshake, then the AMQP SASL header; return the node's first bytes."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with context.wrap_socket(raw, server_hostname="localhost") as sock:
            sock.sendall(SASL_HEADER)
            return sock.recv(8)


def client_context(certs, cert=None, key=None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(certs.ca))
    if cert:
        context.load_cert_chain(str(cert), str(key))
    return context


def test_tls_listener_serves_amqps_and_refuses_plaintext(start_node, certs, clients, tmp_path):
    node = start_node({"tls": {"cert": str(certs.server_cert), "key": str(certs.server_key)}})
    assert tls_hello(node.port, client_context(certs)) == SASL_HEADER
    amqps = node.url.replace("amqp://", "amqps://")
    (sent,) = clients("rhea", "send", amqps, address="secure", count=5, tls_insecure=True).finish()
    assert sent["accepted"] == 5
    lines = clients("rhea", "send", node.url, address="secure", count=1, timeout_ms=5000).finish()
    assert lines[-1]["error"] is not None  # plaintext AMQP on a TLS port fails


def test_mutual_tls_requires_a_trusted_client_certificate(start_node, certs):
    node = start_node({"tls": {"cert": str(certs.server_cert), "key": str(certs.server_key),
                               "ca": str(certs.ca), "verify_client": True}})
    good = client_context(certs, certs.client_cert, certs.client_key)
    assert tls_hello(node.port, good) == SASL_HEADER
    for bad in (client_context(certs), client_context(certs, certs.rogue_cert, certs.rogue_key)):
        with pytest.raises((ssl.SSLError, ConnectionResetError, BrokenPipeError)):
            reply = tls_hello(node.port, bad)
            if reply == b"":  # TLS 1.3: the alert arrives as a closed stream
                raise ssl.SSLError("closed by the node")


def test_tls_handshakes_under_way_are_capped_and_limits_apply_before_tls(start_node, certs):
    """Issue #21: limits were applied only after the TLS handshake, so one address opening
    handshakes drove a node to 4 GB. Now a connection is admitted (limits) before any TLS work,
    and at most ``max_pending_handshakes`` handshakes are under way: past that, closed at once."""
    node = start_node({"tls": {"cert": str(certs.server_cert), "key": str(certs.server_key)},
                       "limits": {"max_pending_handshakes": 3, "handshake_timeout": 30}})
    silent = [socket.create_connection(("127.0.0.1", node.port), timeout=5) for _ in range(3)]
    try:
        refused = []
        for _ in range(5):  # the handshake slots are taken by silent clients
            sock = socket.create_connection(("127.0.0.1", node.port), timeout=5)
            try:
                refused.append(sock.recv(1) == b"")  # closed by the node without a byte
            except ConnectionResetError:
                refused.append(True)
            finally:
                sock.close()
        assert refused == [True] * 5
        node.wait_log("max_pending_handshakes")
    finally:
        for sock in silent:
            sock.close()
    # the slots come back once the node has seen the silent clients go: a real client gets in
    for _ in range(50):  # bounded: 5 s
        try:
            assert tls_hello(node.port, client_context(certs)) == SASL_HEADER
            break
        except (ConnectionError, ssl.SSLError, OSError):
            time.sleep(0.1)
    else:
        raise AssertionError("no handshake after the silent clients left")
