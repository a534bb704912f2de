"""Fuzz streams for the token path (docs/oauth.md): SASL PLAIN / OAUTHBEARER with
mutated JWTs (some valid: the login goes on to the AMQP header and open).

Not here: put-token requests on ``$cbs``. The runner writes a whole stream at
once, and transfers written before the node's begin is read are outside the
session window it opens (``amqp:session:window-violation``), so they never
reach the node; ``tests/protocol/test_oauth_validation.py`` fuzzes put-token
requests in memory instead.

``token_stream(fuzzer)`` draws from the fuzzer's own ``random.Random``, so a
seed repeats byte for byte; the tokens themselves (``fuzzer.tokens``: valid
ones from the test's issuer, keys made per run) differ between runs.
"""

from __future__ import annotations

from fuzz.frames import AMQP_HEADER, SASL_HEADER, SASL_INIT, Stream, binary, open_frame, sasl_frame, symbol


def mutated_token(fz) -> bytes:
    r = fz.rng
    token = r.choice(fz.tokens).encode()
    choice = r.randrange(8)
    if choice == 0:
        return token  # a valid one: the login goes on
    if choice == 1:
        return fz.mutate(token)
    if choice == 2:
        return token[: r.randrange(len(token))]
    if choice == 3:  # parts swapped or repeated
        parts = token.split(b".")
        return b".".join(r.choice(parts) for _ in range(r.randint(1, 5)))
    if choice == 4:  # over the size cap (16 KiB), or over the SASL frame cap (17 KiB)
        return b"eyJ" + b"A" * r.choice([16 * 1024, 17 * 1024, 20 * 1024]) + b".e30.x"
    if choice == 5:
        return b"eyJhbGciOiJub25lIn0." + fz.rand_bytes(0, 300) + b"."
    if choice == 6:
        return fz.rand_bytes(0, 400)
    return token.replace(b".", b"", 1)


def token_init(fz) -> bytes:
    r = fz.rng
    token = mutated_token(fz)
    if r.random() < 0.5:
        return sasl_frame(SASL_INIT, [symbol("PLAIN"), binary(b"\x00any\x00" + token)])
    gs2 = r.choice([b"n,,", b"y,,", b"n,a=fuzz,", b"p=x,,", b"n", b""])
    auth = r.choice([b"auth=Bearer ", b"auth=bearer ", b"auth=Basic ", b"auth=", b""])
    tail = r.choice([b"\x01\x01", b"\x01", b"", b"\x01host=h\x01\x01"])
    return sasl_frame(SASL_INIT, [symbol("OAUTHBEARER"), binary(gs2 + b"\x01" + auth + token + tail)])


def token_stream(fz) -> Stream:
    fz.counter += 1
    data = SASL_HEADER + token_init(fz) + AMQP_HEADER + open_frame(f"fuzz-{fz.counter}")
    return Stream("token", data, 1)
