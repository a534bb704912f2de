"""What a selector identifier reads from an encoded AMQP 1.0 message.

``MessageView(payload).lookup(name)`` gives the value of one identifier, as a
``str``, ``int``, ``float``, ``bool`` or ``None`` (absent, or of a type a
selector cannot use). The view is made once per evaluation and decodes lazily:
the first lookup finds where the sections before the body start
(``codec.section_offsets``), and each section (header, message-annotations,
properties, application-properties) is decoded the first time a name needs it,
at most once. The body is never decoded. A malformed section reads as absent.

Names (the JMS headers as the AMQP JMS Mapping and Qpid JMS define them; see
docs/selectors.md):

* ``JMSMessageID``: properties.message-id as Qpid JMS shows it ("ID:..." kept,
  other strings "ID:AMQP_NO_PREFIX:...", ulong "ID:AMQP_ULONG:n", uuid
  "ID:AMQP_UUID:...", binary "ID:AMQP_BINARY:HEX");
* ``JMSCorrelationID``: properties.correlation-id, likewise except that a
  string without "ID:" stays as it is;
* ``JMSPriority``: header.priority, 4 when absent, 9 when above 9 (as Artemis);
* ``JMSTimestamp``: properties.creation-time in ms, 0 when absent;
* ``JMSExpiration``: properties.absolute-expiry-time, else creation-time + ttl,
  else 0;
* ``JMSType``: properties.subject, else the legacy message annotation
  ``x-opt-jms-type``;
* ``JMSDeliveryMode``: 'PERSISTENT' when header.durable is true, else
  'NON_PERSISTENT';
* ``JMSRedelivered``: header.delivery-count > 0;
* ``JMSXDeliveryCount``: header.delivery-count + 1;
* ``JMSXGroupID``, ``JMSXGroupSeq``: properties.group-id, group-sequence;
* ``JMSXUserID``: properties.user-id decoded as UTF-8;
* ``m.<key>`` (Artemis's prefix, written as a quoted identifier
  ``"m.x-opt-foo"``): the message annotation ``<key>``;
* any other name: the application property of that name.
"""

from __future__ import annotations

import uuid

from . import codec

_SIMPLE = frozenset((str, int, float, bool))
_ABSENT = {}  # a section that is not there (or could not be decoded) reads as empty
_ID = "ID:"
_TYPE_PREFIXES = ("AMQP_BINARY:", "AMQP_UUID:", "AMQP_ULONG:", "AMQP_STRING:", "AMQP_NO_PREFIX:")


class MessageView:
    """Lazy field access to one encoded message; see the module docstring."""

    __slots__ = ("_payload", "_wanted", "_offsets", "_header", "_properties", "_annotations",
                 "_application")

    def __init__(self, payload, wanted: dict | None = None) -> None:
        """``wanted`` (see ``wanted_properties``): the application properties to decode."""
        if type(payload) is not bytes:  # bytearray, memoryview: slices must be hashable bytes
            payload = bytes(payload)
        self._payload = payload
        self._wanted = wanted
        self._offsets = None
        self._header = None
        self._properties = None
        self._annotations = None
        self._application = None

    def lookup(self, name: str):
        """The identifier's value (str, int, float, bool) or None."""
        special = _SPECIAL.get(name)
        if special is not None:
            return special(self)
        if name.startswith("m."):
            value = self.annotations().get(name[2:])
        else:
            application = self._application
            if application is None:
                application = self._application = self._application_properties()
            value = application.get(name)
        return value if value.__class__ in _SIMPLE else None

    # -- sections, decoded on first use ------------------------------------------------

    def _offset(self, code: int):
        offsets = self._offsets
        if offsets is None:
            offsets = self._offsets = codec.section_offsets(self._payload)
        return offsets.get(code)

    def _section_list(self, code: int) -> list | None:
        position = self._offset(code)
        if position is None:
            return []
        try:
            return codec.read_list(self._payload, position)
        except Exception:  # noqa: BLE001 - malformed: the fields read as unknown
            return None

    def _section_map(self, code: int) -> dict:
        position = self._offset(code)
        if position is None:
            return _ABSENT
        try:
            return codec.read_map(self._payload, position)
        except Exception:  # noqa: BLE001 - malformed: read as absent
            return _ABSENT

    def _application_properties(self) -> dict:
        wanted = self._wanted
        if wanted is None:
            return self._section_map(codec.APPLICATION_PROPERTIES)
        position = self._offset(codec.APPLICATION_PROPERTIES)
        if position is None or not wanted:
            return _ABSENT
        try:
            return codec.read_entries(self._payload, position, wanted)
        except Exception:  # noqa: BLE001 - malformed: read as absent
            return _ABSENT

    def header(self) -> list | None:
        """The header's fields ([] when absent, None when malformed)."""
        header = self._header
        if header is None:
            header = self._header = self._section_list(codec.HEADER)
            if header is None:
                self._header = False
        return header if header is not False else None

    def properties(self) -> list | None:
        """The properties section's fields ([] when absent, None when malformed)."""
        properties = self._properties
        if properties is None:
            properties = self._properties = self._section_list(codec.PROPERTIES)
            if properties is None:
                self._properties = False
        return properties if properties is not False else None

    def annotations(self) -> dict:
        annotations = self._annotations
        if annotations is None:
            annotations = self._annotations = self._section_map(codec.MESSAGE_ANNOTATIONS)
        return annotations


# -- the JMS names ------------------------------------------------------------------------


def _field(fields: list | None, index: int):
    return fields[index] if fields and len(fields) > index else None


def _typed(value, kind):
    return value if type(value) is kind else None


def message_id_string(value) -> str | None:
    """properties.message-id as Qpid JMS's getJMSMessageID() shows it."""
    if type(value) is str:
        if not value.startswith(_ID):
            return _ID + "AMQP_NO_PREFIX:" + value
        if value.startswith(_TYPE_PREFIXES, 3):
            return _ID + "AMQP_STRING:" + value
        return value
    return _non_string_id(value)


def correlation_id_string(value) -> str | None:
    """properties.correlation-id as Qpid JMS's getJMSCorrelationID() shows it."""
    if type(value) is str:
        if value.startswith(_ID) and value.startswith(_TYPE_PREFIXES, 3):
            return _ID + "AMQP_STRING:" + value
        return value
    return _non_string_id(value)


def _non_string_id(value) -> str | None:
    if type(value) is int:
        return f"ID:AMQP_ULONG:{value}" if value >= 0 else None
    if type(value) is uuid.UUID:
        return f"ID:AMQP_UUID:{value}"
    if type(value) is bytes:
        return "ID:AMQP_BINARY:" + value.hex().upper()
    return None


def _jms_message_id(view):
    return message_id_string(_field(view.properties(), 0))


def _jms_correlation_id(view):
    return correlation_id_string(_field(view.properties(), 5))


def _jms_priority(view):
    header = view.header()
    if header is None:
        return None
    priority = _field(header, 1)
    if priority is None:
        return 4
    return min(priority, 9) if type(priority) is int else None


def _jms_delivery_mode(view):
    header = view.header()
    if header is None:
        return None
    return "PERSISTENT" if _field(header, 0) is True else "NON_PERSISTENT"


def _delivery_count(view):
    header = view.header()
    if header is None:
        return None
    count = _field(header, 4)
    return 0 if count is None else _typed(count, int)


def _jms_redelivered(view):
    count = _delivery_count(view)
    return None if count is None else count > 0


def _jmsx_delivery_count(view):
    count = _delivery_count(view)
    return None if count is None else count + 1


def _jms_timestamp(view):
    properties = view.properties()
    if properties is None:
        return None
    created = _field(properties, 9)
    return 0 if created is None else _typed(created, int)


def _jms_expiration(view):
    properties = view.properties()
    if properties is None:
        return None
    expiry = _typed(_field(properties, 8), int)
    if expiry:
        return expiry
    created = _typed(_field(properties, 9), int)
    ttl = _typed(_field(view.header(), 2), int)
    return created + ttl if created is not None and ttl else 0


def _jms_type(view):
    subject = _field(view.properties(), 3)
    if subject is None:
        subject = view.annotations().get("x-opt-jms-type")
    return _typed(subject, str)


def _jmsx_user_id(view):
    user = _field(view.properties(), 1)
    if type(user) is bytes and user:
        try:
            return user.decode()
        except UnicodeDecodeError:
            return None
    return _typed(user, str) or None


def _properties_field(index: int, kind):
    def get(view: MessageView):
        return _typed(_field(view.properties(), index), kind)
    return get


_SPECIAL = {
    "JMSMessageID": _jms_message_id,
    "JMSCorrelationID": _jms_correlation_id,
    "JMSPriority": _jms_priority,
    "JMSTimestamp": _jms_timestamp,
    "JMSExpiration": _jms_expiration,
    "JMSType": _jms_type,
    "JMSDeliveryMode": _jms_delivery_mode,
    "JMSRedelivered": _jms_redelivered,
    "JMSXDeliveryCount": _jmsx_delivery_count,
    "JMSXGroupID": _properties_field(10, str),
    "JMSXGroupSeq": _properties_field(11, int),
    "JMSXUserID": _jmsx_user_id,
}

HEADER_NAMES = frozenset(_SPECIAL)


def wanted_properties(names) -> dict:
    """{UTF-8 key: name} of the application properties that ``names`` read (for MessageView)."""
    return {name.encode(): name for name in names
            if name not in _SPECIAL and not name.startswith("m.")}


def normalize(value):
    """A caller's value as a selector sees it: str, int, float, bool or None."""
    kind = value.__class__
    if kind in _SIMPLE:
        return value
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    return None
