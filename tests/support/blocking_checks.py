"""Message checks over proton's BlockingConnection, shared by the proxy and fragment tests."""

from __future__ import annotations

from proton import Endpoint, Message, Timeout
from proton.reactor import Copy, Selector
from proton.utils import BlockingConnection, LinkDetached

# below, just above and far above 64 KiB: multi-frame, larger than proton's output buffer
LARGE_SIZES = (300, 65_537, 300_000)


def large_bodies(sizes=LARGE_SIZES) -> list[bytes]:
    """One body per size, each of its own byte."""
    return [bytes([i + 1]) * size for i, size in enumerate(sizes)]


def send_messages(url: str, address: str, messages, timeout: float = 30) -> None:
    """Send each message, waiting for its outcome."""
    conn = BlockingConnection(url, timeout=timeout)
    try:
        sender = conn.create_sender(address)
        for message in messages:
            sender.send(message)
    finally:
        conn.close()


def receive_messages(url: str, address: str, count: int, timeout: float = 30) -> list[Message]:
    """``count`` messages, each accepted. The messages are returned whole: proton's
    binary body is a view into its message, so read bodies while the message lives."""
    conn = BlockingConnection(url, timeout=timeout)
    try:
        receiver = conn.create_receiver(address, credit=count)
        got = []
        for _ in range(count):
            got.append(receiver.receive(timeout=15))
            receiver.accept()
        return got
    finally:
        conn.close()


def check_drain(url: str, address: str) -> None:
    """§2.6.7 through a node: a drain of 10 on a queue of 3 gets the 3 and is answered,
    and a drain on the then empty queue is answered too."""
    conn = BlockingConnection(url, timeout=20)
    try:
        sender = conn.create_sender(address)
        for i in range(3):
            sender.send(Message(id=f"d{i}", body="x"))
        receiver = conn.create_receiver(address, credit=0)
        link = receiver.link
        link.drain(10)
        conn.wait(lambda: link.credit == 0 and len(receiver.fetcher.incoming) == 3,
                  timeout=15, msg="drain with 3 messages answered")
        link.drain(5)  # the queue is empty now
        conn.wait(lambda: link.credit == 0, timeout=15, msg="drain on an empty queue answered")
        assert len(receiver.fetcher.incoming) == 3
        assert [receiver.receive(timeout=5).id for _ in range(3)] == ["d0", "d1", "d2"]
        receiver.accept()
    finally:
        conn.close()


def accepted_ids(url: str, address: str, count: int, options=None, timeout: float = 30) -> list:
    """Ids of the first ``count`` messages a receiver with ``options`` gets, each accepted."""
    conn = BlockingConnection(url, timeout=timeout)
    try:
        receiver = conn.create_receiver(address, credit=count, options=options)
        got = []
        for _ in range(count):
            got.append(receiver.receive(timeout=15).id)
            receiver.accept()
        return got
    finally:
        conn.close()


def browse(url: str, address: str, count: int) -> list:
    """What a browsing receiver (distribution-mode copy) is sent, each accepted: an
    outcome for a copy must take nothing."""
    return accepted_ids(url, address, count, Copy())


def select(url: str, address: str, selector: str, count: int) -> list:
    """What a receiver with a JMS selector gets, each accepted."""
    return accepted_ids(url, address, count, Selector(selector))


def refusal(url: str, address: str, options, timeout: float = 30) -> str | None:
    """The condition a receiver with ``options`` is detached with (through a proxy
    that comes after its attach was answered), or None if it stays attached."""
    conn = BlockingConnection(url, timeout=timeout)
    try:
        receiver = conn.create_receiver(address, credit=10, options=options)
        conn.wait(lambda: receiver.link.state & Endpoint.REMOTE_CLOSED, timeout=10,
                  msg="the refusal")
    except LinkDetached as detached:
        return detached.link.remote_condition.name
    except Timeout:
        return None
    finally:
        conn.close()
    return receiver.link.remote_condition.name if receiver.link.remote_condition else None
