"""The subject or the ``to`` of an encoded message, decoding only its properties section.

Exchanges route on the subject (AMQP 1.0 §3.2.4, properties field 3), the
anonymous relay on ``to`` (field 2). An
encoded message is a run of described sections in a fixed order (§3.2):
header (list), delivery-annotations and message-annotations (maps), then
properties (list). The sections before properties are skipped by their
encoded sizes (list8/32, map8/32, null: §1.6); only the properties section
is handed to proton's ``Data`` decoder. Any other shape (a symbolic
descriptor, say) falls back to decoding the whole message with ``Message``.
Local-queue and proxy traffic never comes here: it stays undecoded.
"""

from __future__ import annotations

from proton import Data, Message

HEADER, DELIVERY_ANNOTATIONS, MESSAGE_ANNOTATIONS, PROPERTIES = 0x70, 0x71, 0x72, 0x73
_SKIPPABLE = (HEADER, DELIVERY_ANNOTATIONS, MESSAGE_ANNOTATIONS)


def _descriptor(payload: bytes, pos: int) -> tuple[int, int] | None:
    """(section code, position of its value) for the section starting at ``pos``."""
    if payload[pos] != 0x00:
        return None
    code = payload[pos + 1]
    if code == 0x53:  # smallulong
        return payload[pos + 2], pos + 3
    if code == 0x80:  # ulong
        return int.from_bytes(payload[pos + 2:pos + 10], "big"), pos + 10
    return None


def _value_end(payload: bytes, pos: int) -> int | None:
    """End of the list/map/null value at ``pos`` (§1.6.22-25), from its size field."""
    code = payload[pos]
    if code in (0x40, 0x45):  # null, list0
        return pos + 1
    if code in (0xC0, 0xC1):  # list8, map8: size counts the bytes after the size field
        return pos + 2 + payload[pos + 1]
    if code in (0xD0, 0xD1):  # list32, map32
        return pos + 5 + int.from_bytes(payload[pos + 1:pos + 5], "big")
    return None


def read_subject(payload: bytes) -> str | None:
    """The message's subject, or None when it has none (or is not a valid message)."""
    return _read_field(payload, 3)


def read_to(payload: bytes) -> str | None:
    """The message's ``to`` address (§3.2.4 field 2), or None; the anonymous relay routes on it."""
    return _read_field(payload, 2)


def _read_field(payload: bytes, index: int) -> str | None:
    """A string field of the properties section (``to`` 2, ``subject`` 3), or None."""
    try:
        pos = 0
        while pos < len(payload):
            found = _descriptor(payload, pos)
            if found is None:
                break
            code, value = found
            end = _value_end(payload, value)
            if end is None:
                break
            if code in _SKIPPABLE:
                pos = end
                continue
            if code != PROPERTIES:
                return None  # no properties section
            data = Data()
            data.decode(payload[pos:end])
            data.rewind()
            data.next()
            fields = data.get_object().value
            value = fields[index] if isinstance(fields, list) and len(fields) > index else None
            return value if isinstance(value, str) else None
        return None if pos >= len(payload) else _slow_field(payload, index)
    except (IndexError, ValueError, KeyError, TypeError, AttributeError):
        return _slow_field(payload, index)
    except Exception:  # proton's DataException and friends: not a message we can read
        return _slow_field(payload, index)


def _slow_field(payload: bytes, index: int) -> str | None:
    message = Message()
    try:
        message.decode(payload)
    except Exception:  # noqa: BLE001 - anything undecodable has neither
        return None
    value = message.address if index == 2 else message.subject
    return value if isinstance(value, str) else None
