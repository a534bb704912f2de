"""The ``[oauth]`` table made live: the token validator with its key set (docs/oauth.md).

``oauth_validator(config)`` is what the node and ``fedgate check-config`` use: the
key files named in ``[oauth]`` load here (a missing or unusable one is a
``ConfigError`` naming ``oauth.keys[i]`` or ``oauth.jwks_ca``); the JWKS document
is fetched once the node starts (``KeySet.start``).
"""

from __future__ import annotations

from proxy.auth.oauth import KeySet, Validator
from proxy.auth.oauth.keys import KeyFileError
from proxy.config.errors import ConfigError


def oauth_validator(config) -> Validator | None:
    """The token validator of ``config.oauth``, or None without an ``[oauth]`` table."""
    if config.oauth is None:
        return None
    try:
        keys = KeySet.from_config(config.oauth, config.resolve_path)
    except KeyFileError as exc:
        raise ConfigError(exc.key, exc.detail) from None
    return Validator(config.oauth, keys, config.acl)
