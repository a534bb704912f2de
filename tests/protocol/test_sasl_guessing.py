"""Password guessing is slowed per source address, and unknown users cost as much as known ones.

Issue #21: 200 PLAIN attempts a second from one address were answered at
once, and PLAIN answered an unknown user about 5x faster than a known one
(user names could be probed). Now a failed exchange's outcome waits 0.1 s,
doubling with each failure from the same address within a minute (at most
2 s); other addresses are not slowed. Measured on the playbook's virtual
clock: exact, no sleeping.
"""

from __future__ import annotations

import asyncio
import statistics
import time

import pytest
from fuzz import frames as f

from playbook import World, run
from proxy.auth.mechanisms import Authenticator, SaslFailure
from proxy.auth.users import UsersFile, make_record

pytestmark = pytest.mark.timeout(30)
SASL_HEADER = b"AMQP\x03\x01\x00\x00"


class SaslProbe(asyncio.Protocol):
    """Sends a PLAIN sasl-init; notes when the outcome (the second SASL frame) arrives."""

    def __init__(self, user: str, password: str) -> None:
        self.init = f.sasl_frame(f.SASL_INIT, [f.symbol("PLAIN"), f.binary(f"\0{user}\0{password}".encode())])
        self.received = b""
        self.sent_at = self.outcome_at = None
        self.lost = False

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.loop = asyncio.get_running_loop()
        transport.write(SASL_HEADER)

    def data_received(self, data: bytes) -> None:
        self.received += data
        if self.sent_at is None and len(self.received) > 8:  # our header back + mechanisms
            self.sent_at = self.loop.time()
            self.transport.write(self.init)
        elif self.sent_at is not None and self.outcome_at is None:
            self.outcome_at = self.loop.time()

    def eof_received(self):
        return False

    def connection_lost(self, exc) -> None:
        self.lost = True

    @property
    def waited(self) -> float:
        return round(self.outcome_at - self.sent_at, 3)


def users_file(tmp_path, iterations: int = 4096) -> str:
    users = UsersFile(tmp_path / "users.json")
    users.add(make_record("alice", "right-password", iterations=iterations))
    users.save()
    return str(tmp_path / "users.json")


async def attempt(world: World, host: str, password: str, user: str = "alice") -> SaslProbe:
    """One PLAIN exchange; a failed one also ends the connection."""
    _, probe = await world.network.host(host).connect(lambda: SaslProbe(user, password), "a", 5672)
    await world.until(lambda: probe.outcome_at is not None and (probe.lost or password == "right-password"),
                      what="the outcome")
    return probe


def test_failed_logins_from_one_address_wait_longer_and_longer(tmp_path):
    async def play():
        world = World(tmp_path)
        await world.node("a", sasl={"mechanisms": ["PLAIN"], "users_file": users_file(tmp_path),
                                    "allow_plain_without_tls": True, "require": True})
        waits = [(await attempt(world, "guesser", f"guess{i}")).waited for i in range(7)]
        assert waits == [0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0]
        # another address is not slowed by the guesser, and a right password is answered at once
        assert (await attempt(world, "bystander", "wrong")).waited == 0.1
        assert (await attempt(world, "owner", "right-password")).waited == 0.0
        await world.close()

    run(play)


def test_an_unknown_user_takes_as_long_as_a_known_one_with_a_wrong_password(tmp_path):
    authenticator = Authenticator(UsersFile(tmp_path / "users.json",
                                            {"alice": make_record("alice", "pw", iterations=60_000)}))

    def timed(name: str) -> float:
        started = time.perf_counter()
        assert isinstance(authenticator.check_plain(name, "wrong"), SaslFailure)
        return time.perf_counter() - started

    known = statistics.median(timed("alice") for _ in range(5))
    unknown = statistics.median(timed("mallory") for _ in range(5))
    # same key derivation either way (60,000 PBKDF2 rounds, tens of ms): before, ~0 for unknown
    assert 0.5 < unknown / known < 2.0, (known, unknown)
