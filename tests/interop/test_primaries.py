"""Which primaries' answers the proxy does not trust (proxy.primaries): pure logic."""

from __future__ import annotations

import pytest
from proton import symbol

from proxy.upstream.primaries import (
    drain_unanswered,
    echoes_source_unapplied,
    filters_applied,
    modified_unsupported,
)


def props(product: str, version: str) -> dict:
    return {symbol("product"): product, symbol("version"): version}


@pytest.mark.parametrize("properties, echoes, no_drain, no_modified", [
    (props("RabbitMQ", "3.10.8"), True, True, True),  # measured: see the module note
    (props("RabbitMQ", "3.13.7"), True, True, True),
    # measured: echoes browse/selector, drains, a quorum queue honours modified
    (props("RabbitMQ", "4.0.5"), True, False, False),
    (props("RabbitMQ", "4.1.0"), False, False, False),
    (props("apache-activemq-artemis", "2.40.0"), False, False, False),
    (props("RabbitMQ", "unknown"), True, True, True),  # an unreadable version counts as old
    ({}, False, False, False),
    (None, False, False, False),
])
def test_known_primaries(properties, echoes, no_drain, no_modified):
    for check, untrusted in ((echoes_source_unapplied, echoes), (drain_unanswered, no_drain),
                             (modified_unsupported, no_modified)):
        reason = check(properties)
        assert (reason is not None) == untrusted, check.__name__
        if untrusted:
            assert "RabbitMQ" in reason


@pytest.mark.parametrize("properties, applied", [
    (props("RabbitMQ", "3.10.8"), set()),  # no streams over AMQP 1.0
    (props("RabbitMQ", "4.0.5"), {"rabbitmq:stream-offset-spec"}),  # measured: applied
    (props("apache-activemq-artemis", "2.40.0"), set()),  # its echo is trusted anyway
    (None, set()),
])
def test_filters_a_primary_applies_although_its_echo_is_not_trusted(properties, applied):
    assert filters_applied(properties) == applied
