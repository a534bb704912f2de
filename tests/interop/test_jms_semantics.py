"""What a JMS application expects of a queue (issue #43): one module, run against ActiveMQ
Artemis (the reference) and against fedgate, with Qpid JMS (docs/queue-semantics.md).

Each case sends the same messages to both targets and asserts the same result from each:
selectors (the grammar's corner cases), priority, scheduled delivery (JMS 2.0's delivery
delay), and a poison message rolled back until it reaches the dead-letter queue (Artemis:
max-delivery-attempts 10 to ``DLQ``; fedgate: ``delivery_limit = 10``, ``dead_letter =
"DLQ"``). Queue names are unique per run (the Artemis broker is shared and keeps them).
"""

from __future__ import annotations

import time
import uuid

import brokers
import pytest
from test_jms import JmsProcess, jms  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def artemis_url() -> str:
    url = brokers.ensure_artemis()
    return f"{url}?jms.username={brokers.ARTEMIS_USER}&jms.password={brokers.ARTEMIS_PASSWORD}"


@pytest.fixture(params=["artemis", "fedgate"])
def target(request, start_node, artemis_url):
    """(JMS URL, queue prefix) of the target under test."""
    run = uuid.uuid4().hex[:8]
    if request.param == "artemis":
        return artemis_url, f"sem.{run}."
    node = start_node({"queues": {"delivery_limit": 10, "dead_letter": "DLQ"}})
    return node.url, f"sem.{run}."


COLOURED = ";".join(
    f"m{i}:4:0:colour={('red', 'blue', 'green')[i % 3]},n={i},"
    f"name={('a_b', 'a%b', 'axb', 'AB', 'a.b')[i % 5]}" + (",flag=true" if i % 4 == 0 else "")
    for i in range(15))

SELECTORS = {
    "equality": ("colour = 'red'", [0, 3, 6, 9, 12]),
    "and-or-precedence": ("colour = 'blue' OR colour = 'green' AND n > 10", [1, 4, 7, 10, 11, 13, 14]),
    "between": ("n BETWEEN 3 AND 5", [3, 4, 5]),
    "not-between": ("n NOT BETWEEN 2 AND 12", [0, 1, 13, 14]),
    "in": ("colour IN ('red', 'green') AND n < 6", [0, 2, 3, 5]),
    "like-escape": (r"name LIKE 'a\_b' ESCAPE '\'", [0, 5, 10]),
    "like-percent": ("name LIKE 'a%'", [0, 1, 2, 4, 5, 6, 7, 9, 10, 11, 12, 14]),
    "like-dot-is-literal": ("name LIKE 'a.b'", [4, 9, 14]),
    "is-null": ("flag IS NULL AND n < 6", [1, 2, 3, 5]),
    "is-not-null": ("flag IS NOT NULL", [0, 4, 8, 12]),
    "null-is-unknown": ("missing = 1 OR n = 2", [2]),
    "not-unknown": ("NOT (missing = 1)", []),
    "arithmetic": ("n * 2 + 1 = 9 OR n / 2 = 6", [4, 12]),
    "boolean": ("flag = TRUE AND n > 0", [4, 8, 12]),
    "string-vs-number": ("colour = 1", []),
    "jms-priority": ("JMSPriority = 4 AND n = 1", [1]),
}


def test_selectors_select_what_artemis_selects(target, jms):  # noqa: F811
    """Every case in one JMS process (a JVM start each would be minutes): its own queue, the
    15 messages, a consumer with the selector, then one without for what waited."""
    url, prefix = target
    cases = list(SELECTORS)
    found = jms("selector-cases", url, prefix + "sel", COLOURED,
                *(SELECTORS[case][0] for case in cases), "colour = 'red' AND").result()
    results = dict(zip(cases + ["does-not-parse"], found["cases"]))
    for case in cases:
        expected = SELECTORS[case][1]
        assert results[case].get("selected") == [f"m{i}" for i in expected], (case, results[case])
        # what was not selected waited for the next consumer
        assert results[case]["rest"] == [f"m{i}" for i in range(15) if i not in expected], case
    refused = results["does-not-parse"]
    assert refused.get("type") == "jakarta.jms.InvalidSelectorException", refused


def test_higher_priority_first_fifo_within_a_priority(target, jms):  # noqa: F811
    url, prefix = target
    order = [4, 9, 0, 9, 4, 7, 1, 7]
    spec = ";".join(f"p{i}:{p}:0:" for i, p in enumerate(order))
    assert jms("sendx", url, prefix + "prio", spec).result()["sent"] == len(order)
    got = jms("receive", url, prefix + "prio", 0, 1500).result()["ids"]
    expected = [f"p{i}" for i, _ in sorted(enumerate(order), key=lambda x: (-x[1], x[0]))]
    assert got == expected


def test_a_delivery_delay_holds_the_message_until_then(target, jms):  # noqa: F811
    url, prefix = target
    queue = prefix + "delay"
    sent_at = time.time()
    # 8 s: two JVM starts (the send, the first receive) fit well within it on a busy machine
    assert jms("sendx", url, queue, "late:4:8000:;now:4:0:").result()["sent"] == 2
    first = jms("receive", url, queue, 0, 500).result()["ids"]
    assert first == ["now"] and time.time() - sent_at < 8.0, first
    later = jms("receive", url, queue, 1, 15_000).result()["ids"]
    assert later == ["late"] and time.time() - sent_at >= 8.0


def test_a_poison_message_goes_to_the_dead_letter_queue_after_ten_deliveries(target, jms):  # noqa: F811
    url, prefix = target
    queue = prefix + "poison"
    poison = f"poison-{uuid.uuid4().hex[:8]}"
    assert jms("sendx", url, queue, f"{poison}:4:0:;fine:4:0:").result()["sent"] == 2
    taken = jms("poison", url, queue, 1500).result()["deliveries"]
    assert taken == {poison: 10, "fine": 10}, taken
    dead = jms("select", url, "DLQ", f"id = '{poison}'", 1, 5000).result()["ids"]
    assert dead == [poison]
    assert jms("receive", url, queue, 0, 1000).result()["ids"] == []


# -- topic subscriptions ------------------------------------------------------------------------
def spec(first: int, count: int) -> str:
    return ";".join(f"t{i}:4:0:n={i}" for i in range(first, first + count))


def subscriber(jms, url, topic, client, name, idle=600, selector=None):  # noqa: F811
    """A subscriber process, once it is in place (its "ready" line)."""
    process = jms("subscribe", url, topic, client, name, idle, *([selector] if selector else []))
    assert process.readline(timeout=60).get("ready"), "subscriber not ready"
    return process


def test_a_durable_subscription_keeps_what_came_while_away_until_unsubscribed(target, jms):  # noqa: F811
    url, prefix = target
    topic, client = prefix + "news", prefix + "client"
    assert subscriber(jms, url, topic, client, "audit").result()["ids"] == []  # made, away
    assert jms("publish", url, topic, spec(0, 4)).result()["sent"] == 4
    assert subscriber(jms, url, topic, client, "audit").result()["ids"] == [f"t{i}" for i in range(4)]
    assert jms("unsubscribe", url, client, "audit").result() == {"unsubscribed": "audit"}
    assert jms("publish", url, topic, spec(4, 2)).result()["sent"] == 2
    # a new subscription of that name starts empty: t4 and t5 were kept for nobody
    assert subscriber(jms, url, topic, client, "audit").result()["ids"] == []
    assert jms("unsubscribe", url, client, "audit").result() == {"unsubscribed": "audit"}
    missing = jms("unsubscribe", url, client, "audit").result()
    assert missing.get("type") == "jakarta.jms.InvalidDestinationException", missing


def test_a_durable_subscription_with_a_selector_collects_only_what_it_selects(target, jms):  # noqa: F811
    url, prefix = target
    topic, client = prefix + "ticks", prefix + "client"
    assert subscriber(jms, url, topic, client, "big", selector="n >= 3").result()["ids"] == []
    jms("publish", url, topic, spec(0, 6)).result()
    got = subscriber(jms, url, topic, client, "big", selector="n >= 3").result()["ids"]
    assert got == ["t3", "t4", "t5"]
    jms("unsubscribe", url, client, "big").result()


def test_non_durable_subscribers_each_get_every_message_published_while_there(target, jms):  # noqa: F811
    url, prefix = target
    topic = prefix + "live"
    # each takes until 600 ms without a message once the first came (up to 60 s for it)
    one = subscriber(jms, url, topic, prefix + "c1", "-", idle="60000/600")
    two = subscriber(jms, url, topic, prefix + "c2", "-", idle="60000/600")
    assert jms("publish", url, topic, spec(0, 5)).result()["sent"] == 5
    expected = [f"t{i}" for i in range(5)]
    assert one.result()["ids"] == expected and two.result()["ids"] == expected


@pytest.mark.parametrize("durable", [False, True])
def test_shared_consumers_compete_for_one_subscription(target, jms, durable):  # noqa: F811
    url, prefix = target
    topic = prefix + "jobs"
    shared = jms("shared", url, topic, prefix + "workers", 2, 2000, str(durable).lower())
    assert shared.readline(timeout=60).get("ready")
    assert jms("publish", url, topic, spec(0, 20)).result()["sent"] == 20
    consumers = shared.result()["consumers"]
    taken = consumers[0] + consumers[1]
    assert sorted(taken) == sorted(f"t{i}" for i in range(20)), consumers  # each once


def test_a_no_local_subscriber_gets_nothing_its_own_connection_publishes(target, jms):  # noqa: F811
    """JMS ``createConsumer(topic, null, true)`` and ``createDurableSubscriber(topic, name, null,
    true)`` (the ``apache.org:no-local-filter:list`` filter): what their connection publishes
    is not theirs; another connection's messages are, and a plain subscriber gets both."""
    url, prefix = target
    got = jms("nolocal", url, prefix + "chat", prefix + "me", spec(0, 3), spec(3, 2)).result()
    assert got == {"nolocal": ["t3", "t4"], "durable": ["t3", "t4"],
                   "plain": [f"t{i}" for i in range(5)]}, got


def test_subscriptions_on_a_node_with_workers(start_node, jms):  # noqa: F811
    """A JMS topic on a node with two workers (docs/exchanges.md): its name is a local address
    one worker owns, and its subscribers and publishers are served wherever they land; a
    durable subscription keeps what came while away until unsubscribed, a shared one's
    consumers take each message once."""
    url = start_node({"node": {"workers": 2}}).url
    topic, client = "wsub.news", "wsub.client"
    assert subscriber(jms, url, topic, client, "audit").result()["ids"] == []
    assert jms("publish", url, topic, spec(0, 4)).result()["sent"] == 4
    assert subscriber(jms, url, topic, client, "audit").result()["ids"] == [f"t{i}" for i in range(4)]
    assert jms("unsubscribe", url, client, "audit").result() == {"unsubscribed": "audit"}
    shared = jms("shared", url, "wsub.jobs", "workers", 2, 2000, "true")
    assert shared.readline(timeout=60).get("ready")
    assert jms("publish", url, "wsub.jobs", spec(0, 10)).result()["sent"] == 10
    consumers = shared.result()["consumers"]
    assert sorted(consumers[0] + consumers[1]) == sorted(f"t{i}" for i in range(10)), consumers
