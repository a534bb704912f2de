"""[[acl]] authorization: who may send to / receive from which addresses.

Protocol-level over in-memory transports (real proton clients, the node's
ServerConnection, SASL and broker): a denied attach is answered and detached
with amqp:unauthorized-access, an allowed one gets credit or messages.
"""

from __future__ import annotations

import pytest
from memory import Harness
from proton import Message

from proxy.auth.acl import Acl
from proxy.auth.users import UsersFile, make_record
from proxy.config import settings as config_mod
from proxy.config.errors import ConfigError

pytestmark = pytest.mark.dmz  # the DMZ gateway's tests: pytest -m dmz

UNAUTHORIZED = "amqp:unauthorized-access"

ACL = [
    {"user": "alice", "send": ["orders.#", "tmp.#"], "receive": ["orders.#"]},
    {"group": "ops", "receive": ["audit.#", "orders.eu"], "dynamic": False},
    {"user": "*", "send": ["feedback"]},
    {"user": "anonymous", "receive": ["public.*"]},
]


@pytest.fixture
def harness(tmp_path):
    users = UsersFile(tmp_path / "users.json")
    users.add(make_record("alice", "alice pw", iterations=4096))
    users.add(make_record("bob", "bob pw", iterations=4096, groups=("ops",)))
    users.add(make_record("carol", "carol pw", iterations=4096))
    h = Harness(mechanisms=("PLAIN", "ANONYMOUS"), users=users)
    h.broker.authorize = Acl(config_mod.from_dict({"acl": ACL}).acl).allows
    return h


def login(h: Harness, user: str | None):
    if user is None:
        return h.client(sasl_mechs="ANONYMOUS")
    return h.client(sasl_mechs="PLAIN", user=user, password=f"{user} pw")


def refused(link) -> str | None:
    cond = link.remote_condition
    return cond.name if cond else None


@pytest.mark.parametrize("user, direction, address, allowed", [
    ("alice", "send", "orders.eu.1", True),
    ("alice", "send", "orders", True),              # '#' matches zero words
    ("alice", "receive", "orders.us", True),
    ("alice", "send", "audit.log", False),
    ("alice", "receive", "feedback", False),
    ("alice", "send", "feedback", True),             # user = "*": every authenticated user
    ("bob", "receive", "audit.2024.06", True),       # through group ops
    ("bob", "receive", "orders.eu", True),
    ("bob", "receive", "orders.us", False),
    ("bob", "send", "orders.eu", False),
    ("carol", "send", "feedback", True),
    ("carol", "receive", "public.news", False),      # the anonymous entry is for anonymous only
    (None, "receive", "public.news", True),
    (None, "receive", "public.news.eu", False),      # '*' is exactly one word
    (None, "send", "public.news", False),
    (None, "send", "feedback", False),               # '*' does not include anonymous
    ("alice", "receive", "tmp.t.1", False),          # temporary queues by name need a pattern
])
def test_attach_is_allowed_only_by_an_entry(harness, user, direction, address, allowed):
    client = login(harness, user)
    if direction == "send":
        link = client.sender(address)
        ok = refused(link) is None and link.credit > 0
    else:
        link = client.receiver(address, credit=1)
        ok = refused(link) is None
    assert ok is allowed
    if not allowed:
        assert refused(link) == UNAUTHORIZED


def test_allowed_messages_flow_and_denied_ones_never_arrive(harness):
    alice, bob = login(harness, "alice"), login(harness, "bob")
    consumer = bob.receiver("orders.eu", credit=10)
    sender = alice.sender("orders.eu")
    alice.send(sender, Message(body="ok"))
    harness.pump()
    assert [r.message.body for r in bob.received(consumer)] == ["ok"]
    denied = bob.sender("orders.eu")
    assert refused(denied) == UNAUTHORIZED and denied.credit == 0


@pytest.mark.parametrize("user, allowed", [
    ("alice", True),   # authenticated: dynamic nodes allowed by default
    ("bob", False),    # group ops says dynamic = false
    (None, False),     # anonymous: only with an anonymous entry saying dynamic = true
])
def test_dynamic_nodes(harness, user, allowed):
    client = login(harness, user)
    receiver = client.receiver(None, dynamic=True, credit=1)
    sender = client.sender(None, dynamic=True)
    for link in (receiver, sender):
        assert (refused(link) is None) is allowed
    if allowed:
        assert receiver.remote_source.address.startswith("tmp.t.")


def test_anonymous_dynamic_when_granted(tmp_path):
    h = Harness(mechanisms=("ANONYMOUS",))
    h.broker.authorize = Acl(config_mod.from_dict(
        {"acl": [{"user": "anonymous", "receive": ["x"], "dynamic": True}]}).acl).allows
    client = login(h, None)
    assert refused(client.receiver(None, dynamic=True, credit=1)) is None
    assert refused(client.sender("x")) == UNAUTHORIZED


def test_without_acl_everything_is_allowed():
    h = Harness()
    client = login(h, None)
    assert refused(client.sender("anything.at.all")) is None
    assert Acl(()).allows(None, "x", "send")


@pytest.mark.parametrize("entry, key", [
    ({"send": ["a"]}, "acl[0]"),                                   # neither user nor group
    ({"user": "a", "group": "g"}, "acl[0]"),                       # both
    ({"user": ""}, "acl[0].user"),
    ({"user": "a", "send": ["orders.x#"]}, "acl[0].send[0]"),      # wildcard glued to a word
    ({"user": "a", "receive": [""]}, "acl[0].receive[0]"),
    ({"user": "a", "send": "orders"}, "acl[0].send"),              # not a list
    ({"user": "a", "dynamic": "yes"}, "acl[0].dynamic"),
    ({"user": "a", "sned": ["x"]}, "acl[0].sned"),
])
def test_bad_acl_entries_name_the_key(entry, key):
    with pytest.raises(ConfigError) as info:
        config_mod.from_dict({"acl": [entry]})
    assert info.value.key == key
