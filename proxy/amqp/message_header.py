"""Rewrite the header section of an encoded message without touching the rest.

Messages are stored as the producer encoded them (AMQP 1.0 §3.2: a sequence of
described sections). Only on the rare redelivery paths do we need to change
anything: the header's delivery-count (§3.2.1) after modified(delivery-failed)
or a lost consumer, and message-annotations merged from a modified outcome
(§3.4.5). The header, when present, is the first section, so we decode just
that one, re-encode it, and keep every following byte as it was.
"""

from __future__ import annotations

from proton import Data, DataException, Message, symbol, ulong

from proxy.selectors import codec

HEADER = 0x70
_HEADER_PREFIX = b"\x00\x53\x70"  # described by smallulong 0x70
_HEADER_PREFIX_LONG = b"\x00\x80" + (0x70).to_bytes(8, "big")


def _split_header(payload: bytes) -> tuple[list, bytes]:
    """Return (header fields, rest of the payload). Fields is [] when absent."""
    if not (payload.startswith(_HEADER_PREFIX) or payload.startswith(_HEADER_PREFIX_LONG)):
        return [], payload
    data = Data()
    consumed = data.decode(payload)
    data.rewind()
    data.next()
    data.enter()
    data.next()  # descriptor
    data.next()  # the list
    fields: list = []
    if data.type() == Data.LIST:
        data.enter()
        while data.next() is not None:
            fields.append(data.get_object())
    return fields, payload[consumed:]


def _encode_header(fields: list) -> bytes:
    fields = (fields + [None] * 5)[:5]
    durable, priority, ttl, first_acquirer, delivery_count = fields
    data = Data()
    data.put_described()
    data.enter()
    data.put_ulong(ulong(HEADER))
    data.put_list()
    data.enter()
    for value, put in (
        (durable, data.put_bool),
        (priority, data.put_ubyte),
        (ttl, data.put_uint),
        (first_acquirer, data.put_bool),
        (delivery_count, data.put_uint),
    ):
        if value is None:
            data.put_null()
        else:
            put(value)
    data.exit()
    data.exit()
    return bytes(data.encode())


def ttl_ms(payload: bytes) -> int:
    """The header's ttl in milliseconds (§3.2.1 field 2), 0 when there is none."""
    return ttl_and_priority(payload)[0]


def ttl_and_priority(payload: bytes) -> tuple[int, int]:
    """The header's ttl in milliseconds (0: none) and priority (§3.2.1, default 4; above 9
    counted as 9, as JMS does).

    Called for every message a local queue stores: the usual encodings are read
    byte by byte (a list of up to three fields: durable, priority, ttl), anything
    else through proton's decoder.
    """
    if not payload.startswith(_HEADER_PREFIX):
        return _slow_fields(payload) if payload.startswith(_HEADER_PREFIX_LONG) else (0, 4)
    try:
        code = payload[3]
        if code == 0x45:  # list0: no fields
            return 0, 4
        if code == 0xC0:  # list8: size, count
            count, pos = payload[5], 6
        elif code == 0xD0:  # list32
            count, pos = int.from_bytes(payload[8:12], "big"), 12
        else:
            return _slow_fields(payload)
        if count < 2:
            return 0, 4
        field = payload[pos]  # durable (bool) or null
        if field in (0x40, 0x41, 0x42):
            pos += 1
        elif field == 0x56:
            pos += 2
        else:
            return _slow_fields(payload)
        field = payload[pos]  # priority (ubyte) or null
        if field == 0x40:
            priority = 4
            pos += 1
        elif field == 0x50:
            priority = min(payload[pos + 1], 9)
            pos += 2
        else:
            return _slow_fields(payload)
        if count < 3:
            return 0, priority
        field = payload[pos]
        if field in (0x40, 0x43):  # null, uint0
            return 0, priority
        if field == 0x52:  # smalluint
            return payload[pos + 1], priority
        if field == 0x70:  # uint
            return int.from_bytes(payload[pos + 1:pos + 5], "big"), priority
    except IndexError:
        return 0, 4
    return _slow_fields(payload)


def _slow_fields(payload: bytes) -> tuple[int, int]:
    try:
        fields, _ = _split_header(payload)
    except (DataException, ValueError, TypeError, KeyError):
        return 0, 4
    value = fields[2] if len(fields) > 2 else None
    ttl = int(value) if isinstance(value, int) and value > 0 else 0
    value = fields[1] if len(fields) > 1 else None
    priority = min(int(value), 9) if isinstance(value, int) and value >= 0 else 4
    return ttl, priority


def message_annotations(payload: bytes) -> dict:
    """The message-annotations section (§3.2.3) as a dict with str keys; {} when there is
    none or it cannot be read. Reads the sections before it only, never the body (by hand:
    ``proxy.selectors.codec``, a few µs; proton's decoder is left for what it cannot read)."""
    try:
        position = codec.section_offsets(payload).get(codec.MESSAGE_ANNOTATIONS)
        return {} if position is None else codec.read_map(payload, position)
    except Exception:  # noqa: BLE001 - an encoding the hand reader does not take
        pass
    try:
        data = Data()
        pos = 0
        while pos < len(payload):
            data.clear()
            pos += data.decode(payload[pos:])
            data.rewind()
            data.next()
            data.enter()
            data.next()
            code = data.get_object()
            if code not in (0x70, 0x71, 0x72):
                return {}
            if code == 0x72:
                data.next()
                value = data.get_object()
                return {str(k): v for k, v in value.items()} if isinstance(value, dict) else {}
    except (DataException, ValueError, TypeError, KeyError):
        pass
    return {}


def delivery_count(payload: bytes) -> int:
    fields, _ = _split_header(payload)
    return int(fields[4]) if len(fields) > 4 and fields[4] is not None else 0


def modify(payload: bytes, *, increment_count: bool, annotations: dict | None = None) -> bytes:
    """Return payload with delivery-count + 1 and/or message-annotations merged.

    A payload we cannot parse is returned unchanged: redelivery must never be
    blocked by a producer's odd encoding.
    """
    try:
        if annotations:
            message = Message()
            message.decode(payload)
            if increment_count:
                message.delivery_count += 1
            merged = dict(message.annotations or {})
            merged.update({symbol(str(k)): v for k, v in annotations.items()})
            message.annotations = merged
            return bytes(message.encode())
        if not increment_count:
            return payload
        fields, rest = _split_header(payload)
        fields = (fields + [None] * 5)[:5]
        fields[4] = (fields[4] or 0) + 1
        return _encode_header(fields) + rest
    except (DataException, ValueError, TypeError, KeyError):
        return payload
