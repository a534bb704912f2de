"""The run-time wiring record's checks (issue #46): ACL grants (admin_api.grants), binding
ids (remote sources included) and what a static cluster's node takes from another
(admin_api.wiring_sync). Pure functions and a node stand-in: no I/O."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from admin_api import grants
from admin_api.errors import ApiError
from admin_api.wiring import binding_id
from admin_api.wiring_sync import check_shape, order
from proxy.amqp.connection import Identity
from proxy.config import settings
from proxy.config.errors import ConfigError

CONFIG = settings.from_dict({"acl": [{"user": "bob", "send": ["#"]},
                                     {"group": "ops", "receive": ["audit"]}]})
ALICE = Identity("alice", "PLAIN", ())
CAROL = Identity("carol", "PLAIN", ("partners",))


def test_grants_are_checked_as_the_files_entries_with_the_field_named():
    parsed = grants.parse([{"user": "alice", "send": ["orders.*"], "dynamic": False},
                           {"group": "partners", "receive": ["inbox.#"]}], CONFIG)
    assert [grants.subject_of(e) for e in parsed] == ["alice", "group:partners"]
    assert parsed[0].dynamic is False and parsed[1].receive == ("inbox.#",)
    cases = [
        ([{"user": "alice", "send": ["a.##"]}], "acl[0].send[0]"),
        ([{"user": "alice", "group": "x"}], "acl[0]"),
        ([{"user": "alice", "sned": ["a"]}], "acl[0].sned"),
        ([{"user": "alice", "send": "a"}], "acl[0].send"),
        ([{"user": "bob", "send": ["a"]}], "acl[0].user"),  # the file's
        ([{"group": "ops", "send": ["a"]}], "acl[0].group"),  # the file's
        ([{"user": "alice"}, {"user": "alice", "send": ["b"]}], "acl[1].user"),  # twice
        ({"user": "alice"}, "acl"),
    ]
    for raw, field in cases:
        with pytest.raises(ConfigError) as refused:
            grants.parse(raw, CONFIG)
        assert refused.value.key == field, (raw, refused.value)


def test_subjects_name_users_or_groups():
    assert grants.entry_table("alice", {"send": ["x"]}) == {"user": "alice", "send": ["x"]}
    assert grants.entry_table("group:ops", {}) == {"group": "ops"}
    assert grants.table_subject({"group": "ops"}) == "group:ops"
    assert grants.table_subject({"user": "alice"}) == "alice"
    assert grants.in_config(CONFIG, "bob") and grants.in_config(CONFIG, "group:ops")
    assert not grants.in_config(CONFIG, "alice")


def stand_in(config):
    return SimpleNamespace(config=config, broker=SimpleNamespace(handlers={}, authorize=None))


def test_applying_grants_changes_what_the_next_attach_may_do():
    node = stand_in(CONFIG)
    grants.apply(node, grants.parse([{"user": "alice", "send": ["orders.*"]}], CONFIG))
    assert node.broker.authorize(ALICE, "orders.eu", "send")
    assert not node.broker.authorize(ALICE, "orders.eu", "receive")
    assert not node.broker.authorize(CAROL, "orders.eu", "send")
    assert node.broker.authorize(Identity("bob", "PLAIN", ()), "x", "send")  # the file's stay
    grants.apply(node, grants.parse([{"group": "partners", "send": ["orders.*"]}], CONFIG))
    assert node.broker.authorize(CAROL, "orders.eu", "send")
    assert not node.broker.authorize(ALICE, "orders.eu", "send")  # taken away
    grants.apply(node, ())
    assert not node.broker.authorize(CAROL, "orders.eu", "send")


def test_the_first_grant_on_a_node_without_acl_turns_default_deny_on():
    node = stand_in(settings.from_dict({}))
    grants.apply(node, ())
    assert node.broker.authorize(CAROL, "anything", "send")
    grants.apply(node, grants.parse([{"user": "alice", "send": ["a"]}], node.config))
    assert node.broker.authorize(ALICE, "a", "send")
    assert not node.broker.authorize(CAROL, "anything", "send")


def test_binding_ids_name_the_same_binding_everywhere():
    by_exchange = binding_id({"exchange": "events", "queue": "eu", "key": "orders.eu.#"})
    assert by_exchange == binding_id({"key": "orders.eu.#", "queue": "eu", "exchange": "events"})
    source = {"queue": "copy", "source": {"primary": "amqp://h:5672", "address": "src"}}
    assert binding_id(source) == binding_id({**source, "source": {**source["source"], "window": 5}})
    assert binding_id(source) != binding_id({**source, "source": {"primary": "amqp://h:5672",
                                                                  "address": "other"}})
    assert len({by_exchange, binding_id(source)}) == 2 and len(by_exchange) == 12


def test_a_record_from_another_node_is_checked_then_ordered():
    record = {"version": 3, "updated_at": 10.0, "origin": "n1", "exchanges": [], "bindings": [],
              "queues": [], "acl": [{"user": "alice"}]}
    assert check_shape(record) is record
    for bad in ({**record, "version": "3"}, {**record, "acl": {}}, {**record, "updated_at": True},
                {**record, "origin": 5}, {**record, "bindings": None}, []):
        with pytest.raises(ApiError) as refused:
            check_shape(bad)
        assert refused.value.status == 400
    # the greater (version, updated_at, origin) wins
    assert order(record) > order({**record, "version": 2, "updated_at": 99.0})
    assert order(record) > order({**record, "updated_at": 9.0})
    assert order({**record, "origin": "n2"}) > order(record)
    assert order({"version": 0}) == (0, 0.0, "")
