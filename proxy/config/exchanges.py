"""``[[exchanges]]`` and ``[[bindings]]``: parsing and validation (no I/O).

::

    [[exchanges]]
    name = "events"            # the address clients send to
    type = "topic"             # fanout | direct | topic (routes on the message subject)
    # optional: let this primary fan out for us (see proxy.exchanges)
    upstream_fanout = { primary = "amqp://127.0.0.1:5672", address = "/exchange/events" }

    [[bindings]]               # exchange -> an address on this node
    exchange = "events"
    queue = "audit"            # a local queue, or a proxied queue through [[rules]]
    key = "orders.#"           # topic: a pattern (routing.compile_pattern); direct: the subject

    [[bindings]]               # a remote exchange/queue -> a local queue
    queue = "local-audit"
    source = { primary = "amqp://127.0.0.1:5672", address = "/exchange/amq.topic/orders.#" }

Every problem raises ``ConfigError`` naming the key (``bindings[1].exchange``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from string import Formatter
from typing import Any

from proxy.config.errors import ConfigError
from routing import RuleError, UpstreamOptions, compile_pattern, is_amqp_url

EXCHANGE_TYPES = ("fanout", "direct", "topic")
DEFAULT_WINDOW = 1000


@dataclass(frozen=True)
class UpstreamFanout:
    """A primary that routes the exchange's messages itself (once per primary)."""

    primary: str  # as configured: URL or peer id
    url: str  # resolved URL
    address: str  # may contain {subject}
    upstream: UpstreamOptions = field(default_factory=UpstreamOptions)

    def expand(self, subject: str | None) -> str:
        return self.address.replace("{subject}", subject or "").replace("{{", "{").replace("}}", "}")


@dataclass(frozen=True)
class ExchangeDecl:
    name: str
    type: str
    upstream_fanout: UpstreamFanout | None = None


@dataclass(frozen=True)
class RemoteSource:
    """A source on a primary that feeds a local queue."""

    primary: str
    url: str
    address: str
    window: int = DEFAULT_WINDOW
    upstream: UpstreamOptions = field(default_factory=UpstreamOptions)


@dataclass(frozen=True)
class BindingDecl:
    queue: str
    exchange: str | None = None
    key: str | None = None
    source: RemoteSource | None = None


def _error(key: str, detail: str) -> ConfigError:
    return ConfigError(key, detail)


def _table(raw: Any, key: str, allowed: tuple[str, ...]) -> dict:
    if not isinstance(raw, dict):
        raise _error(key, "expected a table")
    for name in raw:
        if name not in allowed:
            raise _error(f"{key}.{name}", f"unknown key (known: {', '.join(allowed)})")
    return raw


def _string(raw: dict, name: str, key: str, *, required: bool = True) -> str | None:
    value = raw.get(name)
    if value is None:
        if required:
            raise _error(f"{key}.{name}", "required")
        return None
    if not isinstance(value, str) or not value:
        raise _error(f"{key}.{name}", f"expected a non-empty string, got {value!r}")
    return value


def _primary(raw: dict, key: str, peers: dict) -> tuple[str, str]:
    primary = _string(raw, "primary", key)
    if "://" in primary:
        if not is_amqp_url(primary):
            raise _error(f"{key}.primary", f"{primary!r} is not a valid amqp:// or amqps:// URL")
        return primary, primary
    if primary not in peers:
        raise _error(f"{key}.primary", f"{primary!r} is neither a URL nor a peer in [peers]")
    return primary, peers[primary]


def _upstream(raw: dict, key: str) -> UpstreamOptions:
    if "upstream" not in raw:
        return UpstreamOptions()
    try:
        return UpstreamOptions.from_dict(raw["upstream"], field=f"{key}.upstream")
    except RuleError as exc:
        raise _error(exc.field, exc.detail) from None


def _check_template(address: str, key: str) -> None:
    try:
        parts = list(Formatter().parse(address))
    except ValueError as exc:
        raise _error(key, f"invalid template {address!r}: {exc}") from None
    for _, name, spec, conversion in parts:
        if name is not None and (name != "subject" or spec or conversion):
            raise _error(key, f"only {{subject}} may be substituted, not {{{name}}}")


def parse_exchanges(raw_list: Any, peers: dict) -> tuple[ExchangeDecl, ...]:
    if not isinstance(raw_list, list):
        raise _error("exchanges", "expected [[exchanges]] entries")
    out: list[ExchangeDecl] = []
    seen: dict[str, int] = {}
    for index, raw in enumerate(raw_list):
        key = f"exchanges[{index}]"
        _table(raw, key, ("name", "type", "upstream_fanout"))
        name = _string(raw, "name", key)
        if name in seen:
            raise _error(f"{key}.name", f"{name!r} already declared by exchanges[{seen[name]}]")
        seen[name] = index
        kind = raw.get("type")
        if kind not in EXCHANGE_TYPES:
            raise _error(f"{key}.type", f"one of {', '.join(EXCHANGE_TYPES)}; got {kind!r}")
        fanout = None
        if "upstream_fanout" in raw:
            fkey = f"{key}.upstream_fanout"
            table = _table(raw["upstream_fanout"], fkey, ("primary", "address", "upstream"))
            primary, url = _primary(table, fkey, peers)
            address = _string(table, "address", fkey)
            _check_template(address, f"{fkey}.address")
            fanout = UpstreamFanout(primary, url, address, _upstream(table, fkey))
        out.append(ExchangeDecl(name, kind, fanout))
    return tuple(out)


def parse_bindings(raw_list: Any, exchanges: tuple[ExchangeDecl, ...],
                   peers: dict) -> tuple[BindingDecl, ...]:
    if not isinstance(raw_list, list):
        raise _error("bindings", "expected [[bindings]] entries")
    by_name = {e.name: e for e in exchanges}
    out: list[BindingDecl] = []
    for index, raw in enumerate(raw_list):
        key = f"bindings[{index}]"
        _table(raw, key, ("queue", "exchange", "key", "source"))
        queue = _string(raw, "queue", key)
        if queue in by_name:
            raise _error(f"{key}.queue", f"{queue!r} is an exchange; bind queues, not exchanges")
        if ("exchange" in raw) == ("source" in raw):
            raise _error(key, "exactly one of 'exchange' (local exchange -> queue) or "
                              "'source' (remote source -> local queue)")
        if "source" in raw:
            if "key" in raw:
                raise _error(f"{key}.key", "not used with 'source' (the source address selects)")
            skey = f"{key}.source"
            table = _table(raw["source"], skey, ("primary", "address", "window", "upstream"))
            primary, url = _primary(table, skey, peers)
            address = _string(table, "address", skey)
            window = table.get("window", DEFAULT_WINDOW)
            if isinstance(window, bool) or not isinstance(window, int) or not 1 <= window <= 100_000:
                raise _error(f"{skey}.window", f"an integer between 1 and 100000, got {window!r}")
            out.append(BindingDecl(queue, source=RemoteSource(primary, url, address, window,
                                                              _upstream(table, skey))))
            continue
        name = _string(raw, "exchange", key)
        exchange = by_name.get(name)
        if exchange is None:
            known = ", ".join(sorted(by_name)) or "none declared"
            raise _error(f"{key}.exchange", f"unknown exchange {name!r} (known: {known})")
        binding_key = raw.get("key")
        if exchange.type == "fanout":
            if binding_key is not None:
                raise _error(f"{key}.key", f"exchange {name!r} is fanout: it routes every message, "
                                           "a key is not used")
        else:
            if not isinstance(binding_key, str):
                raise _error(f"{key}.key", f"required for a {exchange.type} exchange (a string)")
            if exchange.type == "topic":
                try:
                    compile_pattern(binding_key)
                except RuleError as exc:
                    raise _error(f"{key}.key", exc.detail) from None
        out.append(BindingDecl(queue, exchange=name, key=binding_key))
    return tuple(out)


def check_against_rules(config) -> None:
    """A source binding feeds a local queue: its name must not be routed elsewhere."""
    ruleset = config.ruleset()
    names = {e.name for e in config.exchanges}
    for index, binding in enumerate(config.bindings):
        if binding.source is None:
            continue
        decision = ruleset.resolve(binding.queue)
        if decision.kind != "local":
            raise _error(f"bindings[{index}].queue",
                         f"{binding.queue!r} is routed as {decision.kind!r} ({decision.reason}); "
                         "a source binding feeds a local queue")
    for index, binding in enumerate(config.bindings):
        if binding.exchange is not None and binding.queue in names:  # pragma: no cover - parsed out
            raise _error(f"bindings[{index}].queue", "exchange-to-exchange bindings are not supported")
