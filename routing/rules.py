"""One routing rule: its fields, per-rule validation, dict (TOML/JSON) form.

``Rule``, ``UpstreamOptions`` and ``FragmentMember`` are frozen
dataclasses. Validation lives in ``_*_problems`` functions that return a
list of :class:`RuleError` (field path + detail) instead of raising, so
that:

* constructing a dataclass directly raises the first problem
  (``__post_init__``);
* ``Rule.from_dict`` raises the first problem of a dict;
* ``parse_rule`` (used by ``RuleSet.build``) returns *all* problems.

Parsing is shape-only (unknown keys, tables -> dataclasses, arrays ->
tuples); value checks are shared with direct construction. Checks that
need context outside the rule (peer ids, duplicate names, shadowing) are
done by ``RuleSet.build``. ``to_dict`` emits ``name``/``match``/``kind``
plus every non-default field, and round-trips through ``from_dict``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import MISSING as _MISSING
from dataclasses import dataclass, field, fields
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

from .declare import QUEUE_TYPES, QueueDeclare, parse_declare as _parse_declare  # noqa: F401
from .replication import replication_problems
from .errors import RuleError
from .patterns import Pattern, compile_pattern
from .templates import Template, compile_template

__all__ = [
    "KINDS",
    "ON_CHANGE",
    "FragmentMember",
    "Rule",
    "UpstreamOptions",
    "is_amqp_url",
    "parse_rule",
]

KINDS = ("local", "proxy", "fragmented", "replicated", "deny")
ON_CHANGE = ("keep", "redirect")
MAX_POOL_SIZE = 16
_NAME_RE = re.compile(r"[A-Za-z0-9_.-]+")
_BAD: Any = object()  # placeholder for a value whose problem is already reported


def is_amqp_url(value: object) -> bool:
    """True for ``amqp://host...`` / ``amqps://host...`` URLs."""
    if not isinstance(value, str):
        return False
    try:
        parts = urlsplit(value)
        _ = parts.port  # raises ValueError on a bad port
    except ValueError:
        return False
    return parts.scheme in ("amqp", "amqps") and bool(parts.hostname)


def _url_problem(value: str) -> str | None:
    if is_amqp_url(value):
        return None
    return f"{value!r} is not a valid amqp:// or amqps:// URL"


def _type_name(v: object) -> str:
    return type(v).__name__


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: object) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) and math.isfinite(v)


def _opt_str(problems: list, path: str, v: object) -> None:
    if v is not None and (not isinstance(v, str) or not v):
        problems.append(RuleError(path, f"expected a non-empty string, got {v!r}"))


def _unknown_keys(d: Mapping, allowed: tuple[str, ...], prefix: str) -> list[RuleError]:
    return [
        RuleError(f"{prefix}.{k}", f"unknown key (allowed: {', '.join(allowed)})")
        for k in d
        if k not in allowed
    ]


# --------------------------------------------------------------------------
# UpstreamOptions

def _upstream_problems(u: Any, p: str) -> list[RuleError]:
    problems: list[RuleError] = []
    for name in ("user", "password_file", "password_env", "vhost"):
        _opt_str(problems, f"{p}.{name}", getattr(u, name))
    if u.declare is not None and not isinstance(u.declare, QueueDeclare):
        problems.append(RuleError(f"{p}.declare", f"expected a table, got {_type_name(u.declare)}"))
    if u.password_file is not None and u.password_env is not None:
        problems.append(RuleError(f"{p}.password_env", "give password_file or password_env, not both"))
    if (u.password_file is not None or u.password_env is not None) and u.user is None:
        problems.append(RuleError(f"{p}.user", "a password needs a user (SASL PLAIN)"))
    for name in ("idle_timeout", "heartbeat"):
        v = getattr(u, name)
        if not _is_number(v):
            problems.append(RuleError(f"{p}.{name}", f"expected a number of seconds, got {v!r}"))
        elif v <= 0:
            problems.append(RuleError(f"{p}.{name}", f"must be > 0, got {v!r}"))
    v = u.recheck_interval
    if not _is_number(v):
        problems.append(RuleError(f"{p}.recheck_interval", f"expected a number of seconds, got {v!r}"))
    elif v < 0:
        problems.append(RuleError(f"{p}.recheck_interval", f"must be >= 0 (0: never), got {v!r}"))
    if not _is_int(u.pool_size):
        problems.append(RuleError(f"{p}.pool_size", f"expected an integer, got {u.pool_size!r}"))
    elif not 1 <= u.pool_size <= MAX_POOL_SIZE:
        problems.append(
            RuleError(f"{p}.pool_size", f"must be between 1 and {MAX_POOL_SIZE}, got {u.pool_size}")
        )
    v = u.max_connections
    if not _is_int(v):
        problems.append(RuleError(f"{p}.max_connections", f"expected an integer, got {v!r}"))
    elif v < 0:
        problems.append(RuleError(f"{p}.max_connections", f"must be >= 0 (0: no cap), got {v!r}"))
    elif v and v < (per_worker := connections_per_worker(u.pool_size, u.split_directions)):
        problems.append(RuleError(
            f"{p}.max_connections", f"at least the {per_worker} connections one "
            f"process makes (pool_size {u.pool_size}"
            + (", both directions)" if u.split_directions is True else ")") + f", got {v}"))
    v = u.max_send_failures
    if not _is_int(v):
        problems.append(RuleError(f"{p}.max_send_failures", f"expected an integer, got {v!r}"))
    elif v < 1:
        problems.append(RuleError(f"{p}.max_send_failures", f"must be >= 1, got {v!r}"))
    if not isinstance(u.split_directions, bool):
        problems.append(RuleError(f"{p}.split_directions", f"expected true or false, got {u.split_directions!r}"))
    for name in ("tls_ca", "tls_cert", "tls_key"):
        _opt_str(problems, f"{p}.{name}", getattr(u, name))
    if (u.tls_cert is None) != (u.tls_key is None):
        missing = "tls_key" if u.tls_key is None else "tls_cert"
        problems.append(RuleError(f"{p}.{missing}", "tls_cert and tls_key must be given together"))
    return problems


def connections_per_worker(pool_size, split_directions) -> int:
    size = pool_size if _is_int(pool_size) else 1
    return size * (2 if split_directions is True else 1)


@dataclass(frozen=True)
class UpstreamOptions:
    """How the node connects to the upstream broker of a proxy/fragment."""

    # SASL PLAIN to the primary: the password is read from a file or an environment
    # variable, never written in the rules (without user: ANONYMOUS, or the URL's)
    user: str | None = None
    password_file: str | None = None
    password_env: str | None = None
    vhost: str | None = None  # the open frame's hostname says "vhost:NAME" (RabbitMQ)
    # RabbitMQ 4: declare a /queues/NAME remote before the first attach (management node)
    declare: QueueDeclare | None = None
    idle_timeout: float = 60.0
    pool_size: int = 1
    heartbeat: float = 10.0
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    # idle proxy consumers re-check that their remote source still exists (0: never)
    recheck_interval: float = 30.0
    # links that send to the primary and links that receive from it use separate
    # connections (pool_size each): a broker that blocks a publishing connection
    # (RabbitMQ's flow control) must not stall the consumers' acks and credit
    split_directions: bool = True
    # times a message may be in flight when the primary ends the connection or session
    # carrying it before it is rejected to its sender (proxy.suspects)
    max_send_failures: int = 2
    # connections to the primary for the whole node, whatever its number of worker
    # processes (each worker makes its own pool: proxy.workers); 0: no cap
    max_connections: int = 0

    def __post_init__(self) -> None:
        problems = _upstream_problems(self, "upstream")
        if problems:
            raise problems[0]

    @property
    def connections_per_worker(self) -> int:
        """Connections one node process makes to the primary for these options."""
        return connections_per_worker(self.pool_size, self.split_directions)

    @property
    def is_default(self) -> bool:
        return self == _DEFAULT_UPSTREAM

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, field: str = "upstream") -> "UpstreamOptions":
        value, problems = _parse_upstream(d, field)
        if problems:
            raise problems[0]
        return value

    def to_dict(self) -> dict[str, Any]:
        """Non-default fields only (``{}`` for the defaults)."""
        return {
            f.name: (value.to_dict() if isinstance(value, QueueDeclare) else value)
            for f in fields(self)
            if (value := getattr(self, f.name)) != getattr(_DEFAULT_UPSTREAM, f.name)
        }


_DEFAULT_UPSTREAM = UpstreamOptions()
_UPSTREAM_KEYS = tuple(f.name for f in fields(UpstreamOptions))


def _parse_upstream(d: object, p: str) -> tuple[UpstreamOptions | None, list[RuleError]]:
    if not isinstance(d, Mapping):
        return None, [RuleError(p, f"expected a table, got {_type_name(d)}")]
    problems = _unknown_keys(d, _UPSTREAM_KEYS, p)
    values = {k: d[k] for k in _UPSTREAM_KEYS if k in d}
    if "declare" in values:
        values["declare"], declare_problems = _parse_declare(values["declare"], f"{p}.declare")
        problems += declare_problems
        if declare_problems:
            values.pop("declare")
    problems += _upstream_problems(SimpleNamespace(**{**_DEFAULT_UPSTREAM.__dict__, **values}), p)
    if problems:
        return None, problems
    return UpstreamOptions(**values), []


# --------------------------------------------------------------------------
# FragmentMember


def _member_problems(m: Any, p: str) -> list[RuleError]:
    problems: list[RuleError] = []
    _opt_str(problems, f"{p}.peer", m.peer)
    _opt_str(problems, f"{p}.url", m.url)
    _opt_str(problems, f"{p}.address", m.address)
    if (m.peer is None) == (m.url is None):
        problems.append(RuleError(p, "a fragment member needs exactly one of 'peer' or 'url'"))
    elif isinstance(m.url, str) and m.url and (msg := _url_problem(m.url)):
        problems.append(RuleError(f"{p}.url", msg))
    return problems


@dataclass(frozen=True)
class FragmentMember:
    """A fragment of a fragmented queue: a peer id or an explicit URL."""

    peer: str | None = None  # peer id or this node's own id
    url: str | None = None
    address: str | None = None  # None: use the rule's remote template

    def __post_init__(self) -> None:
        problems = _member_problems(self, "fragment")
        if problems:
            raise problems[0]

    @property
    def key(self) -> str:
        """The id used by ``prefer``: the peer id, else the URL."""
        return self.peer if self.peer is not None else self.url  # type: ignore[return-value]

    @classmethod
    def from_obj(cls, obj: object, *, field: str = "fragment") -> "FragmentMember":
        value, problems = _parse_member(obj, field)
        if problems:
            raise problems[0]
        return value

    def to_obj(self) -> str | dict[str, str]:
        """A bare peer id string when possible, else a table."""
        if self.peer is not None and self.address is None:
            return self.peer
        items = (("peer", self.peer), ("url", self.url), ("address", self.address))
        return {k: v for k, v in items if v is not None}


_MEMBER_KEYS = ("peer", "url", "address")


def _parse_member(obj: object, p: str) -> tuple[FragmentMember | None, list[RuleError]]:
    if isinstance(obj, str):
        values: dict[str, Any] = {"peer": obj}
        problems: list[RuleError] = []
    elif isinstance(obj, Mapping):
        problems = _unknown_keys(obj, _MEMBER_KEYS, p)
        values = {k: obj[k] for k in _MEMBER_KEYS if k in obj}
    else:
        return None, [RuleError(p, f"expected a peer id or a table, got {_type_name(obj)}")]
    full = {"peer": None, "url": None, "address": None, **values}
    problems += _member_problems(SimpleNamespace(**full), p)
    if problems:
        return None, problems
    return FragmentMember(**values), []


# --------------------------------------------------------------------------
# Rule


def _rule_problems(r: Any, p: str) -> list[RuleError]:
    """Value checks for one rule; fields equal to ``_BAD`` are skipped."""
    problems: list[RuleError] = []

    def bad(name: str, detail: str) -> None:
        problems.append(RuleError(f"{p}.{name}", detail))

    if r.name is not _BAD and (not isinstance(r.name, str) or not _NAME_RE.fullmatch(r.name)):
        bad("name", f"must be a non-empty string of letters, digits, '_', '.', '-'; got {r.name!r}")

    pattern: Pattern | None = None
    if r.match is not _BAD:
        try:
            pattern = compile_pattern(r.match) if isinstance(r.match, str) else Pattern(r.match)
        except RuleError as exc:
            bad("match", exc.detail)

    kind = r.kind
    if kind is not _BAD and kind not in KINDS:
        bad("kind", f"must be one of {', '.join(KINDS)}; got {kind!r}")
        kind = _BAD
    known = kind is not _BAD

    primary = r.primary
    if primary is not None and (not isinstance(primary, str) or not primary):
        bad("primary", f"expected a URL or peer id, got {primary!r}")
    elif isinstance(primary, str) and "://" in primary and (msg := _url_problem(primary)):
        bad("primary", msg)
    if known and kind == "proxy" and primary is None:
        bad("primary", "required for kind 'proxy' (a URL or a peer id)")
    if known and kind in ("local", "deny", "replicated") and primary is not None:
        bad("primary", f"not allowed for kind {kind!r}")

    if not isinstance(r.remote, str):
        bad("remote", f"expected a string, got {r.remote!r}")
    else:
        try:
            compile_template(r.remote, pattern.wildcards if pattern else None)
        except RuleError as exc:
            bad("remote", exc.detail)
        if known and kind in ("local", "deny", "replicated") and r.remote != "{address}":
            bad("remote", f"not allowed for kind {kind!r} (only proxy/fragmented)")

    if r.upstream is not _BAD:
        if not isinstance(r.upstream, UpstreamOptions):
            bad("upstream", f"expected UpstreamOptions, got {_type_name(r.upstream)}")
        elif known and kind in ("local", "deny", "replicated") and not r.upstream.is_default:
            bad("upstream", f"not allowed for kind {kind!r} (only proxy/fragmented)")
        elif (r.upstream.declare is not None and isinstance(r.remote, str)
              and not r.remote.startswith("/queues/")):
            bad("upstream.declare", "declares RabbitMQ 4 queues: needs remote = \"/queues/...\", "
                                    f"not {r.remote!r}")

    members: tuple = ()
    if r.fragments is not _BAD:
        if not isinstance(r.fragments, tuple) or not all(
            isinstance(m, FragmentMember) for m in r.fragments
        ):
            bad("fragments", "expected a tuple of FragmentMember")
        else:
            members = r.fragments
            if known and kind == "fragmented" and not members and not r.every_member:
                bad("fragments", "kind 'fragmented' needs at least one member")
            if known and kind != "fragmented" and r.every_member:
                bad("fragments", f"not allowed for kind {kind!r}")
            if known and kind != "fragmented" and members:
                bad("fragments", f"not allowed for kind {kind!r}")
            seen: dict[FragmentMember, int] = {}
            for i, m in enumerate(members):
                if m in seen:
                    bad(f"fragments[{i}]", f"duplicate of fragments[{seen[m]}]")
                else:
                    seen[m] = i

    for key in ("prefer", "draining"):
        listed = getattr(r, key)
        if listed is _BAD:
            continue
        if not isinstance(listed, tuple) or not all(isinstance(x, str) and x for x in listed):
            bad(key, f"expected a list of member ids, got {listed!r}")
            continue
        if known and kind != "fragmented" and listed:
            bad(key, f"not allowed for kind {kind!r}")
        keys = {m.key for m in members}
        seen_p: set[str] = set()
        for i, x in enumerate(listed):
            if members and x not in keys:
                bad(f"{key}[{i}]", f"{x!r} is not a fragment member (peer id or url)")
            if x in seen_p:
                bad(f"{key}[{i}]", f"{x!r} listed twice")
            seen_p.add(x)
    if r.draining is not _BAD and isinstance(r.draining, tuple) and members \
            and len(set(r.draining)) >= len(members):
        bad("draining", "at least one member must stay (not draining)")

    if r.on_change not in ON_CHANGE:
        bad("on_change", f"must be one of {', '.join(ON_CHANGE)}; got {r.on_change!r}")

    for name in ("mirror_auto_delete", "durable"):
        if not isinstance(getattr(r, name), bool):
            bad(name, f"expected true or false, got {getattr(r, name)!r}")
    if known and kind != "proxy" and r.mirror_auto_delete is True:
        bad("mirror_auto_delete", f"only allowed for kind 'proxy', not {kind!r}")

    if r.dead_letter is not None:
        if not isinstance(r.dead_letter, str) or not r.dead_letter:
            bad("dead_letter", f"expected a non-empty address, got {r.dead_letter!r}")
        elif known and kind not in ("local", "fragmented", "replicated"):
            bad("dead_letter", f"only for kinds 'local', 'fragmented' and 'replicated', not {kind!r}")

    if r.delivery_limit is not None:
        if not _is_int(r.delivery_limit):
            bad("delivery_limit", f"expected an integer, got {r.delivery_limit!r}")
        elif r.delivery_limit <= 0:
            bad("delivery_limit", f"must be > 0, got {r.delivery_limit}")
        elif known and kind not in ("local", "fragmented", "replicated"):
            bad("delivery_limit",
                f"only for kinds 'local', 'fragmented' and 'replicated', not {kind!r}")

    replication_problems(r, kind, known, bad)

    if r.max_depth is not None:
        if not _is_int(r.max_depth):
            bad("max_depth", f"expected an integer, got {r.max_depth!r}")
        elif r.max_depth <= 0:
            bad("max_depth", f"must be > 0, got {r.max_depth}")
        elif known and kind not in ("local", "fragmented", "replicated"):
            bad("max_depth", f"only for kinds 'local', 'fragmented' and 'replicated', not {kind!r}")
    return problems


@dataclass(frozen=True)
class Rule:
    """Maps addresses matching ``match`` to a routing ``kind``."""

    name: str
    match: str
    kind: str
    primary: str | None = None
    remote: str = "{address}"
    upstream: UpstreamOptions = field(default_factory=UpstreamOptions)
    fragments: tuple[FragmentMember, ...] = ()
    prefer: tuple[str, ...] = ()
    # members being removed: no new enqueues, their backlog is stolen, then gone
    draining: tuple[str, ...] = ()
    on_change: str = "keep"
    mirror_auto_delete: bool = False
    dead_letter: str | None = None
    max_depth: int | None = None
    # times a message may come back from consumers before it is dead-lettered
    delivery_limit: int | None = None
    durable: bool = False
    # replicated queues and fragments (routing.replication, docs/replication.md)
    replicas: int | None = None
    nodes: tuple[str, ...] = ()
    min_in_sync: int = 1
    catchup_timeout: float = 10.0
    # fragments = "*": one fragment on every live member of the cluster (RuleSet.build expands it)
    every_member: bool = False
    # Compiled forms, derived from match/remote.
    pattern: Pattern = field(init=False, repr=False, compare=False)
    template: Template = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("fragments", "prefer", "draining", "nodes"):  # accept lists for convenience
            if isinstance(getattr(self, name), list):
                object.__setattr__(self, name, tuple(getattr(self, name)))
        problems = _rule_problems(self, rule_prefix({"name": self.name}, None))
        if problems:
            raise problems[0]
        pattern = compile_pattern(self.match)
        object.__setattr__(self, "pattern", pattern)
        object.__setattr__(self, "template", compile_template(self.remote, pattern.wildcards))

    def expand_remote(self, address: str, captures: tuple[str, ...] = ()) -> str:
        """The remote address for a client ``address`` matched with ``captures``."""
        return self.template.expand(address, captures)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, index: int | None = None) -> "Rule":
        """Parse a TOML/JSON table; raises the first :class:`RuleError` found."""
        rule, problems = parse_rule(d, index=index)
        if problems:
            raise problems[0]
        assert rule is not None
        return rule

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable: name/match/kind plus non-default fields."""
        out: dict[str, Any] = {"name": self.name, "match": self.match, "kind": self.kind}
        for f in fields(self):
            if f.name in out or not f.init:
                continue
            value = getattr(self, f.name)
            default = f.default_factory() if f.default_factory is not _MISSING else f.default
            if value == default:
                continue
            if f.name == "every_member":
                out["fragments"] = "*"
                continue
            if f.name == "upstream":
                value = value.to_dict()
            elif f.name == "fragments":
                value = [m.to_obj() for m in value]
            elif f.name in ("prefer", "draining", "nodes"):
                value = list(value)
            out[f.name] = value
        return out


_RULE_KEYS = tuple(f.name for f in fields(Rule) if f.init and f.name != "every_member")
_RULE_DEFAULTS = {
    f.name: (f.default_factory() if f.default_factory is not _MISSING else f.default)
    for f in fields(Rule)
    if f.init and (f.default is not _MISSING or f.default_factory is not _MISSING)
}


def rule_prefix(d: object, index: int | None) -> str:
    """Field-path prefix for a rule: ``rules[i]``, else its name, else ``rule``."""
    if index is not None:
        return f"rules[{index}]"
    name = d.get("name") if isinstance(d, Mapping) else None
    return name if isinstance(name, str) and _NAME_RE.fullmatch(name) else "rule"


def parse_rule(d: object, *, index: int | None = None) -> tuple[Rule | None, list[RuleError]]:
    """Parse one rule table, returning ``(rule, [])`` or ``(None, problems)``."""
    p = rule_prefix(d, index)
    if not isinstance(d, Mapping):
        return None, [RuleError(p, f"expected a table, got {_type_name(d)}")]
    problems = _unknown_keys(d, _RULE_KEYS, p)
    values: dict[str, Any] = {k: d[k] for k in _RULE_KEYS if k in d}
    for k in ("name", "match", "kind"):
        if k not in d:
            problems.append(RuleError(f"{p}.{k}", "required"))
            values[k] = _BAD

    if "upstream" in values:
        upstream, ps = _parse_upstream(values["upstream"], f"{p}.upstream")
        problems += ps
        values["upstream"] = upstream if upstream is not None else _BAD

    if "fragments" in values:
        raw = values["fragments"]
        if raw == "*":
            values["fragments"], values["every_member"] = (), True
        elif isinstance(raw, (list, tuple)):
            parsed = []
            for i, obj in enumerate(raw):
                member, ps = _parse_member(obj, f"{p}.fragments[{i}]")
                problems += ps
                parsed.append(member)
            values["fragments"] = _BAD if None in parsed else tuple(parsed)
        else:
            problems.append(
                RuleError(f"{p}.fragments", f"expected an array or \"*\", got {_type_name(raw)}")
            )
            values["fragments"] = _BAD

    for key in ("prefer", "draining", "nodes"):
        if key in values:
            raw = values[key]
            if isinstance(raw, (list, tuple)):
                values[key] = tuple(raw)
            else:
                problems.append(RuleError(f"{p}.{key}", f"expected an array, got {_type_name(raw)}"))
                values[key] = _BAD

    problems += _rule_problems(SimpleNamespace(**{**_RULE_DEFAULTS, **values}), p)
    if problems:
        return None, problems
    return Rule(**values), []
