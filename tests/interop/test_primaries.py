"""Which primaries' answers the proxy does not trust (proxy.primaries): pure logic."""

from __future__ import annotations

import pytest
from proton import symbol

from proxy.upstream.primaries import drain_unanswered, echoes_source_unapplied


def props(product: str, version: str) -> dict:
    return {symbol("product"): product, symbol("version"): version}


@pytest.mark.parametrize("properties, untrusted", [
    (props("RabbitMQ", "3.10.8"), True),  # measured: see the module note
    (props("RabbitMQ", "3.13.7"), True),
    (props("RabbitMQ", "4.0.5"), False),
    (props("apache-activemq-artemis", "2.40.0"), False),
    (props("RabbitMQ", "unknown"), True),  # an unreadable version counts as old
    ({}, False),
    (None, False),
])
def test_known_primaries(properties, untrusted):
    for check in (echoes_source_unapplied, drain_unanswered):
        reason = check(properties)
        assert (reason is not None) == untrusted
        if untrusted:
            assert "RabbitMQ" in reason
