"""The static coordinator (no etcd) and fragments = "*" in the rules: plain data, no network."""

from __future__ import annotations

import asyncio
import json

import pytest

from proxy.cluster import StaticCoordinator
from routing import RuleSet, RuleValidationError

WORK = {"name": "work", "match": "work.*", "kind": "fragmented", "fragments": "*"}


def static(tmp_path, **options):
    return StaticCoordinator(node_id="n1", amqp="amqp://h1:5672", admin="http://h1:8080", workers=1,
                             version="test", peers={"n2": "amqp://h2:5672", "n3": "amqp://h3:5672"},
                             peer_admins={"n2": "http://h2:8080"}, data_dir=tmp_path, **options)


def test_static_members_are_this_node_and_its_peers_always_healthy_and_acting(tmp_path):
    c = static(tmp_path)
    assert [(m.id, m.amqp, m.admin) for m in c.members()] == [
        ("n1", "amqp://h1:5672", "http://h1:8080"), ("n2", "amqp://h2:5672", "http://h2:8080"),
        ("n3", "amqp://h3:5672", None)]
    assert c.kind == "static" and c.healthy and c.acting() and c.describe()["kind"] == "static"


def test_static_claims_raise_an_epoch_kept_in_the_data_dir_across_restarts(tmp_path):
    async def play():
        c = static(tmp_path)
        seen = []
        c.on_owner("queue/", lambda resource, claim: seen.append((resource, claim)))
        first = await c.claim("queue/a")
        assert (first.owner, first.epoch) == ("n1", 1)
        assert await c.claim("queue/a") == first and c.current_owner("queue/a") == first
        await c.release(first)
        assert c.current_owner("queue/a") is None
        again = await c.claim("queue/a")
        assert again.epoch == 2
        assert seen == [("queue/a", first), ("queue/a", None), ("queue/a", again)]
        await c.put_state("ready/n2", b"\x00yes")
        restarted = static(tmp_path)  # a new process on the same data dir
        assert (await restarted.claim("queue/a")).epoch == 3
        assert await restarted.get_state("ready/") == {"ready/n2": b"\x00yes"}
        # a person promoting a node by hand raises the epoch in the file
        path = tmp_path / "cluster" / "epochs.json"
        path.write_text(json.dumps({"queue/b": 41}))
        assert (await static(tmp_path).claim("queue/b")).epoch == 42
    asyncio.run(play())


def test_every_member_expands_to_the_live_members_and_is_kept_as_written():
    ruleset = RuleSet.build([WORK], node_id="n1", members={"n1": False, "n3": True, "n2": False},
                            peers={"n2": "amqp://h2:5672", "n3": "amqp://h3:5672"})
    rule = ruleset.resolve("work.x").rule
    assert [m.peer for m in rule.fragments] == ["n1", "n2", "n3"]
    assert rule.draining == ("n3",) and not rule.every_member
    assert ruleset.to_list() == [WORK] and ruleset.every_member_rules == {"work"}
    alone = RuleSet.build([WORK], node_id="n1", members={"n1": True})
    assert alone.resolve("work.x").rule.draining == ()  # nobody left to drain to


def test_every_member_only_for_fragmented_rules_and_peers_open_only_on_etcd():
    with pytest.raises(RuleValidationError, match="fragments: not allowed for kind 'local'"):
        RuleSet.build([{"name": "l", "match": "l.*", "kind": "local", "fragments": "*"}])
    proxy_to_n9 = [{"name": "p", "match": "p.*", "kind": "proxy", "primary": "n9"}]
    with pytest.raises(RuleValidationError, match="unknown peer 'n9'"):
        RuleSet.build(proxy_to_n9, node_id="n1")
    open_set = RuleSet.build(proxy_to_n9, node_id="n1", open_peers=True)
    assert open_set.resolve("p.x").primary_url is None  # not live: the attach is refused
    with pytest.raises(RuleValidationError, match="would loop"):
        RuleSet.build([{"name": "p", "match": "p.*", "kind": "proxy", "primary": "n1"}],
                      node_id="n1", open_peers=True)


@pytest.mark.parametrize("section, field", [
    ({"etcd": ["10.0.0.5:2379"]}, "cluster.etcd[0]"),
    ({"etcd": ["http://e:2379"], "lease_ttl": 2.5}, "cluster.lease_ttl"),
    ({"etcd": ["http://e:2379"], "cert": "c.pem"}, "cluster.key"),
    ({"etcd": ["http://e:2379"], "user": "fedgate"}, "cluster.password_file"),
    ({"ca": "ca.pem"}, "cluster.ca"),
    ({"name": "a/b"}, "cluster.name"),
    ({"etcd": ["http://e:2379"], "advertise": "http://h:5672"}, "cluster.advertise"),
])
def test_cluster_section_names_the_bad_key(section, field):
    from proxy.config import settings
    from proxy.config.errors import ConfigError

    with pytest.raises(ConfigError) as caught:
        settings.from_dict({"cluster": section})
    assert str(caught.value).startswith(field), caught.value


def test_with_etcd_peers_are_optional_and_rules_may_name_members_to_come():
    from proxy.config import settings

    config = settings.from_dict({
        "cluster": {"etcd": ["https://e1:2379", "https://e2:2379"], "name": "prod"},
        "rules": [{"name": "p", "match": "p.*", "kind": "proxy", "primary": "n2"}, WORK]})
    assert config.cluster.enabled and config.cluster.tls and config.peers == {}
    assert settings.from_dict({}).cluster.enabled is False
