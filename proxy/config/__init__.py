"""The node's configuration: TOML into frozen dataclasses, checked key by key.

Owns: ``settings`` (every section), ``exchanges`` (``[[exchanges]]`` and
``[[bindings]]``), ``rules_store`` (routing rules kept on disk for the admin
API), ``errors`` (``ConfigError`` naming the key), ``oauth`` (the ``[oauth]``
table's token validator and key files), ``version`` (the release, from pyproject.toml),
``compat`` (what this release speaks to other releases: features, negotiation, the data
dir's marker; docs/upgrades.md).
May import: ``routing``,
``proxy.auth`` (ACL entries, SASL mechanism names, the OAuth validator).
"""
