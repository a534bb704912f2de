"""AMQP 1.0 transactions on the wire (§4): the coordinator's messages and the delivery states.

What crosses a coordinator link (§4.2, §4.5):

* ``declare`` (described type 0x31, ``amqp:declare:list``: ``[global-id]``) and
  ``discharge`` (0x32, ``amqp:discharge:list``: ``[txn-id, fail]``) are the
  bodies (an amqp-value section) of messages the controller sends;
* the coordinator answers a declare with the ``declared`` state (0x33,
  ``[txn-id]``) and a discharge with ``accepted``, or either with ``rejected``
  carrying a transaction error (``amqp:transaction:unknown-id``,
  ``amqp:transaction:rollback``, ``amqp:transaction:timeout``).

Transactional work is marked by the ``transactional-state`` delivery state
(0x34, ``[txn-id, outcome]``): on a transfer (§4.4.1, no outcome: the message
is part of the transaction), on a disposition for a message the controller
received (§4.4.2, with the outcome that applies at commit), and on the
resource's answer to a transactional transfer (the outcome it gives, §4.4.1).

proton (python-qpid-proton 0.40) keeps a state it has no name for as its type
code and the list of its fields: ``pn_delivery_remote_state`` answers 0x34,
``pn_disposition_data`` holds ``[txn-id, outcome]``; a local state is written
the same way (fields, then ``pn_delivery_update`` with the code). Descriptors
may come as codes (Qpid JMS) or as symbols (proton's own client).
"""

from __future__ import annotations

from dataclasses import dataclass

from cproton import ffi as _ffi
from cproton import lib as _lib
from cproton import (
    PN_ACCEPTED,
    PN_MODIFIED,
    PN_REJECTED,
    PN_RELEASED,
    pn_delivery_local,
    pn_delivery_remote,
    pn_delivery_settle,
    pn_delivery_update,
    pn_disposition_data,
)
from proton import Condition, Data, Delivery, Described, Message, ProtonException, symbol, ulong

DECLARE = 0x31
DISCHARGE = 0x32
DECLARED = 0x33
TRANSACTIONAL_STATE = 0x34
COORDINATOR = 0x30

# transaction-error conditions (§4.5.8)
UNKNOWN_ID = "amqp:transaction:unknown-id"
ROLLBACK = "amqp:transaction:rollback"
TIMEOUT = "amqp:transaction:timeout"

# txn-capability (§4.5.7): what our coordinator offers
LOCAL_TRANSACTIONS = "amqp:local-transactions"
MULTI_TXNS_PER_SSN = "amqp:multi-txns-per-ssn"
MULTI_SSNS_PER_TXN = "amqp:multi-ssns-per-txn"
CAPABILITIES = (LOCAL_TRANSACTIONS, MULTI_TXNS_PER_SSN, MULTI_SSNS_PER_TXN)

_SYMBOLS = {
    "amqp:declare:list": DECLARE, "amqp:discharge:list": DISCHARGE,
    "amqp:declared:list": DECLARED, "amqp:transactional-state:list": TRANSACTIONAL_STATE,
    "amqp:accepted:list": PN_ACCEPTED, "amqp:rejected:list": PN_REJECTED,
    "amqp:released:list": PN_RELEASED, "amqp:modified:list": PN_MODIFIED,
}
_ERROR = 0x1D  # the error type (§2.8.14)


class ControlError(ValueError):
    """A coordinator message that is neither a declare nor a discharge (amqp:decode-error)."""


@dataclass(frozen=True)
class Declare:
    global_id: object = None  # set: a distributed transaction (not offered)


@dataclass(frozen=True)
class Discharge:
    txn_id: bytes
    fail: bool


@dataclass(frozen=True)
class TxnState:
    """A ``transactional-state`` read from a delivery: its txn-id and outcome (None: a posting)."""

    txn_id: bytes
    outcome: int | None = None  # PN_ACCEPTED, PN_REJECTED, PN_RELEASED, PN_MODIFIED
    fields: tuple = ()  # the outcome's own fields (modified's flags, rejected's error)

    @property
    def failed(self) -> bool:
        """modified: delivery-failed (§3.4.5)."""
        return self.outcome == PN_MODIFIED and bool(self.fields[:1] and self.fields[0])

    @property
    def undeliverable(self) -> bool:
        """modified: undeliverable-here (§3.4.5)."""
        return self.outcome == PN_MODIFIED and bool(self.fields[1:2] and self.fields[1])

    @property
    def annotations(self) -> dict | None:
        """modified: message-annotations to merge (§3.4.5)."""
        value = self.fields[2] if self.outcome == PN_MODIFIED and len(self.fields) > 2 else None
        return value or None


def _code(descriptor) -> int | None:
    if isinstance(descriptor, int):
        return int(descriptor)
    return _SYMBOLS.get(str(descriptor))


def _binary(value) -> bytes:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)  # proton hands out a view into its own memory: copied
    raise ControlError(f"a txn-id is binary, got {type(value).__name__}")


def parse_control(payload: bytes) -> Declare | Discharge:
    """The declare or discharge a coordinator message carries (§4.5.1, §4.5.3)."""
    message = Message()
    try:
        message.decode(payload)
    except ProtonException as exc:  # proton's decode errors
        raise ControlError(f"not an AMQP message: {exc}") from None
    body = message.body
    if not isinstance(body, Described):
        raise ControlError("the body is not a declare or a discharge (a described list)")
    code = _code(body.descriptor)
    fields = list(body.value or []) if isinstance(body.value, (list, tuple)) else None
    if fields is None:
        raise ControlError("a declare or discharge is a list")
    if code == DECLARE:
        return Declare(fields[0] if fields else None)
    if code == DISCHARGE:
        if not fields:
            raise ControlError("a discharge needs its txn-id")
        return Discharge(_binary(fields[0]), bool(fields[1]) if len(fields) > 1 else False)
    raise ControlError(f"descriptor {body.descriptor!r} is neither declare nor discharge")


def encode_declare() -> bytes:
    return Message(body=Described(ulong(DECLARE), [None])).encode()


def encode_discharge(txn_id: bytes, fail: bool) -> bytes:
    return Message(body=Described(ulong(DISCHARGE), [txn_id, fail])).encode()


def read_state(delivery, *, remote: bool = True) -> TxnState | None:
    """The ``transactional-state`` of ``delivery`` (its peer's, or ours); None if malformed."""
    data = Data(pn_disposition_data((pn_delivery_remote if remote else pn_delivery_local)(delivery)))
    data.rewind()
    if data.next() is None:
        return None
    fields = data.get_object()
    if not isinstance(fields, (list, tuple)) or not fields:
        return None
    try:
        txn_id = _binary(fields[0])
    except ControlError:
        return None
    outcome = fields[1] if len(fields) > 1 else None
    if not isinstance(outcome, Described):
        return TxnState(txn_id)
    code = _code(outcome.descriptor)
    if code not in (PN_ACCEPTED, PN_REJECTED, PN_RELEASED, PN_MODIFIED):
        return None
    value = outcome.value
    return TxnState(txn_id, code, tuple(value) if isinstance(value, (list, tuple)) else ())


def read_declared(delivery) -> bytes | None:
    """The txn-id of a ``declared`` answer (§4.5.4), or None."""
    data = Data(pn_disposition_data(pn_delivery_remote(delivery)))
    data.rewind()
    if data.next() is None:
        return None
    fields = data.get_object()
    try:
        return _binary(fields[0]) if isinstance(fields, (list, tuple)) and fields else None
    except ControlError:
        return None


def _put(delivery, code: int, fields: list) -> None:
    data = Data(pn_disposition_data(pn_delivery_local(delivery)))
    data.clear()
    data.put_object(fields)
    pn_delivery_update(delivery, code)


def answer_declared(delivery, txn_id: bytes, encoded: bytes | None = None) -> None:
    """The coordinator's answer to a declare (§4.5.4), settled; ``encoded``: ``[txn-id]``
    encoded already (``posting_key``)."""
    if encoded is None:
        _put(delivery, DECLARED, [txn_id])
    else:
        data = Data(pn_disposition_data(pn_delivery_local(delivery)))
        data.clear()
        data.decode(encoded)
        pn_delivery_update(delivery, DECLARED)
    pn_delivery_settle(delivery)


def mark_transactional(delivery, txn_id: bytes) -> None:
    """A transfer we send as part of transaction ``txn_id`` (§4.4.1); call before it is written."""
    _put(delivery, TRANSACTIONAL_STATE, [txn_id])


def error_value(condition: Condition | None):
    if condition is None:
        return None
    return Described(ulong(_ERROR), [symbol(condition.name), condition.description])


def set_outcome(delivery, txn_id: bytes, outcome: int = PN_ACCEPTED, fields: tuple | list = ()) -> None:
    """``transactional-state`` with ``outcome`` on ``delivery`` (not settled): an answer to a
    transactional transfer (§4.4.1) or a retirement passed on (§4.4.2)."""
    _put(delivery, TRANSACTIONAL_STATE, [txn_id, Described(ulong(outcome), list(fields))])


def reject(delivery, name: str, description: str, *, settle: bool = True) -> None:
    """``rejected`` with an error (§3.4.3): a refused declare, discharge or transfer."""
    wrapped = Delivery.wrap(delivery)
    wrapped.local.condition = Condition(name, description)
    wrapped.update(Delivery.REJECTED)
    if settle:
        pn_delivery_settle(delivery)


# -- the hot path: one posting (§4.4.1) costs a few C calls ------------------------------------
_KEY_SIZE = 128
_key_buffer = bytearray(_KEY_SIZE)
_key_cbuffer = _ffi.from_buffer(_key_buffer)
_encode = _lib.pn_data_encode
_copy = _lib.pn_data_copy
_data = _lib.pn_disposition_data
_remote = _lib.pn_delivery_remote
_local = _lib.pn_delivery_local
_update = _lib.pn_delivery_update


def state_key(delivery) -> bytes | None:
    """The peer's delivery state fields of ``delivery``, as proton encodes them: equal for every
    transfer of one transaction (``[txn-id]``), so a dict key for it. None if too large."""
    size = _encode(_data(_remote(delivery)), _key_cbuffer, _KEY_SIZE)
    return bytes(_key_buffer[:size]) if size > 0 else None


def posting_key(txn_id: bytes) -> bytes:
    """``state_key`` of a transfer posted in ``txn_id`` (``[txn-id]``, as proton encodes it)."""
    data = Data()
    data.put_object([txn_id])
    return bytes(data.encode())


def accepted_template(txn_id: bytes) -> Data:
    """``[txn-id, accepted]``, built once per transaction, copied into each posting's answer."""
    template = Data()
    template.put_object([txn_id, Described(ulong(PN_ACCEPTED), [])])
    return template


def answer_accepted(delivery, template: Data) -> None:
    """A posting's answer (§4.4.1): ``transactional-state`` with ``accepted`` (not settled)."""
    _copy(_data(_local(delivery)), template._data)
    _update(delivery, TRANSACTIONAL_STATE)
