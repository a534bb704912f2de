"""Topic subscriptions on a node's exchanges, in memory (issue #43, docs/exchanges.md): a
receiver attached to a topic address subscribes, as Qpid JMS asks (source capabilities,
durability, expiry, link names); the same cases against Artemis in
tests/interop/test_jms_semantics.py."""

from __future__ import annotations

from memory import Harness, put_selector
from proton import Described, Endpoint, Message, Terminus, symbol

from proxy.amqp.termini import NO_LOCAL_FILTER, capability_names, filters, is_no_local, set_capabilities


def subscriber(c, address: str | None, *, name: str, credit: int = 10, durable=False,
               shared=False, global_=False, selector: str | None = None, topic=True):
    link = c._session().receiver(name)
    if address is not None:
        link.source.address = address
        caps = (("topic",) if topic else ()) + (("shared",) if shared else ()) + (
            ("global",) if global_ else ())
        if caps:
            set_capabilities(link.source, caps)
        if durable:
            link.source.durability = Terminus.DELIVERIES
            link.source.expiry_policy = Terminus.EXPIRE_NEVER
        if selector is not None:
            put_selector(link.source, selector, "jms-selector")
    link.open()
    c.inbox[link] = []
    if credit:
        link.flow(credit)
    c.harness.pump()
    return link


def publish(c, address: str, ids, **properties) -> None:
    link = c._session().sender(f"p-{address}-{ids[0]}")
    link.target.address = address
    set_capabilities(link.target, ("topic",))
    link.open()
    c.harness.pump()
    for i in ids:
        c.send(link, Message(id=i, body=i, properties=dict(properties, n=int(i[1:]))))
    c.harness.pump()


def ids(c, link) -> list:
    return [r.message.id for r in c.received(link)]


def accept(c, link) -> list:
    got = c.received(link)
    for r in got:
        r.delivery.update(r.delivery.ACCEPTED)
        r.delivery.settle()
    c.harness.pump()
    return [r.message.id for r in got]


def test_every_subscriber_gets_every_message_and_a_non_durable_one_goes_at_detach():
    h = Harness()
    c = h.client()
    one = subscriber(c, "prices", name="s1")
    two = subscriber(c, "prices", name="s2")
    publish(c, "prices", ["m0", "m1", "m2"])
    assert ids(c, one) == ["m0", "m1", "m2"] and ids(c, two) == ["m0", "m1", "m2"]
    assert "topic" in capability_names(one.remote_source)
    one.close()
    h.pump()
    subs = h.broker.exchanges.topic_subscriptions
    assert [s["name"].split(":")[-2] for s in subs.describe()] == ["s2"]
    publish(c, "prices", ["m3"])  # no queue grows for the gone subscriber
    assert ids(c, two) == ["m3"] and len(h.queues.queues) == 1


def test_messages_published_before_a_subscription_are_not_kept_for_it():
    h = Harness()
    c = h.client()
    publish(c, "news", ["m0"])  # nobody subscribed: accepted and dropped, as a topic does
    late = subscriber(c, "news", name="late")
    publish(c, "news", ["m1"])
    assert ids(c, late) == ["m1"]


def test_a_durable_subscription_collects_while_detached_and_unsubscribe_removes_it():
    h = Harness()
    c = h.client()
    sub = subscriber(c, "orders", name="audit", durable=True)
    publish(c, "orders", ["m0"])
    assert accept(c, sub) == ["m0"]
    sub.detach()  # closed = false: the subscription stays
    h.pump()
    publish(c, "orders", ["m1", "m2"])
    again = subscriber(c, "orders", name="audit", durable=True)
    assert accept(c, again) == ["m1", "m2"]
    # one consumer at a time (the same client id on another connection)
    twin = h.client(container=c.connection.container)
    second = subscriber(twin, "orders", name="audit", durable=True)
    assert second.remote_condition.name == "amqp:resource-locked"
    third = h.client(container=c.connection.container)
    busy = subscriber(third, None, name="audit", credit=0)  # no unsubscribe while consumed
    assert busy.remote_condition.name == "amqp:resource-locked"
    again.detach()
    h.pump()
    lookup = subscriber(c, None, name="audit", credit=0)  # JMS unsubscribe: find it by name,
    assert lookup.remote_source.address == "orders"     # then close it
    assert lookup.remote_source.durability == Terminus.DELIVERIES
    lookup.close()
    h.pump()
    assert h.broker.exchanges.topic_subscriptions.describe() == []
    missing = subscriber(c, None, name="audit", credit=0)
    assert missing.remote_condition.name == "amqp:not-found"


def test_a_durable_subscription_attached_again_with_another_selector_starts_again_empty():
    h = Harness()
    c = h.client()
    sub = subscriber(c, "t", name="d", durable=True, selector="n > 0")
    sub.detach()
    h.pump()
    publish(c, "t", ["m0", "m1", "m2"])
    changed = subscriber(c, "t", name="d", durable=True, selector="n > 1")
    publish(c, "t", ["m3"])
    assert ids(c, changed) == ["m3"]  # m1 and m2 went with the old subscription


def test_a_selector_on_a_subscription_filters_what_it_collects():
    h = Harness()
    c = h.client()
    sub = subscriber(c, "ticks", name="big", durable=True, selector="n >= 2", credit=0)
    publish(c, "ticks", ["m0", "m1", "m2", "m3"])
    queue = h.broker.exchanges.topic_subscriptions.by_name[next(
        iter(h.broker.exchanges.topic_subscriptions.by_name))].queue
    assert queue.depth == 2  # never collected what it does not select
    sub.flow(10)
    h.pump()
    assert ids(c, sub) == ["m2", "m3"]


def test_consumers_of_a_shared_subscription_compete_and_it_goes_with_the_last_one():
    h = Harness()
    c = h.client()
    one = subscriber(c, "jobs", name="workers", shared=True, global_=True)
    two = subscriber(c, "jobs", name="workers|2", shared=True, global_=True)
    other = subscriber(c, "jobs", name="audit", shared=True, global_=True)
    publish(c, "jobs", [f"m{i}" for i in range(6)])
    first, second = ids(c, one), ids(c, two)
    assert sorted(first + second) == [f"m{i}" for i in range(6)] and first and second
    assert ids(c, other) == [f"m{i}" for i in range(6)]
    one.close()
    two.close()
    h.pump()
    names = [s["name"] for s in h.broker.exchanges.topic_subscriptions.describe()]
    assert names == ["global:audit"]


def test_a_subscription_selector_that_does_not_parse_is_refused():
    h = Harness()
    c = h.client()
    bad = subscriber(c, "t", name="x", selector="n >")
    assert bad.state & Endpoint.REMOTE_CLOSED
    assert bad.remote_condition.name == "amqp:invalid-field"


def no_local_subscriber(c, address: str, *, name: str, durable: bool = False):
    """A subscriber with the no-local filter, as Qpid JMS sends it (an empty list)."""
    link = c._session().receiver(name)
    link.source.address = address
    set_capabilities(link.source, ("topic",))
    if durable:
        link.source.durability = Terminus.DELIVERIES
        link.source.expiry_policy = Terminus.EXPIRE_NEVER
    link.source.filter.put_dict({symbol("no-local"): Described(symbol(NO_LOCAL_FILTER), [])})
    link.open()
    c.inbox[link] = []
    link.flow(10)
    c.harness.pump()
    return link


def test_a_no_local_subscriber_gets_nothing_its_own_connection_publishes():
    h = Harness()
    mine, theirs = h.client(), h.client()
    live = no_local_subscriber(mine, "chat", name="live")
    kept = no_local_subscriber(mine, "chat", name="kept", durable=True)
    plain = subscriber(mine, "chat", name="plain")
    assert any(is_no_local(d) for d, _ in filters(live.remote_source).values())  # echoed
    publish(mine, "chat", ["m0", "m1"])
    publish(theirs, "chat", ["m2"])
    publish(mine, "chat", ["m3"])
    assert ids(mine, live) == ["m2"] and ids(mine, kept) == ["m2"]
    assert ids(mine, plain) == ["m0", "m1", "m2", "m3"]
    (record,) = [s for s in h.broker.exchanges.topic_subscriptions.describe() if s["durable"]]
    assert record["no_local"] == mine.connection.container  # kept across a restart with it
