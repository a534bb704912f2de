"""Fragments kept on backups: each member's fragment a replicated copy (rule ``replicas`` > 1).

How this works
--------------
"Each fragment (sub-queue) content is replicated to backups just like a normal
queue" (the 2007 design). With ``replicas = k`` the fragment of member ``m`` is
the replicated resource ``fragment/<address>/<m>`` of the replication service
(``proxy.replication``): its home member ``m`` is its preferred primary and the
ring's next ``k - 1`` live members keep copies (docs/replication.md).

* A member serves its own fragment (the group's local queue) only while it is
  that copy's primary: until then (claiming it, or after coming back while
  another member holds it) the group works as on a node without a fragment:
  its producers go to another member, its consumers steal.
* When a member dies, a backup of its fragment takes it over under the name
  ``<address>@<m>``: an ordinary local queue there, from which every member,
  that backup too (over its own listener), steals as from ``m`` before
  (``location``). The owner watch tells every group where each fragment lives.
* When ``m`` comes back it catches up as a backup of its own fragment; once it
  is in sync the member holding it hands it back (``ReplicatedAddress``), and
  ``m`` serves it again. Nothing is stranded and nothing is served twice.
"""

from __future__ import annotations

import logging

from proxy.replication.parked import hold_link, release_links

log = logging.getLogger("fedgate.fragments")


class FragmentReplicas:
    def __init__(self, group) -> None:
        self.group = group
        self.node = group.node
        self.service = group.node.broker.kind_handlers.get("replicated")
        if self.service is None:
            raise RuntimeError("fragments with replicas need the replication service")
        self.service.fragment_listeners[group.address] = lambda: self
        self.pending: set = set()  # PendingLink: attached while the claim is under way
        # copies made before this group by replication links (a node started again with no
        # client of the queue yet): this group hears of them from now on
        for entry in self._entries():
            entry.listener = self
        self.own = None
        if group.local_key is not None:
            self.own = self.service.fragment(group.address, group.local_key, group.rule, listener=self)

    # links that came while this node claims its own fragment: routed once it is settled
    @property
    def address(self) -> str:
        return self.group.address

    def claiming(self) -> bool:
        """This node's own fragment is not served yet, and no other member serves it."""
        own = self.own
        return (own is not None and self.group.queue is None
                and (own.owner is None or own.owner[0] == self.node.node_id))

    def wait(self, client, link) -> None:
        hold_link(client, link, self, False)
        self.start()

    def go_on(self) -> None:
        """Route the links that waited (the group serves its fragment now, or cannot)."""
        for pending, handler, link in release_links(self):
            try:
                self.group.attach(handler, link)
            except Exception as exc:  # LinkRefused and the like: the client is told
                handler.close_link(link, getattr(exc, "condition", "amqp:internal-error"),
                                   getattr(exc, "description", str(exc)))
                continue
            pending.routed()  # a stealer's drain asked for meanwhile is answered
        self.node.broker.run_pending()

    def start(self) -> None:
        """Settle who serves this node's own fragment (a claim on a fresh one); if this node
        is its primary already (handed back before the group was made, see ``__init__``),
        the group serves it now."""
        own = self.own
        if own is None:
            return
        if own.primary is None:
            own.resolve()
        elif not own.primary.fenced and self.group.queue is None:
            self.group.serve_own(own.primary.queue)

    def update(self, rule) -> None:
        for entry in self._entries():
            entry.listener = self
        if self.own is None and self.group.local_key is not None:
            self.own = self.service.fragment(self.group.address, self.group.local_key, rule,
                                             listener=self)
            self.start()

    def _entries(self):
        prefix = f"fragment/{self.group.address}/"
        return [e for resource, e in self.service.entries.items() if resource.startswith(prefix)]

    def location(self, key: str) -> tuple[str, str] | None:
        """Where member ``key``'s fragment is served now: (URL, address), None if at home."""
        resource = f"fragment/{self.group.address}/{key}"
        entry = self.service.entries.get(resource)
        owner = entry.owner if entry is not None else None
        if owner is None:
            claim = self.service.coordinator.current_owner(resource)
            owner = (claim.owner, claim.epoch) if claim is not None else None
        if owner is None or owner[0] == key:
            return None
        url = self.service.url_of(owner[0])
        return (url, f"{self.group.address}@{key}") if url is not None else None

    # -- the replication service's listener ------------------------------------------------
    def copy_primary(self, entry) -> None:
        if entry is self.own:
            self.group.serve_own(entry.primary.queue)
        else:
            log.warning("fragment %s of %s: served here now (%s)", entry.home, self.group.address,
                        entry.address)
            self.group.fragment_moved(entry.home)
            self._located()

    def copy_fenced(self, entry) -> None:
        if entry is self.own:
            self.group.lose_own()
        else:
            self.group.fragment_moved(entry.home)
            self._located()

    def copy_moved(self, entry) -> None:
        if entry is not self.own:
            self.group.fragment_moved(entry.home)
            self._located()
        elif not self.claiming():
            self.go_on()  # another member serves this node's fragment: links go there

    def _located(self) -> None:
        """Another member's fragment has a known place again: links that waited for it go on
        (the group's attach makes them wait again if it is still nowhere)."""
        if self.pending and not self.claiming():
            self.go_on()

    def describe(self) -> dict:
        return {key: (f"{loc[1]} at {loc[0]}" if (loc := self.location(key)) else "home")
                for key in self.group.members}
