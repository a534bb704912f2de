"""Changes to the node's routing rules: validate, persist, apply, tell the cluster.

How this works
--------------
All changes go through one ``asyncio.Lock`` so that the version check, the
write and the swap happen as one step among writers (readers never wait:
``RoutingTable`` swaps an immutable snapshot). A change is:

1. checked against the expected version (``If-Match``): stale -> 412;
2. validated as a whole with ``RuleSet.build`` and this node's peers and id:
   any problem -> 422 naming the field, and nothing has changed;
3. written to ``<data_dir>/rules.json`` atomically (``proxy.config.rules_store``)
   in a worker thread, so the node's loop keeps serving AMQP meanwhile;
4. swapped in with ``node.routing.replace``: new attaches follow it at once;
   the node's own subscribers deal with existing links (``on_change``);
5. announced to listeners (the cluster sync pushes it to the other nodes).

``adopt`` takes a record accepted elsewhere: it applies it only when its key
``(version, updated_at, origin)`` is greater than the current one (last
writer wins) and it validates here.

**On etcd** (``[cluster] etcd``, issue #34) the record lives in etcd and step 3
starts with a compare-and-swap there: the new record is written only if the
rules key is still at the mod revision this node last saw
(``EtcdCoordinator.swap_rules``). The base of a change is the newest record
seen in etcd. When another node changed the rules first, its record is taken
here at once, and the change answers 412 with the new ETag when it came with
an ``If-Match`` (nothing is overwritten silently); without one, the edit is
applied again to the newer rules. etcd unreachable: 503 with the reason. Every
node follows the watch (``follow``): a new record is validated, persisted and
swapped in under the same lock; one that does not validate here is kept in
``rejected``. The gossip (``admin_api.cluster``) is for static clusters only.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable

from proxy.cluster import CoordinatorUnavailable
from proxy.config.rules_store import MAX_VERSION, RecordError, RulesRecord
from routing import RuleError, RuleSet

from .errors import ApiError

log = logging.getLogger("fedgate.admin.rules")


class VersionMismatch(Exception):
    def __init__(self, expected: str, current: RulesRecord) -> None:
        super().__init__(f"expected {expected}, current is version {current.version}")
        self.expected = expected
        self.current = current


def etag_of(record: RulesRecord) -> str:
    return f'"{record.version}-{record.digest[:16]}"'


def if_match_ok(header: str | None, record: RulesRecord) -> bool:
    """``If-Match``: ``*``, an ETag we gave out, or a bare version number."""
    if header is None:
        return True
    etag = etag_of(record)
    for item in header.split(","):
        item = item.strip()
        if item.startswith("W/"):
            item = item[2:]
        if item == "*" or item == etag:
            return True
        if item.strip('"') == str(record.version):
            return True
    return False


THREAD_ABOVE = 100  # rules: larger sets are validated in a thread
CAS_ATTEMPTS = 5  # a change without If-Match is applied again at most this often


def encode(record: RulesRecord) -> bytes:
    return json.dumps(record.to_dict(), sort_keys=True, separators=(",", ":")).encode()


def decode(value: bytes) -> RulesRecord:
    """RecordError (or ValueError) when it is not a rules record."""
    return RulesRecord.from_dict(json.loads(value))


class RulesManager:
    def __init__(self, node) -> None:
        self.node = node
        self.store = node.rules_store
        self.lock = asyncio.Lock()
        self.listeners: list[Callable[[RulesRecord], None]] = []
        # told of every record taken here, made here or adopted (the node's other workers)
        self.followers: list[Callable[[RulesRecord], None]] = []
        self.coordinator = node.coordinator
        self.on_etcd = self.coordinator.kind == "etcd"
        self.rejected: dict | None = None  # the last record from etcd that does not validate here
        self._followed = 0  # mod revision of the last record taken from etcd
        self._tasks: set[asyncio.Task] = set()

    @property
    def current(self) -> RulesRecord:
        return self.store.current

    def validate(self, rules: list) -> RuleSet:
        """Raises RuleValidationError listing every problem."""
        return self.node.build_ruleset(rules)

    async def change(self, edit: Callable[[list[dict]], list], if_match: str | None = None) -> RulesRecord:
        """Apply ``edit(current rules) -> new rules`` as a new version."""
        if self.on_etcd:
            return await self._change_on_etcd(edit, if_match)
        async with self.lock:
            current = self.current
            if not if_match_ok(if_match, current):
                raise VersionMismatch(if_match or "", current)
            if current.version >= MAX_VERSION:
                raise ApiError(409, "version_exhausted",
                               f"rules version {current.version} cannot go higher", field="version")
            rules = edit([dict(r) for r in current.rules])
            ruleset, listed = await self._validated(rules)
            record = RulesRecord(current.version + 1, time.time(), self.node.node_id, listed)
            await self._commit(record, ruleset)
        log.info("rules version %d accepted here (%d rules)", record.version, len(record.rules))
        for listener in (*self.listeners, *self.followers):
            listener(record)
        return record

    async def adopt(self, record: RulesRecord) -> bool:
        """Apply a record from another node if it wins; RuleValidationError if invalid here."""
        async with self.lock:
            # version 0 is a node's own config file, never a cluster-wide change
            if record.version == 0 or record.key() <= self.current.key():
                return False
            ruleset, listed = await self._validated(list(record.rules))
            record = RulesRecord(record.version, record.updated_at, record.origin, listed)
            await self._commit(record, ruleset)
        log.info("rules version %d from %s adopted", record.version, record.origin)
        for follower in self.followers:
            follower(record)
        return True

    # -- on etcd ---------------------------------------------------------------------------
    def _etcd_base(self) -> tuple[RulesRecord, int]:
        """The newest record known (etcd's, else this node's own) and the rules key's revision."""
        value, revision = self.coordinator.rules_record()
        if value is None:
            return self.current, 0
        try:
            return decode(value), revision
        except (ValueError, RecordError):
            return self.current, revision  # not ours: overwritten by the next change

    async def _change_on_etcd(self, edit, if_match: str | None) -> RulesRecord:
        unavailable = None
        async with self.lock:
            for _ in range(CAS_ATTEMPTS):
                if not self.coordinator.healthy:
                    unavailable = self.coordinator.describe().get("last_error") or "connecting"
                    break
                base, revision = self._etcd_base()
                if not if_match_ok(if_match, base):
                    raise VersionMismatch(if_match or "", base)
                if base.version >= MAX_VERSION:
                    raise ApiError(409, "version_exhausted",
                                   f"rules version {base.version} cannot go higher", field="version")
                ruleset, listed = await self._validated(edit([dict(r) for r in base.rules]))
                record = RulesRecord(base.version + 1, time.time(), self.node.node_id, listed)
                try:
                    written, value, now_at = await self.coordinator.swap_rules(revision, encode(record))
                except CoordinatorUnavailable as exc:
                    unavailable = str(exc)
                    break
                if written:
                    self._followed = max(self._followed, now_at)
                    await self._commit(record, ruleset)
                    break
                # another node changed the rules first: theirs here at once, then 412 or again
                winner = await self._take(value, now_at)
                if if_match is not None and winner is not None and \
                        if_match.strip() not in ("*", 'W/"*"'):
                    raise VersionMismatch(if_match, winner)
            else:
                raise ApiError(409, "conflict", f"the rules changed {CAS_ATTEMPTS} times during this "
                               "change; try again")
        if unavailable is not None:
            raise ApiError(503, "coordinator_unavailable",
                           f"rule changes need etcd, which cannot be reached: {unavailable}",
                           headers={"Retry-After": "1"})
        log.info("rules version %d written to etcd here (%d rules)", record.version, len(record.rules))
        for listener in (*self.listeners, *self.followers):
            listener(record)
        return record

    def follow(self, value: bytes | None, revision: int) -> None:
        """``EtcdCoordinator.on_rules``: a new record in etcd (None: there is none now; the
        rules here stay, and the next record is taken whatever its revision: a new etcd)."""
        if value is None:
            self._followed = revision
            return
        task = asyncio.get_running_loop().create_task(self._follow(value, revision))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _follow(self, value: bytes, revision: int) -> None:
        async with self.lock:
            record = await self._take(value, revision)
        if record is not None:
            for follower in self.followers:
                follower(record)

    async def _take(self, value: bytes | None, revision: int) -> RulesRecord | None:
        """Apply the record etcd holds at ``revision`` (under the lock); None if not applied."""
        if value is None or revision <= self._followed:
            return None
        self._followed = revision
        try:
            record = decode(value)
        except (ValueError, RecordError) as exc:
            log.error("the rules record in etcd at revision %d is not one fedgate wrote: %s",
                      revision, exc)
            return None
        current = self.current
        if (record.version, record.digest) == (current.version, current.digest):
            return record
        try:
            ruleset, listed = await self._validated(list(record.rules))
        except RuleError as exc:
            problems = getattr(exc, "problems", None) or [exc]
            self.rejected = {"version": record.version, "from": record.origin, "revision": revision,
                             "detail": "; ".join(f"{p.field}: {p.detail}" for p in problems)}
            log.warning("rules version %d from etcd (by %s) do not validate here: %s",
                        record.version, record.origin, self.rejected["detail"])
            return None
        record = RulesRecord(record.version, record.updated_at, record.origin, listed)
        await self._commit(record, ruleset)
        self.rejected = None
        log.info("rules version %d from etcd (by %s) applied", record.version, record.origin)
        return record

    async def _validated(self, rules: list) -> tuple[RuleSet, tuple]:
        """The rule set built and listed in a thread (routing is pure): 16,000 rules took
        2.3 s, and the event loop serves AMQP clients meanwhile (issue #21)."""
        def build():
            ruleset = self.validate(rules)
            return ruleset, tuple(ruleset.to_list())
        if len(rules) < THREAD_ABOVE:
            return build()
        return await asyncio.to_thread(build)

    async def _commit(self, record: RulesRecord, ruleset: RuleSet) -> None:
        # shielded: once the write has started, the swap follows it even if
        # the request that caused it goes away
        await asyncio.shield(self._write_then_swap(record, ruleset))

    async def _write_then_swap(self, record: RulesRecord, ruleset: RuleSet) -> None:
        await asyncio.to_thread(self.store.save, record)
        self.node.routing.replace(ruleset)
        self.node.refresh_routing()  # the members changed while it was validated

