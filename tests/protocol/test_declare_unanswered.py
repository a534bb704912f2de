"""A queue declare the primary never answers is asked again, then refused by name.

A rule with ``upstream.declare`` asks RabbitMQ 4's management node to declare
the queue before the first attach (``proxy.upstream.management``). If no answer
comes (a request or reply lost, a primary that takes the request links but has
no management node), the client's link must not wait for ever: each request is
given up after ``ANSWER_TIMEOUT``, asked again, and after ``DECLARE_TRIES``
the client's link is refused with ``amqp:internal-error``. A fedgate node as
primary shows it: it takes ``/management`` for a queue of its own, so the
gateway's request is stored there and never answered.
"""

from __future__ import annotations

import pytest

from playbook import World, run
from proxy.upstream import management, owner

DECLARE_RULE = {"name": "work", "match": "work.*", "kind": "proxy", "primary": "amqp://primary:5672",
                "remote": "/queues/{1}", "upstream": {"declare": True}}

pytestmark = pytest.mark.timeout(30)


def test_an_unanswered_declare_is_asked_again_then_refused_by_name(tmp_path):
    async def play():
        world = World(tmp_path)
        await world.node("primary")
        await world.node("gw", rules=[DECLARE_RULE])
        client = await world.client("gw")
        sender = client.sender("work.orders")
        tries = owner.DECLARE_TRIES
        await world.until(lambda: sender.closed_with, timeout=management.ANSWER_TIMEOUT * (tries + 1),
                          what="the client's link refused")
        assert sender.closed_with == "amqp:internal-error"
        assert "no answer" in sender.link.remote_condition.description
        # the only messages the gateway sent the primary: the request, asked once and again
        assert len(world.frames("gw", "primary", "transfer")) == tries
        # the gateway goes on serving: another client's local queue works
        other = await world.client("gw")
        local = other.sender("local.q")
        await world.until(lambda: local.credit > 0, what="a local queue served")
        await world.close()

    run(play)
