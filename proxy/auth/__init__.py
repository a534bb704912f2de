"""Who a client is and what it may do: SASL, SCRAM, the users file, ACLs.

Owns: ``sasl`` (the SASL exchange and its frames, §5.3), ``mechanisms``
(ANONYMOUS, PLAIN, EXTERNAL and what a step returns), ``scram``
(SCRAM-SHA-256), ``users`` (salted verifiers on disk), ``acl`` (per-user
address rules), ``oauth`` (JWT bearer tokens: keys, validation, grants,
OAUTHBEARER; docs/oauth.md). May import: ``routing`` (patterns); ``oauth``
also PyJWT, cryptography, aiohttp.
"""
