"""Token renewal in band on ``$cbs`` (docs/oauth.md, proxy/amqp/cbs.py), against a live node.

python-qpid-proton plays the Azure SDK / rhea-promise side of the put-token
exchange: a sender and a receiver on ``$cbs``, a request with
application-properties ``operation = put-token``, ``type = jwt``, ``name``,
the token as the body; the answer's ``status-code`` and correlation-id are
checked. A connection renewed before its token expires lives on past the old
expiry; a narrowed scope detaches the links it no longer allows and refuses
new ones; a refused token (401), another user's token (403) and a SAS token
(400) change nothing.
"""

from __future__ import annotations

import time
import uuid

import pytest
from conftest import NodeProcess
from dmz_support import condition_of
from oauth_issuer import node_config
from proton import ConnectionException, Message
from proton.utils import BlockingConnection, LinkDetached

pytestmark = pytest.mark.dmz

UNAUTHORIZED = "amqp:unauthorized-access"
SCOPES = "fedgate.send:orders.* fedgate.receive:orders.* fedgate.receive:replies.#"


@pytest.fixture(scope="module")
def node(tmp_path_factory, issuer):
    node = NodeProcess(tmp_path_factory.mktemp("oauth-cbs"), node_config(issuer)).start()
    yield node
    node.stop()


class Cbs:
    """The client side of the put-token exchange on one connection."""

    def __init__(self, conn: BlockingConnection) -> None:
        self.sender = conn.create_sender("$cbs")
        self.receiver = conn.create_receiver("$cbs", credit=10)

    def put_token(self, token, type_: str = "jwt", name: str = "fedgate-dmz") -> tuple[int, str]:
        request_id = str(uuid.uuid4())
        self.sender.send(Message(id=request_id, reply_to="cbs", body=token, properties={
            "operation": "put-token", "type": type_, "name": name,
            "expiration": int(time.time()) + 300}), timeout=5)
        answer = self.receiver.receive(timeout=5)  # sent settled: nothing to accept
        assert answer.correlation_id == request_id
        return answer.properties["status-code"], answer.properties["status-description"]


def connect(node, token: str) -> BlockingConnection:
    return BlockingConnection(node.url, user="any", password=token, allowed_mechs="PLAIN", timeout=10)


def test_renewed_connection_lives_past_the_old_expiry(node, issuer):
    first = issuer.token("rene", SCOPES, ttl=3)
    old_exp = time.time() + 3
    conn = connect(node, first)
    try:
        cbs = Cbs(conn)
        assert cbs.put_token(issuer.token("rene", SCOPES, ttl=300)) == (202, "Accepted")
        sender = conn.create_sender("orders.renew")
        receiver = conn.create_receiver("orders.renew", credit=10)
        # the old token's expiry is a known instant: wait until it is 1.5 s behind us
        time.sleep(max(0.0, old_exp + 1.5 - time.time()))
        sender.send(Message(body="after the old expiry"), timeout=5)
        assert receiver.receive(timeout=5).body == "after the old expiry"
        receiver.accept()
    finally:
        conn.close()
    assert "token renewed on $cbs" in node.log_path.read_text()


def test_unrenewed_connection_is_closed_at_expiry(node, issuer):
    conn = connect(node, issuer.token("ursula", SCOPES, ttl=2))
    try:
        receiver = conn.create_receiver("replies.ursula", credit=1)
        with pytest.raises(ConnectionException) as closed:
            receiver.receive(timeout=15)
        assert condition_of(closed.value) == UNAUTHORIZED
    finally:
        try:
            conn.close()
        except Exception:
            pass


def test_narrowed_scope_detaches_links_outside_it(node, issuer):
    conn = connect(node, issuer.token("nina", SCOPES))
    try:
        cbs = Cbs(conn)
        orders = conn.create_receiver("orders.nina", credit=1)
        replies = conn.create_receiver("replies.nina", credit=1)
        narrowed = "fedgate.receive:replies.# fedgate.send:replies.#"
        assert cbs.put_token(issuer.token("nina", narrowed)) == (202, "Accepted")
        with pytest.raises(LinkDetached) as detached:
            orders.receive(timeout=5)
        assert condition_of(detached.value) == UNAUTHORIZED
        with pytest.raises(LinkDetached) as refused:
            conn.create_sender("orders.nina")  # new links: the new grants
        assert condition_of(refused.value) == UNAUTHORIZED
        conn.create_sender("replies.nina").send(Message(body="still allowed"), timeout=5)
        assert replies.receive(timeout=5).body == "still allowed"  # the link inside stays
    finally:
        conn.close()


def test_bad_put_token_requests_change_nothing(node, issuer):
    conn = connect(node, issuer.token("bert", SCOPES, ttl=300))
    try:
        cbs = Cbs(conn)
        assert cbs.put_token(issuer.token("bert", SCOPES, ttl=-60))[0] == 401
        assert cbs.put_token(issuer.token("someone-else", SCOPES)) == (403, "the token is another user's")
        assert cbs.put_token(issuer.token("bert", SCOPES), type_="servicebus.windows.net:sastoken")[0] == 400
        assert cbs.put_token(None)[0] == 400
        conn.create_sender("orders.bert").send(Message(body="the old grants hold"), timeout=5)
    finally:
        conn.close()


def test_rhea_renews_on_cbs_as_rhea_promise_does(node, issuer):
    """tests/js/cbs.js: rhea's put-token, then a send after the first token's expiry."""
    from conftest import ClientProcess

    def run(first: str, renewal: str, **options) -> dict:
        client = ClientProcess("rhea", "cbs", node.url, username="any", password=first, sasl="plain",
                               token=renewal, timeout_ms=20000, **options)
        try:
            return client.finish(timeout=30)[-1]
        finally:
            client.kill()

    done = run(issuer.token("rhea", SCOPES, ttl=2), issuer.token("rhea", SCOPES, ttl=300),
               address="orders.rhea", wait_ms=3500)
    assert (done["status_code"], done["correlated"], done["sent"], done["error"]) == (202, True, "accepted", None)
    other = run(issuer.token("rhea", SCOPES), issuer.token("mallory", SCOPES))
    assert (other["status_code"], other["status_description"]) == (403, "the token is another user's")
