"""The write side of a transport: bytes its peer has not taken yet, and asyncio's flow control.

How this works
--------------
``WriteBuffer`` is sans-I/O: it is given ``send(data) -> int``, which hands
bytes to the kernel (or to the memory network's stand-in for it) and says how
many were taken (0 when its buffer is full; an ``OSError`` when the connection
is broken), and the protocol to tell. asyncio's contract, as its own
transports keep it:

* ``write(data)`` sends at once what the kernel takes and keeps the rest, in
  order behind anything kept before; past the high-water mark the protocol gets
  ``pause_writing()`` (once);
* ``writable()`` is called when the kernel can take bytes again: what waits
  goes, and at or below the low-water mark the protocol gets
  ``resume_writing()`` (once per pause).

``resume_writing`` is where a protocol writes what it held back, so it runs
last, with the buffer's state already settled: a ``write`` from inside it sees
the buffer as it is now. (Issue #33: a transport that looked at its old,
emptied buffer after calling it dropped what the protocol had just written;
the stream lost bytes mid-frame and the connection stayed paused for good.)
``waiting`` tells the transport whether to watch for writability.
"""

from __future__ import annotations

from typing import Callable


class WriteBuffer:
    __slots__ = ("_send", "_protocol", "_data", "paused", "high", "low", "sent")

    def __init__(self, send: Callable[[object], int], protocol, *, high: int = 64 * 1024,
                 low: int = 16 * 1024) -> None:
        self._send = send
        self._protocol = protocol
        self._data: bytearray | None = None  # created when the kernel does not take a write
        self.paused = False  # the protocol was told pause_writing and not yet resume_writing
        self.high = high
        self.low = low
        self.sent = 0  # bytes the kernel took, in all (admin: is a connection's output moving?)

    def set_limits(self, high: int | None = None, low: int | None = None) -> None:
        if high is None:
            high = 64 * 1024 if low is None else 4 * low
        if low is None:
            low = high // 4
        if not high >= low >= 0:
            raise ValueError(f"high ({high!r}) must be >= low ({low!r}) must be >= 0")
        self.high, self.low = high, low

    @property
    def waiting(self) -> int:
        """Bytes written that the kernel has not taken yet."""
        data = self._data
        return len(data) if data is not None else 0

    def write(self, data) -> None:
        """Send ``data`` now, or keep it (in order) for ``writable``. ``OSError``: broken."""
        if self._data is None:
            sent = self._send(data)
            self.sent += sent
            if sent == len(data):
                return
            self._data = bytearray(memoryview(data)[sent:])
        else:
            self._data += data
        if not self.paused and len(self._data) > self.high:
            self.paused = True
            self._protocol.pause_writing()

    def writable(self) -> None:
        """The kernel takes bytes again: send what waits. ``OSError``: broken."""
        data = self._data
        if data is None:
            return
        sent = self._send(data)
        self.sent += sent
        del data[:sent]
        if not data:
            self._data = None
        if self.paused and len(data) <= self.low:
            self.paused = False
            self._protocol.resume_writing()  # last: it may write (module note)

    def drop(self) -> None:
        """The connection is gone: what waits will never be sent. The buffer lets go of the
        transport (``send`` is its method) and the protocol, so a closed connection is freed
        at once, not at the garbage collector's next pass (issue #21)."""
        self._data = None
        self._send = _gone
        self._protocol = None


def _gone(data) -> int:
    raise OSError("the connection is closed")
