"""TLS from the node to its primaries: CA verification and client certificates, per rule."""

from __future__ import annotations

import time

import pytest
from admin_client import ADMIN, upstream_pools


def primary_and_proxy(start_node, certs, upstream: dict, mutual: bool):
    tls = {"cert": str(certs.server_cert), "key": str(certs.server_key)}
    if mutual:
        tls.update(ca=str(certs.ca), verify_client=True)
    primary = start_node({"tls": tls}, name="primary")
    proxy = start_node({
        "admin": ADMIN,
        "rules": [{"name": "secure", "match": "secure.#", "kind": "proxy",
                   "primary": f"amqps://localhost:{primary.port}", "upstream": upstream}],
    }, name="proxy")
    return primary, proxy


@pytest.mark.parametrize("mutual", [False, True])
def test_messages_cross_a_verified_tls_upstream(start_node, certs, clients, mutual):
    upstream = {"tls_ca": str(certs.ca)}
    if mutual:
        upstream.update(tls_cert=str(certs.client_cert), tls_key=str(certs.client_key))
    primary, proxy = primary_and_proxy(start_node, certs, upstream, mutual)
    (sent,) = clients("rhea", "send", proxy.url, address="secure.q", count=50, prefix="t").finish()
    assert sent["accepted"] == 50
    if not mutual:  # rhea cannot present a client certificate; check through the proxy instead
        lines = clients("rhea", "receive", primary.url.replace("amqp://", "amqps://"),
                        address="secure.q", count=50, tls_insecure=True).finish()
    else:
        lines = clients("rhea", "receive", proxy.url, address="secure.q", count=50).finish()
    assert sorted(line["id"] for line in lines if "id" in line) == sorted(f"t-{i}" for i in range(50))


def test_untrusted_primary_certificate_is_refused(start_node, certs, clients):
    primary, proxy = primary_and_proxy(start_node, certs, {"tls_ca": str(certs.ca.parent / "rogue-ca.crt")}, False)
    lines = clients("rhea", "send", proxy.url, address="secure.q", count=1, timeout_ms=3000).finish()
    assert lines[-1]["error"]["condition"] == "timeout"  # no credit: the primary is unreachable
    deadline = time.monotonic() + 10
    while True:
        pools = upstream_pools(proxy)
        errors = [m.get("last_error") or "" for p in pools for m in p.get("members", [])]
        if any("CERTIFICATE_VERIFY_FAILED" in e for e in errors) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert any("CERTIFICATE_VERIFY_FAILED" in e for e in errors), errors
