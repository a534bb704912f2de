"""Byte streams for fuzzing: valid prefixes followed by malformed frames.

How this works
--------------
``Fuzzer(seed)`` is a deterministic generator (``random.Random(seed)``):
``connection()`` returns one ``Stream``: the bytes one client connection
sends and how many fuzz cases (mutated frames) they hold. A stream starts
with a valid prefix chosen at random, so mutations reach every layer:

* ``raw``       nothing valid: garbage and damaged protocol headers;
* ``sasl``      the SASL header, then mutated SASL frames (§5.3);
* ``amqp``      SASL ANONYMOUS + AMQP header + open, then mutated frames;
* ``link``      ... + begin + attaches to the fuzz queue + flow, then mutated
                frames (transfers, dispositions, flows out of order, ...);
* ``bare``      the AMQP header without SASL + open, then mutated frames.

Frames are built with a small AMQP type encoder (§1.6) written here, so
that they can also be wrong on purpose: wrong field types, bad descriptors,
bad constructors and lengths, huge and zero sizes, bad ``doff``, unknown
frame types and channels, transfers before attach, and so on. Several
mutated frames go on one connection (up to the first fatal one the node
acts on them; the rest are read and ignored).
"""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass

SASL_HEADER = b"AMQP\x03\x01\x00\x00"
AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
TLS_HEADER = b"AMQP\x02\x01\x00\x00"

OPEN, BEGIN, ATTACH, FLOW, TRANSFER, DISPOSITION, DETACH, END, CLOSE = range(0x10, 0x19)
SASL_MECHANISMS, SASL_INIT, SASL_CHALLENGE, SASL_RESPONSE, SASL_OUTCOME = range(0x40, 0x45)
ERROR, SOURCE, TARGET, ACCEPTED, REJECTED, RELEASED, MODIFIED = 0x1D, 0x28, 0x29, 0x24, 0x25, 0x26, 0x27
DATA_SECTION, HEADER_SECTION, PROPERTIES_SECTION = 0x75, 0x70, 0x73


# -- AMQP type encoding (§1.6) ---------------------------------------------------------
def null() -> bytes:
    return b"\x40"


def boolean(v: bool) -> bytes:
    return b"\x41" if v else b"\x42"


def ubyte(v: int) -> bytes:
    return b"\x50" + struct.pack(">B", v & 0xFF)


def ushort(v: int) -> bytes:
    return b"\x60" + struct.pack(">H", v & 0xFFFF)


def uint(v: int) -> bytes:
    v &= 0xFFFFFFFF
    if v == 0:
        return b"\x43"
    if v < 256:
        return b"\x52" + bytes([v])
    return b"\x70" + struct.pack(">I", v)


def ulong(v: int) -> bytes:
    v &= 0xFFFFFFFFFFFFFFFF
    if v == 0:
        return b"\x44"
    if v < 256:
        return b"\x53" + bytes([v])
    return b"\x80" + struct.pack(">Q", v)


def string(s: str | bytes) -> bytes:
    raw = s.encode("utf-8", "surrogatepass") if isinstance(s, str) else s
    return (b"\xa1" + bytes([len(raw)]) if len(raw) < 256 else b"\xb1" + struct.pack(">I", len(raw))) + raw


def symbol(s: str | bytes) -> bytes:
    raw = s.encode("ascii", "replace") if isinstance(s, str) else s
    return (b"\xa3" + bytes([len(raw)]) if len(raw) < 256 else b"\xb3" + struct.pack(">I", len(raw))) + raw


def binary(b: bytes) -> bytes:
    return (b"\xa0" + bytes([len(b)]) if len(b) < 256 else b"\xb0" + struct.pack(">I", len(b))) + b


def lst(items: list[bytes]) -> bytes:
    if not items:
        return b"\x45"
    body = b"".join(items)
    if len(body) + 1 < 256 and len(items) < 256:
        return b"\xc0" + bytes([len(body) + 1, len(items)]) + body
    return b"\xd0" + struct.pack(">II", len(body) + 4, len(items)) + body


def amap(pairs: list[tuple[bytes, bytes]]) -> bytes:
    body = b"".join(k + v for k, v in pairs)
    count = 2 * len(pairs)
    if len(body) + 1 < 256 and count < 256:
        return b"\xc1" + bytes([len(body) + 1, count]) + body
    return b"\xd1" + struct.pack(">II", len(body) + 4, count) + body


def described(code: int, value: bytes) -> bytes:
    return b"\x00" + ulong(code) + value


def performative(code: int, fields: list[bytes]) -> bytes:
    return described(code, lst(fields))


def frame(body: bytes, *, ftype: int = 0, channel: int = 0, doff: int = 2, size: int | None = None,
          ext: bytes = b"") -> bytes:
    total = 8 + len(ext) + len(body) if size is None else size
    return struct.pack(">IBBH", total & 0xFFFFFFFF, doff & 0xFF, ftype & 0xFF, channel & 0xFFFF) + ext + body


def error(condition: str, description: str = "") -> bytes:
    return described(ERROR, lst([symbol(condition), string(description)]))


# -- valid frames --------------------------------------------------------------------------
def open_frame(container: str = "fuzz", max_frame: int = 16384) -> bytes:
    return frame(performative(OPEN, [string(container), string("localhost"), uint(max_frame),
                                     ushort(16), uint(0)]))


def begin_frame(channel: int = 0) -> bytes:
    return frame(performative(BEGIN, [null(), uint(0), uint(1000), uint(1000), uint(32)]), channel=channel)


def attach_frame(name: str, handle: int, role_receiver: bool, address: str | None,
                 channel: int = 0, dynamic: bool = False) -> bytes:
    addr = string(address) if address is not None else null()
    terminus_fields = [addr, uint(0), symbol("session-end"), uint(0), boolean(dynamic)]
    source = described(SOURCE, lst(terminus_fields if role_receiver else [addr]))
    target = described(TARGET, lst([addr] if role_receiver else terminus_fields))
    return frame(performative(ATTACH, [string(name), uint(handle), boolean(role_receiver), ubyte(2),
                                       ubyte(0), source, target, null(), null(), uint(0)]), channel=channel)


def flow_frame(handle: int | None, credit: int, channel: int = 0, drain: bool = False) -> bytes:
    fields = [uint(0), uint(1000), uint(0), uint(1000)]
    if handle is not None:
        fields += [uint(handle), uint(0), uint(credit), null(), boolean(drain)]
    return frame(performative(FLOW, fields), channel=channel)


def message(body: bytes) -> bytes:
    return described(DATA_SECTION, binary(body))


def transfer_frame(handle: int, delivery_id: int, tag: bytes, payload: bytes, *, settled: bool = False,
                   more: bool = False, channel: int = 0) -> bytes:
    return frame(performative(TRANSFER, [uint(handle), uint(delivery_id), binary(tag), uint(0),
                                         boolean(settled), boolean(more)]) + payload, channel=channel)


def disposition_frame(first: int, last: int, state: bytes | None, channel: int = 0, role: bool = True) -> bytes:
    return frame(performative(DISPOSITION, [boolean(role), uint(first), uint(last), boolean(True),
                                            state if state is not None else null()]), channel=channel)


def sasl_frame(code: int, fields: list[bytes]) -> bytes:
    return frame(performative(code, fields), ftype=1)


SASL_ANONYMOUS = sasl_frame(SASL_INIT, [symbol("ANONYMOUS"), binary(b"fuzz")])


@dataclass
class Stream:
    kind: str
    data: bytes
    cases: int


class Fuzzer:
    """Deterministic stream generator; see the module docstring."""

    PREFIXES = ("raw", "sasl", "amqp", "link", "link", "bare")

    def __init__(self, seed: int, *, max_frames: int = 16, queue: str = "fuzz",
                 tokens: tuple[str, ...] = ()) -> None:
        self.rng = random.Random(seed)
        self.max_frames = max_frames
        self.queue = queue
        self.counter = 0
        self.tokens = tuple(tokens)  # valid JWTs: streams on the token path too (fuzz.tokens)

    # -- random values -------------------------------------------------------------------
    def rand_bytes(self, low: int = 0, high: int = 64) -> bytes:
        return self.rng.randbytes(self.rng.randint(low, high))

    def rand_text(self) -> str:
        choice = self.rng.random()
        if choice < 0.3:
            return self.rng.choice(["fuzz", "canary", "", "tmp.n1.1", "#", "a" * 300, "\x00", "ü"])
        return "".join(chr(self.rng.randint(0x20, 0x7E)) for _ in range(self.rng.randint(0, 20)))

    def rand_value(self, depth: int = 0) -> bytes:
        r = self.rng
        kind = r.randrange(24 if depth < 2 else 18)
        if kind == 0:
            return null()
        if kind == 1:
            return boolean(r.random() < 0.5)
        if kind == 2:
            return ubyte(r.getrandbits(8))
        if kind == 3:
            return ushort(r.getrandbits(16))
        if kind == 4:
            return uint(r.choice([0, 1, 2**31, 2**32 - 1, r.getrandbits(32)]))
        if kind == 5:
            return ulong(r.choice([0, 2**63, 2**64 - 1, r.getrandbits(64)]))
        if kind == 6:
            return b"\x51" + bytes([r.getrandbits(8)])  # byte
        if kind == 7:
            return b"\x71" + r.randbytes(4)  # int
        if kind == 8:
            return b"\x81" + r.randbytes(8)  # long
        if kind == 9:
            return b"\x72" + r.randbytes(4)  # float (any bit pattern, NaNs too)
        if kind == 10:
            return b"\x82" + r.randbytes(8)  # double
        if kind == 11:
            return b"\x73" + r.randbytes(4)  # char, maybe not a code point
        if kind == 12:
            return b"\x83" + r.randbytes(8)  # timestamp
        if kind == 13:
            return b"\x98" + r.randbytes(16)  # uuid
        if kind == 14:
            return binary(self.rand_bytes())
        if kind == 15:
            return string(self.rand_text())
        if kind == 16:
            return b"\xa1" + bytes([4]) + r.randbytes(4)  # str8 with invalid UTF-8 (maybe)
        if kind == 17:
            return symbol(self.rand_text())
        if kind in (18, 19):
            return lst([self.rand_value(depth + 1) for _ in range(r.randint(0, 6))])
        if kind == 20:
            return amap([(self.rand_value(depth + 1), self.rand_value(depth + 1)) for _ in range(r.randint(0, 3))])
        if kind == 21:
            elem = r.choice([b"\x52", b"\xa3", b"\x40", b"\x70", b"\x56"])  # array with a constructor
            count = r.randint(0, 5)
            body = bytes([count]) + elem + r.randbytes(r.randint(0, 12))
            return b"\xe0" + bytes([len(body)]) + body
        if kind == 22:
            return described(r.getrandbits(64) if r.random() < 0.5 else r.randint(0, 0x80),
                             self.rand_value(depth + 1))
        return bytes([r.getrandbits(8)]) + self.rand_bytes(0, 8)  # any constructor byte

    # -- streams -----------------------------------------------------------------------------
    def connection(self) -> Stream:
        if self.tokens and self.rng.random() < 0.4:
            from fuzz.tokens import token_stream

            return token_stream(self)
        kind = self.rng.choice(self.PREFIXES)
        if kind == "raw":
            return Stream(kind, self.raw_stream(), 1)
        prefix = self.prefix(kind)
        count = self.rng.randint(1, self.max_frames)
        frames = [self.sasl_case() if kind == "sasl" else self.amqp_case(kind) for _ in range(count)]
        return Stream(kind, prefix + b"".join(frames), count)

    def raw_stream(self) -> bytes:
        r = self.rng
        choice = r.randrange(6)
        if choice == 0:
            return self.rand_bytes(1, 200)
        if choice == 1:  # a damaged protocol header
            header = bytearray(r.choice([SASL_HEADER, AMQP_HEADER, TLS_HEADER]))
            header[r.randrange(8)] = r.getrandbits(8)
            return bytes(header) + self.rand_bytes(0, 40)
        if choice == 2:  # a truncated header
            return r.choice([SASL_HEADER, AMQP_HEADER])[: r.randint(1, 7)]
        if choice == 3:  # HTTP, TLS hello, and friends
            return r.choice([b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
                             b"SSH-2.0-OpenSSH\r\n", b"\r\n" * 20])
        if choice == 4:  # header then a frame before any negotiation
            return AMQP_HEADER + frame(self.rand_bytes(0, 40), size=r.choice([0, 7, 513, 2**32 - 1, None]))
        return TLS_HEADER + self.rand_bytes(0, 60)

    def prefix(self, kind: str) -> bytes:
        self.counter += 1
        if kind == "sasl":
            return SASL_HEADER
        if kind == "bare":
            return AMQP_HEADER + open_frame(f"fuzz-{self.counter}")
        data = SASL_HEADER + SASL_ANONYMOUS + AMQP_HEADER + open_frame(f"fuzz-{self.counter}")
        if kind == "link":
            dynamic = self.rng.random() < 0.2
            data += (begin_frame()
                     + attach_frame("snd", 0, False, None if dynamic else self.queue, dynamic=dynamic)
                     + attach_frame("rcv", 1, True, None if dynamic else self.queue, dynamic=dynamic)
                     + flow_frame(1, 5))
        return data

    # -- SASL mutations ---------------------------------------------------------------------
    def sasl_case(self) -> bytes:
        r = self.rng
        choice = r.randrange(10)
        mech = r.choice(["PLAIN", "SCRAM-SHA-256", "ANONYMOUS", "EXTERNAL", "GSSAPI", "", "PLAIN\x00"])
        if choice == 0:  # init with junk responses for real mechanisms
            return sasl_frame(SASL_INIT, [symbol(mech), binary(self.rand_bytes(0, 120))])
        if choice == 1:  # SCRAM with plausible but wrong messages
            first = r.choice([b"n,,n=alice,r=abc", b"y,,n=,r=", b"p=x,,n=a,r=b", b"n,a=b,n=c,r=d",
                              b"n,,n=alice,r=abc,m=x", b"n,," + self.rand_bytes(0, 40)])
            return sasl_frame(SASL_INIT, [symbol("SCRAM-SHA-256"), binary(first)])
        if choice == 2:  # response before init, or after
            return sasl_frame(SASL_RESPONSE, [self.rand_value()])
        if choice == 3:  # wrong field types
            return sasl_frame(r.choice([SASL_INIT, SASL_RESPONSE]), [self.rand_value() for _ in range(r.randint(0, 4))])
        if choice == 4:  # performatives a client never sends
            return sasl_frame(r.choice([SASL_MECHANISMS, SASL_CHALLENGE, SASL_OUTCOME, OPEN, 0x99]),
                              [self.rand_value()])
        if choice == 5:  # an AMQP frame type during SASL
            return frame(performative(SASL_INIT, [symbol("ANONYMOUS")]), ftype=r.choice([0, 2, 255]))
        if choice == 6:  # header damage
            body = performative(SASL_INIT, [symbol(mech), binary(b"x")])
            return frame(body, size=r.choice([0, 1, 7, 8, 9, 513, 2**32 - 1]), ftype=1,
                         doff=r.choice([0, 1, 2, 3, 255]))
        if choice == 7:  # not a described body
            return frame(self.rand_value(), ftype=1)
        if choice == 8:  # a symbol descriptor
            return frame(b"\x00" + symbol(r.choice(["amqp:sasl-init:list", "amqp:sasl-response:list", "x"]))
                         + lst([symbol(mech), self.rand_value()]), ftype=1)
        return self.mutate(sasl_frame(SASL_INIT, [symbol(mech), binary(b"\x00alice\x00secret")]))

    # -- AMQP mutations -----------------------------------------------------------------------
    def amqp_case(self, kind: str) -> bytes:
        r = self.rng
        choice = r.randrange(16)
        if choice == 0:
            return self.mutate(self.valid_amqp_frame())
        if choice == 1:  # a performative with random field values
            code = r.randint(OPEN, CLOSE)
            return frame(performative(code, [self.rand_value() for _ in range(r.randint(0, 12))]),
                         channel=r.choice([0, 0, 1, 65535]))
        if choice == 2:  # unknown or bad descriptors
            desc = r.choice([ulong(r.getrandbits(64)), ulong(r.randint(0, 0x80)), symbol(self.rand_text()),
                             string("amqp:open:list"), null(), lst([])])
            return frame(b"\x00" + desc + self.rand_value())
        if choice == 3:  # size trouble
            body = performative(FLOW, [uint(0)] * 4)
            return frame(body, size=r.choice([0, 1, 7, 8, 9, 512, 16385, 2**31, 2**32 - 1]))
        if choice == 4:  # doff trouble
            return frame(performative(BEGIN, [null(), uint(0), uint(1), uint(1)]),
                         doff=r.choice([0, 1, 3, 15, 255]), ext=self.rand_bytes(0, 8))
        if choice == 5:  # unknown frame type or channel
            return frame(self.valid_body(), ftype=r.choice([1, 2, 3, 255]), channel=r.getrandbits(16))
        if choice == 6:  # empty frames (heartbeats), valid and many
            return frame(b"") * r.randint(1, 20)
        if choice == 7:  # transfers: before attach, wrong handle, huge ids
            handle = r.choice([0, 1, 7, 2**32 - 1])
            return transfer_frame(handle, r.getrandbits(32), self.rand_bytes(0, 40),
                                  message(self.rand_bytes(0, 200)), settled=r.random() < 0.5,
                                  channel=r.choice([0, 0, 3]))
        if choice == 8:  # an oversized or never-ending multi-frame message
            chunk = message(b"x" * r.choice([1000, 8000, 16000]))
            return b"".join(transfer_frame(0, 0, b"big", chunk, more=True) for _ in range(r.randint(1, 12)))
        if choice == 9:  # a frame bigger than max-frame-size
            return transfer_frame(0, 0, b"t", message(b"y" * r.choice([16385, 70000])))
        if choice == 10:  # dispositions with odd ranges and states
            state = r.choice([described(ACCEPTED, lst([])), described(REJECTED, lst([error("x:y")])),
                              described(MODIFIED, lst([boolean(True), boolean(True), amap([])])),
                              described(RELEASED, lst([])), self.rand_value(), None])
            first = r.getrandbits(32)
            return disposition_frame(first, r.choice([first, 0, 2**32 - 1, first + 5]), state,
                                     role=r.random() < 0.8)
        if choice == 11:  # flows: unknown handle, enormous credit, drain
            return flow_frame(r.choice([None, 0, 1, 9, 2**32 - 1]), r.choice([0, 1, 2**31, 2**32 - 1]),
                              channel=r.choice([0, 0, 5]), drain=r.random() < 0.3)
        if choice == 12:  # session and link lifecycle out of order
            return r.choice([
                begin_frame(r.choice([0, 1, 2])),
                attach_frame(self.rand_text(), r.choice([0, 1, 2, 2**32 - 1]), r.random() < 0.5,
                             r.choice([self.queue, None, self.rand_text()]), channel=r.choice([0, 1]),
                             dynamic=r.random() < 0.3),
                frame(performative(DETACH, [uint(r.choice([0, 1, 5])), boolean(True)])),
                frame(performative(END, [])),
                frame(performative(END, [error("amqp:internal-error")]), channel=r.choice([0, 4])),
                frame(performative(CLOSE, [])),
                open_frame(),
            ])
        if choice == 13:  # a valid message, to exercise the queue between bad frames
            return transfer_frame(0, r.getrandbits(8), b"ok", message(b"payload"), settled=r.random() < 0.5)
        if choice == 14:  # garbage body of a plausible size
            return frame(self.rand_bytes(1, 100))
        return self.truncate(self.valid_amqp_frame())

    def valid_body(self) -> bytes:
        return performative(FLOW, [uint(0), uint(10), uint(0), uint(10)])

    def valid_amqp_frame(self) -> bytes:
        r = self.rng
        return r.choice([
            open_frame(), begin_frame(), attach_frame("x", 2, r.random() < 0.5, self.queue),
            flow_frame(1, 10), transfer_frame(0, 1, b"t", message(b"hello")),
            disposition_frame(0, 0, described(ACCEPTED, lst([]))),
            frame(performative(DETACH, [uint(0), boolean(True), error("amqp:not-found", "x")])),
            frame(performative(END, [])), frame(performative(CLOSE, [error("amqp:internal-error")])),
        ])

    # -- generic mutations -------------------------------------------------------------------
    def mutate(self, data: bytes) -> bytes:
        r = self.rng
        out = bytearray(data)
        for _ in range(r.randint(1, 8)):
            op = r.randrange(4)
            if op == 0 and out:  # flip a bit
                i = r.randrange(len(out))
                out[i] ^= 1 << r.randrange(8)
            elif op == 1 and out:  # set a byte
                out[r.randrange(len(out))] = r.getrandbits(8)
            elif op == 2:  # insert bytes
                i = r.randrange(len(out) + 1)
                out[i:i] = self.rand_bytes(1, 8)
            elif out:  # delete bytes
                i = r.randrange(len(out))
                del out[i : i + r.randint(1, 8)]
        return bytes(out)

    def truncate(self, data: bytes) -> bytes:
        """A frame cut short, its size field still claiming the full length."""
        return data[: self.rng.randrange(1, max(2, len(data)))]
