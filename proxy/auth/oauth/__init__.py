"""OAuth 2 bearer tokens (JWTs) as credentials: issue #47, design in docs/oauth.md.

Owns: ``settings`` (the ``[oauth]`` table), ``keys`` (PEM files and a JWKS URL,
cached, refetched on an unknown ``kid`` at a bounded rate), ``validate``
(PyJWT: signature, ``exp``, ``nbf``, ``iss``, ``aud``; the grants a token
carries, as ``proxy.auth.acl`` entries; refusals counted by reason) and
``bearer`` (SASL OAUTHBEARER, RFC 7628). May import: ``routing`` (patterns),
``proxy.auth.acl``, PyJWT, cryptography, aiohttp, orjson.
"""

from proxy.auth.oauth.keys import KeySet
from proxy.auth.oauth.settings import OAuthSection
from proxy.auth.oauth.validate import (
    CBS_ADDRESS,
    MAX_TOKEN_BYTES,
    OAUTH_SASL_MAX_FRAME,
    TokenGrant,
    TokenRefused,
    Validator,
    looks_like_jwt,
    token_authorizer,
)

__all__ = ["CBS_ADDRESS", "KeySet", "MAX_TOKEN_BYTES", "OAUTH_SASL_MAX_FRAME", "OAuthSection", "TokenGrant",
           "TokenRefused", "Validator", "looks_like_jwt", "token_authorizer"]
