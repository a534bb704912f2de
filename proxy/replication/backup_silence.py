"""How long each backup node has answered nothing, over every queue this node is primary of
(docs/replication.md, 5b; docs/nemesis.md, finding 29).

A backup's silence is its node's, not one queue's: a queue that had sent a node nothing
(no client until now) owes it nothing, and its first batch must not start the node's silence
again when the node's other queues have heard nothing from it for longer. So the primaries
of a node share one ``BackupSilence``:

* ``sent`` / ``answered``: since when each backup node owes an answer and has given none;
* a keepalive per backup node, not per queue: a queue with no client sends one only when no
  queue sent that node anything for ``every`` seconds and it owes nothing (an idle node of
  many queues sends a few small batches a second per peer, not one per queue);
* who was heard since the silence began: the peers' activity when a node's silence crossed
  half a lease (``listen``), so that a queue that comes to judge later (a producer just
  arrived) judges on the same evidence as one that saw the silence grow;
* a verdict (``judged``): a queue dropped the node after hearing other peers; the node's
  other queues drop it too, without listening again, until it answers.

Pure bookkeeping on the times the caller gives: the event loop's, a virtual one in tests.
``cut_off_alone`` is the judgement both of a primary's rules make from it (``copies.py``):
whether this node, not its silent backups, is the one cut off.
"""

from __future__ import annotations


class BackupSilence:
    def __init__(self) -> None:
        self._owed_since: dict[str, float] = {}
        self._last_sent: dict[str, float] = {}
        self._listening: dict[str, tuple[float, dict]] = {}  # node -> (since, peers' activity)
        self._judged: set[str] = set()

    def sent(self, node: str, now: float) -> None:
        self._owed_since.setdefault(node, now)
        self._last_sent[node] = now

    def answered(self, node: str) -> None:
        self._owed_since.pop(node, None)
        self._listening.pop(node, None)
        self._judged.discard(node)

    def silent_for(self, node: str, now: float) -> float:
        since = self._owed_since.get(node)
        return 0.0 if since is None else now - since

    def keepalive_due(self, node: str, now: float, every: float) -> bool:
        """Whether a queue with no client should send ``node`` an empty batch: nothing owed
        and nothing sent to it by any queue for ``every`` seconds."""
        return node not in self._owed_since and now - self._last_sent.get(node, -every) >= every

    def wants_listening(self, node: str, now: float, after: float) -> bool:
        return node not in self._listening and self.silent_for(node, now) >= after

    def listen(self, node: str, now: float, activity: dict) -> None:
        self._listening.setdefault(node, (now, activity))

    def listening(self, nodes) -> tuple[float, dict] | None:
        """(since, peers' activity then) for the silence of ``nodes``: the latest that began,
        when every one of them is silent long enough to be listened for, else None."""
        found = [self._listening.get(node) for node in nodes]
        if not found or None in found:
            return None
        return max(found, key=lambda entry: entry[0])

    def alone(self, silent: set, members: set, node_id: str, now_heard: dict) -> bool:
        """``cut_off_alone`` for ``silent`` backup nodes, every one a live member, on the note
        taken when their silence crossed half a lease; without one, nothing to judge by."""
        noted = self.listening(silent)
        return (noted is not None and silent <= members
                and cut_off_alone(silent, members, node_id, noted[1], now_heard))

    def judged(self, node: str) -> None:
        """A queue dropped ``node`` from its in-sync set while it owed an answer, after hearing
        other peers (or with its lease gone): the node's other queues drop it too."""
        if node in self._owed_since:
            self._judged.add(node)

    def was_judged(self, node: str) -> bool:
        return node in self._judged


def cut_off_alone(silent: set, members: set, node_id: str, before: dict, now_heard: dict) -> bool:
    """Whether this node is the one cut off (docs/replication.md, 5b): its ``silent`` in-sync
    backups (every one still a live member: the caller checks) answer nothing, and no other
    peer was heard since their silence began (``before``: the peers' activity then;
    ``now_heard``: now). With no other peer, two or more silent backups say so too; one alone
    tells nothing."""
    heard = [peer for peer, seen in now_heard.items() if peer not in silent
             and seen != before.get(peer)]
    others = members - silent - {node_id}
    return not heard and (bool(others) or len(silent) >= 2)
