"""Token validation (proxy.auth.oauth, docs/oauth.md): in memory, keys made per run.

Each refusal is asserted by its reason (the label in /metrics); the client
only ever sees the SASL outcome ``auth``. The hostile tokens (``alg: none``,
HMAC over the public key, a 64 KB token, garbage) are refused before any
signature check, in bounded time.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from oauth_issuer import AUDIENCE, ISSUER, Issuer

from proxy.auth.acl import AclEntry
from proxy.auth.mechanisms import Authenticator, SaslFailure, SaslSuccess
from proxy.auth.oauth import MAX_TOKEN_BYTES, KeySet, OAuthSection, TokenRefused, Validator
from proxy.auth.oauth.bearer import OAuthBearerMechanism, parse_gs2
from proxy.auth.oauth.keys import keys_from_jwks


@pytest.fixture(scope="module")
def issuer():
    return Issuer()


def validator(issuer, acl=(), **section) -> Validator:
    settings = OAuthSection(issuer=ISSUER, audience=AUDIENCE, keys=("x.pem",), **section)
    keys = KeySet()
    keys.fetched = keys_from_jwks(issuer.jwks())
    return Validator(settings, keys, acl)


def reason_of(v: Validator, token) -> str:
    with pytest.raises(TokenRefused) as refused:
        v.validate(token)
    return refused.value.reason


@pytest.mark.parametrize("kind", ["rsa", "ec", "ed"])
def test_each_algorithm_is_accepted(issuer, kind):
    grant = validator(issuer).validate(issuer.token("alice", "fedgate.send:orders.*", kind=kind))
    assert grant.subject == "alice" and grant.send == ("orders.*",)
    assert grant.expires_at > time.time()


def test_refusals_by_reason(issuer):
    v = validator(issuer)
    other = Issuer()  # same kid names, other keys: the signature does not verify
    cases = {
        "expired": issuer.token(ttl=-120),  # past the 30 s leeway
        "bad_audience": issuer.token(aud="someone-else"),
        "bad_issuer": issuer.token(iss="https://evil.test/"),
        "unknown_key": issuer.token(kid=issuer.add_key("rsa", publish=False)),
        "bad_algorithm": issuer.unsigned(),
        "bad_signature": other.token(kid=issuer.kid_of("rsa")),
        "not_yet_valid": issuer.token(nbf=int(time.time()) + 600),
        "malformed": "a.b.c",
        "no_subject": issuer.token(sub=None),
    }
    assert {reason: reason_of(v, token) for reason, token in cases.items()} == {r: r for r in cases}
    assert reason_of(v, issuer.hmac_with_public_key()) == "bad_algorithm"
    assert reason_of(v, issuer.token(exp=None)) == "expired"  # exp is required


def test_leeway_allows_a_little_clock_skew(issuer):
    v = validator(issuer, leeway=30.0)
    grant = v.validate(issuer.token(ttl=-10))
    assert grant.subject == "alice"
    assert grant.closes_at == grant.expires_at + 30  # a connection on it lives to exp + leeway
    assert reason_of(validator(issuer, leeway=0.0), issuer.token(ttl=-10)) == "expired"


def test_a_key_of_the_wrong_type_for_alg_is_refused(issuer):
    """A token that says ES256 but names the RSA key's kid never reaches a verifier."""
    import jwt

    kid = issuer.kid_of("rsa")
    token = jwt.encode(issuer.claims(), issuer.keys[issuer.kid_of("ec")][1], algorithm="ES256",
                       headers={"kid": kid})
    assert reason_of(validator(issuer), token) == "bad_algorithm"


def test_hostile_tokens_cost_little(issuer):
    v = validator(issuer)
    huge = "e" * (64 * 1024)
    garbage = "eyJhbGciOiJSUzI1NiJ9." + "A" * 12000 + ".x"
    start = time.perf_counter()
    for _ in range(200):
        assert reason_of(v, huge) == "too_large"
    per_huge = (time.perf_counter() - start) / 200
    start = time.perf_counter()
    for _ in range(200):
        assert reason_of(v, garbage) == "malformed"
    per_garbage = (time.perf_counter() - start) / 200
    start = time.perf_counter()
    good = issuer.token()
    for _ in range(50):
        v.validate(good)
    per_good = (time.perf_counter() - start) / 50
    print(f"64 KB token {per_huge * 1e6:.1f} us, 12 KB malformed {per_garbage * 1e6:.1f} us, "
          f"valid RS256 {per_good * 1e6:.1f} us")
    assert per_huge < 0.001 and per_garbage < 0.005
    assert len(huge) > MAX_TOKEN_BYTES


def test_scopes_and_map_become_acl_grants(issuer):
    acl = (AclEntry(group="ops", receive=("ops.#",)),)
    v = validator(issuer, acl, map=({"claim": "realm_access.roles", "value": "auditor",
                                     "receive": ["audit.#"], "read": True, "groups": ["ops"]},))
    grant = v.validate(issuer.token("bob", "openid fedgate.send:orders.* fedgate.receive:replies.bob "
                                    "fedgate.admin other.scope fedgate.send: fedgate.bogus",
                                    realm_access={"roles": ["auditor"]}))
    assert grant.admin and grant.read and grant.groups == ("ops",)
    assert grant.scopes == ("fedgate.send:orders.*", "fedgate.receive:replies.bob", "fedgate.admin",
                            "fedgate.receive:audit.#", "fedgate.read")
    from proxy.amqp.connection import Identity

    who = Identity("bob", "PLAIN", grant.groups, grant)
    assert grant.allows(who, "orders.eu", "send") and not grant.allows(who, "orders.eu", "receive")
    assert grant.allows(who, "audit.x.y", "receive") and grant.allows(who, "ops.q", "receive")
    assert not grant.allows(who, "payments", "send")
    bare = v.validate(issuer.token("carol", "openid"))
    assert not bare.allows(Identity("carol", "PLAIN", (), bare), "orders.eu", "send")  # nothing granted


def test_oauthbearer_response_parsing(issuer):
    assert parse_gs2(b"n,,\x01auth=Bearer abc\x01\x01") == ("", {"auth": b"Bearer abc"})
    assert parse_gs2(b"n,a=al=2Cice,\x01host=h\x01auth=Bearer t\x01\x01")[0] == "al,ice"
    for bad in (b"p=tls-unique,,\x01auth=Bearer t\x01\x01", b"n,,auth=Bearer t", b"x"):
        with pytest.raises(ValueError):
            parse_gs2(bad)
    auth = Authenticator(None, validator(issuer))
    mech = OAuthBearerMechanism(auth)
    token = issuer.token("alice", "fedgate.send:a")
    step = mech.start(b"n,,\x01auth=Bearer " + token.encode() + b"\x01\x01")
    assert isinstance(step, SaslSuccess) and step.identity == "alice" and step.token.send == ("a",)
    step = mech.start(b"n,a=mallory,\x01auth=Bearer " + token.encode() + b"\x01\x01")
    assert isinstance(step, SaslFailure) and "may not act as" in step.reason
    assert auth.oauth.refused["wrong_user"] == 1


def test_plain_tries_the_users_file_then_the_token(issuer, tmp_path):
    from proxy.auth.users import UsersFile, make_record

    users = UsersFile(tmp_path / "u.json", {"svc": make_record("svc", "pw", iterations=4096)})
    auth = Authenticator(users, validator(issuer))
    assert auth.check_plain("svc", "pw") == SaslSuccess("svc", "PLAIN", ())
    step = auth.check_plain("anything", issuer.token("alice", "fedgate.receive:x"))
    assert isinstance(step, SaslSuccess) and step.identity == "alice" and step.token.receive == ("x",)
    refused = auth.check_plain("anything", issuer.token(ttl=-3600))
    assert isinstance(refused, SaslFailure) and refused.code == 1 and "expired" in refused.reason
    assert isinstance(auth.check_plain("svc", "wrong"), SaslFailure)  # not a token: the file's answer


def test_jwks_fetched_refetched_on_unknown_kid_and_rate_limited():
    issuer = Issuer().serve()
    try:
        async def scenario():
            clock = [1000.0]
            keys = KeySet(jwks_url=issuer.jwks_url, min_interval=10.0, clock=lambda: clock[0])
            await keys.start()
            assert set(keys.fetched) == set(issuer.published) and issuer.fetches == 1
            new = issuer.rotate("ec")
            clock[0] += 5  # within min_interval: no fetch
            assert keys.candidates(new) == [] and keys.fetches["rate_limited"] == 1
            clock[0] += 6
            assert keys.candidates(new) == []  # this miss starts the fetch...
            assert keys.candidates(new) == []  # ... and a second miss does not start another
            await asyncio.wait_for(keys._task, 10)
            assert len(keys.candidates(new)) == 1 and issuer.fetches == 2
            await keys.stop()

        asyncio.run(scenario())
    finally:
        issuer.stop()


def test_admin_api_roles_from_tokens(issuer):
    from admin_api.auth import NO_ROLE, Tokens, allowed, role_for

    v = validator(issuer, map=({"claim": "groups", "value": "ops", "admin": True},))
    configured = Tokens.from_config(({"token": "static-admin-token", "role": "admin"},))
    assert role_for(configured, v, "static-admin-token") == "admin"  # configured tokens first
    assert role_for(configured, v, issuer.token("a", "fedgate.admin")) == "admin"
    assert role_for(configured, v, issuer.token("a", "", groups=["ops"])) == "admin"
    assert role_for(configured, v, issuer.token("r", "fedgate.read")) == "read"
    assert role_for(configured, v, issuer.token("n", "openid")) == NO_ROLE
    assert not allowed(NO_ROLE, "GET")
    assert role_for(configured, v, issuer.token(ttl=-3600)) is None
    assert role_for(configured, None, issuer.token("a", "fedgate.admin")) is None  # no [oauth]
    assert v.refused["expired"] == 1


def test_token_authorizer(issuer):
    from proxy.amqp.connection import Identity
    from proxy.auth.acl import Acl
    from proxy.auth.oauth import token_authorizer

    acl = Acl((AclEntry(user="svc", send=("jobs",)),))
    authorize = token_authorizer(acl)
    grant = validator(issuer).validate(issuer.token("alice", "fedgate.send:orders.*"))
    alice = Identity("alice", "PLAIN", (), grant)
    svc = Identity("svc", "PLAIN")
    assert authorize(alice, "orders.x", "send") and not authorize(alice, "jobs", "send")
    assert authorize(svc, "jobs", "send") and not authorize(svc, "orders.x", "send")
    assert authorize(alice, "$cbs", "send") and not authorize(svc, "$cbs", "send")  # renewal: tokens only
    assert authorize(alice, None, "receive")  # a temporary queue, as for users-file users
    assert not token_authorizer(Acl(()))(Identity("bob", "PLAIN", (), validator(issuer).validate(
        issuer.token("bob", "openid"))), "orders.x", "send")  # no [[acl]]: still nothing granted


def test_fuzzed_tokens_are_refused_with_a_reason_never_an_exception(issuer):
    """Mutations of valid tokens (bytes flipped, cut, parts swapped, headers rewritten): each
    is refused with one of the known reasons, or (a mutation that changed nothing the
    signature covers) accepted; nothing else escapes, and each costs little."""
    import base64
    import json
    import random

    from proxy.auth.oauth.validate import REASONS

    rng = random.Random(int(time.time()))
    v = validator(issuer)
    seeds = [issuer.token("fuzz", "fedgate.send:a", kind=k) for k in ("rsa", "ec", "ed")]

    def b64(obj) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()

    headers = [{"alg": "RS256", "kid": ["x"]}, {"alg": "RS256", "kid": "k" * 5000}, {"alg": None},
               {"alg": "RS256", "crit": ["exp"]}, [], {"alg": "ES256", "kid": issuer.kid_of("ed")},
               {"alg": "EdDSA", "kid": issuer.kid_of("rsa")}, {"alg": "HS512"}, {"alg": "RS256", "jku": "http://x"}]
    slowest = 0.0
    for case in range(600):
        token = rng.choice(seeds)
        head, body, sig = token.split(".")
        kind = case % 6
        if kind == 0:
            i = rng.randrange(len(token))
            token = token[:i] + rng.choice("AZaz09-_.=!") + token[i + 1:]
        elif kind == 1:
            token = token[: rng.randrange(len(token))]
        elif kind == 2:
            token = ".".join(rng.sample([head, body, sig], 3))
        elif kind == 3:
            token = f"{b64(rng.choice(headers))}.{body}.{sig}"
        elif kind == 4:
            token = f"{head}.{b64(rng.choice([[], 'x', {'exp': 'soon'}, {'aud': 5}, None]))}.{sig}"
        else:
            token = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 3000)))
        start = time.perf_counter()
        try:
            v.validate(token)
        except TokenRefused as exc:
            assert exc.reason in REASONS
        slowest = max(slowest, time.perf_counter() - start)
    assert slowest < 0.05


def test_put_token_requests_fuzzed(issuer):
    """$cbs put-token requests (proxy.amqp.cbs) decoded from mutated encodings: every one is
    answered with a status (202, 400, 401, 403), nothing escapes."""
    import random
    from types import SimpleNamespace

    from proton import Message

    from proxy.amqp.cbs import CbsNode
    from proxy.amqp.connection import Identity

    v = validator(issuer)
    node = CbsNode(v)
    grant = v.validate(issuer.token("cbs-user", "fedgate.send:a"))
    renewed = []
    connection = SimpleNamespace(identity=Identity("cbs-user", "PLAIN", (), grant),
                                 renew_token=renewed.append)
    handler = SimpleNamespace(server_connection=connection, peer="test", connection_id=1, links={},
                              broker=SimpleNamespace(authorize=lambda *a: True))
    good = Message(id="r", reply_to="cbs", body=issuer.token("cbs-user", "fedgate.send:a"),
                   properties={"operation": "put-token", "type": "jwt", "name": "x"}).encode()
    assert node.put_token(handler, decoded(good)) == (202, "Accepted") and len(renewed) == 1
    rng = random.Random(int(time.time()))
    statuses = set()
    for _ in range(400):
        data = bytearray(good)
        for _ in range(rng.randint(1, 6)):
            data[rng.randrange(len(data))] = rng.getrandbits(8)
        message = decoded(bytes(data))
        if message is None:
            continue  # proton could not decode it: the node answers 400 (CbsRequests)
        status, _ = node.put_token(handler, message)
        statuses.add(status)
    assert statuses <= {202, 400, 401, 403} and statuses & {400, 401}


def decoded(data: bytes):
    from proton import Message

    message = Message()
    try:
        message.decode(data)
    except Exception:
        return None
    return message


def test_key_files_that_do_not_load_name_their_key(tmp_path):
    from proxy.auth.oauth.keys import KeyFileError

    (tmp_path / "bad.pem").write_text("-----BEGIN PUBLIC KEY-----\nnot a key\n-----END PUBLIC KEY-----\n")
    for keys, key in ((("missing.pem",), "oauth.keys[0]"), (("missing.pem", "bad.pem"), "oauth.keys[0]")):
        section = OAuthSection(issuer=ISSUER, audience=AUDIENCE, keys=keys)
        with pytest.raises(KeyFileError) as exc:
            KeySet.from_config(section, lambda p: tmp_path / p)
        assert exc.value.key == key
    section = OAuthSection(issuer=ISSUER, audience=AUDIENCE, keys=("bad.pem",))
    with pytest.raises(KeyFileError, match="oauth.keys.0.: .*bad.pem"):
        KeySet.from_config(section, lambda p: tmp_path / p)


def test_sasl_waits_once_for_a_refetch_under_way(issuer):
    """A token whose kid is new while the JWKS document is being fetched again: the SASL
    outcome waits for that fetch (bytes the client pipelines meanwhile stay buffered), then
    the token is checked again; a kid still unknown then is refused once."""
    from proxy.auth.mechanisms import Wait
    from proxy.auth.sasl import INIT, SaslServer, encode_frame
    from proxy.auth.oauth.keys import keys_from_jwks

    class Refetching(KeySet):
        pending = False

        @property
        def fetching(self):
            return self.pending

        def request_fetch(self):
            self.pending = True

    keys = Refetching()
    keys.fetched = keys_from_jwks(issuer.jwks())
    v = Validator(OAuthSection(issuer=ISSUER, audience=AUDIENCE, keys=("x.pem",)), keys)
    auth = Authenticator(None, v)
    new_kid = issuer.add_key("rsa", publish=False)
    amqp_header = b"AMQP\x00\x01\x00\x00"

    def login(token: str):
        server = SaslServer(("PLAIN",), auth)
        server.start()
        out = server.receive(encode_frame(INIT, [("symbol", "PLAIN"),
                                                 ("binary", b"\x00any\x00" + token.encode())]) + amqp_header)
        return server, out

    server, out = login(issuer.token("rot", "fedgate.send:a", kid=new_kid))
    assert out == b"" and isinstance(server.waiting, Wait) and server.result is None
    assert server.resume() == b""  # not ready: nothing yet
    issuer.published.append(new_kid)
    keys.fetched, keys.pending = keys_from_jwks(issuer.jwks()), False  # the fetch is done
    assert server.resume() != b"" and isinstance(server.result, SaslSuccess)
    assert server.result.identity == "rot" and server.leftover == amqp_header
    assert v.refused["unknown_key"] == 0
    server, out = login(issuer.token("rot", kid=issuer.add_key("rsa", publish=False)))
    keys.pending = False
    assert server.resume() != b"" and isinstance(server.result, SaslFailure)
    assert v.refused["unknown_key"] == 1  # counted once, after the wait
    keys.pending = False
    keys.request_fetch = lambda: None  # rate-limited: no fetch under way, no wait
    server, out = login(issuer.token("rot", kid=issuer.add_key("rsa", publish=False)))
    assert out != b"" and isinstance(server.result, SaslFailure) and server.waiting is None
