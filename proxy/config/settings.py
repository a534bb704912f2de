"""Node configuration: TOML (stdlib ``tomllib``) into frozen dataclasses.

Every section is a dataclass; ``_section`` checks a TOML table against the
dataclass's fields and their annotated types, so an unknown key or a value of
the wrong type fails at start with a message naming the key
(``limits.max_frame_size: expected an integer``). Every command-line flag of
``fedgate serve`` maps to a key here (see ``apply_overrides``).
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from proxy.auth.acl import AclEntry
from proxy.auth.oauth.settings import OAuthSection
from proxy.config.cluster import ClusterSection
from proxy.config.errors import ConfigError
from routing import RuleSet, RuleValidationError
from routing.errors import RuleError

DEFAULT_LISTEN = "127.0.0.1:5672"
DEFAULT_ADMIN = "127.0.0.1:8080"
LOG_LEVELS = ("debug", "info", "warning", "error")


def parse_hostport(text: str, key: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[V6]:PORT`` -> (host, port)."""
    if not isinstance(text, str) or ":" not in text:
        raise ConfigError(key, f"expected HOST:PORT, got {text!r}")
    host, _, port_text = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        port = int(port_text)
    except ValueError:
        raise ConfigError(key, f"port {port_text!r} is not a number") from None
    if not 0 <= port <= 65535 or not host:
        raise ConfigError(key, f"invalid address {text!r}")
    return host, port


MAX_WORKERS = 256


def worker_count(workers: int | str) -> int:
    """``[node] workers`` as a number: "auto" is one per core this process may use."""
    if workers == "auto":
        try:
            return max(1, min(MAX_WORKERS, len(os.sched_getaffinity(0))))
        except AttributeError:  # not Linux
            return max(1, min(MAX_WORKERS, os.cpu_count() or 1))
    return int(workers)


@dataclass(frozen=True)
class NodeSection:
    id: str = "fedgate"
    listen: str = DEFAULT_LISTEN
    data_dir: str = "var/fedgate"
    log_level: str = "info"
    # worker processes behind the one listener (proxy.workers): a number, or "auto" (one per core)
    workers: int | str = 1
    # with workers: a connection whose first attach names a local queue another worker owns
    # is handed to that worker before its frames are read (proxy.amqp.first_attach)
    place_by_first_attach: bool = True

    def check(self, key: str) -> None:
        parse_hostport(self.listen, f"{key}.listen")
        if isinstance(self.workers, str) and self.workers != "auto":
            raise ConfigError(f"{key}.workers", f'a number of processes or "auto", not {self.workers!r}')
        if isinstance(self.workers, int) and not 1 <= self.workers <= MAX_WORKERS:
            raise ConfigError(f"{key}.workers", f"between 1 and {MAX_WORKERS}, not {self.workers}")
        if not self.id or any(c.isspace() for c in self.id):
            raise ConfigError(f"{key}.id", f"invalid node id {self.id!r}")
        if self.log_level not in LOG_LEVELS:
            raise ConfigError(f"{key}.log_level", f"one of {', '.join(LOG_LEVELS)}")


ADMIN_ROLES = ("read", "admin")


@dataclass(frozen=True)
class AdminSection:
    """The HTTP admin API (``admin_api``): listener, bearer tokens, cluster peers."""

    listen: str = DEFAULT_ADMIN
    enabled: bool = True
    # [{token = "...", role = "admin"}, {token_sha256 = "<64 hex>", role = "read"}]
    tokens: tuple[dict, ...] = ()
    # other nodes' admin URLs, for cluster-wide rules: {n2 = "http://host:port"}
    cluster: dict[str, str] = field(default_factory=dict)
    # token sent to the other nodes (must be an admin token there);
    # default: the first admin token given in plain text above
    cluster_token: str | None = None
    # slow clients: seconds to send a request's head (also the idle keep-alive limit),
    # and to send its body
    header_timeout: float = 10.0
    body_timeout: float = 30.0

    def check(self, key: str) -> None:
        parse_hostport(self.listen, f"{key}.listen")
        if self.header_timeout <= 0 or self.body_timeout <= 0:
            raise ConfigError(f"{key}.header_timeout", "header_timeout and body_timeout must be positive")
        for index, entry in enumerate(self.tokens):
            _check_token(entry, f"{key}.tokens[{index}]")
        for node_id, url in self.cluster.items():
            _check_http_url(url, f"{key}.cluster.{node_id}")
        if self.cluster_token is not None and not self.cluster_token:
            raise ConfigError(f"{key}.cluster_token", "must not be empty")
        if self.cluster and self.node_token() is None:
            raise ConfigError(f"{key}.cluster_token",
                              "required with admin.cluster (or an admin token given as 'token')")

    def node_token(self) -> str | None:
        """The bearer token this node presents to the other nodes."""
        if self.cluster_token:
            return self.cluster_token
        for entry in self.tokens:
            if entry.get("role") == "admin" and entry.get("token"):
                return entry["token"]
        return None


def _check_token(entry: dict, key: str) -> None:
    for name in entry:
        if name not in ("token", "token_sha256", "role", "name"):
            raise ConfigError(f"{key}.{name}", "unknown key (known: name, role, token, token_sha256)")
    if "name" in entry and (not isinstance(entry["name"], str) or not 0 < len(entry["name"]) <= 64):
        raise ConfigError(f"{key}.name", "a name of 1 to 64 characters (who, in the audit log)")
    if ("token" in entry) == ("token_sha256" in entry):
        raise ConfigError(key, "exactly one of 'token' or 'token_sha256'")
    if "token" in entry:
        token = entry["token"]
        if not isinstance(token, str) or len(token) < 16 or any(c.isspace() for c in token):
            raise ConfigError(f"{key}.token", "at least 16 characters, no spaces")
    else:
        digest = entry["token_sha256"]
        if not isinstance(digest, str) or len(digest) != 64 or any(
                c not in "0123456789abcdefABCDEF" for c in digest):
            raise ConfigError(f"{key}.token_sha256", "64 hex digits (sha256 of the token)")
    if entry.get("role") not in ADMIN_ROLES:
        raise ConfigError(f"{key}.role", f"one of {', '.join(ADMIN_ROLES)}")


def _check_http_url(url: Any, key: str) -> None:
    from urllib.parse import urlsplit

    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ConfigError(key, f"expected an http:// or https:// URL, got {url!r}")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as exc:
        raise ConfigError(key, f"invalid URL {url!r}: {exc}") from None
    if not parts.hostname:
        raise ConfigError(key, f"invalid URL {url!r}: no host")


@dataclass(frozen=True)
class SaslSection:
    mechanisms: tuple[str, ...] = ("ANONYMOUS",)
    users_file: str | None = None
    require: bool = False  # refuse clients that skip the SASL layer
    allow_plain_without_tls: bool = False
    external_identity: str = "CN"  # EXTERNAL: the client-certificate subject field used as user name

    def check(self, key: str) -> None:
        from proxy.auth.mechanisms import SUBJECT_FIELDS
        from proxy.auth.sasl import SUPPORTED_MECHANISMS

        for index, mech in enumerate(self.mechanisms):
            if mech not in SUPPORTED_MECHANISMS:
                raise ConfigError(f"{key}.mechanisms[{index}]",
                                  f"unsupported mechanism {mech!r} (supported: {', '.join(SUPPORTED_MECHANISMS)})")
        for mech in ("SCRAM-SHA-256",):  # PLAIN: _check_across_sections ([oauth] tokens)
            if mech in self.mechanisms and not self.users_file:
                raise ConfigError(f"{key}.users_file", f"{mech} needs a users file")
        if self.external_identity not in SUBJECT_FIELDS:
            raise ConfigError(f"{key}.external_identity",
                              f"one of {', '.join(SUBJECT_FIELDS)}")


@dataclass(frozen=True)
class TlsSection:
    cert: str = ""
    key: str = ""
    ca: str | None = None
    verify_client: bool = False

    def check(self, key: str) -> None:
        if not self.cert:
            raise ConfigError(f"{key}.cert", "required")
        if not self.key:
            raise ConfigError(f"{key}.key", "required")
        if self.verify_client and not self.ca:
            raise ConfigError(f"{key}.ca", "verify_client needs a CA file")


@dataclass(frozen=True)
class LimitsSection:
    max_frame_size: int = 65536
    max_message_size: int = 16 * 1024 * 1024
    max_connections: int = 0  # 0 = unlimited
    max_connections_per_ip: int = 0  # checked at accept; 0 = unlimited
    max_connections_per_user: int = 0  # authenticated users, checked when SASL succeeds
    max_sessions_per_connection: int = 32
    max_links_per_connection: int = 1024
    # upstream senders the anonymous relay may have open at once (proxy.anonymous_relay)
    max_relay_destinations: int = 1024
    idle_timeout: float = 60.0
    handshake_timeout: float = 10.0
    # TLS handshakes under way at once (each holds TLS state); more are refused at accept
    max_pending_handshakes: int = 256
    # bytes a session may hold for a client that is not reading (deliveries wait on the queue)
    max_output_buffer: int = 256 * 1024
    # bytes of messages all local queues may hold; above it publishers get no new credit
    max_memory: int = 0  # 0 = unlimited
    max_temp_queues_per_connection: int = 64  # 0 = unlimited
    # AMQP transactions (proxy.transactions): open at once per connection (0 = unlimited), and
    # seconds after which one not discharged is rolled back (0 = never)
    max_transactions_per_connection: int = 64
    transaction_timeout: float = 60.0
    # with [paging] enabled, max_memory is the budget for message bodies in memory, and these
    # bound the page store: its bytes (0 = unlimited), and the free space left on its disk
    max_disk: int = 0
    min_free_disk: int = 256 * 1024 * 1024

    def check(self, key: str) -> None:
        if not 512 <= self.max_frame_size <= 16 * 1024 * 1024:
            raise ConfigError(f"{key}.max_frame_size", "between 512 and 16777216")
        for name in ("max_message_size", "max_connections", "max_sessions_per_connection",
                     "max_links_per_connection", "max_connections_per_ip",
                     "max_connections_per_user", "max_relay_destinations", "max_pending_handshakes",
                     "max_output_buffer", "max_memory", "max_temp_queues_per_connection",
                     "max_transactions_per_connection", "transaction_timeout", "max_disk",
                     "min_free_disk"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{key}.{name}", "must not be negative")
        if self.idle_timeout < 0 or self.handshake_timeout < 0:
            raise ConfigError(f"{key}.idle_timeout", "must not be negative")


@dataclass(frozen=True)
class WebSocketSection:
    """AMQP over WebSocket on the AMQP listener (proxy.net.websocket), ``ws://`` and,
    on a TLS listener, ``wss://``."""

    enabled: bool = True
    paths: tuple[str, ...] = ()  # request paths accepted (e.g. ["/amqp"]); empty: any
    origins: tuple[str, ...] = ()  # browser Origin values accepted; empty: any
    max_message_size: int = 1024 * 1024  # one WebSocket message; larger: close 1009

    def check(self, key: str) -> None:
        for index, path in enumerate(self.paths):
            if not path.startswith("/"):
                raise ConfigError(f"{key}.paths[{index}]", "a path starts with /")
        for index, origin in enumerate(self.origins):
            if "://" not in origin:
                raise ConfigError(f"{key}.origins[{index}]",
                                  "an origin is scheme://host[:port], e.g. https://app.example.com")
        if not 512 <= self.max_message_size <= 64 * 1024 * 1024:
            raise ConfigError(f"{key}.max_message_size", "between 512 and 67108864")

    def settings(self):
        from proxy.net.websocket import WebSocketSettings

        if not self.enabled:
            return None
        return WebSocketSettings(paths=self.paths, origins=self.origins,
                                 max_message_size=self.max_message_size)


@dataclass(frozen=True)
class QueuesSection:
    auto_create: bool = True
    max_depth: int = 0  # 0 = unlimited
    credit_window: int = 1000
    # a proxied sender's window (proxy.links.proxy_producer) grows to at most this many
    # times credit_window while the primary keeps up; 1: fixed at credit_window
    producer_window_growth: int = 16
    dead_letter: str | None = None
    durable: bool = False  # journal messages sent with header durable=true (proxy.journal)
    max_bytes: int = 0  # 0 = unlimited
    overflow: str = "reject-publish"  # or "drop-head"
    # times a message may come back from consumers before it is dead-lettered; 0: no limit
    delivery_limit: int = 0

    def check(self, key: str) -> None:
        if self.max_depth < 0:
            raise ConfigError(f"{key}.max_depth", "must not be negative")
        if self.delivery_limit < 0:
            raise ConfigError(f"{key}.delivery_limit", "must not be negative")
        _check_bytes(key, self.max_bytes, self.overflow)
        if not 1 <= self.credit_window <= 100_000:
            raise ConfigError(f"{key}.credit_window", "between 1 and 100000")
        if not 1 <= self.producer_window_growth <= 64:
            raise ConfigError(f"{key}.producer_window_growth", "between 1 and 64")


@dataclass(frozen=True)
class QueueDecl:
    name: str = ""
    max_depth: int = 0
    dead_letter: str | None = None
    durable: bool | None = None  # None: [queues] durable
    max_bytes: int = 0  # 0: [queues] max_bytes
    overflow: str | None = None  # None: [queues] overflow
    delivery_limit: int = 0  # 0: the rule's, or [queues] delivery_limit

    def check(self, key: str) -> None:
        if not self.name:
            raise ConfigError(f"{key}.name", "required")
        if self.max_depth < 0:
            raise ConfigError(f"{key}.max_depth", "must not be negative")
        if self.delivery_limit < 0:
            raise ConfigError(f"{key}.delivery_limit", "must not be negative")
        _check_bytes(key, self.max_bytes, self.overflow)


def parse_queue(raw: Any, key: str) -> QueueDecl:
    """One ``[[queue]]`` table (also a queue declared through the admin API); ConfigError."""
    return _section(raw, QueueDecl, key)


def parse_acl_entry(raw: Any, key: str) -> AclEntry:
    """One ``[[acl]]`` table (also a grant made through the admin API); ConfigError."""
    return _section(raw, AclEntry, key)


def _check_bytes(key: str, max_bytes: int, overflow: str | None) -> None:
    if max_bytes < 0:
        raise ConfigError(f"{key}.max_bytes", "must not be negative")
    if overflow is not None and overflow not in ("reject-publish", "drop-head"):
        raise ConfigError(f"{key}.overflow", "'reject-publish' or 'drop-head'")


@dataclass(frozen=True)
class JournalSection:
    """The append-only journal of durable queues, under ``<data_dir>/journal``."""

    fsync: bool = True  # false: survives a process crash, not an OS crash
    segment_size: int = 64 * 1024 * 1024
    batch_delay: float = 0.0  # seconds the writer waits to gather more records per fsync

    def check(self, key: str) -> None:
        if not 4096 <= self.segment_size <= 1024 * 1024 * 1024:
            raise ConfigError(f"{key}.segment_size", "between 4096 and 1073741824")
        if not 0.0 <= self.batch_delay <= 1.0:
            raise ConfigError(f"{key}.batch_delay", "between 0 and 1 (seconds)")


@dataclass(frozen=True)
class PagingSection:
    """Bodies of waiting messages on disk beyond ``[limits] max_memory`` (docs/paging.md),
    under ``<data_dir>/paging``. Only with a ``max_memory``: without one nothing pages."""

    enabled: bool = True
    read_ahead: int = 1000  # messages kept in memory ahead of a queue's consumers
    read_ahead_bytes: int = 4 * 1024 * 1024  # and at most these bytes of them
    segment_size: int = 64 * 1024 * 1024
    io_thread: bool = True  # false: the I/O on the event loop (tests on a virtual clock)
    runs: bool = True  # FIFO and priority queues and backups' copies keep paged messages as runs

    def check(self, key: str) -> None:
        if self.read_ahead < 1 or self.read_ahead_bytes < 1:
            raise ConfigError(f"{key}.read_ahead", "at least 1")
        if not 4096 <= self.segment_size <= 1024 * 1024 * 1024:
            raise ConfigError(f"{key}.segment_size", "between 4096 and 1073741824")


@dataclass(frozen=True)
class Config:
    node: NodeSection = field(default_factory=NodeSection)
    peers: dict[str, str] = field(default_factory=dict)
    admin: AdminSection = field(default_factory=AdminSection)
    sasl: SaslSection = field(default_factory=SaslSection)
    tls: TlsSection | None = None
    limits: LimitsSection = field(default_factory=LimitsSection)
    websocket: WebSocketSection = field(default_factory=WebSocketSection)
    queues: QueuesSection = field(default_factory=QueuesSection)
    journal: JournalSection = field(default_factory=JournalSection)
    paging: PagingSection = field(default_factory=PagingSection)
    cluster: ClusterSection = field(default_factory=ClusterSection)  # [cluster]: static or etcd
    oauth: OAuthSection | None = None  # [oauth]: JWT bearer tokens (docs/oauth.md)
    queue: tuple[QueueDecl, ...] = ()
    rules: tuple[dict, ...] = ()
    acl: tuple[AclEntry, ...] = ()  # [[acl]]: when any is given, what none allows is denied
    exchanges: tuple = ()  # [[exchanges]] (proxy.exchange_config.ExchangeDecl)
    bindings: tuple = ()  # [[bindings]] (proxy.exchange_config.BindingDecl)
    source: str | None = None  # the file it came from

    @property
    def listen(self) -> tuple[str, int]:
        return parse_hostport(self.node.listen, "node.listen")

    @property
    def admin_listen(self) -> tuple[str, int]:
        return parse_hostport(self.admin.listen, "admin.listen")

    def ruleset(self) -> RuleSet:
        # with etcd, peers come and go: a rule may name one that is not live (yet)
        return RuleSet.build(list(self.rules), peers=self.peers, node_id=self.node.id,
                             open_peers=self.cluster.enabled)

    def resolve_path(self, path: str) -> Path:
        """Relative paths in a config file are relative to that file's directory."""
        candidate = Path(path)
        if candidate.is_absolute() or self.source is None:
            return candidate
        return Path(self.source).parent / candidate


_SECTIONS = {
    "node": NodeSection,
    "admin": AdminSection,
    "sasl": SaslSection,
    "tls": TlsSection,
    "limits": LimitsSection,
    "websocket": WebSocketSection,
    "queues": QueuesSection,
    "journal": JournalSection,
    "paging": PagingSection,
    "cluster": ClusterSection,
    "oauth": OAuthSection,
}


def _check_type(value: Any, hint: Any, key: str) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType")):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            return _check_type(value, inner[0], key)
        for hint in inner:  # int | str: the first type the value is
            try:
                return _check_type(value, hint, key)
            except ConfigError:
                pass
        names = {int: "an integer", str: "a string", float: "a number", bool: "true or false"}
        raise ConfigError(key, "expected " + " or ".join(names.get(h, str(h)) for h in inner))
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(key, "expected true or false")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(key, "expected an integer")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(key, "expected a number")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(key, "expected a string")
        return value
    if origin is tuple:
        if not isinstance(value, list):
            raise ConfigError(key, "expected a list")
        return tuple(_check_type(v, args[0], f"{key}[{i}]") for i, v in enumerate(value))
    if hint is dict or origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(key, "expected a table")
        return value
    raise ConfigError(key, f"unsupported type {hint!r}")  # pragma: no cover


def _section(raw: Any, cls: type, key: str):
    if not isinstance(raw, dict):
        raise ConfigError(key, "expected a table")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    values = {}
    for name, value in raw.items():
        if name not in names:
            raise ConfigError(f"{key}.{name}", f"unknown key (known: {', '.join(sorted(names))})")
        values[name] = _check_type(value, hints[name], f"{key}.{name}")
    section = cls(**values)
    try:
        section.check(key)
    except RuleError as exc:  # auth.acl checks its entries with routing's field errors
        raise ConfigError(exc.field, exc.detail) from None
    return section


def from_dict(raw: dict, *, source: str | None = None) -> Config:
    known = set(_SECTIONS) | {"peers", "queue", "rules", "acl", "exchanges", "bindings"}
    for name in raw:
        if name not in known:
            raise ConfigError(name, f"unknown section (known: {', '.join(sorted(known))})")
    values: dict[str, Any] = {"source": source}
    for name, cls in _SECTIONS.items():
        if name in raw:
            values[name] = _section(raw[name], cls, name)
    peers = raw.get("peers", {})
    if not isinstance(peers, dict):
        raise ConfigError("peers", "expected a table of id = URL")
    for peer_id, url in peers.items():
        if not isinstance(url, str) or not url.startswith(("amqp://", "amqps://")):
            raise ConfigError(f"peers.{peer_id}", "expected an amqp:// or amqps:// URL")
    values["peers"] = dict(peers)
    queue_list = raw.get("queue", [])
    if not isinstance(queue_list, list):
        raise ConfigError("queue", "expected [[queue]] entries")
    values["queue"] = tuple(_section(q, QueueDecl, f"queue[{i}]") for i, q in enumerate(queue_list))
    rules = raw.get("rules", [])
    if not isinstance(rules, list) or not all(isinstance(r, dict) for r in rules):
        raise ConfigError("rules", "expected [[rules]] entries")
    values["rules"] = tuple(rules)
    acl_list = raw.get("acl", [])
    if not isinstance(acl_list, list):
        raise ConfigError("acl", "expected [[acl]] entries")
    values["acl"] = tuple(_section(a, AclEntry, f"acl[{i}]") for i, a in enumerate(acl_list))
    from proxy.config.exchanges import check_against_rules, parse_bindings, parse_exchanges

    values["exchanges"] = parse_exchanges(raw.get("exchanges", []), values["peers"])
    values["bindings"] = parse_bindings(raw.get("bindings", []), values["exchanges"], values["peers"])
    config = Config(**values)
    _check_across_sections(config)
    try:
        config.ruleset()
    except RuleValidationError as exc:
        first = exc.problems[0]
        raise ConfigError(first.field, "; ".join(f"{p.field}: {p.detail}" for p in exc.problems)) from exc
    check_against_rules(config)
    return config


def _check_across_sections(config: Config) -> None:
    if config.cluster.enabled and config.cluster.advertise is None and config.listen[1] == 0:
        raise ConfigError("cluster.advertise", "with etcd, [node] listen needs a fixed port "
                          "(other nodes find this one by it), or set advertise")
    # replicated queues and replicated fragments run with any number of workers (issue #45)
    mechanisms = config.sasl.mechanisms
    if "PLAIN" in mechanisms and not config.sasl.users_file and config.oauth is None:
        raise ConfigError("sasl.users_file", "PLAIN needs a users file (or [oauth] tokens)")
    if "OAUTHBEARER" in mechanisms and config.oauth is None:
        raise ConfigError("sasl.mechanisms", "OAUTHBEARER needs an [oauth] table")
    if "EXTERNAL" in mechanisms and (config.tls is None or not config.tls.ca):
        raise ConfigError("sasl.mechanisms", "EXTERNAL needs [tls] with a 'ca' to verify client certificates")


def load(path: str | Path) -> Config:
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError("", f"config file {path} not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("", f"{path}: invalid TOML: {exc}") from exc
    return from_dict(raw, source=str(path))


def apply_overrides(config: Config, **flags: Any) -> Config:
    """Command-line flags win over the file: listen, admin, node_id, data_dir, log_level,
    workers, advertise, advertise_admin."""
    node = config.node
    node_changes = {
        key: flags[flag]
        for flag, key in (("listen", "listen"), ("node_id", "id"), ("data_dir", "data_dir"),
                          ("log_level", "log_level"), ("workers", "workers"))
        if flags.get(flag) is not None
    }
    if node_changes:
        node = dataclasses.replace(node, **node_changes)
        node.check("node")
    admin = config.admin
    if flags.get("admin") is not None:
        admin = dataclasses.replace(admin, listen=flags["admin"])
        admin.check("admin")
    cluster = config.cluster
    cluster_changes = {key: flags[key] for key in ("advertise", "advertise_admin")
                       if flags.get(key) is not None}
    if cluster_changes:
        cluster = dataclasses.replace(cluster, **cluster_changes)
        cluster.check("cluster")
    return dataclasses.replace(config, node=node, admin=admin, cluster=cluster)
