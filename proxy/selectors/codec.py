"""Just enough of the AMQP 1.0 type system (§1.6) to read the sections a selector needs.

An encoded message is a run of described sections (§3.2): header (list),
delivery-annotations and message-annotations (maps), properties (list),
application-properties (map), then the body and the footer. ``section_offsets``
walks the sections before the body, skipping each by its encoded size, and
records where each one's value starts; ``read_list`` and ``read_map`` decode one
of them when a selector asks for a field in it. The body is never decoded.

Values come back as Python objects: ``None``, ``bool``, ``int`` (every integer
width, and timestamps as milliseconds), ``float`` (float and double), ``str``
(string, symbol, char), ``bytes`` (binary), ``uuid.UUID``; a decimal, a list, a
map, an array or a described value inside a section comes back as ``OTHER``.
Anything malformed raises ``ValueError``/``IndexError``/``struct.error``/
``UnicodeDecodeError``: the caller (``fields``) turns that into "section absent".
"""

from __future__ import annotations

import struct
import uuid

HEADER, DELIVERY_ANNOTATIONS, MESSAGE_ANNOTATIONS, PROPERTIES, APPLICATION_PROPERTIES = (
    0x70, 0x71, 0x72, 0x73, 0x74)

OTHER = object()  # a value of a type a selector cannot use (decimal, list, map, described, ...)

_SYMBOLIC_SECTIONS = {
    b"amqp:header:list": 0x70,
    b"amqp:delivery-annotations:map": 0x71,
    b"amqp:message-annotations:map": 0x72,
    b"amqp:properties:list": 0x73,
    b"amqp:application-properties:map": 0x74,
}

_unpack_from = struct.unpack_from
_I = struct.Struct(">I").unpack_from
_II = struct.Struct(">II").unpack_from
_SB = struct.Struct(">BB").unpack_from


def _fixed(width: int, fmt: str | None):
    """A reader for a fixed-width value; ``fmt`` None means 'skip it, OTHER'."""
    if fmt is None:
        return lambda b, p: (OTHER, p + width)
    unpack = struct.Struct(fmt).unpack_from
    return lambda b, p: (unpack(b, p)[0], p + width)


def _utf8_8(b, p):
    n = b[p]
    return b[p + 1:p + 1 + n].decode(), p + 1 + n


def _utf8_32(b, p):
    n = _I(b, p)[0]
    return b[p + 4:p + 4 + n].decode(), p + 4 + n


def _ascii_8(b, p):
    n = b[p]
    return b[p + 1:p + 1 + n].decode("ascii"), p + 1 + n


def _ascii_32(b, p):
    n = _I(b, p)[0]
    return b[p + 4:p + 4 + n].decode("ascii"), p + 4 + n


def _bin_8(b, p):
    n = b[p]
    end = p + 1 + n
    if end > len(b):
        raise ValueError("binary runs past the end")
    return bytes(b[p + 1:end]), end


def _bin_32(b, p):
    n = _I(b, p)[0]
    end = p + 4 + n
    if end > len(b):
        raise ValueError("binary runs past the end")
    return bytes(b[p + 4:end]), end


def _char(b, p):
    return chr(_I(b, p)[0]), p + 4


def _uuid(b, p):
    if p + 16 > len(b):
        raise ValueError("uuid runs past the end")
    return uuid.UUID(bytes=bytes(b[p:p + 16])), p + 16


def _compound_8(b, p):  # list8/map8/array8: the size byte counts what follows it
    return OTHER, p + 1 + b[p]


def _compound_32(b, p):
    return OTHER, p + 4 + _I(b, p)[0]


def _described(b, p):
    _, p = read(b, p)  # descriptor
    _, p = read(b, p)  # value
    return OTHER, p


_READERS = {
    0x40: lambda b, p: (None, p),
    0x41: lambda b, p: (True, p),
    0x42: lambda b, p: (False, p),
    0x56: lambda b, p: (b[p] != 0, p + 1),
    0x43: lambda b, p: (0, p),  # uint0
    0x44: lambda b, p: (0, p),  # ulong0
    0x45: lambda b, p: (OTHER, p),  # list0
    0x50: lambda b, p: (b[p], p + 1),  # ubyte
    0x52: lambda b, p: (b[p], p + 1),  # smalluint
    0x53: lambda b, p: (b[p], p + 1),  # smallulong
    0x51: _fixed(1, ">b"),
    0x54: _fixed(1, ">b"),  # smallint
    0x55: _fixed(1, ">b"),  # smalllong
    0x60: _fixed(2, ">H"),
    0x61: _fixed(2, ">h"),
    0x70: _fixed(4, ">I"),
    0x71: _fixed(4, ">i"),
    0x72: _fixed(4, ">f"),
    0x73: _char,
    0x74: _fixed(4, None),  # decimal32
    0x80: _fixed(8, ">Q"),
    0x81: _fixed(8, ">q"),
    0x82: _fixed(8, ">d"),
    0x83: _fixed(8, ">q"),  # timestamp, ms since the epoch
    0x84: _fixed(8, None),  # decimal64
    0x94: _fixed(16, None),  # decimal128
    0x98: _uuid,
    0xA0: _bin_8,
    0xA1: _utf8_8,
    0xA3: _ascii_8,
    0xB0: _bin_32,
    0xB1: _utf8_32,
    0xB3: _ascii_32,
    0xC0: _compound_8,
    0xC1: _compound_8,
    0xE0: _compound_8,
    0xD0: _compound_32,
    0xD1: _compound_32,
    0xF0: _compound_32,
    0x00: _described,
}


def read(b, p: int):
    """(value, position after it) of the value whose format code is at ``p``."""
    code = b[p]
    if code == 0xA1:  # str8: the usual key and string value, read inline
        n = b[p + 1]
        end = p + 2 + n
        return b[p + 2:end].decode(), end
    return _READERS[code](b, p + 1)


def _count_and_start(b, p: int, list8: int, list32: int) -> tuple[int, int, int]:
    """(element count, first element, end) of a list/map at ``p``; count 0 for null/list0."""
    code = b[p]
    if code == list8:
        size, count = _SB(b, p + 1)
        end = p + 2 + size
        first = p + 3
    elif code == list32:
        size, count = _II(b, p + 1)
        end = p + 5 + size
        first = p + 9
    elif code == 0x40 or (code == 0x45 and list8 == 0xC0):
        return 0, p + 1, p + 1
    else:
        raise ValueError(f"format code 0x{code:02x} where a section value was expected")
    if end > len(b):
        raise ValueError("section runs past the end of the message")
    return count, first, end


def read_list(b, p: int) -> list:
    """The fields of the list at ``p`` (a header or properties section's value)."""
    count, q, end = _count_and_start(b, p, 0xC0, 0xD0)
    fields = []
    append = fields.append
    for _ in range(count):
        if b[q] == 0x40:  # null: most of a properties section's fields
            append(None)
            q += 1
        else:
            value, q = read(b, q)
            append(value)
    if q > end:
        raise ValueError("list fields run past the list's size")
    return fields


def read_map(b, p: int) -> dict:
    """The map at ``p`` (an annotations or application-properties section's value).

    Keys that are not strings or symbols are left out; values are as ``read``
    gives them.
    """
    count, q, end = _count_and_start(b, p, 0xC1, 0xD1)
    if count & 1:
        raise ValueError("map with an odd number of elements")
    result = {}
    for _ in range(count >> 1):
        key, q = read(b, q)
        value, q = read(b, q)
        if type(key) is str:
            result[key] = value
    if q > end:
        raise ValueError("map entries run past the map's size")
    return result


_WIDTH = [-1] * 256  # bytes after the format code, for the fixed-width types
for _codes, _width in (((0x40, 0x41, 0x42, 0x43, 0x44, 0x45), 0), ((0x50, 0x51, 0x52, 0x53, 0x54,
                        0x55, 0x56), 1), ((0x60, 0x61), 2), ((0x70, 0x71, 0x72, 0x73, 0x74), 4),
                       ((0x80, 0x81, 0x82, 0x83, 0x84), 8), ((0x94, 0x98), 16)):
    for _code in _codes:
        _WIDTH[_code] = _width
_SIZE8 = frozenset((0xA0, 0xA1, 0xA3, 0xC0, 0xC1, 0xE0))
_SIZE32 = frozenset((0xB0, 0xB1, 0xB3, 0xD0, 0xD1, 0xF0))


def skip(b, p: int) -> int:
    """The position after the value at ``p``, without decoding it."""
    code = b[p]
    width = _WIDTH[code]
    if width >= 0:
        return p + 1 + width
    if code in _SIZE8:
        return p + 2 + b[p + 1]
    if code in _SIZE32:
        return p + 5 + _I(b, p + 1)[0]
    if code == 0x00:
        return skip(b, skip(b, p + 1))
    raise ValueError(f"unknown format code 0x{code:02x}")


def read_entries(b, p: int, wanted: dict) -> dict:
    """Only the entries of the map at ``p`` whose key is in ``wanted``.

    ``wanted`` maps a key's UTF-8 bytes to the name to file its value under.
    Other keys are compared as bytes, their values skipped undecoded; the walk
    stops as soon as every wanted key has been seen.
    """
    count, q, end = _count_and_start(b, p, 0xC1, 0xD1)
    found: dict = {}
    remaining = len(wanted)
    for _ in range(count >> 1):
        code = b[q]
        if code == 0xA1 or code == 0xA3:
            key_end = q + 2 + b[q + 1]
            name = wanted.get(b[q + 2:key_end])
        elif code == 0xB1 or code == 0xB3:
            key_end = q + 5 + _I(b, q + 1)[0]
            name = wanted.get(b[q + 5:key_end])
        else:
            key_end, name = skip(b, q), None
        if name is None:  # skip the value; the common fixed and short ones inline
            code = b[key_end]
            width = _WIDTH[code]
            if width >= 0:
                q = key_end + 1 + width
            elif code == 0xA1:
                q = key_end + 2 + b[key_end + 1]
            else:
                q = skip(b, key_end)
        else:
            if name in found:  # a repeated key: the first one counts
                q = skip(b, key_end)
                continue
            found[name], q = read(b, key_end)
            if q > end:
                raise ValueError("map entries run past the map's size")
            remaining -= 1
            if not remaining:
                return found
    if q > end:
        raise ValueError("map entries run past the map's size")
    return found


def section_offsets(b) -> dict[int, int]:
    """{section code: position of its value} for the sections before the body.

    Stops at the first body section (data, amqp-sequence, amqp-value), the
    footer, or anything that is not a described section. A truncated or
    malformed section ends the walk too: it and the sections after it are
    left out (read as absent).
    """
    offsets: dict[int, int] = {}
    p = 0
    n = len(b)
    try:
        while p < n:
            if b[p]:
                break
            if b[p + 1] == 0x53:  # smallulong descriptor, the usual case
                code, q = b[p + 2], p + 3
            else:
                code, q = _long_descriptor(b, p)
            if code < HEADER or code > APPLICATION_PROPERTIES or code in offsets:
                break
            value_code = b[q]
            if value_code == 0xC0 or value_code == 0xC1:
                end = q + 2 + b[q + 1]
            elif value_code == 0xD0 or value_code == 0xD1:
                end = q + 5 + _I(b, q + 1)[0]
            elif value_code == 0x45 or value_code == 0x40:
                end = q + 1
            else:
                break
            if end > n:
                break
            offsets[code] = q
            p = end
    except (IndexError, struct.error):
        pass
    return offsets


def _long_descriptor(b, p: int) -> tuple[int, int]:
    """(section code, value position) of a ulong or symbolic descriptor; code -1: neither."""
    kind = b[p + 1]
    if kind == 0x80:
        return int.from_bytes(b[p + 2:p + 10], "big"), p + 10
    if kind == 0xA3:
        length = b[p + 2]
        return _SYMBOLIC_SECTIONS.get(bytes(b[p + 3:p + 3 + length]), -1), p + 3 + length
    return -1, p
