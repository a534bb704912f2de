"""TLS listener: TLS-only when [tls] is configured; optional client-certificate checks."""

from __future__ import annotations

import socket
import ssl

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
