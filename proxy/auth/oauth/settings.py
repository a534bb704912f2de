"""The ``[oauth]`` table (docs/oauth.md), checked like every config section.

``[[oauth.map]]`` entries give grants to tokens from providers that cannot
issue ``fedgate.*`` scopes: ``claim`` (dots walk into objects, e.g.
``realm_access.roles``), ``value``, and ``send`` / ``receive`` (patterns),
``admin`` / ``read`` (the admin API) and ``groups`` (matched by ``[[acl]]
group = ...``).
"""

from __future__ import annotations

from dataclasses import dataclass

from routing import compile_pattern
from routing.errors import RuleError

MAP_KEYS = {"claim": str, "value": str, "send": list, "receive": list, "admin": bool, "read": bool,
            "groups": list}


@dataclass(frozen=True)
class OAuthSection:
    issuer: str = ""  # the tokens' "iss", exactly
    audience: str = ""  # must be one of the tokens' "aud"
    jwks_url: str | None = None  # the provider's JWKS document (http:// or https://)
    jwks_ca: str | None = None  # a CA file to verify an https jwks_url with (default: the system's)
    keys: tuple[str, ...] = ()  # PEM public keys or certificates; kid = file name without .pem
    scope_claim: str = "scope"  # space-separated string or list of strings
    scope_prefix: str = "fedgate."
    user_claim: str = "sub"  # the connection's user name
    leeway: float = 30.0  # seconds of clock skew allowed on exp / nbf / iat
    jwks_refresh: float = 300.0  # seconds between fetches of jwks_url
    jwks_min_interval: float = 10.0  # at most one fetch per this many seconds (unknown kids)
    map: tuple[dict, ...] = ()  # [[oauth.map]]

    def check(self, key: str) -> None:
        if not self.issuer:
            raise RuleError(f"{key}.issuer", "required (the tokens' 'iss')")
        if not self.audience:
            raise RuleError(f"{key}.audience", "required (the tokens must name this node's audience)")
        if not self.jwks_url and not self.keys:
            raise RuleError(f"{key}.jwks_url", "either jwks_url or keys (PEM files) is required")
        if self.jwks_url and not self.jwks_url.startswith(("http://", "https://")):
            raise RuleError(f"{key}.jwks_url", "expected an http:// or https:// URL")
        if not self.scope_claim or not self.user_claim:
            raise RuleError(f"{key}.scope_claim", "must not be empty")
        for name in ("leeway", "jwks_refresh", "jwks_min_interval"):
            if not 0 <= getattr(self, name) <= 86400:
                raise RuleError(f"{key}.{name}", "expected 0 to 86400 seconds")
        for index, entry in enumerate(self.map):
            _check_map_entry(entry, f"{key}.map[{index}]")


def _check_map_entry(entry: dict, key: str) -> None:
    for name, value in entry.items():
        kind = MAP_KEYS.get(name)
        if kind is None:
            raise RuleError(f"{key}.{name}", f"unknown key (known: {', '.join(sorted(MAP_KEYS))})")
        if not isinstance(value, kind) or (kind is list and not all(isinstance(v, str) for v in value)):
            raise RuleError(f"{key}.{name}", f"expected {'a list of strings' if kind is list else kind.__name__}")
    for name in ("claim", "value"):
        if not entry.get(name):
            raise RuleError(f"{key}.{name}", "required")
    for direction in ("send", "receive"):
        for index, pattern in enumerate(entry.get(direction, ())):
            try:
                compile_pattern(pattern)
            except RuleError as exc:
                raise RuleError(f"{key}.{direction}[{index}]", exc.detail) from None
