"""Selectors against encoded AMQP 1.0 messages: what each identifier reads (proxy.selectors.fields).

Messages are built with ``proton.Message(...).encode()``, as a producer sends
them; the JMS names follow the AMQP JMS Mapping as Qpid JMS shows them
(docs/selectors.md).
"""

from __future__ import annotations

import random
import uuid

import pytest
from proton import (Message, byte, char, decimal32, float32, int32, short, symbol, timestamp, ubyte,
                    uint, ulong, ushort)

from proxy.selectors import parse
from proxy.selectors.fields import MessageView

CREATED = 1_700_000_000_500  # ms


def encode(**fields) -> bytes:
    return bytes(Message(**fields).encode())


def selects(selector: str, payload: bytes) -> bool:
    return parse(selector).matches(payload)


FULL = encode(
    id="ID:order-1", correlation_id="req-7", subject="order.created", group_id="customer-42",
    group_sequence=3, creation_time=CREATED / 1000, priority=7, durable=True, delivery_count=2,
    ttl=30.0, user_id=b"alice", address="orders", reply_to="replies",
    properties={"color": "red", "weight": 12, "price": 9.5, "express": True, "region": "eu-west"},
    annotations={symbol("x-opt-partition"): 5, symbol("x-opt-origin"): "edge"},
    instructions={symbol("x-opt-delivery-note"): "da"},
    body="the body " * 100)


@pytest.mark.parametrize("selector, expected", [
    ("color = 'red'", True), ("color = 'blue'", False), ("weight > 10", True),
    ("weight = 12.0", True), ("price BETWEEN 9 AND 10", True), ("express", True),
    ("NOT express", False), ("region LIKE 'eu-%'", True), ("region IN ('us', 'eu-west')", True),
    ("missing IS NULL", True), ("missing = 1", False), ("NOT missing = 1", False),
    ("color = 'red' AND weight > 10 AND express AND region LIKE '%west'", True),
    ("JMSPriority = 7", True), ("JMSPriority > 4", True), ("JMSDeliveryMode = 'PERSISTENT'", True),
    ("JMSMessageID = 'ID:order-1'", True), ("JMSCorrelationID = 'req-7'", True),
    ("JMSType = 'order.created'", True), ("JMSTimestamp = 1700000000500", True),
    ("JMSXDeliveryCount = 3", True), ("JMSRedelivered", True),
    ("JMSXGroupID = 'customer-42'", True),
    ("JMSXGroupSeq = 3", True), ("JMSXUserID = 'alice'", True),
    ("JMSExpiration = 1700000030500", True),
    ('"m.x-opt-partition" = 5', True), ('"m.x-opt-origin" = \'edge\'', True),
    ('"m.x-opt-delivery-note" IS NULL', True),  # a delivery annotation, not a message one
    ('"m.x-opt-absent" IS NULL', True),
])
def test_a_message_with_every_section(selector, expected):
    assert selects(selector, FULL) is expected


def test_application_properties_of_every_simple_type():
    payload = encode(properties={
        "b": byte(-5), "s": short(-300), "i": int32(-70000), "l": -2**40, "ub": ubyte(200),
        "us": ushort(60000), "ui": uint(4_000_000_000), "ul": ulong(2**63), "f": float32(1.5),
        "d": 2.25, "t": True, "n": False, "str": "text", "long": "x" * 300, "c": char("x"),
        "sym": symbol("abc"), "ts": timestamp(CREATED), "bin": b"\x01\x02",
        "u": uuid.UUID(int=1), "list": [1, 2], "map": {"k": "v"}, "dec": decimal32(5),
        "none": None, "uni": "ünï €"})
    for selector in ["b = -5", "s = -300", "i = -70000", "l = -1099511627776", "ub = 200",
                     "us = 60000", "ui = 4000000000", "ul = 9223372036854775808", "f = 1.5",
                     "d = 2.25", "t = TRUE", "t", "n = FALSE", "NOT n", "str = 'text'",
                     "long LIKE 'xxx%'", "c = 'x'", "sym = 'abc'", "ts = 1700000000500",
                     "uni = 'ünï €'", "b + s + i < 0", "f * 2 = 3"]:
        assert selects(selector, payload), selector
    for name in ["bin", "u", "list", "map", "dec", "none", "absent"]:
        assert selects(f"{name} IS NULL", payload), name


def test_a_float_property_compares_as_its_float32_value():
    payload = encode(properties={"f": float32(1.1)})
    assert not selects("f = 1.1", payload)  # 1.1f is not 1.1, as in Java
    assert selects("f BETWEEN 1.0999 AND 1.1001", payload)


def test_priority_defaults_to_4_and_delivery_mode_to_non_persistent():
    bare = encode(body="x")
    assert selects("JMSPriority = 4", bare)
    assert selects("JMSDeliveryMode = 'NON_PERSISTENT'", bare)
    assert selects("JMSXDeliveryCount = 1", bare)
    assert selects("NOT JMSRedelivered", bare)
    assert selects("JMSTimestamp = 0", bare)
    assert selects("JMSExpiration = 0", bare)
    for name in ["JMSMessageID", "JMSCorrelationID", "JMSType", "JMSXGroupID", "JMSXGroupSeq",
                 "JMSXUserID"]:
        assert selects(f"{name} IS NULL", bare), name
    assert selects("JMSPriority = 0", encode(priority=0))
    assert selects("JMSPriority = 9", encode(priority=9))
    assert selects("JMSPriority = 9", encode(priority=200))  # above 9 counts as 9, as in Artemis
    assert selects("JMSDeliveryMode = 'NON_PERSISTENT'", encode(durable=False, priority=5))
    assert selects("JMSDeliveryMode = 'PERSISTENT'", encode(durable=True))


@pytest.mark.parametrize("message_id, shown", [
    ("ID:abc", "ID:abc"),
    ("abc", "ID:AMQP_NO_PREFIX:abc"),
    ("ID:AMQP_UUID:x", "ID:AMQP_STRING:ID:AMQP_UUID:x"),
    (ulong(7), "ID:AMQP_ULONG:7"),
    (uuid.UUID("12345678-1234-5678-1234-567812345678"),
     "ID:AMQP_UUID:12345678-1234-5678-1234-567812345678"),
    (b"\x01\xab\xff", "ID:AMQP_BINARY:01ABFF"),
])
def test_jms_message_id_is_shown_as_qpid_jms_shows_it(message_id, shown):
    payload = encode(id=message_id)
    assert selects(f"JMSMessageID = '{shown}'", payload)
    assert selects(f"JMSMessageID IN ('{shown}')", payload)


@pytest.mark.parametrize("correlation_id, shown", [
    ("ID:abc", "ID:abc"),
    ("abc", "abc"),
    (ulong(7), "ID:AMQP_ULONG:7"),
    (uuid.UUID(int=255), f"ID:AMQP_UUID:{uuid.UUID(int=255)}"),
    (b"\x00\x10", "ID:AMQP_BINARY:0010"),
])
def test_jms_correlation_id_is_shown_as_qpid_jms_shows_it(correlation_id, shown):
    assert selects(f"JMSCorrelationID = '{shown}'", encode(correlation_id=correlation_id))


def test_jms_type_is_the_subject_else_the_legacy_annotation():
    assert selects("JMSType = 'a'", encode(subject="a"))
    legacy = encode(annotations={symbol("x-opt-jms-type"): "b"})
    assert selects("JMSType = 'b'", legacy)
    both = encode(subject="a", annotations={symbol("x-opt-jms-type"): "b"})
    assert selects("JMSType = 'a'", both)


def test_expiration_is_the_absolute_expiry_else_creation_plus_ttl():
    absolute = Message(creation_time=CREATED / 1000, ttl=10.0)
    absolute.expiry_time = (CREATED + 5000) / 1000
    assert selects("JMSExpiration = 1700000005500", bytes(absolute.encode()))
    assert selects("JMSExpiration = 1700000010500", encode(creation_time=CREATED / 1000, ttl=10.0))
    assert selects("JMSExpiration = 0", encode(ttl=10.0))


def test_header_names_win_over_application_properties_of_the_same_name():
    payload = encode(priority=2, properties={"JMSPriority": 8, "JMSType": "fake"})
    assert selects("JMSPriority = 2", payload)
    assert selects("JMSType IS NULL", payload)
    # not a header name: an application property
    assert selects("JMSXCustom = 1", encode(properties={"JMSXCustom": 1}))


def test_the_body_is_never_decoded():
    good = encode(properties={"a": 1}, body="x")
    body_at = good.index(b"\x00\x53\x77")
    broken = good[:body_at] + b"\x00\x53\x77\xff\xff\xff"  # an undecodable body
    assert selects("a = 1", broken)
    assert selects("JMSPriority = 4", broken)
    no_body = encode(properties={"a": 1}, body=None)
    assert selects("a = 1", no_body)


def test_sections_with_long_or_symbolic_descriptors():
    header = b"\x00\x80" + (0x70).to_bytes(8, "big") + b"\xc0\x04\x02\x41\x50\x06"  # durable, 6
    name = b"amqp:application-properties:map"
    properties = (b"\x00\xa3" + bytes([len(name)]) + name
                  + b"\xc1\x08\x02\xa1\x01k\xa1\x02vv")
    payload = header + properties + b"\x00\x53\x77\xa1\x01x"
    assert selects("JMSPriority = 6 AND JMSDeliveryMode = 'PERSISTENT' AND k = 'vv'", payload)


def test_32_bit_encodings():
    key, value = b"k", b"v" * 3
    entries = (b"\xb1" + len(key).to_bytes(4, "big") + key
               + b"\xb1" + len(value).to_bytes(4, "big") + value)
    body = (2).to_bytes(4, "big") + entries
    properties = b"\x00\x53\x74\xd1" + len(body).to_bytes(4, "big") + body
    header_body = (2).to_bytes(4, "big") + b"\x40\x50\x03"
    header = b"\x00\x53\x70\xd0" + len(header_body).to_bytes(4, "big") + header_body
    assert selects("k = 'vvv' AND JMSPriority = 3", header + properties)


def test_payloads_other_than_bytes():
    assert parse("color = 'red'").matches(bytearray(FULL))
    assert parse("color = 'red'").matches(memoryview(FULL))


@pytest.mark.parametrize("payload", [
    b"", b"\x00", b"\x00\x53", b"\x00\x53\x74", b"\x00\x53\x74\xc1", b"\x00\x53\x74\xc1\x05\x02",
    b"\x00\x53\x74\xc1\x05\x02\xa1\x01k\x55", b"\x00\x53\x74\xc1\x04\x02\xa1\x09k\x55\x01",
    b"\x00\x53\x74\xd1\xff\xff\xff\xff", b"\x00\x53\x74\xc1\x03\x01\x40", b"\x00\x53\x74\x71",
    b"\x00\x53\x74\xc1\x05\x02\xa1\x01k\xff", b"\x00\x53\x74\xc1\x06\x02\xa1\x02\xff\xfe\x40",
    b"\x00\x53\x70\xc0\x03\x05\x41", b"\x00\x53\x73\xc0\xff\x0d", b"\xff\xff\xff", b"garbage",
])
def test_malformed_messages_are_never_selected_and_never_raise(payload):
    for selector in ["k IS NULL OR k = 1", "NOT (k IS NULL)", "k = 1", "JMSPriority = 4",
                     "JMSMessageID IS NULL", "JMSType IS NULL", '"m.k" IS NULL']:
        assert parse(selector).matches(payload) in (True, False)
    assert parse("k = 1").matches(payload) is False


def test_a_malformed_section_reads_as_absent_and_earlier_sections_still_read():
    good = encode(priority=6, properties={"a": 1})
    cut = good[:-3]  # application-properties truncated
    assert selects("JMSPriority = 6", cut)
    assert selects("a IS NULL", cut)
    assert not selects("a = 1", cut)


def test_random_corruption_never_raises():
    selectors = [parse(text) for text in [
        "color = 'red' AND weight > 10", "JMSMessageID LIKE 'ID:%'", "JMSType = 'order.created'",
        "JMSXUserID = 'alice' OR JMSExpiration > 0", '"m.x-opt-origin" = \'edge\'',
        "JMSCorrelationID IS NOT NULL AND JMSXGroupSeq = 3"]]
    generator = random.Random(7)
    for _ in range(2000):
        data = bytearray(FULL[:600])
        for _ in range(generator.randint(1, 4)):
            data[generator.randrange(len(data))] = generator.randrange(256)
        data = bytes(data[:generator.randrange(len(data) + 1)])
        for selector in selectors:
            assert selector.matches(data) in (True, False)


def test_only_the_wanted_application_properties_are_decoded():
    view = MessageView(FULL, {b"color": "color"})
    assert view.lookup("color") == "red"
    assert view.lookup("weight") is None  # not wanted: not decoded
    full = MessageView(FULL)
    assert full.lookup("weight") == 12
    assert full.lookup("JMSPriority") == 7


def test_a_selector_reading_only_header_fields_does_not_decode_properties():
    view = MessageView(FULL, {})
    assert view.lookup("JMSPriority") == 7
    assert view._properties is None and view._application is None
    assert view.lookup("color") is None
