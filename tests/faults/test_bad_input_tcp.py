"""Hostile and broken input against a live node, while another client keeps working.

Each case: the offender gets a clear answer (a protocol header, a SASL outcome,
or a close with an AMQP error condition) and its socket is closed within a
bounded time; a long-lived receiver on another connection still gets messages;
the node keeps running.
"""

from __future__ import annotations

import socket
import struct
import subprocess
import time

import pytest
from conftest import PYTHON, ROOT
from proton import Connection, Message, Transport
from proton.utils import BlockingConnection

from proxy.auth.sasl import INIT, OUTCOME, SASL_HEADER, decode_body, encode_frame

AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
DEADLINE = 1.0  # the node's handshake deadline in these tests


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    from conftest import NodeProcess

    workdir = tmp_path_factory.mktemp("bad-input")
    users = workdir / "users.json"
    subprocess.run(
        [PYTHON, "-m", "proxy", "users", "add", "alice", "--file", str(users), "--password-stdin"],
        input=b"correct horse\n", check=True, cwd=ROOT, capture_output=True,
    )
    node = NodeProcess(workdir, {
        "sasl": {"mechanisms": ["ANONYMOUS", "PLAIN"], "users_file": str(users),
                 "allow_plain_without_tls": True},
        "limits": {"handshake_timeout": DEADLINE},
    }).start()
    yield node
    node.stop()


@pytest.fixture(scope="module")
def canary(secured):
    """A client with a working link, kept open across all the bad-input cases."""
    conn = BlockingConnection(secured.url, timeout=10)
    receiver = conn.create_receiver("canary", credit=10)
    sender = conn.create_sender("canary")
    yield sender, receiver
    conn.close()


def canary_still_works(canary, marker: str) -> None:
    sender, receiver = canary
    sender.send(Message(id=marker, body=marker))
    assert receiver.receive(timeout=5).id == marker
    receiver.accept()


def exchange(url: str, payload: bytes, timeout: float = 5.0) -> tuple[bytes, float]:
    """Send raw bytes, read until the node closes; return (reply, seconds to close)."""
    host, port = url.removeprefix("amqp://").split(":")
    start = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        if payload:
            sock.sendall(payload)
        reply = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except (ConnectionResetError, socket.timeout) as exc:
                if isinstance(exc, socket.timeout):
                    raise AssertionError(f"node did not close within {timeout}s; got {reply!r}")
                break
            if not chunk:
                break
            reply += chunk
    return reply, time.monotonic() - start


def sasl_frames(data: bytes):
    frames = []
    while len(data) >= 8:
        size, doff = struct.unpack_from(">IB", data)
        frames.append(decode_body(data[doff * 4 : size]))
        data = data[size:]
    return frames


def amqp_close_condition(reply: bytes):
    transport, conn = Transport(), Connection()
    transport.bind(conn)
    transport.push(reply)
    return conn.remote_condition


def test_garbage_bytes(secured, canary):
    reply, _ = exchange(secured.url, b"\xde\xad\xbe\xef" * 64)
    assert reply == SASL_HEADER  # §2.2: our supported header, then close
    canary_still_works(canary, "after-garbage")


def test_wrong_protocol_header(secured, canary):
    reply, _ = exchange(secured.url, b"AMQP\x01\x01\x00\x0a")
    assert reply == SASL_HEADER
    canary_still_works(canary, "after-wrong-header")


def test_truncated_header_closed_at_deadline(secured, canary):
    reply, elapsed = exchange(secured.url, b"AMQ")
    assert reply == b"" and elapsed < DEADLINE + 2
    canary_still_works(canary, "after-truncated")


def test_frame_larger_than_512_before_open(secured, canary):
    frame = struct.pack(">IBBH", 4096, 2, 0, 0) + b"\x00" * 4088
    reply, _ = exchange(secured.url, AMQP_HEADER + frame)
    condition = amqp_close_condition(reply)
    assert condition.name == "amqp:connection:framing-error"
    canary_still_works(canary, "after-oversized")


def test_oversized_sasl_frame(secured, canary):
    frame = struct.pack(">IBBH", 100_000, 2, 1, 0) + b"\x00" * 100
    reply, _ = exchange(secured.url, SASL_HEADER + frame)
    assert reply.startswith(SASL_HEADER)  # mechanisms were offered, then the node closed
    canary_still_works(canary, "after-sasl-oversized")


def test_plain_with_wrong_password(secured, canary, clients):
    lines = clients("rhea", "send", secured.url, address="q", count=1, username="alice",
                    password="wrong", timeout_ms=10000).finish()
    assert lines[-1]["error"]["condition"] == "amqp:unauthorized-access"
    lines = clients("proton", "send", secured.url, address="q", count=1, username="alice",
                    password="wrong", timeout_ms=10000).finish()
    assert lines[-1]["error"]["condition"] == "amqp:unauthorized-access"
    canary_still_works(canary, "after-wrong-password")


def test_plain_with_right_password_works(secured, clients):
    (result,) = clients("rhea", "send", secured.url, address="q", count=3, username="alice",
                        password="correct horse").finish()
    assert result["accepted"] == 3


def test_unknown_sasl_mechanism(secured, canary):
    reply, _ = exchange(secured.url, SASL_HEADER + encode_frame(INIT, [("symbols", ["GSSAPI"])]))
    frames = sasl_frames(reply[8:])
    assert frames[-1] == (OUTCOME, [1])  # sasl-code auth, then closed
    canary_still_works(canary, "after-unknown-mech")


def test_node_survived_everything(secured, canary):
    assert secured.alive()
    canary_still_works(canary, "at-the-end")
