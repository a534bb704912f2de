"""OAuth 2 tokens against a live node (docs/oauth.md): a real issuer with a JWKS endpoint.

The issuer (``tests/support/oauth_issuer.py``) makes its keys per run and serves
them over HTTP; the node fetches them. python-qpid-proton logs in with SASL
PLAIN and the token as password (RabbitMQ's convention); OAUTHBEARER (RFC 7628)
is spoken by ``RawClient``. Refused tokens get the SASL outcome ``auth`` and are
counted in /metrics by reason; a connection outliving its token is closed with
``amqp:unauthorized-access``; the scopes are the ACL; the admin API takes the
same tokens.
"""

from __future__ import annotations

import time

import pytest
from admin_client import ADMIN_TOKEN, http
from conftest import NodeProcess
from dmz_support import RawClient, condition_of
from oauth_issuer import node_config
from proton import Message
from proton import ConnectionException
from proton.utils import BlockingConnection, LinkDetached

pytestmark = pytest.mark.dmz  # the DMZ gateway's tests: pytest -m dmz

AUTH = 1
UNAUTHORIZED = "amqp:unauthorized-access"
SCOPES = "openid fedgate.send:orders.* fedgate.receive:orders.* fedgate.receive:replies.#"


@pytest.fixture(scope="module")
def node(tmp_path_factory, issuer):
    workdir = tmp_path_factory.mktemp("oauth")
    node = NodeProcess(workdir, node_config(issuer, map=[
        {"claim": "realm_access.roles", "value": "fedgate-operator", "admin": True, "send": ["ops.#"]}])).start()
    yield node
    node.stop()


def connect(node, token: str, user: str = "ignored") -> BlockingConnection:
    return BlockingConnection(node.url, user=user, password=token, allowed_mechs="PLAIN", timeout=10)


def metrics(node) -> dict[str, float]:
    status, text = http("GET", node.admin_url + "/metrics")
    assert status == 200
    found = {}
    for line in text.splitlines():
        if line.startswith("fedgate_oauth_refused_total{"):
            reason = line.split('reason="', 1)[1].split('"', 1)[0]
            found[reason] = float(line.rsplit(" ", 1)[1])
    return found


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"no {what} within {timeout} s")


def test_proton_plain_with_a_token_sends_within_its_scopes(node, issuer):
    conn = connect(node, issuer.token("alice", SCOPES))
    try:
        conn.create_sender("orders.eu").send(Message(body="hello"))
        receiver = conn.create_receiver("orders.eu", credit=1)
        assert receiver.receive(timeout=5).body == "hello"
        receiver.accept()
        with pytest.raises(LinkDetached) as denied:
            conn.create_sender("payments.eu")  # no fedgate.send:payments.* scope
        assert condition_of(denied.value) == UNAUTHORIZED
    finally:
        conn.close()
    assert "authenticated: user alice (PLAIN)" in node.log_path.read_text()


@pytest.mark.parametrize("kind", ["ec", "ed"])
def test_es256_and_eddsa_tokens(node, issuer, kind):
    conn = connect(node, issuer.token("erin", "fedgate.send:orders.*", kind=kind))
    try:
        conn.create_sender("orders.x").send(Message(body=kind))
    finally:
        conn.close()


def refused_tokens(issuer) -> dict[str, str]:
    return {
        "expired": issuer.token(ttl=-60),
        "bad_audience": issuer.token(aud="another-service"),
        "unknown_key": issuer.token(kid=issuer.add_key("rsa", publish=False)),
        "bad_algorithm": issuer.unsigned(scope=SCOPES),
        "malformed": "eyJhbGciOi%%%.e30.bm90LWEtc2lnbmF0dXJl",
    }


def test_refused_tokens_get_sasl_auth_and_are_counted_by_reason(node, issuer):
    before = metrics(node)
    tokens = refused_tokens(issuer)
    tokens["bad_algorithm:hmac"] = issuer.hmac_with_public_key(scope=SCOPES)
    for reason, token in tokens.items():
        with pytest.raises(ConnectionException) as refused:
            connect(node, token).create_sender("orders.x")
        assert "amqp:unauthorized-access" in str(refused.value) or "SASL" in str(refused.value) \
            or "auth" in str(refused.value).lower(), reason
    after = metrics(node)
    grew = {r: after.get(r, 0) - before.get(r, 0) for r in after}
    assert grew["expired"] == 1 and grew["bad_audience"] == 1 and grew["unknown_key"] == 1
    assert grew["bad_algorithm"] == 2 and grew["malformed"] == 1
    log = node.log_path.read_text()
    assert "token refused (SASL PLAIN): bad_audience" in log


def test_oauthbearer_rfc7628(node, issuer):
    client = RawClient("127.0.0.1", node.port)
    try:
        assert "OAUTHBEARER" in client.start_sasl()
        token = issuer.token("olga", "fedgate.send:orders.*")
        code, fields = client.init("OAUTHBEARER", b"n,,\x01auth=Bearer " + token.encode() + b"\x01\x01")
        assert fields[0] == 0
        assert client.amqp().send("orders.o", "via OAUTHBEARER") == "accepted"
    finally:
        client.close()
    client = RawClient("127.0.0.1", node.port)
    try:
        client.start_sasl()
        bad = issuer.token("olga", aud="another-service")
        code, fields = client.init("OAUTHBEARER", b"n,,\x01auth=Bearer " + bad.encode() + b"\x01\x01")
        assert fields[0] == AUTH  # the outcome at once: no JSON error challenge
        assert client.read_until_closed(5) == b""
    finally:
        client.close()


def test_huge_and_malformed_tokens_are_refused_quickly(node, issuer):
    client = RawClient("127.0.0.1", node.port)
    try:
        client.start_sasl()
        started = time.monotonic()
        client.sock.sendall(client_init_frame(b"\x00user\x00" + b"e" * 65536))
        assert client.read_until_closed(5) == b""  # a frame over the cap: closed, no outcome
        assert time.monotonic() - started < 1.0
    finally:
        client.close()
    client = RawClient("127.0.0.1", node.port)
    try:
        client.start_sasl()
        started = time.monotonic()
        code, fields = client.init("PLAIN", b"\x00user\x00" + b"eyJhbGciOiJSUzI1NiJ9." + b"A" * 14000 + b".x")
        assert fields[0] == AUTH
        assert time.monotonic() - started < 3.0  # the failure delay (at most 2 s) included
    finally:
        client.close()
    assert node.alive()


def client_init_frame(initial: bytes) -> bytes:
    from proxy.auth.sasl import INIT, encode_frame

    return encode_frame(INIT, [("symbol", "PLAIN"), ("binary", initial)])


def test_key_rotation_the_first_login_waits_for_the_refetch(tmp_path, issuer):
    """A token signed with a key the node has not fetched yet: the unknown kid starts a
    refetch of the JWKS document and the SASL outcome waits for it, so the very first login
    with the rotated key succeeds (no rate limit here: jwks_min_interval = 0)."""
    node = NodeProcess(tmp_path, node_config(issuer, jwks_min_interval=0.0)).start()
    try:
        before = issuer.fetches
        kid = issuer.rotate("rsa")  # published now; the node has not fetched it yet
        conn = connect(node, issuer.token("rita", "fedgate.send:orders.*", kid=kid))
        try:
            conn.create_sender("orders.rotated").send(Message(body="new key"), timeout=5)
        finally:
            conn.close()
        assert issuer.fetches == before + 1
        assert metrics(node).get("unknown_key", 0) == 0
    finally:
        node.stop()


def test_a_connection_outliving_its_token_is_closed(node, issuer):
    conn = connect(node, issuer.token("eve", SCOPES, ttl=3))
    try:
        receiver = conn.create_receiver("replies.eve", credit=1)
        started = time.monotonic()
        with pytest.raises(ConnectionException) as closed:
            receiver.receive(timeout=15)
        assert condition_of(closed.value) == UNAUTHORIZED
        assert 1.0 < time.monotonic() - started < 10
    finally:
        try:
            conn.close()
        except Exception:
            pass
    node.wait_log("token expired")  # written when the node sees the socket go


def test_connections_view_and_admin_api_with_tokens(node, issuer):
    conn = connect(node, issuer.token("victor", SCOPES))
    try:
        conn.create_receiver("orders.v", credit=1)
        reader = issuer.token("viewer", "fedgate.read")
        status, listing = http("GET", node.admin_url + "/api/v1/connections", token=reader)
        assert status == 200
        items = listing["connections"] if isinstance(listing, dict) else listing
        mine = [c for c in items if c.get("user") == "victor"]
        assert mine and mine[0]["token"]["sub"] == "victor"
        assert "fedgate.receive:replies.#" in mine[0]["token"]["scopes"]
        assert mine[0]["token"]["expires_at"] > time.time()
    finally:
        conn.close()
    assert http("DELETE", node.admin_url + "/api/v1/connections/999999", token=reader)[0] == 403
    operator = issuer.token("oscar", "", realm_access={"roles": ["fedgate-operator"]})
    assert http("DELETE", node.admin_url + "/api/v1/connections/999999", token=operator)[0] == 404
    # the audit log names the token's subject (issue #46)
    status, audit = http("GET", node.admin_url + "/api/v1/audit", token=reader)
    assert status == 200
    assert [(e["who"], e["role"], e["status"]) for e in audit["entries"]] == [
        ("sub:viewer", "read", 403), ("sub:oscar", "admin", 404)]
    assert http("GET", node.admin_url + "/api/v1/connections", token=issuer.token("nobody", "openid"))[0] == 403
    assert http("GET", node.admin_url + "/api/v1/connections", token=issuer.token(ttl=-60))[0] == 401
