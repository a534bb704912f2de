"""ACL grants made through the admin API (the ``acl`` of the run-time wiring record).

How this works
--------------
A grant is an ``[[acl]]`` table (``proxy.auth.acl``: ``user`` or ``group``, ``send``,
``receive``, ``dynamic``), kept in the wiring record's ``acl`` list (``admin_api.wiring``:
in etcd or each node's state file, pushed and pulled like the rest of the record) and
checked as a configuration file's entries are (``parse``: a problem is a ``ConfigError``
naming ``acl[i].field``). A user or group with an ``[[acl]]`` entry in the configuration
file has its grants there only: the API may not add, change or remove theirs.

``apply(node, grants)`` makes the node's ``authorize`` hook check the configuration's
entries plus these, so the next attach is checked by them, and then detaches every link
they no longer allow (with ``amqp:unauthorized-access``, as a renewed token's narrower
grants do, ``proxy.amqp.cbs.detach_outside``): taking a grant away takes its access away
at once, not at the client's next reconnect. Links the node itself made (between
workers, to other nodes) are trusted and stay. As with the file, the first grant on a
node without any ``[[acl]]`` turns default deny on. Token logins (``[oauth]``) get the
new entries with their next token (the validator's entries are replaced; a connection's
grant is fixed when its token is checked).
"""

from __future__ import annotations

import logging
from typing import Any

from proxy.amqp.cbs import detach_outside
from proxy.auth.acl import Acl
from proxy.auth.oauth import token_authorizer
from proxy.config.errors import ConfigError
from proxy.config.settings import parse_acl_entry

log = logging.getLogger("fedgate.admin.acl")

GROUP = "group:"  # the path's {subject} for a group: group:<name>


def subject_of(entry) -> str:
    return entry.user if entry.user is not None else GROUP + entry.group


def table_subject(table: dict) -> str | None:
    """The subject of a record's ``acl`` table (as it is stored: a dict)."""
    if isinstance(table.get("group"), str):
        return GROUP + table["group"]
    return table.get("user")


def entry_table(subject: str, body: dict) -> dict:
    """The record's table for ``subject`` (a user, or ``group:<name>``) and its grants."""
    if subject.startswith(GROUP):
        return {"group": subject[len(GROUP):], **body}
    return {"user": subject, **body}


def in_config(config, subject: str) -> bool:
    return any(subject_of(entry) == subject for entry in config.acl)


def parse(raw_list: Any, config) -> tuple:
    """The record's ``acl`` as ``AclEntry``; ConfigError naming ``acl[i]...``."""
    if not isinstance(raw_list, list):
        raise ConfigError("acl", "expected a list of [[acl]] tables")
    seen: dict[str, int] = {}
    entries = []
    for index, raw in enumerate(raw_list):
        entry = parse_acl_entry(raw, f"acl[{index}]")
        subject = subject_of(entry)
        field = f"acl[{index}].{'user' if entry.user is not None else 'group'}"
        if in_config(config, subject):
            raise ConfigError(field, f"{subject!r} has [[acl]] entries in the configuration file")
        if subject in seen:
            raise ConfigError(field, f"{subject!r} already granted by acl[{seen[subject]}]")
        seen[subject] = index
        entries.append(entry)
    return tuple(entries)


def apply(node, grants: tuple) -> int:
    """The configuration's entries plus ``grants`` checked from now on; links they no longer
    allow detached (how many)."""
    entries = tuple(node.config.acl) + tuple(grants)
    acl = Acl(entries)
    if node.config.oauth is not None:
        node.broker.authorize = token_authorizer(acl)
        if getattr(node, "oauth", None) is not None:
            node.oauth.acl_entries = entries
    else:
        node.broker.authorize = acl.allows if acl.enabled else (lambda identity, address, d: True)
    detached = 0
    for handler in list(node.broker.handlers.values()):
        if getattr(handler, "trusted", False):
            continue
        detached += detach_outside(handler, handler.identity,
                                   "the ACL changed through the admin API: no longer allowed to")
    if detached:
        node.broker.run_pending()
    log.info("ACL: %d entries from the configuration, %d granted through the admin API; "
             "%d links detached", len(node.config.acl), len(grants), detached)
    return detached
