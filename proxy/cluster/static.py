"""The coordinator of a static cluster (no etcd): ``[peers]`` is the membership.

How this works
--------------
Nothing runs and nothing is asked of anyone: the members are this node and
the ``[peers]`` table (admin URLs from ``[admin] cluster`` when given), always
healthy, and the node always acts. ``claim`` grants every resource to this
node with an epoch kept in ``<data_dir>/cluster/epochs.json`` (written
atomically, fsync'ed), so epochs go up across restarts too, and a person
promoting a node by hand can raise one in that file. ``current_owner`` knows
only this node's own claims; ``put_state``/``get_state`` keep
``<data_dir>/cluster/state.json``. Rules are gossiped between admin APIs as
before (``admin_api.cluster``).
"""

from __future__ import annotations

import base64
import json
import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from proxy.config.compat import FEATURES

from .model import Claim, CoordinatorError, Listeners, Member

log = logging.getLogger("fedgate.cluster")


def write_atomically(path: Path, body: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(body, handle, indent=2, sort_keys=True)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _read(path: Path) -> dict:
    try:
        body = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise OSError(f"{path}: unreadable ({exc})") from None
    if not isinstance(body, dict):
        raise OSError(f"{path}: expected a JSON object")
    return body


class StaticCoordinator:
    kind = "static"
    healthy = True
    revision = 0

    def __init__(self, *, node_id: str, amqp: str, admin: str | None, workers: int, version: str,
                 peers: dict[str, str], peer_admins: dict[str, str], data_dir: Path) -> None:
        self.node_id = node_id
        self.local = Member(node_id, amqp, admin, workers, version, None,
                            features=tuple(sorted(FEATURES)))
        self.peers = dict(peers)
        self.peer_admins = dict(peer_admins)
        self.endpoints: list[str] = []
        self.directory = Path(data_dir) / "cluster"
        self.claims: dict[str, Claim] = {}
        self._owners: list[tuple[str, Callable]] = []
        self._members = Listeners(log)

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        self.claims.clear()

    def members(self) -> list[Member]:
        others = [Member(peer, url, self.peer_admins.get(peer), 1, "", None)
                  for peer, url in sorted(self.peers.items()) if peer != self.node_id]
        return sorted([self.local, *others], key=lambda m: m.id)

    def on_members(self, callback) -> None:
        self._members.add(callback)  # the table never changes while the node runs

    def acting(self) -> bool:
        return True

    def on_fenced(self, callback) -> None:
        pass  # never fenced

    async def claim(self, resource: str, *, only_if_owner_gone: bool = True,
                    require_state: dict | None = None, put_state: dict | None = None,
                    epoch_at_least: int = 0) -> Claim | None:
        held = self.claims.get(resource)
        if held is not None and held.epoch >= epoch_at_least:
            return held
        path = self.directory / "epochs.json"
        epochs = _read(path)
        epoch = max(int(epochs.get(resource, 0)) + 1, epoch_at_least)
        epochs[resource] = epoch
        write_atomically(path, epochs)
        for key, value in (put_state or {}).items():
            await self.put_state(key, value)
        claim = self.claims[resource] = Claim(resource, self.node_id, epoch)
        self._tell(resource, claim)
        return claim

    async def release(self, claim: Claim) -> None:
        if self.claims.get(claim.resource) == claim:
            del self.claims[claim.resource]
            self._tell(claim.resource, None)

    def current_owner(self, resource: str) -> Claim | None:
        return self.claims.get(resource)

    def on_owner(self, resource_prefix: str, callback) -> None:
        self._owners.append((resource_prefix, callback))

    async def put_state(self, key: str, value: bytes, *, if_owner: Claim | None = None) -> None:
        if if_owner is not None and self.claims.get(if_owner.resource) != if_owner:
            raise CoordinatorError(f"put state {key}: {if_owner.resource} is no longer held here")
        path = self.directory / "state.json"
        state = _read(path)
        state[key] = base64.b64encode(value).decode()
        write_atomically(path, state)

    async def swap_state(self, key: str, expected: bytes | None, value: bytes) -> bool:
        current = (await self.get_state(key)).get(key)
        if current != expected:
            return False
        await self.put_state(key, value)
        return True

    async def get_state(self, prefix: str) -> dict[str, bytes]:
        state = _read(self.directory / "state.json")
        return {k: base64.b64decode(v) for k, v in state.items() if k.startswith(prefix)}

    def describe(self) -> dict:
        return {"kind": self.kind, "name": None, "endpoints": [], "endpoint": None,
                "healthy": True, "revision": 0, "acting": True, "fenced": False, "lease": None,
                "last_error": None, "reconnects": 0, "error": None}

    def _tell(self, resource: str, claim: Claim | None) -> None:
        for prefix, callback in list(self._owners):
            if resource.startswith(prefix):
                try:
                    callback(resource, claim)
                except Exception:
                    log.exception("cluster owner listener %r failed", callback)
