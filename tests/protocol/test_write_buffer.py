"""proxy.net.write_buffer: asyncio's write flow control, as data (issue #33).

A stand-in kernel takes what it has room for; the tests say when it reads.
The case that wedged connections: the protocol writes from ``resume_writing``
(what it held back while paused) right after the kernel took the whole buffer.
"""

from __future__ import annotations

from proxy.net.write_buffer import WriteBuffer


class Kernel:
    def __init__(self, room: int) -> None:
        self.room = room
        self.taken = bytearray()

    def send(self, data) -> int:
        count = min(self.room, len(data))
        self.taken += bytes(memoryview(data)[:count])
        self.room -= count
        return count

    def read(self, size: int) -> None:
        self.room += size


class Protocol:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.on_resume = None

    def pause_writing(self) -> None:
        self.calls.append("pause")

    def resume_writing(self) -> None:
        self.calls.append("resume")
        if self.on_resume is not None:
            self.on_resume()


def test_a_write_from_resume_writing_after_the_kernel_took_everything_is_kept():
    kernel, protocol = Kernel(room=100), Protocol()
    buffer = WriteBuffer(kernel.send, protocol, high=1000, low=200)
    first = bytes(range(250)) * 20  # 5,000 bytes: 100 go, the rest waits, past high water
    buffer.write(first)
    assert protocol.calls == ["pause"] and buffer.waiting == 4900
    second = b"second" * 1000
    held = [second]  # what the protocol held back while paused
    protocol.on_resume = lambda: held and buffer.write(held.pop())
    kernel.read(4900)  # the peer reads: room for the whole buffer at once
    buffer.writable()
    assert protocol.calls == ["pause", "resume", "pause"]  # paused again by the second write
    assert buffer.waiting == len(second)  # kept, not dropped with the emptied buffer
    kernel.read(len(second))
    buffer.writable()
    assert bytes(kernel.taken) == first + second and buffer.waiting == 0
    assert protocol.calls == ["pause", "resume", "pause", "resume"]


def test_bytes_keep_their_order_and_resume_comes_once_below_low_water():
    kernel, protocol = Kernel(room=10), Protocol()
    buffer = WriteBuffer(kernel.send, protocol, high=50, low=20)
    chunks = [bytes([i]) * 30 for i in range(5)]
    for chunk in chunks:
        buffer.write(chunk)
    assert protocol.calls == ["pause"] and buffer.waiting == 140
    while buffer.waiting:
        kernel.read(15)
        buffer.writable()
    assert bytes(kernel.taken) == b"".join(chunks)
    assert protocol.calls == ["pause", "resume"] and buffer.sent == 150


def test_a_write_that_fits_is_not_kept_and_pauses_nothing():
    kernel, protocol = Kernel(room=1000), Protocol()
    buffer = WriteBuffer(kernel.send, protocol, high=10, low=5)
    buffer.write(b"x" * 500)
    assert buffer.waiting == 0 and protocol.calls == []
