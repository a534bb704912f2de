"""A client may open ``limits.max_sessions_per_connection`` sessions; one more is ended."""

from __future__ import annotations

import dataclasses

from memory import Harness
from proton import Endpoint, Message


def test_a_session_over_the_limit_is_ended_with_resource_limit_exceeded_and_the_others_work():
    harness = Harness()
    harness.settings = dataclasses.replace(harness.settings, max_sessions=2)
    client = harness.client()
    sessions = [client.connection.session() for _ in range(3)]
    for session in sessions:
        session.open()
    harness.pump()

    assert [bool(s.state & Endpoint.REMOTE_ACTIVE) for s in sessions[:2]] == [True, True]
    refused = sessions[2]
    assert refused.state & Endpoint.REMOTE_CLOSED
    assert refused.remote_condition.name == "amqp:resource-limit-exceeded"

    # the connection and its sessions within the limit keep working
    client.session = sessions[1]
    receiver = client.receiver("q.sessions", credit=10)
    sender = client.sender("q.sessions")
    harness.pump()
    for n in range(3):
        client.send(sender, Message(id=n, body=f"m{n}"))
    harness.pump()
    assert sorted(r.message.id for r in client.received(receiver)) == [0, 1, 2]
    assert not (client.connection.state & Endpoint.REMOTE_CLOSED)


def test_ending_a_session_frees_its_place():
    harness = Harness()
    harness.settings = dataclasses.replace(harness.settings, max_sessions=1)
    client = harness.client()
    first = client.connection.session()
    first.open()
    harness.pump()
    first.close()
    harness.pump()
    assert first.state & Endpoint.REMOTE_CLOSED and first.remote_condition is None
    second = client.connection.session()
    second.open()
    harness.pump()
    assert second.state & Endpoint.REMOTE_ACTIVE
