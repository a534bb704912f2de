"""Clients for the DMZ tests: raw SASL over a (TLS) socket, SCRAM, proton over that socket.

``RawClient`` speaks the SASL layer itself (AMQP 1.0 §5.3), with frames built
and parsed by proton's ``Data`` codec (not the node's code), so a test can do
what no ready-made client does: pick any mechanism, send any response, run
SCRAM-SHA-256 with ``scramp`` (an independent SCRAM implementation), then hand
the socket to a proton client ``Transport`` (without SASL) to use the
authenticated connection.
"""

from __future__ import annotations

import re
import socket
import ssl
import struct
import time

from proton import Array, Connection, Data, Message, Transport

from proxy.auth.sasl import encode_frame

SASL_HEADER = b"AMQP\x03\x01\x00\x00"
AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
SASL_INIT, SASL_CHALLENGE, SASL_RESPONSE, SASL_OUTCOME, SASL_MECHANISMS = 0x41, 0x42, 0x43, 0x44, 0x40


def sasl_frame(code: int, *fields) -> bytes:
    """fields: ("symbol", s) | ("binary", b) | None (the node's own encoder writes them)."""
    return encode_frame(code, [field if field is not None else ("binary", None) for field in fields])


def parse_sasl_frame(frame: bytes) -> tuple[int, list]:
    size, doff = struct.unpack_from(">IB", frame)
    data = Data()
    data.decode(frame[doff * 4 : size])
    data.rewind()
    data.next()
    described = data.get_object()
    values = list(described.value)
    return int(described.descriptor), [
        bytes(v) if isinstance(v, memoryview) else list(v.elements) if isinstance(v, Array) else v
        for v in values
    ]


class RawClient:
    def __init__(self, host: str, port: int, *, context: ssl.SSLContext | None = None,
                 source: str | None = None, timeout: float = 5.0) -> None:
        sock = socket.create_connection((host, port), timeout=timeout,
                                        source_address=(source, 0) if source else None)
        if context is not None:
            sock = context.wrap_socket(sock, server_hostname="localhost")
        self.sock = sock
        self.buffer = b""
        self.mechanisms: list[str] = []

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    # -- bytes -----------------------------------------------------------------
    def _read(self, count: int) -> bytes:
        while len(self.buffer) < count:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError(f"closed by the node after {self.buffer!r}")
            self.buffer += chunk
        out, self.buffer = self.buffer[:count], self.buffer[count:]
        return out

    def read_frame(self) -> tuple[int, list]:
        head = self._read(8)
        (size,) = struct.unpack_from(">I", head)
        return parse_sasl_frame(head + self._read(size - 8))

    def read_until_closed(self, timeout: float) -> bytes:
        """Everything the node sends until it closes; AssertionError if it does not close in time."""
        self.sock.settimeout(timeout)
        data, self.buffer = self.buffer, b""
        while True:
            try:
                chunk = self.sock.recv(65536)
            except (ConnectionResetError, ssl.SSLError):
                return data
            except socket.timeout:
                raise AssertionError(f"node did not close within {timeout}s; got {data!r}") from None
            if not chunk:
                return data
            data += chunk

    # -- SASL --------------------------------------------------------------------
    def start_sasl(self) -> list[str]:
        self.sock.sendall(SASL_HEADER)
        assert self._read(8) == SASL_HEADER
        code, fields = self.read_frame()
        assert code == SASL_MECHANISMS
        offered = fields[0] if fields else []
        self.mechanisms = [str(m) for m in (offered if isinstance(offered, list) else [offered])]
        return self.mechanisms

    def init(self, mechanism: str, initial: bytes | None) -> tuple[int, list]:
        self.sock.sendall(sasl_frame(SASL_INIT, ("symbol", mechanism),
                                     ("binary", initial) if initial is not None else None))
        return self.read_frame()

    def respond(self, response: bytes) -> tuple[int, list]:
        self.sock.sendall(sasl_frame(SASL_RESPONSE, ("binary", response)))
        return self.read_frame()

    def scram(self, user: str, password: str) -> tuple[int, bytes | None]:
        """SCRAM-SHA-256 with scramp; returns (sasl-code, additional-data), server signature verified."""
        from scramp import ScramClient

        client = ScramClient(["SCRAM-SHA-256"], user, password)
        code, fields = self.init("SCRAM-SHA-256", client.get_client_first().encode())
        if code == SASL_OUTCOME:
            return fields[0], None
        assert code == SASL_CHALLENGE, (code, fields)
        client.set_server_first(fields[0].decode())
        code, fields = self.respond(client.get_client_final().encode())
        assert code == SASL_OUTCOME, (code, fields)
        additional = fields[1] if len(fields) > 1 else None
        if fields[0] == 0:
            client.set_server_final(additional.decode())  # raises unless the server proved the key
        return fields[0], additional

    # -- AMQP after SASL --------------------------------------------------------
    def amqp(self) -> "ProtonOverSocket":
        return ProtonOverSocket(self)


class ProtonOverSocket:
    """A proton client transport (no SASL) pumped over the RawClient's socket."""

    def __init__(self, raw: RawClient) -> None:
        self.raw = raw
        self.transport = Transport()
        self.connection = Connection()
        self.transport.bind(self.connection)
        self.connection.container = "dmz-test"
        self.connection.hostname = "localhost"
        self.connection.open()
        self.session = self.connection.session()
        self.session.open()
        if raw.buffer:
            self.transport.push(raw.buffer)
            raw.buffer = b""

    def pump_until(self, done, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        sock = self.raw.sock
        while not done():
            pending = self.transport.pending()
            if pending > 0:
                sock.sendall(bytes(self.transport.peek(pending)))
                self.transport.pop(pending)
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError("timed out waiting on the node")
            sock.settimeout(min(remaining, 0.5))
            try:
                chunk = sock.recv(65536)
            except socket.timeout:
                continue
            except (ConnectionResetError, ssl.SSLError):
                chunk = b""
            if not chunk:
                self.transport.close_tail()
                if not done():
                    raise EOFError("node closed the connection")
                return
            self.transport.push(chunk)

    def send(self, address: str, body: str) -> str:
        """Send one message; return 'accepted' or the link/connection error condition."""
        link = self.session.sender(f"s-{address}-{time.monotonic_ns()}")
        link.target.address = address
        link.open()
        self.pump_until(lambda: link.remote_condition is not None or link.credit > 0
                        or self.connection.remote_condition is not None)
        if link.remote_condition is not None:
            return link.remote_condition.name
        if self.connection.remote_condition is not None:
            return self.connection.remote_condition.name
        delivery = link.delivery(b"1")
        link.send(Message(body=body).encode())
        link.advance()
        self.pump_until(lambda: delivery.remote_state or link.remote_condition is not None)
        if link.remote_condition is not None:
            return link.remote_condition.name
        return "accepted" if delivery.remote_state == delivery.ACCEPTED else str(delivery.remote_state)

    def connection_condition(self) -> str | None:
        cond = self.connection.remote_condition or self.transport.condition
        return cond.name if cond else None


CONDITION = re.compile(r"amqp:[a-z:-]+")


def condition_of(exc: BaseException) -> str | None:
    """The AMQP condition name of a proton-python exception (from its attribute or text)."""
    condition = getattr(exc, "condition", None)
    if condition:
        return str(condition)
    match = CONDITION.search(str(exc))
    return match.group(0) if match else None
