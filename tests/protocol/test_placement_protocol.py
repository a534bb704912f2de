"""Placement by first attach (issue #36): a worker reads a new connection's first attach
before proton does and may hand the connection, with the frames it held, to the worker
that owns its queue. Here over in-memory bytes: two brokers stand for two workers."""

from __future__ import annotations

from memory import Harness
from proton import Connection, Message, Transport

from proxy.amqp.connection import AMQP_HEADER, Identity, ServerConnection
from proxy.amqp.first_attach import MAX_HELD, only_open_and_begin, sniff
from proxy.amqp.termini import set_capabilities
from proxy.broker.handler import ClientHandler
from proxy.workers.ownership import CONSUMER, PRODUCER, balanced_worker


# -- the frames a client sends, as proton writes them --------------------------------
def client_frames(*, sender: str | None = None, receiver: str | None = None,
                  dynamic: bool = False, relay: bool = False, links: bool = True,
                  capabilities: tuple[str, ...] = ()) -> bytes:
    """What a proton client writes after its AMQP header: open, begin, its attach."""
    connection, transport = Connection(), Transport()
    transport.bind(connection)
    connection.open()
    if links:
        session = connection.session()
        session.open()
        if sender is not None or relay:
            link = session.sender("s")
            link.target.address = sender  # None: the anonymous relay (no target address)
            if capabilities:
                set_capabilities(link.target, capabilities)
            link.open()
        if receiver is not None or dynamic:
            link = session.receiver("r")
            if dynamic:
                link.source.dynamic = True
            else:
                link.source.address = receiver
            link.open()
    out = bytes(transport.peek(transport.pending()))
    assert out.startswith(AMQP_HEADER)
    return out[len(AMQP_HEADER):]


def test_the_first_attach_is_read_from_a_sender_and_from_a_receiver():
    sent = sniff(client_frames(sender="orders"))
    assert (sent.state, sent.address, sent.receiver) == ("attach", "orders", False)
    got = sniff(client_frames(receiver="orders"))
    assert (got.state, got.address, got.receiver) == ("attach", "orders", True)


def test_a_primary_replication_link_is_told_apart_from_a_client_sender():
    """A backup copy's first use weighs less in the owners' table (issue #45)."""
    from proxy.replication.links import REPLICATION

    assert not sniff(client_frames(sender="orders")).replication
    assert not sniff(client_frames(sender="orders", capabilities=("queue",))).replication
    pushed = sniff(client_frames(sender="orders", capabilities=(REPLICATION,)))
    assert (pushed.state, pushed.address, pushed.replication) == ("attach", "orders", True)
    both = sniff(client_frames(sender="orders", capabilities=("queue", REPLICATION)))
    assert both.replication


def test_an_incomplete_frame_waits_and_open_and_begin_pass_to_proton():
    frames = client_frames(sender="orders")
    for cut in (1, 7, 12, len(frames) - 1):
        assert sniff(frames[:cut]).state == "wait", cut
    # open (and begin) only: a client waiting for our open before it begins (go-amqp, JMS)
    assert sniff(client_frames(links=False)).state == "pass"
    assert only_open_and_begin(client_frames(links=False))
    assert not only_open_and_begin(client_frames(sender="orders"))  # an attach among them
    assert not only_open_and_begin(client_frames(links=False) + b"\x00\x00\x00\x08\x02\x00\x00\x00")


def test_what_cannot_be_placed_is_served_here():
    assert sniff(client_frames(dynamic=True)).state == "serve"  # a dynamic node: no address
    assert sniff(client_frames(relay=True)).state == "serve"  # the anonymous relay
    assert sniff(b"\x00\x00\x00\x08\x02\x00\x00\x00" + client_frames(sender="q")).state == "serve"
    assert sniff(b"\x00" * (MAX_HELD + 1)).state == "serve"
    assert sniff(b"\x00\x00\x00\x04\x02\x00\x00\x00").state == "serve"  # not a frame we read


def test_a_fragmented_queue_places_each_role_where_it_is_missing():
    # worker 0 has a consumer and no producer: a producer arriving on worker 1 goes there
    assert balanced_worker({0: [1, 0]}, 1, PRODUCER, [0, 1]) == 0
    # a consumer with no producer anywhere stays where it landed
    assert balanced_worker({0: [1, 0]}, 1, CONSUMER, [0, 1]) == 1
    # both workers lack a producer equally: the one where it landed
    assert balanced_worker({0: [1, 0], 1: [1, 0]}, 1, PRODUCER, [0, 1]) == 1
    # producers waiting on worker 1 draw a consumer there
    assert balanced_worker({1: [0, 2]}, 0, CONSUMER, [0, 1]) == 1
    # a worker that is not running gets nothing
    assert balanced_worker({0: [3, 0]}, 1, PRODUCER, [1]) == 1


# -- a connection begun on one worker, served by another -----------------------------
def placing_client(harness: Harness):
    """A client whose server side holds its first attach (as a worker does); not pumped."""
    from memory import Client

    client = Client(harness)
    client.server.placing = True
    return client


def open_link(client, *, sender: str | None = None, receiver: str | None = None):
    session = client.session or client.connection.session()
    client.session = session
    session.open()
    if sender is not None:
        link = session.sender("s")
        link.target.address = sender
    else:
        link = session.receiver("r")
        link.source.address = receiver
        client.inbox[link] = []
    link.open()
    return link


def hand_over(client, a: Harness, b: Harness) -> None:
    """What the worker that owns the queue does with the connection worker A held."""
    server_a = client.server
    frames, answered = server_a.handover()
    server_b = ServerConnection(b.settings, b.authenticator, handler := ClientHandler(b.broker), 0.0)
    handler.server_connection = server_b
    server_b.resume_handed_over(Identity("anonymous", "ANONYMOUS"), frames, answered)
    server_a.release()
    a.clients.remove(client)
    client.server, client.handler = server_b, handler
    b.clients.append(client)


def test_a_connection_handed_over_after_its_first_attach_is_served_by_the_owner():
    """Worker A holds the client's open, begin and attach back from proton; worker B
    resumes from them; the client sees one ordinary connection (one AMQP header)."""
    a, b = Harness(), Harness()
    producer = placing_client(a)
    link = open_link(producer, sender="orders")
    a.pump()
    attach = producer.server.first_attach
    assert attach is not None and (attach.address, attach.receiver) == ("orders", False)
    assert not producer.connection.state & Connection.REMOTE_ACTIVE  # nothing but our header yet
    assert a.broker.queues.get("orders") is None  # worker A never saw the attach
    assert producer.server.handover()[1] == AMQP_HEADER  # nothing but our header was written
    hand_over(producer, a, b)
    b.pump()
    assert producer.connection.state & Connection.REMOTE_ACTIVE
    assert link.credit > 0, "the owner answered the attach and gave credit"
    for n in range(20):
        producer.send(link, Message(id=f"m{n}", body=n))
    b.pump()
    consumer = b.client()
    receiver = consumer.receiver("orders", credit=50)
    b.pump()
    assert [r.message.id for r in consumer.received(receiver)] == [f"m{n}" for n in range(20)]
    assert producer.transport.condition is None, producer.transport.condition


def test_a_connection_not_handed_over_is_served_where_it_landed():
    a = Harness()
    producer = placing_client(a)
    link = open_link(producer, sender="orders")
    a.pump()
    assert producer.server.first_attach is not None
    producer.server.serve_here()
    a.pump()
    assert link.credit > 0
    producer.send(link, Message(id="here", body=1))
    a.pump()
    assert a.broker.queues.get("orders").depth == 1


def test_a_client_that_waits_for_our_open_and_begin_is_handed_over_after_them():
    """go-amqp and Qpid JMS wait for our open (and begin) before they attach: worker A's
    proton answers them; worker B reads the same frames, and its answers, which the
    client has already, are dropped."""
    a, b = Harness(), Harness()
    client = placing_client(a)
    a.pump()  # SASL, header, open: answered by A
    assert client.connection.state & Connection.REMOTE_ACTIVE
    client.session = client.connection.session()
    client.session.open()
    a.pump()  # begin: answered by A
    assert client.session.state & Connection.REMOTE_ACTIVE
    assert client.server.placing and client.server.first_attach is None
    link = open_link(client, receiver="orders")
    a.pump()
    attach = client.server.first_attach
    assert (attach.address, attach.receiver) == ("orders", True)
    frames, answered = client.server.handover()
    assert answered.startswith(AMQP_HEADER) and len(answered) > len(AMQP_HEADER)
    hand_over(client, a, b)
    link.flow(10)
    b.pump()
    assert link.state & Connection.REMOTE_ACTIVE  # B answered the attach
    producer = b.client()
    sender = producer.sender("orders")
    for n in range(5):
        producer.send(sender, Message(id=f"m{n}", body=n))
    b.pump()
    assert [r.message.id for r in client.received(link)] == [f"m{n}" for n in range(5)]
    assert client.transport.condition is None, client.transport.condition


def test_a_heartbeat_written_before_the_attach_keeps_the_connection_where_it_is():
    a = Harness()
    client = placing_client(a)
    a.pump()
    client.server._placement_output(b"\x00\x00\x00\x08\x02\x00\x00\x00")  # as an idle tick writes
    assert client.server.placing  # still reading for the first attach, but it will stay here
    link = open_link(client, sender="orders")
    a.pump()
    assert client.server.first_attach is not None
    assert client.server.handover() is None  # B could not write the same: served here
    client.server.serve_here()
    a.pump()
    assert link.credit > 0


def test_a_long_wait_for_the_first_attach_stops_holding_within_bounds():
    a = Harness()
    client = placing_client(a)
    a.pump()
    for _ in range(MAX_HELD // 30 + 10):  # sessions begun, never an attach
        session = client.connection.session()
        session.open()
        a.pump()
    assert not client.server.placing  # the bound (or a refused session's end) ended it
    assert client.server._replayed == client.server._answered == b""
