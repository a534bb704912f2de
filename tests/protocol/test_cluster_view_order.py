"""The cluster view keeps another node's claim that the watch brought before this node's own
release was answered (issue #42, docs/nemesis.md finding 27).

The nemesis (long seed 6, `single`): n1 handed n3's fragment back to it and released its claim;
n3 claimed at once, and n1's watch told of the release and of n3's claim before the release's
own answer came. Applying that answer ("no owner now") dropped n3's claim from n1's view. When
n3 died, the watch's delete of its claim changed nothing in the view, so n1, the fragment's
in-sync backup, never claimed it: fragment n3 was served by nobody for the rest of the run
(4 minutes), and its producer waited 40 s and 64 s.
"""

from __future__ import annotations

from proxy.cluster.model import Claim, claim_value
from proxy.cluster.store import KV, Event
from proxy.cluster.view import ClusterView, Keys

RESOURCE = "fragment/jobs/n3"


def test_a_release_answered_after_the_watch_brought_the_next_claim_keeps_that_claim():
    view = ClusterView(Keys("playbook"))
    key = view.keys.owner(RESOURCE)
    ours, theirs = Claim(RESOURCE, "n1", 2), Claim(RESOURCE, "n3", 3)
    view.apply_local_owner(RESOURCE, ours, KV(key, claim_value(ours), 10, 10, 1), 10)

    # the watch: our release's delete (11), then n3's claim (12)
    changes = view.apply([Event("delete", key, b"", 11),
                          Event("put", key, claim_value(theirs), 12, 3)])
    assert changes.owners == {RESOURCE: theirs}
    # then the release's answer, at 11: older than what the view knows
    changes = view.apply_local_owner(RESOURCE, None, None, 11)
    assert not changes.owners
    assert view.owner(RESOURCE) == theirs

    # n3 dies: its claim's delete is a change, seen by everyone waiting to claim
    changes = view.apply([Event("delete", key, b"", 20)])
    assert changes.owners == {RESOURCE: None}
    assert view.owner(RESOURCE) is None


def test_an_older_watch_event_after_this_nodes_own_claim_is_not_applied():
    view = ClusterView(Keys("playbook"))
    key = view.keys.owner(RESOURCE)
    ours = Claim(RESOURCE, "n1", 5)
    view.apply_local_owner(RESOURCE, ours, KV(key, claim_value(ours), 30, 30, 1), 30)
    changes = view.apply([Event("delete", key, b"", 29)])  # a release before our claim
    assert not changes.owners
    assert view.owner(RESOURCE) == ours
    changes = view.apply([Event("put", key, claim_value(ours), 30, 1)])  # ours, again
    assert not changes.owners
