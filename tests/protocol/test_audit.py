"""The audit log's bounds (issue #46): the file turns over at MAX_FILE into one older file,
the memory keeps the last KEEP entries, and both are read back at start."""

from __future__ import annotations

import orjson

from admin_api import audit
from admin_api.audit import AuditLog


def test_the_file_turns_over_and_the_last_entries_come_back_at_start(tmp_path, monkeypatch):
    monkeypatch.setattr(audit, "MAX_FILE", 10_000)
    path = tmp_path / "audit.jsonl"
    log = AuditLog(path, "n1")
    for i in range(1500):
        log.record({"n": i, "who": "ops", "path": "/api/v1/queues/q/purge", "status": 200})
    older = path.with_name("audit.jsonl.1")
    assert path.stat().st_size <= 10_000 and older.stat().st_size <= 10_000
    assert not path.with_name("audit.jsonl.2").exists()  # one older file only
    on_disk = [orjson.loads(line)["n"] for f in (older, path) for line in f.read_bytes().splitlines()]
    assert on_disk == list(range(on_disk[0], 1500))  # the newest, in order, none twice
    assert [e["n"] for e in log.entries] == list(range(500, 1500))  # KEEP in memory

    again = AuditLog(path, "n1")  # a restart: what the files still hold, newest last
    assert [e["n"] for e in again.entries] == on_disk[-audit.KEEP:]


def test_a_line_cut_by_a_crash_is_skipped(tmp_path):
    path = tmp_path / "audit.jsonl"
    path.write_bytes(b'{"n": 1}\n{"n": 2, "who\n{"n": 3}\n')
    assert [e["n"] for e in AuditLog(path, "n1").entries] == [1, 3]
