"""Token logins from other clients (docs/oauth.md): rhea, go-amqp and Qpid JMS.

Each sends with SASL PLAIN and a JWT as the password (RabbitMQ's convention:
the user name is ignored), within the token's scopes; a send outside them is
detached with ``amqp:unauthorized-access``, and an expired token is refused at
SASL. python-qpid-proton is in ``tests/integration/test_dmz_oauth.py``.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest
from conftest import TESTS, ClientProcess, NodeProcess, require
from oauth_issuer import node_config

pytestmark = pytest.mark.dmz

UNAUTHORIZED = "amqp:unauthorized-access"
SCOPES = "fedgate.send:orders.* fedgate.receive:orders.*"
JMS = TESTS / "jms" / "target"


@pytest.fixture(scope="module")
def node(tmp_path_factory, issuer):
    node = NodeProcess(tmp_path_factory.mktemp("oauth-clients"), node_config(issuer)).start()
    yield node
    node.stop()


def send(kind: str, node, address: str, token: str) -> dict:
    client = ClientProcess(kind, "send", node.url, address=address, count=2, username="any",
                           password=token, sasl="plain", timeout_ms=10000)
    try:
        return client.finish(timeout=30)[-1]
    finally:
        client.kill()


@pytest.mark.parametrize("kind", ["rhea", "go"])
def test_client_sends_with_a_token(node, issuer, kind):
    done = send(kind, node, "orders.rhea", issuer.token(f"{kind}-user", SCOPES))
    assert done["accepted"] == 2 and not done.get("error")
    denied = send(kind, node, "payments.eu", issuer.token(f"{kind}-user", SCOPES))
    assert UNAUTHORIZED in str(denied.get("error"))
    refused = send(kind, node, "orders.rhea", issuer.token(f"{kind}-user", SCOPES, ttl=-60))
    assert refused.get("error") and refused.get("accepted", 0) == 0


def jms(*args) -> dict:
    java = shutil.which("java")
    require(java is not None, "java")
    require((JMS / "classes" / "fedgate" / "JmsClient.class").is_file(),
            "the Qpid JMS test client (bash .ci/install/jms.sh)")
    cmd = [java, "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-cp",
           f"{JMS / 'classes'}:{JMS / 'lib'}/*", "fedgate.JmsClient", *map(str, args)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=90, stdin=subprocess.DEVNULL)
    import json

    lines = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
    assert lines, out.stderr
    return lines[-1]


def test_qpid_jms_sends_and_receives_with_a_token(node, issuer):
    def url(token: str) -> str:
        return node.url + f"?amqp.saslMechanisms=PLAIN&jms.username=any&jms.password={token}"

    token = issuer.token("jms-user", SCOPES)
    assert jms("send", url(token), "orders.jms", 3, "t")["sent"] == 3
    assert jms("receive", url(token), "orders.jms", 3, 2000)["ids"] == ["t-0", "t-1", "t-2"]
    assert UNAUTHORIZED in jms("send", url(token), "payments.jms", 1, "x")["error"]
    refused = jms("send", url(issuer.token("jms-user", SCOPES, ttl=-60)), "orders.jms", 1, "x")
    assert refused["type"].endswith("JMSSecuritySaslException")
