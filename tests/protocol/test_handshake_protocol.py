"""Protocol header, SASL and first-frame checks, over in-memory bytes."""

from __future__ import annotations

import struct

from memory import Harness
import pytest
from proton import Connection, Transport

from proxy.amqp.connection import AMQP_HEADER, Phase
from proxy.auth.sasl import INIT, OUTCOME, SASL_HEADER, decode_body, encode_frame
from proxy.auth.users import UsersFile, make_record


def users_file(tmp_path) -> UsersFile:
    users = UsersFile(tmp_path / "users.json")
    users.add(make_record("alice", "s3cret"))
    return users


def sasl_frames(data: bytes) -> list[tuple[int, list]]:
    frames = []
    while data:
        size, doff = struct.unpack_from(">IB", data)
        frames.append(decode_body(data[doff * 4 : size]))
        data = data[size:]
    return frames


def test_plain_with_right_password_opens_connection(tmp_path):
    h = Harness(mechanisms=("PLAIN",), users=users_file(tmp_path))
    c = h.client(sasl_mechs="PLAIN", user="alice", password="s3cret")
    assert c.connection.state & Connection.REMOTE_ACTIVE
    assert c.server.identity.user == "alice"
    snd = c.sender("q")
    assert snd.credit > 0


def test_plain_with_wrong_password_fails(tmp_path):
    h = Harness(mechanisms=("PLAIN",), users=users_file(tmp_path))
    c = h.client(sasl_mechs="PLAIN", user="alice", password="nope")
    assert c.server.phase is Phase.CLOSED
    assert "wrong password" in c.server.failure
    assert c.transport.condition.name == "amqp:unauthorized-access"
    assert not c.connection.state & Connection.REMOTE_ACTIVE


def test_unknown_user_fails(tmp_path):
    h = Harness(mechanisms=("PLAIN",), users=users_file(tmp_path))
    c = h.client(sasl_mechs="PLAIN", user="mallory", password="x")
    assert "unknown user" in c.server.failure


def test_unknown_mechanism_gets_auth_outcome(tmp_path):
    h = Harness(mechanisms=("PLAIN",), users=users_file(tmp_path))
    server = _bare_server(h)
    server.receive(SASL_HEADER + encode_frame(INIT, [("symbols", ["BOGUS"])]))
    out = server.take_output()
    assert out.startswith(SASL_HEADER)
    frames = sasl_frames(out[8:])
    assert frames[-1] == (OUTCOME, [1])  # sasl-code auth
    assert server.phase is Phase.CLOSED and "not offered" in server.failure


def _bare_server(h: Harness):
    from proxy.amqp.connection import ServerConnection
    from proxy.broker.handler import ClientHandler

    return ServerConnection(h.settings, h.authenticator, ClientHandler(h.broker), 0.0)


def test_wrong_protocol_header_gets_our_header_and_close():
    h = Harness()
    server = _bare_server(h)
    server.receive(b"GET / HTTP/1.1\r\n\r\n")
    assert server.take_output() == SASL_HEADER
    assert server.phase is Phase.CLOSED and server.finished


def test_garbage_is_refused_at_the_first_wrong_byte():
    h = Harness()
    server = _bare_server(h)
    server.receive(b"\x16\x03")  # a TLS client hello on a plaintext port
    assert server.phase is Phase.CLOSED


def test_sasl_required_refuses_bare_amqp_header():
    h = Harness(sasl_required=True)
    server = _bare_server(h)
    server.receive(AMQP_HEADER)
    assert server.take_output() == SASL_HEADER
    assert server.phase is Phase.CLOSED


def test_truncated_header_hits_the_handshake_deadline():
    h = Harness()
    server = _bare_server(h)
    server.receive(b"AMQ")
    assert server.phase is Phase.HEADER
    deadline = server.tick(0.0)
    assert deadline == h.settings.handshake_timeout
    server.tick(deadline)
    assert server.phase is Phase.CLOSED and "deadline" in server.failure


def test_oversized_first_frame_is_a_framing_error():
    h = Harness()
    server = _bare_server(h)
    frame = struct.pack(">IBBH", 2000, 2, 0, 0) + b"\x00" * 1992
    server.receive(AMQP_HEADER + frame)
    out = server.take_output()
    # a real proton client reads the answer: header, open, close(framing-error)
    client = Transport()
    conn = Connection()
    client.bind(conn)
    client.push(out)
    assert conn.remote_condition.name == "amqp:connection:framing-error"
    assert "512" in conn.remote_condition.description
    assert server.finished


def test_users_file_never_holds_the_password(tmp_path):
    users = users_file(tmp_path)
    users.save()
    text = (tmp_path / "users.json").read_text()
    assert "s3cret" not in text and "stored_key" in text
    loaded = UsersFile.load(tmp_path / "users.json")
    assert loaded.get("alice").check_password("s3cret")
    assert not loaded.get("alice").check_password("s3cret!")
    assert (tmp_path / "users.json").stat().st_mode & 0o777 == 0o600


def test_silent_peer_is_closed_after_idle_timeout():
    """§2.4.5: a peer that sends nothing for the idle timeout is closed."""
    from dataclasses import replace

    h = Harness()
    h.settings = replace(h.settings, idle_timeout=2.0)
    c = h.client()
    assert c.connection.state & Connection.REMOTE_ACTIVE
    assert 0 < c.transport.remote_idle_timeout <= 2.0  # proton advertises half, for margin
    c.server.tick(1.0)  # within the timeout: nothing happens
    h.pump()
    assert c.connection.remote_condition is None
    c.server.tick(10.0)  # the client stayed silent
    h.pump()
    assert c.connection.remote_condition.name == "amqp:resource-limit-exceeded"


def test_phases_move_only_as_written_down():
    """PHASE_TRANSITIONS is the whole story: every phase has its moves, others raise."""
    from proxy.amqp.connection import PHASE_TRANSITIONS, PhaseError

    assert set(PHASE_TRANSITIONS) == set(Phase)
    h = Harness()
    server = _bare_server(h)
    server.receive(AMQP_HEADER)  # header -> amqp
    assert server.phase is Phase.AMQP
    with pytest.raises(PhaseError):
        server._enter(Phase.SASL)
    assert server.phase is Phase.AMQP
