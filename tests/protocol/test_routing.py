"""Tests for routing/: patterns, templates, rules, rule sets, routing table."""

from __future__ import annotations

import itertools
import json
import logging

import pytest

from routing import (
    Decision,
    FragmentMember,
    RoutingTable,
    Rule,
    RuleError,
    RuleSet,
    RuleValidationError,
    UpstreamOptions,
    VersionConflict,
    changed_addresses_policy,
    compile_pattern,
    compile_template,
    pattern_covers,
)

PEERS = {"b": "amqp://node-b:5672", "c": "amqps://node-c:5671"}


def problems_of(rules, **kw) -> dict[str, str]:
    with pytest.raises(RuleValidationError) as info:
        RuleSet.build(rules, **kw)
    return {p.field: p.detail for p in info.value.problems}


# ---------------------------------------------------------------- patterns


@pytest.mark.parametrize(
    "pattern,address,expected",
    [
        ("orders.*", "orders.eu", ("eu",)),
        ("orders.*", "orders", None),
        ("orders.*", "orders.eu.x", None),
        ("orders.*", "orders.", None),  # '*' needs a non-empty word
        ("orders.#", "orders", ("",)),  # '#' matches zero words
        ("orders.#", "orders.eu", ("eu",)),
        ("orders.#", "orders.eu.x/y", ("eu.x/y",)),  # separators kept as written
        ("orders.#", "ordersX", None),
        ("#.eu", "eu", ("",)),
        ("#.eu", "a.b.eu", ("a.b",)),
        ("a.#.b", "a.b", ("",)),
        ("a.#.b", "a.x.y.b", ("x.y",)),
        ("#", "anything/at.all", ("anything/at.all",)),
        ("#.#", "x", ("x", "")),
        ("*.*", "a.b", ("a", "b")),
        ("*.#.*", "a.b", ("a", "", "b")),
    ],
)
def test_star_and_hash(pattern, address, expected):
    assert compile_pattern(pattern).match(address) == expected


def test_dot_and_slash_are_both_separators():
    p = compile_pattern("orders.*/#")
    assert p.match("orders/eu.x") == ("eu", "x")
    assert p.match("orders.eu/x/y") == ("eu", "x/y")
    leading = compile_pattern("/queue/*")
    assert leading.match("/queue/foo") == ("foo",)
    assert leading.match(".queue.foo") == ("foo",)  # leading empty word either way
    assert leading.match("queue/foo") is None
    assert compile_pattern("*/queue/*").match("/queue/foo") is None  # empty first word


def test_rabbitmq_style_addresses():
    p = compile_pattern("/exchange/*/#")
    assert p.match("/exchange/amq.topic/orders.eu.new") == ("amq", "topic/orders.eu.new")
    p2 = compile_pattern("/exchange/logs/*")
    assert p2.match("/exchange/logs/error") == ("error",)
    assert p2.match("/exchange/logs/error/x") is None
    assert compile_pattern("/amq/queue/#").match("/amq/queue/work") == ("work",)


def test_exact_pattern_is_string_match():
    p = compile_pattern("orders.eu")
    assert p.is_exact
    assert p.match("orders.eu") == ()
    assert p.match("orders/eu") is None
    assert compile_pattern("a+b(c)").match("a+b(c)") == ()  # regex chars are literal


@pytest.mark.parametrize("bad", ["", "a*b", "orders.#x", "*a", "a.b#", None, 3])
def test_invalid_patterns(bad):
    with pytest.raises(RuleError) as info:
        compile_pattern(bad)
    assert info.value.field == "match"


def test_adjacent_hashes_allowed():
    assert compile_pattern("a.#.#").match("a") == ("", "")


@pytest.mark.parametrize(
    "a,b,expected",
    [
        ("#", "anything.*.#", True),
        ("#", "x", True),
        ("orders.#", "orders.eu.*", True),
        ("orders.#", "orders.x", True),
        ("orders.#", "orders", True),
        ("orders.#", "orders.#", True),
        ("orders.#", "other.#", False),
        ("orders.*", "orders.x", True),
        ("orders.*", "orders.*", True),
        ("orders.*", "orders.#", False),
        ("orders.*", "orders.x.y", False),
        ("orders.x", "orders.x", True),
        ("orders.x", "orders.y", False),
        ("orders.x", "orders.*", False),
        ("orders.x", "orders/x", False),  # exact patterns compare strings
        ("orders/*", "orders.x", True),
        ("*.#", "#", False),  # '#' can match an empty first word
        ("#.x.#", "a.x", True),
        ("#.*.#", "*.*", True),
        ("a.#.b", "a.*.b", True),
        ("a.#.b", "a.#", False),
        ("/queue/#", "/queue/*", True),
        ("/queue/#", "queue/*", False),
    ],
)
def test_pattern_covers(a, b, expected):
    assert pattern_covers(a, b) is expected


def test_pattern_covers_agrees_with_brute_force():
    # Soundness and exactness on small word patterns over a tiny alphabet.
    tokens = ["a", "b", "*", "#"]
    patterns = [".".join(ws) for n in (1, 2, 3) for ws in itertools.product(tokens, repeat=n)]
    words = ["a", "b", "c", ""]  # empty words too: '#' must absorb them, '*' must not
    addresses = [".".join(ws) for n in range(1, 5) for ws in itertools.product(words, repeat=n)]
    matched = {
        p: frozenset(x for x in addresses if compile_pattern(p).match(x) is not None)
        for p in patterns
    }
    for a, b in itertools.product(patterns, repeat=2):
        assert pattern_covers(a, b) == (matched[b] <= matched[a]), (a, b)


# ---------------------------------------------------------------- templates


def test_template_expansion():
    t = compile_template("/exchange/{1}/{2}", 2)
    assert t.expand("orders.eu.new", ("eu", "new")) == "/exchange/eu/new"
    assert compile_template("fed.{address}", 0).expand("q1") == "fed.q1"
    assert compile_template("{{literal}}.{1}", 1).expand("x", ("y",)) == "{literal}.y"


@pytest.mark.parametrize("bad", ["{3}", "{0}", "{}", "{name}", "{1:>3}", "{1!r}", "{1", ""])
def test_template_errors(bad):
    with pytest.raises(RuleError) as info:
        compile_template(bad, 2)
    assert info.value.field == "remote"


# ---------------------------------------------------------------- rules


def full_rule_dict():
    return {
        "name": "orders-eu",
        "match": "orders.*.#",
        "kind": "proxy",
        "primary": "b",
        "remote": "/exchange/orders/{1}.{2}",
        "upstream": {
            "user": "orders-user",
            "password_env": "ORDERS_PASSWORD",
            "vhost": "orders",
            "idle_timeout": 30.0,
            "pool_size": 4,
            "heartbeat": 5,
            "tls_ca": "/etc/ca.pem",
            "tls_cert": "/etc/c.pem",
            "tls_key": "/etc/k.pem",
        },
        "on_change": "redirect",
        "mirror_auto_delete": True,
        "durable": True,
    }


def test_rule_from_dict_and_defaults():
    r = Rule.from_dict({"name": "q", "match": "/queue/#", "kind": "local"})
    assert r.primary is None and r.remote == "{address}" and r.on_change == "keep"
    assert r.upstream == UpstreamOptions() and r.fragments == () and not r.durable
    assert r.to_dict() == {"name": "q", "match": "/queue/#", "kind": "local"}


@pytest.mark.parametrize(
    "d",
    [
        full_rule_dict(),
        {"name": "q", "match": "/queue/#", "kind": "local", "dead_letter": "/queue/dlq", "max_depth": 10},
        {"name": "d", "match": "secret.#", "kind": "deny"},
        {
            "name": "work",
            "match": "/queue/work",
            "kind": "fragmented",
            "fragments": [
                "a",
                "b",
                {"url": "amqp://x:5672", "address": "/queue/w2"},
                {"peer": "c", "address": "w"},
            ],
            "prefer": ["b", "amqp://x:5672"],
            "max_depth": 1000,
        },
    ],
)
def test_to_dict_from_dict_round_trip(d):
    r = Rule.from_dict(d)
    out = r.to_dict()
    assert json.loads(json.dumps(out)) == out
    assert Rule.from_dict(out) == r
    assert out == d  # only non-defaults (+ name/match/kind) are emitted


def test_fragment_members_parsed():
    r = Rule.from_dict(
        {
            "name": "w",
            "match": "w",
            "kind": "fragmented",
            "fragments": ["b", {"url": "amqp://x", "address": "/q"}],
        }
    )
    assert r.fragments == (FragmentMember(peer="b"), FragmentMember(url="amqp://x", address="/q"))


@pytest.mark.parametrize(
    "update,field",
    [
        ({"kind": "bogus"}, "rule.kind"),
        ({"kind": "proxy", "primary": None}, "rule.primary"),
        ({"kind": "local", "primary": "amqp://x"}, "rule.primary"),
        ({"primary": "http://x"}, "rule.primary"),
        ({"remote": "{3}"}, "rule.remote"),
        ({"remote": "{queue}"}, "rule.remote"),
        ({"colour": "red"}, "rule.colour"),
        ({"upstream": {"pool_size": 17}}, "rule.upstream.pool_size"),
        ({"upstream": {"pool_size": 0}}, "rule.upstream.pool_size"),
        ({"upstream": {"pool_size": "2"}}, "rule.upstream.pool_size"),
        ({"upstream": {"idle_timeout": 0}}, "rule.upstream.idle_timeout"),
        ({"upstream": {"heartbeat": True}}, "rule.upstream.heartbeat"),
        ({"upstream": {"split_directions": "yes"}}, "rule.upstream.split_directions"),
        ({"upstream": {"tls_cert": "c.pem"}}, "rule.upstream.tls_key"),
        ({"upstream": {"nope": 1}}, "rule.upstream.nope"),
        ({"upstream": "fast"}, "rule.upstream"),
        ({"name": "bad name!"}, "rule.name"),
        ({"match": "a*b"}, "rule.match"),
        ({"on_change": "drop"}, "rule.on_change"),
        ({"fragments": ["b"]}, "rule.fragments"),
        ({"kind": "fragmented", "primary": None}, "rule.fragments"),
        ({"kind": "local", "primary": None, "mirror_auto_delete": True}, "rule.mirror_auto_delete"),
        ({"dead_letter": "/queue/dlq"}, "rule.dead_letter"),
        ({"kind": "local", "primary": None, "max_depth": 0}, "rule.max_depth"),
        ({"durable": "yes"}, "rule.durable"),
    ],
)
def test_rule_errors_named_by_field(update, field):
    d = {"name": "x", "match": "a.*", "kind": "proxy", "primary": "amqp://h"}
    d.update(update)
    if d["name"] == "x":
        field = field.replace("rule.", "x.", 1)
    with pytest.raises(RuleError) as info:
        Rule.from_dict(d)
    assert info.value.field == field, info.value


def test_rule_error_paths_use_index():
    with pytest.raises(RuleError) as info:
        Rule.from_dict(
            {"name": "x", "match": "a", "kind": "proxy", "primary": "amqp://h", "upstream": {"pool_size": 99}},
            index=2,
        )
    assert info.value.field == "rules[2].upstream.pool_size"
    assert str(info.value).startswith("rules[2].upstream.pool_size: ")


def test_fragment_member_and_prefer_errors():
    base = {"name": "w", "match": "w", "kind": "fragmented"}
    for frags, prefer, field in [
        ([{"address": "/q"}], (), "w.fragments[0]"),
        ([{"peer": "b", "url": "amqp://x"}], (), "w.fragments[0]"),
        ([{"url": "amqp://"}], (), "w.fragments[0].url"),
        ([{"peer": "b", "port": 1}], (), "w.fragments[0].port"),
        ([7], (), "w.fragments[0]"),
        (["b", "b"], (), "w.fragments[1]"),
        (["b"], ["c"], "w.prefer[0]"),
        ("b", (), "w.fragments"),
    ]:
        with pytest.raises(RuleError) as info:
            Rule.from_dict({**base, "fragments": frags, "prefer": list(prefer)})
        assert info.value.field == field, (frags, info.value)


def test_direct_construction_validates():
    with pytest.raises(RuleError):
        Rule(name="p", match="a.#", kind="proxy")
    with pytest.raises(RuleError):
        UpstreamOptions(pool_size=0)
    r = Rule(name="p", match="a.*", kind="proxy", primary="b", remote="x.{1}")
    assert r.expand_remote("a.q", ("q",)) == "x.q"


# ---------------------------------------------------------------- rule sets


def test_resolve_first_match_wins_and_captures():
    rs = RuleSet.build(
        [
            {"name": "deny-secret", "match": "orders.secret.#", "kind": "deny"},
            {
                "name": "orders",
                "match": "orders.*.#",
                "kind": "proxy",
                "primary": "b",
                "remote": "/exchange/orders/{1}/{2}",
            },
            {
                "name": "work",
                "match": "/queue/work",
                "kind": "fragmented",
                "fragments": ["self", "b"],
                "remote": "/queue/fed-work",
            },
            {"name": "rabbit", "match": "/exchange/*/#", "kind": "proxy", "primary": "amqps://rmq:5671"},
        ],
        peers=PEERS,
        node_id="self",
    )
    d = rs.resolve("orders.eu.new.x")
    assert isinstance(d, Decision)
    assert (d.kind, d.rule.name, d.captures) == ("proxy", "orders", ("eu", "new.x"))
    assert d.remote_address == "/exchange/orders/eu/new.x"
    assert (d.primary, d.primary_url) == ("b", "amqp://node-b:5672")
    assert d.reason == "matched rule 'orders' (pattern 'orders.*.#')"

    deny = rs.resolve("orders.secret.keys")
    assert deny.kind == "deny" and deny.rule.name == "deny-secret" and deny.remote_address is None

    frag = rs.resolve("/queue/work")
    assert frag.kind == "fragmented" and frag.remote_address == "/queue/fed-work"

    rmq = rs.resolve("/exchange/amq.topic/k")
    assert rmq.primary_url == "amqps://rmq:5671" and rmq.remote_address == "/exchange/amq.topic/k"
    assert rs.resolve("/exchange/amq.topic/k") is rmq  # cached, immutable


def test_exact_rule_after_wildcard_keeps_order():
    rs = RuleSet.build(
        [
            {"name": "some", "match": "a.*.c", "kind": "deny"},
            {"name": "exact", "match": "a.x", "kind": "local"},
            {"name": "rest", "match": "a.#", "kind": "proxy", "primary": "b"},
        ],
        peers=PEERS,
    )
    assert rs.resolve("a.b.c").rule.name == "some"
    assert rs.resolve("a.x").rule.name == "exact"
    assert rs.resolve("a.y").rule.name == "rest"


def test_default_decision_is_local():
    rs = RuleSet.build([{"name": "o", "match": "orders.#", "kind": "proxy", "primary": "amqp://h"}])
    d = rs.resolve("/queue/other")
    assert d.kind == "local" and d.rule is None and d.remote_address is None and d.primary is None
    assert d.reason == "no rule matched; local queue (embedded default)"
    assert RuleSet.empty().resolve("x").kind == "local"


@pytest.mark.parametrize("bad", ["", None])
def test_resolve_rejects_empty_address(bad):
    with pytest.raises(RuleError) as info:
        RuleSet.empty().resolve(bad)
    assert info.value.field == "address"


def test_all_problems_collected_at_once():
    problems = problems_of(
        [
            {"name": "all", "match": "orders.#", "kind": "proxy", "primary": "b"},
            {"name": "eu", "match": "orders.eu.*", "kind": "local"},  # shadowed
            {"name": "all", "match": "x.#", "kind": "local"},  # duplicate name
            {"name": "k", "match": "y", "kind": "teleport"},  # bad kind
            {"name": "p", "match": "z.#", "kind": "proxy"},  # proxy without primary
            {"name": "u", "match": "u.#", "kind": "proxy", "primary": "nowhere"},  # unknown peer
            {"name": "t", "match": "t.*.*", "kind": "proxy", "primary": "b", "remote": "{3}"},
            {"name": "s", "match": "s", "kind": "local", "colour": "red"},  # unknown key
            {"name": "ps", "match": "ps.#", "kind": "proxy", "primary": "c", "upstream": {"pool_size": 0}},
            {"name": "f", "match": "f", "kind": "fragmented", "fragments": ["self", "b", "ghost"]},
        ],
        peers=PEERS,
        node_id="self",
    )
    assert set(problems) == {
        "rules[1].match",
        "rules[2].name",
        "rules[3].kind",
        "rules[4].primary",
        "rules[5].primary",
        "rules[6].remote",
        "rules[7].colour",
        "rules[8].upstream.pool_size",
        "rules[9].fragments[2]",
    }
    assert "'all'" in problems["rules[1].match"] and "rules[0]" in problems["rules[1].match"]
    assert "rules[0]" in problems["rules[2].name"]
    assert "'nowhere'" in problems["rules[5].primary"]
    assert "{3}" in problems["rules[6].remote"]
    assert "'ghost'" in problems["rules[9].fragments[2]"]


def test_validation_error_is_readable():
    with pytest.raises(RuleValidationError) as info:
        RuleSet.build(
            [{"name": "a", "match": "#", "kind": "local"}, {"name": "b", "match": "x", "kind": "local"}]
        )
    exc = info.value
    assert isinstance(exc, RuleError)
    assert exc.fields == ["rules[1].match"]
    text = str(exc)
    assert "1 problem" in text and "rules[1].match" in text and "'a'" in text


def test_shadowing_by_exact_duplicate_and_non_shadowing():
    problems = problems_of(
        [
            {"name": "a", "match": "q.x", "kind": "local"},
            {"name": "b", "match": "q.x", "kind": "deny"},
        ]
    )
    assert set(problems) == {"rules[1].match"}
    # a narrower rule before a wider one is fine
    RuleSet.build(
        [
            {"name": "a", "match": "orders.eu.*", "kind": "local"},
            {"name": "b", "match": "orders.#", "kind": "deny"},
            {"name": "c", "match": "orders2", "kind": "deny"},
        ]
    )


def test_invalid_peer_urls_and_non_table_rules():
    problems = problems_of([{"name": "a", "match": "a", "kind": "local"}, "oops"], peers={"b": "http://x"})
    assert set(problems) == {"peers.b", "rules[1]"}


def test_build_accepts_rule_objects_and_to_list_round_trips():
    rules = [
        Rule(name="o", match="orders.#", kind="proxy", primary="b", remote="fed.{1}"),
        {
            "name": "w",
            "match": "/queue/w",
            "kind": "fragmented",
            "fragments": ["self", {"url": "amqp://x", "address": "/queue/w"}],
        },
    ]
    rs = RuleSet.build(rules, peers=PEERS, node_id="self")
    again = RuleSet.build(json.loads(json.dumps(rs.to_list())), peers=PEERS, node_id="self")
    assert again.rules == rs.rules


def test_many_rules_resolve_quickly():
    rules = [
        {"name": f"r{i}", "match": f"/exchange/ex{i}/#", "kind": "proxy", "primary": "b"}
        for i in range(200)
    ]
    rules += [{"name": f"q{i}", "match": f"/queue/q{i}", "kind": "local"} for i in range(200)]
    rs = RuleSet.build(rules, peers=PEERS)
    assert rs.resolve("/exchange/ex199/k.1").rule.name == "r199"
    assert rs.resolve("/queue/q7").rule.name == "q7"
    assert rs.resolve("/queue/q999").rule is None


# ---------------------------------------------------------------- routing table


def _rs(kind="local", **extra):
    return RuleSet.build([{"name": "o", "match": "orders.#", "kind": kind, **extra}], peers=PEERS)


def test_routing_table_swap_version_and_conflict():
    first = _rs()
    table = RoutingTable(first)
    assert table.version == 1 and table.current is first
    assert table.resolve("orders.x").kind == "local"

    calls = []
    table.subscribe(lambda old, new, v: calls.append((old, new, v)))
    second = _rs("proxy", primary="b")
    assert table.replace(second) == 2
    assert table.current is second and table.resolve("orders.x").kind == "proxy"
    assert calls == [(first, second, 2)]

    with pytest.raises(VersionConflict) as info:
        table.replace(first, expected_version=1)
    assert (info.value.expected, info.value.actual) == (1, 2)
    assert table.version == 2 and table.current is second and len(calls) == 1

    assert table.replace(first, expected_version=2) == 3
    assert table.snapshot() == (3, first)


def test_failing_subscriber_does_not_block(caplog):
    table = RoutingTable()
    assert table.version == 1 and table.resolve("x").kind == "local"
    seen = []

    def broken(old, new, version):
        raise RuntimeError("boom")

    table.subscribe(broken)
    unsubscribe = table.subscribe(lambda old, new, v: seen.append(v))
    with caplog.at_level(logging.ERROR, logger="fedgate.routing"):
        assert table.replace(_rs()) == 2
    assert seen == [2] and table.version == 2
    assert any("boom" in (r.exc_text or "") or r.exc_info for r in caplog.records)
    unsubscribe()
    table.replace(_rs())
    assert seen == [2]


def test_changed_addresses_policy():
    old = RuleSet.build(
        [
            {"name": "o", "match": "orders.#", "kind": "proxy", "primary": "b", "on_change": "redirect"},
            {"name": "k", "match": "keep.#", "kind": "proxy", "primary": "b"},
        ],
        peers=PEERS,
    )
    new = RuleSet.build(
        [
            {"name": "o2", "match": "orders.#", "kind": "proxy", "primary": "b"},  # same route
            {"name": "k", "match": "keep.#", "kind": "proxy", "primary": "c"},
            {"name": "n", "match": "new.#", "kind": "proxy", "primary": "c", "on_change": "redirect"},
        ],
        peers=PEERS,
    )
    assert changed_addresses_policy(old, new, "orders.x") == "same"
    assert changed_addresses_policy(old, new, "keep.x") == "keep"
    assert changed_addresses_policy(old, new, "new.x") == "redirect"  # old had no rule: new's
    assert changed_addresses_policy(new, old, "new.x") == "redirect"  # old rule's on_change
    assert changed_addresses_policy(old, new, "other") == "same"
    moved = RuleSet.build([{"name": "o", "match": "orders.#", "kind": "local"}])
    assert changed_addresses_policy(old, moved, "orders.x") == "redirect"
