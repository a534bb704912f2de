"""A suspect's failure is its own only when the pool's other connections are heard from
(proxy.upstream.suspects, issue #42).

A message in flight when its connection ended is sent again alone; when that connection
ends again, the failure is counted against the message (at ``max_send_failures`` it is
rejected to its sender) only if the pool's other connections stayed up. In a one-way
partition they stay "up" and hear nothing until their idle timeout, which may come after the
verdict: the message was rejected for a network fault. Now they must also have heard from
the primary after the failure (a heartbeat comes within the verdict's grace).
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from cproton import PN_REJECTED

from proxy.upstream.suspects import Suspect, SuspectSender


def sender_with(heard_at: float) -> tuple[SuspectSender, list]:
    protocol = SimpleNamespace(heard_at=heard_at)
    upstream = SimpleNamespace(members=[SimpleNamespace(protocol=protocol)], disruptions=0,
                               run_pending=lambda: None,
                               target=SimpleNamespace(display="amqp://primary"))
    sender = SuspectSender(upstream, limit=2, grace=1.0)
    outcomes: list = []
    suspect = Suspect(owner=None, address="q", payload=b"m",
                      done=lambda state, delivery, condition: outcomes.append(state))
    sender.queue.append(suspect)
    sender._next = lambda: None  # nothing to send on in this test: only the verdict
    return sender, outcomes


def judge(sender: SuspectSender, failed_at: float) -> None:
    sender._judge(sender.queue[0], 0, failed_at)


def test_others_that_heard_from_the_primary_make_the_failure_the_messages_own():
    sender, outcomes = sender_with(heard_at=11.0)
    judge(sender, failed_at=10.0)
    assert outcomes == [PN_REJECTED]  # its second failure: the limit


def test_others_silent_since_the_failure_prove_nothing_and_the_message_is_sent_again():
    sender, outcomes = sender_with(heard_at=9.0)  # nothing heard after the failure at 10
    judge(sender, failed_at=10.0)
    assert outcomes == [] and len(sender.queue) == 1 and sender.queue[0].failures == 1


def test_a_disruption_of_the_others_proves_nothing_either():
    sender, outcomes = sender_with(heard_at=11.0)
    sender.upstream.disruptions = 1  # another connection went down meanwhile
    judge(sender, failed_at=10.0)
    assert outcomes == [] and sender.queue[0].failures == 1


def test_the_verdict_is_dated_from_the_failure():
    async def play():
        sender, outcomes = sender_with(heard_at=0.0)
        loop = asyncio.get_running_loop()
        sender.current = sender.queue.popleft()
        sender.others_up, sender.sent_at = True, 0
        sender._failed("connection lost", None)
        assert sender.verdict is not None and sender.verdict.when() >= loop.time() + 0.99
        sender.upstream.members[0].protocol.heard_at = loop.time() + 0.5  # a heartbeat came
        await asyncio.sleep(1.1)
        return outcomes
    assert asyncio.run(play()) == [PN_REJECTED]


class Owner:
    moved = None


def refused(owner_moves: bool):
    """A suspect's link refused by the node its owner sent to, with the condition a member
    whose fragment moved gives (fragments/group.py)."""
    from proton import Condition

    async def play():
        sender, outcomes = sender_with(heard_at=0.0)
        owner = Owner()
        owner.moved = (lambda condition: True) if owner_moves else None
        sender.queue[0].owner = owner
        sender.link_refused(Condition("amqp:resource-limit-exceeded", "'jobs': this node's "
                                      "fragment is served by another member now"))
        return sender, owner, outcomes
    return asyncio.run(play())


def test_a_suspect_whose_owner_follows_its_moved_fragment_is_not_rejected_but_handed_over():
    """Nemesis finding 14: 38 messages of a fragmented queue's producer were rejected to it at
    the heal of a one-way partition, for a fragment that had moved."""
    sender, owner, outcomes = refused(owner_moves=True)
    assert outcomes == [] and not sender.queue
    handed = sender.hand_over(owner)  # the owner follows the fragment (rehome)
    assert [s.payload for s in handed] == [b"m"] and not sender.waiting


def test_a_suspect_whose_target_is_refused_for_good_gets_the_condition():
    sender, owner, outcomes = refused(owner_moves=False)
    assert outcomes == [PN_REJECTED] and not sender.waiting
