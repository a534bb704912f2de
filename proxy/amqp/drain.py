"""Answering a receiver's drain on our sending links (AMQP 1.0 §2.6.7).

How this works
--------------
A receiver sets ``drain`` on a flow to ask the sender to use up its credit:
send what it has, then advance ``delivery-count`` over the credit left and
send its flow state back. go-amqp's ``DrainCredit`` (and RabbitMQ's answer
to it) make that flow the end of the drain: the client waits for it, also
when it drained with ``link-credit = 0`` on an empty queue.

proton sends a sender's flow state only from ``pn_link_drained``, and only
when the link has credit left (``link->credit > 0``): a drain with no credit
(credit 0 asked for, or every credit used by transfers before the queue ran
dry) goes unanswered. ``answer_drain`` covers that case by giving the sender
one credit of its own with ``pn_link_flow`` and draining it at once: proton
then advances ``delivery-count`` by the protocol-level credit (none) and
sends ``flow(delivery-count unchanged, link-credit 0, drain true)``, which is
exactly the answer. ``pn_link_flow`` asserts that its link is a receiver;
python-qpid-proton is built with ``NDEBUG`` (Python's own compiler flags),
where that check is compiled out. ``answer_drain_at_zero`` is set at import
by trying it on a pair of in-memory transports; where it is off (a proton
built with assertions), a drain at credit 0 stays unanswered, as before, and
the node says so at start.

Each endpoint answers one drain request once: it notes the request when the
client's flow arrives (``pn_link_get_drain``) and calls ``answer_drain`` when
nothing more will come for the credit (the queue has nothing for it, the
primary answered), then forgets the request.
"""

from __future__ import annotations

import sysconfig

from cproton import lib as _lib

_credit = _lib.pn_link_credit
_drained = _lib.pn_link_drained
_flow = _lib.pn_link_flow
_get_drain = _lib.pn_link_get_drain


def answer_drain(link) -> None:
    """The drain on sender ``link`` is done: use up its credit and send its flow state.

    Nothing when the receiver's last flow did not ask for a drain (a later flow
    without it replaced the request): proton would keep the credit given here.
    """
    if not _get_drain(link):
        return
    if _credit(link) <= 0:
        if not answer_drain_at_zero:
            return
        _flow(link, 1)  # module note: one credit of our own, drained at once
    _drained(link)


def _asserts_compiled_out() -> bool:
    """proton's extension is built with Python's compiler flags; NDEBUG removes its asserts."""
    return "-DNDEBUG" in (sysconfig.get_config_var("CFLAGS") or "").split()


def _answers_at_zero() -> bool:
    """Try ``answer_drain`` at credit 0 between two in-memory proton engines."""
    from proton import Collector, Connection, Event, Transport

    server, client = Connection(), Connection()
    pipes = [(server, Transport(Transport.SERVER)), (client, Transport())]
    for connection, transport in pipes:
        transport.bind(connection)
    collector, client_events = Collector(), Collector()
    server.collect(collector)
    client.collect(client_events)
    client.open()
    receiver = client.session().receiver("probe")
    receiver.session.open()
    receiver.open()

    def pump() -> None:
        for _ in range(10):
            moved = False
            for (_, a), (_, b) in ((pipes[0], pipes[1]), (pipes[1], pipes[0])):
                pending = a.pending()
                if pending > 0:
                    b.push(a.peek(pending))
                    a.pop(pending)
                    moved = True
            if not moved:
                return

    pump()
    sender = None
    while (event := collector.peek()) is not None:
        if event.type == Event.CONNECTION_REMOTE_OPEN:
            event.connection.open()
        elif event.type == Event.SESSION_REMOTE_OPEN:
            event.session.open()
        elif event.type == Event.LINK_REMOTE_OPEN:
            sender = event.link
            sender.source.copy(sender.remote_source)
            sender.target.copy(sender.remote_target)
            sender.open()
        collector.pop()
        pump()
    if sender is None:
        return False
    receiver.drain(0)
    pump()
    if not _lib.pn_link_get_drain(sender._impl) or sender.credit != 0:
        return False
    while client_events.peek() is not None:
        client_events.pop()
    _flow(sender._impl, 1)
    _drained(sender._impl)
    pump()
    answered = False
    while (event := client_events.peek()) is not None:
        answered = answered or (event.type == Event.LINK_FLOW and event.link == receiver)
        client_events.pop()
    return answered and sender.credit == 0 and receiver.credit == 0


answer_drain_at_zero = _asserts_compiled_out() and _answers_at_zero()
