"""Routing rules persisted under the node's data directory.

How this works
--------------
The rules a node serves come from one of two places:

* the config file's ``[[rules]]`` (``RulesRecord.version == 0``), until
* a change through the admin API: the new list is written to
  ``<data_dir>/rules.json`` together with a version, a wall-clock timestamp
  and the id of the node that accepted it. From then on the file wins over the
  config at start (the config's ``[[rules]]`` are ignored while it exists;
  delete the file to go back to them).

``save`` is atomic: the record goes to a temporary file in the same
directory, is flushed and ``fsync``-ed, then ``os.replace``-d over the old
file, and the directory is ``fsync``-ed so the rename itself survives a crash.
A reader therefore sees the old list or the new one, never half of either.

``RulesRecord.key()`` orders records cluster-wide: ``(version, updated_at,
origin)``; the greater key wins (last writer wins, see ``admin_api.cluster``).
A persisted file that is unreadable, malformed or no longer valid for this
node's peers fails the start with a ``ConfigError`` naming the key.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from proxy.config.errors import ConfigError
from proxy.config.settings import Config
from routing import RuleSet, RuleValidationError

RULES_FILE = "rules.json"
FORMAT = 1
MAX_VERSION = 2**53 - 1  # exact in every JSON implementation
MAX_TIMESTAMP = 2**40  # seconds: far beyond any real clock, still exact as a float


def rules_digest(rules: list[dict]) -> str:
    """sha256 of the canonical JSON of a rule list (same rules -> same digest)."""
    text = json.dumps(rules, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class RulesRecord:
    """One version of the rule list, as stored and as exchanged between nodes."""

    version: int  # 0: the config file's rules, never changed through the API
    updated_at: float  # unix time when a node accepted this version
    origin: str  # id of the node that accepted it
    rules: tuple[dict, ...]  # JSON form (RuleSet.to_list())

    def key(self) -> tuple[int, float, str]:
        return (self.version, self.updated_at, self.origin)

    @property
    def digest(self) -> str:
        return rules_digest(list(self.rules))

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version, "updated_at": self.updated_at,
                "origin": self.origin, "rules": list(self.rules)}

    @classmethod
    def from_dict(cls, raw: Any) -> "RulesRecord":
        """Shape check of a stored or received record; raises ``RecordError``."""
        if not isinstance(raw, dict):
            raise RecordError("", "expected an object")
        version = raw.get("version")
        if isinstance(version, bool) or not isinstance(version, int) or not 0 <= version <= MAX_VERSION:
            raise RecordError("version", f"expected an integer between 0 and {MAX_VERSION}")
        updated_at = raw.get("updated_at")
        if (isinstance(updated_at, bool) or not isinstance(updated_at, (int, float))
                or not 0 <= updated_at <= MAX_TIMESTAMP):
            raise RecordError("updated_at", "expected a unix time in seconds")
        origin = raw.get("origin")
        if not isinstance(origin, str) or not origin:
            raise RecordError("origin", "expected a node id")
        rules = raw.get("rules")
        if not isinstance(rules, list):
            raise RecordError("rules", "expected an array of rules")
        for index, rule in enumerate(rules):
            if not isinstance(rule, dict):
                raise RecordError(f"rules[{index}]", "expected an object")
        return cls(version, float(updated_at), origin, tuple(rules))


class RecordError(ValueError):
    def __init__(self, field: str, detail: str) -> None:
        super().__init__(f"{field}: {detail}" if field else detail)
        self.field = field
        self.detail = detail


class RulesStore:
    """``<data_dir>/rules.json``; ``current`` is the record the node serves."""

    def __init__(self, data_dir: str | Path) -> None:
        self.path = Path(data_dir) / RULES_FILE
        self.current: RulesRecord | None = None

    def load(self) -> RulesRecord | None:
        """The persisted record, or None when there is none. ConfigError if bad."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ConfigError(str(self.path), f"cannot read persisted rules: {exc}") from None
        try:
            raw = json.loads(text)
        except ValueError as exc:
            raise ConfigError(str(self.path), f"persisted rules are not valid JSON: {exc}") from None
        if isinstance(raw, dict) and raw.get("format") != FORMAT:
            raise ConfigError(f"{self.path}: format", f"expected {FORMAT}, got {raw.get('format')!r}")
        try:
            return RulesRecord.from_dict(raw)
        except RecordError as exc:
            raise ConfigError(f"{self.path}: {exc.field}", exc.detail) from None

    def initial_ruleset(self, config: Config) -> RuleSet:
        """The rules to start with: the persisted ones when present, else the config's."""
        record = self.load()
        if record is None:
            ruleset = config.ruleset()
            self.current = RulesRecord(0, 0.0, config.node.id, tuple(ruleset.to_list()))
            return ruleset
        try:
            ruleset = RuleSet.build(list(record.rules), peers=config.peers, node_id=config.node.id,
                                    open_peers=config.cluster.enabled)
        except RuleValidationError as exc:
            first = exc.problems[0]
            raise ConfigError(f"{self.path}: {first.field}",
                              "; ".join(f"{p.field}: {p.detail}" for p in exc.problems)) from exc
        self.current = record
        return ruleset

    def save(self, record: RulesRecord) -> None:
        """Write atomically (temp file, fsync, rename, fsync dir); then it is current."""
        directory = self.path.parent
        directory.mkdir(parents=True, exist_ok=True)
        body = json.dumps({"format": FORMAT, **record.to_dict()}, indent=2, ensure_ascii=False)
        fd, tmp = tempfile.mkstemp(prefix=".rules.", suffix=".tmp", dir=directory)
        try:
            with os.fdopen(fd, "w") as handle:
                handle.write(body + "\n")
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        self.current = record
