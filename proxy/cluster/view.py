"""What this node knows of the cluster's keys in etcd: a cache fed by reads and the watch.

How this works
--------------
Everything of one cluster lives under ``/fedgate/<name>/`` (``Keys``)::

    members/<node id>   a node's registration (JSON), under the node's lease
    owners/<resource>   the claim on a resource (JSON: resource, owner, epoch), under the
                        owner's lease: it goes when the owner's lease goes
    epochs/<resource>   the resource's epoch (decimal), no lease: it only goes up
    rules               the routing rules record (JSON, proxy.config.rules_store)
    state/<key>         small per-cluster state (put_state / get_state)

``ClusterView`` holds the last value of each, the revision it has seen, and
turns a full read (``load``) or watch events (``apply``) into ``Changes``: did
the member list change, which claims changed, is there a new rules record.
It is plain data (no I/O): the driver reads and watches, the view remembers.
A member's ``lease_age_s`` is computed when asked, from its registration time.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from .model import Claim, Member, parse_claim, parse_member
from .store import KV, Event

log = logging.getLogger("fedgate.cluster")


@dataclass(frozen=True)
class Keys:
    name: str

    @property
    def prefix(self) -> str:
        return f"/fedgate/{self.name}/"

    def member(self, node_id: str) -> str:
        return f"{self.prefix}members/{node_id}"

    def owner(self, resource: str) -> str:
        return f"{self.prefix}owners/{resource}"

    def epoch(self, resource: str) -> str:
        return f"{self.prefix}epochs/{resource}"

    @property
    def rules(self) -> str:
        return f"{self.prefix}rules"

    def state(self, key: str) -> str:
        return f"{self.prefix}state/{key}"

    def split(self, key: str) -> tuple[str, str] | None:
        """(kind, name) of a key under the prefix: ("members", "n1"), ("rules", "")."""
        if not key.startswith(self.prefix):
            return None
        rest = key[len(self.prefix):]
        if rest == "rules":
            return "rules", ""
        kind, sep, name = rest.partition("/")
        return (kind, name) if sep and name else None


@dataclass
class Changes:
    members: bool = False
    owners: dict[str, Claim | None] = field(default_factory=dict)
    rules: tuple[bytes | None, int] | None = None  # (record or None, mod revision), when new
    deleted_members: dict[str, int] = field(default_factory=dict)  # id -> lease it had

    def __bool__(self) -> bool:
        return bool(self.members or self.owners or self.rules is not None)


@dataclass
class ClusterView:
    keys: Keys
    revision: int = 0
    members_raw: dict[str, KV] = field(default_factory=dict)
    owners: dict[str, tuple[Claim, KV]] = field(default_factory=dict)
    rules: KV | None = None
    state: dict[str, bytes] = field(default_factory=dict)
    # per claim key: the revision of the last change known (put or delete, from the watch or
    # this node's own transaction), so that an older one arriving later is not applied
    owner_revisions: dict[str, int] = field(default_factory=dict)

    def load(self, revision: int, kvs: list[KV]) -> Changes:
        """A full read of the prefix at ``revision``: replaces everything known."""
        changes = Changes()
        seen_members, seen_owners, rules, state = {}, {}, None, {}
        for kv in kvs:
            where = self.keys.split(kv.key)
            if where is None:
                continue
            kind, name = where
            if kind == "members":
                seen_members[name] = kv
            elif kind == "owners":
                claim = parse_claim(kv.value)
                if claim is not None:
                    seen_owners[name] = (claim, kv)
            elif kind == "rules":
                rules = kv
            elif kind == "state":
                state[name] = kv.value
        if {k: v.value for k, v in seen_members.items()} != \
                {k: v.value for k, v in self.members_raw.items()}:
            changes.members = True
        for name, old in self.members_raw.items():
            if name not in seen_members or seen_members[name].lease != old.lease:
                changes.deleted_members[name] = old.lease
        for name in set(self.owners) | set(seen_owners):
            old = self.owners.get(name)
            new = seen_owners.get(name)
            if (old and old[0]) != (new and new[0]):
                changes.owners[name] = new[0] if new else None
        old_rev = self.rules.mod_revision if self.rules else 0
        new_rev = rules.mod_revision if rules else 0
        if old_rev != new_rev or (self.rules and rules and self.rules.value != rules.value):
            changes.rules = (rules.value if rules else None, new_rev)
        self.members_raw, self.owners, self.rules, self.state = seen_members, seen_owners, rules, state
        self.owner_revisions = {name: revision for name in self.owner_revisions}
        self.owner_revisions.update({name: kv.mod_revision for name, (_, kv) in seen_owners.items()})
        self.revision = revision  # a full read is the truth, also from an etcd that went back
        return changes

    def apply(self, events: list[Event]) -> Changes:
        """Watch events, in revision order."""
        changes = Changes()
        for event in events:
            self.revision = max(self.revision, event.mod_revision)
            where = self.keys.split(event.key)
            if where is None:
                continue
            kind, name = where
            if kind == "members":
                changes.members = True
                old = self.members_raw.pop(name, None)
                if event.kind == "put":
                    self.members_raw[name] = KV(event.key, event.value, 0, event.mod_revision,
                                                event.lease)
                if old is not None and (event.kind == "delete" or old.lease != event.lease):
                    changes.deleted_members[name] = old.lease
            elif kind == "owners":
                claim = parse_claim(event.value) if event.kind == "put" else None
                kv = KV(event.key, event.value, 0, event.mod_revision, event.lease)
                self._owner_changed(changes, name, claim, kv, event.mod_revision)
            elif kind == "rules":
                if self.rules is not None and self.rules.mod_revision == event.mod_revision:
                    continue  # our own write, already known (apply_local_rules)
                if event.kind == "put":
                    self.rules = KV(event.key, event.value, 0, event.mod_revision, event.lease)
                    changes.rules = (event.value, event.mod_revision)
                else:
                    self.rules = None
                    changes.rules = (None, event.mod_revision)
            elif kind == "state":
                if event.kind == "put":
                    self.state[name] = event.value
                else:
                    self.state.pop(name, None)
        return changes

    def apply_local_owner(self, resource: str, claim: Claim | None, kv: KV | None,
                          revision: int) -> Changes:
        """This node's own claim or release (at ``revision``), known before the watch brings
        it; unless the watch brought a later change of that claim already: a release answered
        after the watch told of another node's claim on the same resource dropped that claim
        from the view, and when that node died no change was seen, so nobody claimed the
        resource again (docs/nemesis.md, finding 27)."""
        changes = Changes()
        self._owner_changed(changes, resource, claim, kv, revision)
        return changes

    def apply_local_rules(self, kv: KV) -> Changes:
        """This node's own rules write, known before the watch brings it."""
        changes = Changes()
        if self.rules is None or kv.mod_revision > self.rules.mod_revision:
            self.rules = kv
            changes.rules = (kv.value, kv.mod_revision)
        return changes

    def _owner_changed(self, changes: Changes, name: str, claim: Claim | None, kv: KV | None,
                       revision: int) -> None:
        if revision < self.owner_revisions.get(name, 0):
            return  # older than what is known of this claim
        self.owner_revisions[name] = revision
        old = self.owners.get(name)
        if claim is None:
            self.owners.pop(name, None)
        else:
            self.owners[name] = (claim, kv)
        if (old[0] if old else None) != claim:
            changes.owners[name] = claim

    # -- reading ----------------------------------------------------------------------
    def members(self, now_wall: float) -> list[Member]:
        out = []
        for name, kv in sorted(self.members_raw.items()):
            member = parse_member(kv.value, now=now_wall)
            if member is None or member.id != name:
                log.warning("cluster: registration %s is not one fedgate wrote; ignored", kv.key)
                continue
            out.append(member)
        return out

    def member_lease(self, node_id: str) -> int | None:
        kv = self.members_raw.get(node_id)
        return kv.lease if kv is not None else None

    def owner(self, resource: str) -> Claim | None:
        held = self.owners.get(resource)
        return held[0] if held else None

    def owner_lease(self, resource: str) -> int | None:
        held = self.owners.get(resource)
        return held[1].lease if held else None

    @property
    def rules_revision(self) -> int:
        """mod revision of the rules record (0: there is none in etcd)."""
        return self.rules.mod_revision if self.rules else 0
