"""Per-user authorization of link attaches: the ``[[acl]]`` entries.

How this works
--------------
Each entry names who it is for (``user``, or ``group`` from the users file's
``groups``) and what they may do: ``send = [patterns]`` and
``receive = [patterns]``, in the routing rules' pattern syntax
(``routing.compile_pattern``: ``*`` one word, ``#`` any words).

* No ``[[acl]]`` at all: everything is allowed (a development node).
* Any ``[[acl]]``: default deny. An attach is allowed when some entry that
  applies to the client allows that direction on that address.
* ``user = "anonymous"`` is the only entry that applies to clients that used
  SASL ANONYMOUS or no SASL layer; ``user = "*"`` applies to every
  authenticated (non-anonymous) user; no other entry applies to anonymous
  clients.
* Dynamic (temporary) nodes (§3.5.3 ``dynamic``): their names are made by the
  node and private to the link that asked, so an authenticated user may
  create them unless an entry that applies says ``dynamic = false``;
  anonymous clients only when an ``anonymous`` entry says ``dynamic = true``.
  Reaching a temporary queue by name (``tmp.<node>.<n>``, e.g. to reply to a
  requester) is an ordinary send/receive and needs a pattern.

``Acl.allows(identity, address, direction)`` is the broker's ``authorize``
hook (``direction`` is ``"send"`` or ``"receive"``, ``address`` None for a
dynamic node); the broker refuses what it denies with
``amqp:unauthorized-access`` and logs user, address, direction and peer.
"""

from __future__ import annotations

from dataclasses import dataclass

from routing import compile_pattern
from routing.errors import RuleError

ANONYMOUS = "anonymous"
ANY_AUTHENTICATED = "*"


@dataclass(frozen=True)
class AclEntry:
    user: str | None = None
    group: str | None = None
    send: tuple[str, ...] = ()
    receive: tuple[str, ...] = ()
    dynamic: bool | None = None

    def check(self, key: str) -> None:
        """Raise ``RuleError`` (field, detail) for a malformed entry (the config names the key)."""
        if (self.user is None) == (self.group is None):
            raise RuleError(key, "exactly one of 'user' or 'group'")
        if self.user == "" or self.group == "":
            raise RuleError(f"{key}.{'user' if self.user == '' else 'group'}", "must not be empty")
        for direction in ("send", "receive"):
            for index, pattern in enumerate(getattr(self, direction)):
                try:
                    compile_pattern(pattern)
                except RuleError as exc:
                    raise RuleError(f"{key}.{direction}[{index}]", exc.detail) from None

    def applies_to(self, identity) -> bool:
        anonymous = is_anonymous(identity)
        if self.user is not None:
            if self.user == ANY_AUTHENTICATED:
                return not anonymous
            if self.user == ANONYMOUS:
                return anonymous
            return not anonymous and identity.user == self.user
        return not anonymous and self.group in identity.groups


def is_anonymous(identity) -> bool:
    return identity is None or identity.mechanism in (None, "ANONYMOUS") or identity.user == ANONYMOUS


class Acl:
    def __init__(self, entries) -> None:
        self.entries = tuple(entries)
        self._compiled = [
            (entry,
             tuple(compile_pattern(p) for p in entry.send),
             tuple(compile_pattern(p) for p in entry.receive))
            for entry in self.entries
        ]

    @property
    def enabled(self) -> bool:
        return bool(self.entries)

    def allows(self, identity, address: str | None, direction: str) -> bool:
        if not self.entries:
            return True
        applicable = [c for c in self._compiled if c[0].applies_to(identity)]
        if address is None:
            return self._allows_dynamic(identity, [c[0] for c in applicable])
        for _entry, send, receive in applicable:
            patterns = send if direction == "send" else receive
            if any(p.match(address) is not None for p in patterns):
                return True
        return False

    @staticmethod
    def _allows_dynamic(identity, entries) -> bool:
        if any(e.dynamic is False for e in entries):
            return False
        if is_anonymous(identity):
            return any(e.dynamic is True for e in entries)
        return True
