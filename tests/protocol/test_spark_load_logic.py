"""spark_load's pure parts: the stop rule, settings, command line, demo configs (no Spark, no sockets)."""

from __future__ import annotations

import tomllib

import pytest

from spark_load import demo
from spark_load.cli import main as cli_main
from spark_load.coordination import should_stop, totals
from spark_load.job import local_slots
from spark_load.settings import LoadSettings


def producer(done=True, expected=100, resent=0, reconnects=0, done_for_ms=0, sent=100):
    return {"role": "producer", "done": done, "expected": expected, "resent": resent,
            "reconnects": reconnects, "done_for_ms": done_for_ms, "sent": sent}


def consumer(distinct=100, idle_ms=0, reconnects=0, received=None, by_node=None):
    return {"role": "consumer", "distinct": distinct, "idle_ms": idle_ms, "reconnects": reconnects,
            "received": distinct if received is None else received, "by_node": by_node or {}}


def test_nobody_stops_while_a_producer_is_sending():
    states = [producer(done=False), producer(done_for_ms=10**9), consumer(distinct=10**6, idle_ms=10**9)]
    assert not should_stop(states, idle_ms=2000, drain_timeout_ms=60000)


def test_a_clean_run_stops_as_soon_as_everything_arrived():
    states = [producer(expected=70), producer(expected=30), consumer(distinct=60), consumer(distinct=40)]
    assert should_stop(states, idle_ms=2000, drain_timeout_ms=60000)
    states[-1] = consumer(distinct=39)
    assert not should_stop(states, idle_ms=2000, drain_timeout_ms=60000)


def test_after_resends_only_quiet_consumers_end_the_run():
    """Counts can add up through duplicates while a message is still missing: wait for quiet."""
    states = [producer(expected=100, resent=3, done_for_ms=5000), consumer(distinct=60, idle_ms=2500),
              consumer(distinct=45, idle_ms=100)]
    assert not should_stop(states, idle_ms=2000, drain_timeout_ms=60000)
    states[-1] = consumer(distinct=45, idle_ms=2100)
    assert should_stop(states, idle_ms=2000, drain_timeout_ms=60000)


def test_missing_messages_stop_the_run_after_the_drain_timeout_at_the_latest():
    states = [producer(expected=100, done_for_ms=59000), consumer(distinct=99, idle_ms=0)]
    assert not should_stop(states, idle_ms=2000, drain_timeout_ms=60000)
    states[0] = producer(expected=100, done_for_ms=60000)
    assert should_stop(states, idle_ms=2000, drain_timeout_ms=60000)


def test_progress_totals_add_up_per_node():
    states = [producer(sent=5, expected=4), consumer(distinct=3, by_node={"n1": 2, "n2": 1}),
              consumer(distinct=1, by_node={"n2": 1})]
    assert totals(states) == {"sent": 5, "accepted": 4, "received": 4, "producers_done": 1, "producers": 1,
                              "reconnects": 0, "resent": 0, "by_node": {"n1": 2, "n2": 2}}


def test_partitions_are_producers_then_consumers_spread_over_gateways():
    s = LoadSettings(gateways=("amqp://a:1", "amqp://b:2"), producers=3, consumers=2)
    assert [s.role_of(i) for i in range(5)] == [("producer", 0), ("producer", 1), ("producer", 2),
                                                ("consumer", 0), ("consumer", 1)]
    assert [s.gateway_for("producer", i) for i in range(3)] == ["amqp://a:1", "amqp://b:2", "amqp://a:1"]
    assert s.gateway_for("consumer", 1, failover=1) == "amqp://a:1"  # failover moves to the next


@pytest.mark.parametrize("options, message", [
    ({"gateways": ()}, "gateway"),
    ({"gateways": ("http://x",)}, "amqp://"),
    ({"producers": 0}, "at least 1"),
    ({"messages": 0}, "messages per producer"),
    ({"settle": "twice"}, "settle must be one of"),
    ({"speed": 0}, "speed"),
    ({"run_id": "a:b"}, "run id"),
])
def test_bad_settings_are_refused_by_name(options, message):
    options = {"gateways": ("amqp://127.0.0.1:5672",), **options}
    with pytest.raises(ValueError, match=message):
        LoadSettings(**options).validate()


@pytest.mark.parametrize("argv, message", [
    ([], "give --gateway URL (or --demo)"),
    (["--demo", "--gateway", "amqp://x:1"], "leave out --gateway"),
    (["--demo", "--producers", "0"], "at least 1"),
    (["--gateway", "tcp://x:1"], "not an amqp"),
])
def test_command_line_errors_exit_2_with_a_reason(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli_main(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_local_masters_report_their_slots():
    assert local_slots("local") == 1
    assert local_slots("local[5]") == 5
    assert local_slots("local[6,2]") == 6
    assert local_slots("local[*]") >= 1
    assert local_slots("spark://host:7077") is None


@pytest.mark.parametrize("kind", ["proxy", "fragmented"])
def test_demo_configs_are_valid_toml_with_peers_and_the_work_rule(kind, tmp_path):
    ports, admin = {"n1": 1001, "n2": 1002}, {"n1": 2001, "n2": 2002}
    configs = {n: tomllib.loads(demo.node_config(n, ports, admin, tmp_path / n, kind)) for n in demo.NODES}
    assert configs["n1"]["peers"] == {"n2": "amqp://127.0.0.1:1002"}
    assert configs["n2"]["peers"] == {"n1": "amqp://127.0.0.1:1001"}
    rules = {n: c.get("rules", []) for n, c in configs.items()}
    if kind == "fragmented":  # the target: a fragment on each node
        assert all(r == [{"name": "work", "match": "work.#", "kind": "fragmented", "fragments": ["n1", "n2"]}]
                   for r in rules.values())
    else:  # the interim: a local queue on n1, proxied by n2
        assert rules["n1"] == []
        assert rules["n2"] == [{"name": "work", "match": "work.#", "kind": "proxy", "primary": "n1"}]
    assert demo.DEMO_QUEUE in demo.DEMO_RULES
