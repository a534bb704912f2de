"""One server-side AMQP connection, sans-I/O: bytes in, bytes out, events out.

How this works
--------------
The asyncio protocol (``proxy.server``) owns the socket; this object owns the
protocol state. It moves through phases:

``HEADER``  wait for the 8-byte protocol header (§2.2). ``AMQP 3.1.0.0``
            starts SASL, ``AMQP 0.1.0.0`` goes straight to AMQP when SASL is
            optional; anything else gets our header back and is closed
            (the protocol-negotiation reply of §2.2).
``SASL``    our own ``SaslServer`` runs the exchange (§5.3); proton never
            sees SASL, so it is configured without it.
``AMQP``    bytes go to a proton ``Transport`` bound to a ``Connection`` with a
            ``Collector``. The client's AMQP header goes to proton as soon as
            its 8 bytes are in, so our header is answered on receipt: §2.2
            lets a client wait for it before sending anything (go-amqp does).
            The first frame after it (the peer's open) is held until its size
            is known and refused above 512 bytes (§2.4.1,
            MIN-MAX-FRAME-SIZE): proton does not enforce that limit before
            negotiation. After it, proton enforces the negotiated
            max-frame-size.
``CLOSED``  nothing more is read; remaining output is flushed, then the
            socket is closed.

A deadline covers header, SASL and the peer's open (slow-loris); after open,
proton's idle-timeout handling (``tick``) takes over (§2.4.5).

After a successful SASL exchange the ``admit`` hook (the node's per-user
connection limit) may refuse the identity. SASL has already said ok, so the
refusal is an AMQP one: once the client's AMQP header is in, proton answers
with open + close(``amqp:resource-limit-exceeded``) and none of the client's
frames is acted on. EXTERNAL is offered only when the TLS layer verified a
client certificate that yields an identity (``cert_identity``).

Events are read from the collector with proton's low-level calls, and handed to
``handler.on_event(type, event)``; see ``proxy.amqp.engine``. The proton transport
and connection are held as raw pointers (``transport_ptr``, ``connection_ptr``,
released with the ``ProtonPipe``): ``transport`` and ``connection`` give transient
wrappers for the rare calls that want proton's Python API (``engine.transient``),
so an idle connection keeps no Python state in proton's records.
"""

from __future__ import annotations

import enum
import logging
import struct
from dataclasses import dataclass

from cproton import (
    PN_LOCAL_ACTIVE,
    PN_REMOTE_ACTIVE,
)
from cproton import lib as _lib
from cproton import (
    pn_connection_close,
    pn_connection_open,
    pn_connection_remote_container,
    pn_connection_set_container,
    pn_connection_state,
    pn_transport_set_idle_timeout,
    pn_transport_set_max_frame,
    pn_transport_set_server,
)
from proton import Condition, Connection, Transport, symbol

from proxy.amqp import engine
from proxy.amqp.first_attach import MAX_HELD, only_open_and_begin, sniff
from proxy.auth.mechanisms import SaslFailure, SaslSuccess
from proxy.auth.sasl import SASL_HEADER, SaslProtocolError, SaslServer

log = logging.getLogger("fedgate.connection")

AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
TLS_HEADER = b"AMQP\x02\x01\x00\x00"
MIN_MAX_FRAME_SIZE = 512


class Phase(enum.Enum):
    HEADER = "header"
    SASL = "sasl"
    AMQP = "amqp"
    CLOSED = "closed"


# the moves a connection's phase may make, written as data (as h11's _state.py does);
# the AMQP phase ends inside proton (close frames), so it moves nowhere; CLOSED stays
PHASE_TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    Phase.HEADER: frozenset({Phase.SASL, Phase.AMQP, Phase.CLOSED}),
    Phase.SASL: frozenset({Phase.AMQP, Phase.CLOSED}),
    Phase.AMQP: frozenset(),
    Phase.CLOSED: frozenset({Phase.CLOSED}),
}


class PhaseError(RuntimeError):
    """A connection was asked to make a move ``PHASE_TRANSITIONS`` does not allow."""


@dataclass(frozen=True)
class ConnectionSettings:
    container_id: str
    max_frame_size: int = 65536
    idle_timeout: float = 60.0  # seconds; 0 disables
    handshake_timeout: float = 10.0  # header + SASL + open
    sasl_mechanisms: tuple[str, ...] = ("ANONYMOUS",)
    sasl_required: bool = False  # refuse a bare AMQP header (no SASL layer)
    max_sessions: int = 32
    properties: dict | None = None
    offered_capabilities: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Identity:
    user: str = "anonymous"
    mechanism: str | None = None
    groups: tuple[str, ...] = ()
    token: object = None  # a token login's grant (proxy.auth.oauth.TokenGrant): scopes, expiry


ANONYMOUS = Identity()  # every connection's identity until SASL says otherwise
SASL_WAIT_POLL = 0.05  # seconds between looks at a SASL step that waits (a JWKS refetch)


class ServerConnection:
    """Protocol state of one client connection. See the module docstring."""

    # one per client connection: slots keep idle connections small
    __slots__ = ("_first_frame_checked", "_handshake_deadline", "_header_answered", "_held", "_in", "_out",
                 "_refusal", "_sasl", "admit", "failure_delay", "authenticator", "cert_identity", "connection_ptr", "failure", "handler",
                 "identity", "phase", "pipe", "settings", "transport_ptr", "placing", "_placed", "_replayed", "_answered", "_unanswered", "first_attach",
                 "_token_deadline")

    def __init__(self, settings: ConnectionSettings, authenticator, handler, now: float, *,
                 cert_identity: str | None = None, admit=None, failure_delay=None) -> None:
        self.settings = settings
        # () -> seconds the outcome of a failed SASL exchange waits (per source address);
        # the held bytes and when they go: [outcome bytes, delay, release time or None]
        self.failure_delay = failure_delay
        self._held: list | None = None
        self.cert_identity = cert_identity  # from the verified TLS client certificate
        self.admit = admit  # Identity -> None, or the reason to refuse it
        self._refusal: tuple[str, str] | None = None
        self.authenticator = authenticator
        self.handler = handler
        self.phase = Phase.HEADER
        self.identity = ANONYMOUS
        self.failure: str | None = None  # why we closed, for logs and stats
        self._in = b""
        self._out = b""
        self._sasl: SaslServer | None = None
        self._handshake_deadline = now + settings.handshake_timeout if settings.handshake_timeout else None
        self._header_answered = False  # the client's AMQP header went to proton
        self._first_frame_checked = False
        self.pipe: engine.ProtonPipe | None = None
        self.transport_ptr = None  # proton's pn_transport_t, released with the pipe
        self.connection_ptr = None  # proton's pn_connection_t, released with the pipe
        # placement (proxy.amqp.first_attach): hold the first attach back from proton;
        # ``first_attach`` then says where it goes, and the owner of the socket either
        # serves it here (``serve_here``) or hands it on (``handover``)
        self.placing = False
        self._placed = b""  # held back: the first attach and what came with it
        self._replayed = b""  # the client's open and begin frames, which proton read
        # what proton wrote meanwhile (our header, open, begin); None: something else too,
        # which another worker would not write the same (a heartbeat): not handed over
        self._answered: bytes | None = b""
        self._unanswered = b""  # handed over: output the client already has, to drop
        self.first_attach = None
        # a token login: when its token expires (loop time; set by the first tick, None: none)
        self._token_deadline: float | None = None

    @property
    def transport(self) -> Transport | None:
        """A transient wrapper of the proton transport (inspection, rare calls)."""
        return engine.transient(Transport, self.transport_ptr) if self.transport_ptr is not None else None

    @property
    def connection(self) -> Connection | None:
        """A transient wrapper of the proton connection (inspection, rare calls)."""
        return engine.transient(Connection, self.connection_ptr) if self.connection_ptr is not None else None

    @property
    def remote_container(self) -> str:
        if self.connection_ptr is None:
            return ""
        return pn_connection_remote_container(self.connection_ptr) or ""

    def _enter(self, phase: Phase) -> None:
        if phase not in PHASE_TRANSITIONS[self.phase]:
            raise PhaseError(f"connection phase {self.phase.value} -> {phase.value}")
        self.phase = phase

    # -- input -------------------------------------------------------------
    def receive(self, data: bytes) -> None:
        if self.phase is Phase.CLOSED:
            return
        if self.phase is Phase.AMQP:
            self._push_amqp(data)
            return
        self._in += data
        if self.phase is Phase.HEADER:
            self._read_header()
        if self.phase is Phase.SASL:
            self._run_sasl(b"")

    def _read_header(self) -> None:
        if len(self._in) < 8:
            if not (SASL_HEADER.startswith(self._in) or AMQP_HEADER.startswith(self._in)
                    or TLS_HEADER.startswith(self._in)):
                self._refuse_header("wrong protocol header")
            return
        header, rest = self._in[:8], self._in[8:]
        self._in = b""
        if header == SASL_HEADER and self.settings.sasl_mechanisms:
            offered = self.settings.sasl_mechanisms
            if self.cert_identity is None:
                offered = tuple(m for m in offered if m != "EXTERNAL")
            self._sasl = SaslServer(offered, self.authenticator, self.cert_identity)
            self._out += self._sasl.start()
            self._enter(Phase.SASL)
            self._in = rest
        elif header == AMQP_HEADER and not self.settings.sasl_required:
            self._start_amqp(header + rest)
        elif header == AMQP_HEADER or header == TLS_HEADER:
            self._refuse_header(f"protocol header {header!r} not accepted here")
        else:
            self._refuse_header("wrong protocol header")

    def _refuse_header(self, reason: str) -> None:
        # §2.2: reply with the header we support, then close the socket.
        self._out += SASL_HEADER if self.settings.sasl_mechanisms else AMQP_HEADER
        self._fail(reason)

    def _run_sasl(self, data: bytes) -> None:
        assert self._sasl is not None
        try:
            self._out += self._sasl.receive(self._in + data)
        except SaslProtocolError as exc:
            self._fail(f"SASL protocol error: {exc}")
            return
        self._in = b""
        self._sasl_done()

    def _resume_sasl(self, now: float) -> float | None:
        """From ``tick``: a SASL step that waits (a token's JWKS refetch) is answered once
        ready; until then, the next poll (loop time)."""
        try:
            self._out += self._sasl.resume()
        except SaslProtocolError as exc:
            self._fail(f"SASL protocol error: {exc}")
            return None
        if self._sasl.waiting is not None:
            return now + SASL_WAIT_POLL
        self._sasl_done()
        return now if self._held is not None else None  # a failure's delay starts next tick

    def _sasl_done(self) -> None:
        result = self._sasl.result
        if isinstance(result, SaslFailure):
            delay = self.failure_delay() if self.failure_delay is not None else 0.0
            if delay > 0:  # the outcome waits: guessing from one address gets slow
                self._held, self._out = [self._out, delay, None], b""
                self._handshake_deadline = None
            self._fail(f"SASL authentication failed: {result.reason}")
        elif isinstance(result, SaslSuccess):
            self.identity = Identity(result.identity, result.mechanism, result.groups, result.token)
            refusal = self.admit(self.identity) if self.admit is not None else None
            self.admit = None  # asked once per connection
            if refusal:
                self._refusal = ("amqp:resource-limit-exceeded", refusal)
            leftover, self._sasl = self._sasl.leftover, None
            self._start_amqp(leftover)

    def _start_amqp(self, data: bytes) -> None:
        settings = self.settings
        transport = _lib.pn_transport()
        pn_transport_set_server(transport)
        pn_transport_set_max_frame(transport, settings.max_frame_size)
        if settings.idle_timeout:
            pn_transport_set_idle_timeout(transport, int(settings.idle_timeout * 1000))
        connection = _lib.pn_connection()
        pn_connection_set_container(connection, settings.container_id)
        self.pipe = engine.ProtonPipe(transport, connection, self.handler, owned=True,
                                      shared=self.handler.event_pump)
        self.transport_ptr, self.connection_ptr = transport, connection
        self._enter(Phase.AMQP)
        self.handler.on_amqp_start(self)
        if data:
            self._push_amqp(data)

    def _push_amqp(self, data: bytes) -> None:
        if self._refusal is not None:
            self._refuse_after_sasl(data)
            return
        if not self._first_frame_checked:
            data = self._check_first_frame(data)
            if data is None:
                return
        if self.placing:
            data = self._hold_for_placement(data)
            if not data:
                return
        if not self.pipe.push(data) and _lib.pn_transport_capacity(self.transport_ptr) == 0:
            self._abort_amqp("amqp:connection:framing-error", "input not consumed")

    def _check_first_frame(self, data: bytes) -> bytes | None:
        """Answer the AMQP header at once; hold the first frame until its size is known.

        §2.2: the header is answered on receipt, whatever follows it. The first
        frame is refused above 512 bytes (§2.4.1) before proton reads any of it.
        """
        self._in += data
        if not self._header_answered:
            offset = len(AMQP_HEADER)  # the header always comes first in this phase
            if len(self._in) < offset:
                return None
            self._header_answered = True
            self.pipe.push(self._in[:offset])  # proton writes its header back now
            self._in = self._in[offset:]
        buffered = self._in
        if len(buffered) < 4:
            return None
        (size,) = struct.unpack_from(">I", buffered)
        self._first_frame_checked = True
        self._in = b""
        if size > MIN_MAX_FRAME_SIZE:
            self._abort_amqp(
                "amqp:connection:framing-error",
                f"first frame of {size} bytes exceeds {MIN_MAX_FRAME_SIZE} before open (AMQP 1.0 2.4.1)",
            )
            self.failure = f"oversized first frame ({size} bytes)"
            return None
        return buffered

    # -- placement: the first attach read before proton (proxy.amqp.first_attach) ----------
    def _hold_for_placement(self, data: bytes) -> bytes:
        """Hold the first attach back from proton; what to push to proton now."""
        if self.first_attach is not None:  # decided, not yet acted on: keep it all
            self._placed += data
            return b""
        held = self._placed + data
        sniffed = sniff(held)
        if sniffed.state == "wait":
            self._placed = held
            return b""
        if sniffed.state == "attach":
            self._placed, self.first_attach = held, sniffed
            return b""
        self._placed = b""
        if (sniffed.state == "pass" and self._answered is not None
                and len(self._replayed) + len(held) <= MAX_HELD):
            self._replayed += held  # open and begin: proton answers them (_answered)
        else:
            self._stop_placing()
        return held

    def _stop_placing(self) -> None:
        self.placing, self.first_attach = False, None
        self._replayed, self._answered = b"", b""

    def serve_here(self) -> None:
        """Placement done, the connection stays: proton reads what was held."""
        held, self._placed = self._placed, b""
        self._stop_placing()
        if held and self.phase is Phase.AMQP:
            self._push_amqp(held)

    def handover(self) -> tuple[bytes, bytes] | None:
        """For the worker this connection is handed to: the client's frames after its
        AMQP header, and what we answered (our header and proton's answers to its open
        and begin); None when what we wrote is not only that (a heartbeat went out)."""
        if self._answered is None:
            return None
        return self._replayed + self._placed, self._answered

    def resume_handed_over(self, identity: Identity, frames: bytes, answered: bytes) -> None:
        """Serve a connection another worker of this node began: SASL said ``identity``,
        the client has ``answered`` (our AMQP header, open, begin), ``frames`` followed its
        AMQP header. Proton reads the same frames and answers them as the other worker's
        did; that part of its output is dropped (``take_output``)."""
        self.identity = identity
        self._start_amqp(b"")
        self._unanswered = answered
        self._push_amqp(AMQP_HEADER + frames)

    def _refuse_after_sasl(self, data: bytes) -> None:
        """Wait for the AMQP header, then answer open + close(refusal); read nothing else."""
        self._in += data
        if len(self._in) < len(AMQP_HEADER):
            return
        header, self._in = self._in[: len(AMQP_HEADER)], b""
        condition, description = self._refusal
        self._refusal = None
        self._header_answered = self._first_frame_checked = True
        self.failure = f"refused: {description}"
        self.pipe.push(header)
        self._abort_amqp(condition, description)

    def _abort_amqp(self, condition: str, description: str) -> None:
        """Close before the peer's open: proton answers with open + close(condition).

        The condition goes on the transport, which is what proton's error path
        puts in its close frame once the input side is shut.
        """
        self.transport.condition = Condition(condition, description)  # written into proton
        self.pipe.close_input()

    # -- lifecycle ----------------------------------------------------------
    def input_closed(self) -> None:
        """The peer closed its side or the socket failed."""
        if self.phase is Phase.AMQP:
            self.pipe.close_input()
            if _lib.pn_transport_pending(self.transport_ptr) == 0:
                # proton holds a partial frame and writes nothing once the input is
                # shut: close with framing-error so the socket is released now
                self.close("amqp:connection:framing-error", "input ended inside a frame")
        elif self.phase is not Phase.CLOSED:
            self._fail(self.failure or "peer closed during handshake")

    def release(self) -> None:
        """The socket is gone: nothing of this connection stays reachable from shared state."""
        if self.pipe is not None:
            self.pipe.release()

    def close(self, condition: str | None = None, description: str | None = None) -> None:
        """Close the AMQP connection (with an error condition if given)."""
        if self.phase is Phase.AMQP and self.connection_ptr is not None:
            if not pn_connection_state(self.connection_ptr) & PN_LOCAL_ACTIVE:
                self.answer_open()
            connection = self.connection
            if condition:
                connection.condition = Condition(condition, description)
            connection.close()  # writes the condition set on this wrapper
            self.pipe.pump.run()
        else:
            self._fail(description or condition or "closed by node")

    def answer_open(self) -> None:
        """Open our side (§2.4.1): container id, properties and capabilities from the settings."""
        settings = self.settings
        if not settings.properties and not settings.offered_capabilities:
            pn_connection_open(self.connection_ptr)
            return
        connection = self.connection  # proton encodes these from the wrapper on open()
        if settings.properties:
            connection.properties = settings.properties
        if settings.offered_capabilities:
            connection.offered_capabilities = [symbol(c) for c in settings.offered_capabilities]
        connection.open()

    def close_connection(self) -> None:
        """The client closed: close our side too (§2.4.3)."""
        pn_connection_close(self.connection_ptr)

    def _fail(self, reason: str) -> None:
        if self.failure is None:
            self.failure = reason
        self._enter(Phase.CLOSED)
        self._in = b""

    # -- output and timers ---------------------------------------------------
    def take_output(self) -> bytes:
        out = self._out
        if out:
            self._out = b""
        if self.pipe is not None:
            chunk = self.pipe.output()
            if self.placing or self._unanswered:
                chunk = self._placement_output(chunk)
            if not out:
                return chunk
            out += chunk
        return bytes(out)

    def _placement_output(self, chunk) -> bytes:
        """Placement: keep what we answer while the first attach is awaited; handed over,
        drop what the client already has from the other worker (it must be the same)."""
        if self.placing:
            if chunk and self._answered is not None:
                answered = self._answered + chunk
                if (len(answered) <= MAX_HELD and answered.startswith(AMQP_HEADER)
                        and only_open_and_begin(answered[len(AMQP_HEADER):])):
                    self._answered = answered
                else:  # another worker could not write the same (a heartbeat): not handed over
                    self._answered, self._replayed = None, b""
            return chunk
        expected = self._unanswered
        if not chunk:
            return chunk
        taken = bytes(chunk[:len(expected)])
        if taken != expected[:len(taken)]:
            self._unanswered = b""  # never seen: the workers' settings are the same
            raise RuntimeError(f"handed-over connection: proton answered {taken!r} where the "
                               f"client has {expected[:len(taken)]!r}")
        self._unanswered = expected[len(taken):]
        return chunk[len(taken):]

    @property
    def finished(self) -> bool:
        """True when nothing more will be written: the socket may be closed."""
        if self._out or self._held is not None:
            return False
        if self.phase is Phase.CLOSED:
            return True
        return self.pipe is not None and self.pipe.finished

    def tick(self, now: float) -> float | None:
        """Run timers; return the next deadline (loop time) or None."""
        held = self._held
        if held is not None:  # a failed SASL outcome waiting for its delay
            if held[2] is None:
                held[2] = now + held[1]
            if now < held[2]:
                return held[2]
            self._out += held[0]
            self._held = None
            return None
        deadline = None
        if self._handshake_deadline is not None:
            if self._opened():
                self._handshake_deadline = None
            elif now >= self._handshake_deadline:
                self._handshake_deadline = None
                self.failure = self.failure or "handshake deadline passed"
                if self.phase is Phase.AMQP:
                    self._abort_amqp("amqp:connection:forced", "handshake deadline passed")
                else:
                    self._fail("handshake deadline passed")
                return None
            else:
                deadline = self._handshake_deadline
        if self.phase is Phase.SASL and self._sasl is not None and self._sasl.waiting is not None:
            poll = self._resume_sasl(now)
            if poll is not None:
                deadline = poll if deadline is None else min(deadline, poll)
        if self.identity.token is not None and self.phase is Phase.AMQP:
            expires = self.token_deadline(now)
            if now >= expires:
                self._token_deadline = None
                self.failure = self.failure or "token expired"
                self.close("amqp:unauthorized-access", "token expired")
                return None
            deadline = expires if deadline is None else min(deadline, expires)
        if self.phase is Phase.AMQP:
            next_tick = self.pipe.tick(now)
            if next_tick:
                deadline = next_tick if deadline is None else min(deadline, next_tick)
        return deadline

    def token_deadline(self, now: float) -> float:
        """Loop time at which the token login's token expires (exp + leeway, from the wall clock)."""
        if self._token_deadline is None:
            import time

            self._token_deadline = now + (self.identity.token.closes_at - time.time())
        return self._token_deadline

    def renew_token(self, grant) -> None:
        """A new token for this connection (``$cbs`` put-token): its expiry and grants from now."""
        self.identity = Identity(self.identity.user, self.identity.mechanism, grant.groups, grant)
        self._token_deadline = None

    def _opened(self) -> bool:
        connection = self.connection_ptr
        return connection is not None and bool(pn_connection_state(connection) & PN_REMOTE_ACTIVE)

    def process(self) -> None:
        if self.pipe is not None:
            self.pipe.pump.run()
