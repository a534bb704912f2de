"""Token logins under attack, and handed between workers (docs/oauth.md).

* With two workers behind one listener a connection is handed to the worker
  that owns its first attach's queue (proxy.workers.placement): the token's
  grant and expiry go with it, so the scopes still hold there and the token
  still expires there.
* While a legitimate token client keeps sending and receiving, hostile tokens
  arrive (a 64 KB one, garbage, ``alg: none``, HMAC over the public key, bad
  OAUTHBEARER responses, $cbs without a token login): each is refused as it
  should be and the canary never stalls.
"""

from __future__ import annotations

import time

import pytest
from admin_client import http
from conftest import NodeProcess
from dmz_support import RawClient, condition_of
from oauth_issuer import node_config
from proton import ConnectionException, Message
from proton.utils import BlockingConnection, LinkDetached

pytestmark = pytest.mark.dmz

UNAUTHORIZED = "amqp:unauthorized-access"
SCOPES = "fedgate.send:orders.* fedgate.receive:orders.*"
AUTH = 1


def connect(node, token: str) -> BlockingConnection:
    return BlockingConnection(node.url, user="any", password=token, allowed_mechs="PLAIN", timeout=10)


def handed_over(node) -> float:
    status, text = http("GET", node.admin_url + "/metrics")
    assert status == 200
    line = next(x for x in text.splitlines() if x.startswith("fedgate_connections_handed_over_total"))
    return float(line.rsplit(" ", 1)[1])


def test_grants_and_expiry_go_with_a_handed_over_connection(tmp_path, issuer):
    config = node_config(issuer)
    config["node"] = {"workers": 2}
    node = NodeProcess(tmp_path, config).start()
    try:
        for i in range(8):  # first attaches to queues of both workers: some are handed on
            conn = connect(node, issuer.token(f"w{i}", SCOPES))
            try:
                conn.create_sender(f"orders.w{i}").send(Message(body=i), timeout=5)
                with pytest.raises(LinkDetached) as denied:
                    conn.create_sender(f"payments.w{i}")
                assert condition_of(denied.value) == UNAUTHORIZED
            finally:
                conn.close()
        assert handed_over(node) > 0  # (the supervisor's count: worker 0 answers /metrics)
        expiring = []
        for i in range(4):
            conn = connect(node, issuer.token(f"x{i}", SCOPES, ttl=3))
            expiring.append((conn, conn.create_receiver(f"orders.x{i}", credit=1)))
        for conn, receiver in expiring:
            with pytest.raises(ConnectionException) as closed:
                receiver.receive(timeout=15)
            assert condition_of(closed.value) == UNAUTHORIZED
            try:
                conn.close()
            except Exception:
                pass
    finally:
        node.stop()


def test_hostile_tokens_while_a_canary_keeps_going(tmp_path, issuer):
    node = NodeProcess(tmp_path, node_config(issuer)).start()
    canary = connect(node, issuer.token("canary", SCOPES, ttl=600))
    try:
        sender = canary.create_sender("orders.canary")
        receiver = canary.create_receiver("orders.canary", credit=10)
        seq = 0

        def canary_round():
            nonlocal seq
            seq += 1
            sender.send(Message(body=seq), timeout=5)
            assert receiver.receive(timeout=5).body == seq
            receiver.accept()

        attacks = {
            "64 KB PLAIN": b"\x00any\x00" + b"e" * 65536,
            "garbage PLAIN": b"\x00any\x00" + b"a.b." + bytes(range(256)) * 8,
            "alg none": b"\x00any\x00" + issuer.unsigned(scope=SCOPES).encode(),
            "hmac": b"\x00any\x00" + issuer.hmac_with_public_key(scope=SCOPES).encode(),
        }
        for name, initial in attacks.items():
            client = RawClient("127.0.0.1", node.port, timeout=10)
            try:
                client.start_sasl()
                from proxy.auth.sasl import INIT, encode_frame

                started = time.monotonic()
                client.sock.sendall(encode_frame(INIT, [("symbol", "PLAIN"), ("binary", initial)]))
                rest = client.read_until_closed(5)  # the outcome auth, or a close for the 64 KB frame
                assert rest == b"" or rest[-1:] == bytes([AUTH]), name
                assert time.monotonic() - started < 3.0, name  # the failure delay is at most 2 s
            finally:
                client.close()
            canary_round()
        for response in (b"n,,auth=Bearer x", b"p=tls-unique,,\x01auth=Bearer x\x01\x01",
                         b"n,,\x01auth=Basic x\x01\x01", b"\x01" * 100):
            client = RawClient("127.0.0.1", node.port, timeout=10)
            try:
                client.start_sasl()
                assert client.init("OAUTHBEARER", response)[1][0] == AUTH
            finally:
                client.close()
            canary_round()
        assert node.alive()
        assert "Traceback" not in node.log_path.read_text()
    finally:
        canary.close()
        node.stop()
