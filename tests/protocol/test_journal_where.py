"""The journal's compact index of live messages (proxy/journal/where.py, docs/journal-index.md)
against a dict: random sequences of inserts (ascending, and out of order as recovery meets
relocated copies), pops, gets, relocations and compactions behave exactly as the dict."""

from __future__ import annotations

import random

import pytest

from proxy.journal import where as where_module
from proxy.journal.where import Where


def _loc(rng: random.Random, wide: bool = False) -> int:
    segment = rng.randrange(1, 1 << 40) if wide else rng.randrange(1, 300)
    return (segment << 64) | (rng.randrange(24, 1 << 32) << 32) | rng.randrange(10, 1 << 32)


def _check(where: Where, model: dict, rng: random.Random) -> None:
    assert len(where) == len(model)
    assert dict(where.items()) == model
    for message_id in rng.choices(range(0, max(model, default=0) + 3), k=20):
        assert where.get(message_id) == model.get(message_id)
        assert (message_id in where) == (message_id in model)


@pytest.mark.parametrize("seed", range(12))
def test_the_index_behaves_as_a_dict(seed, monkeypatch):
    rng = random.Random(seed)
    if seed % 2 == 0:  # compactions and merges often, not only past thousands of entries
        monkeypatch.setattr(where_module, "_MIN_COMPACT", 8)
        monkeypatch.setattr(where_module, "_MIN_MERGE", 4)
    where, model = Where(), {}
    next_id = 1
    wide = seed % 4 == 3  # segment numbers past 32 bits (the arrays widen)
    for step in range(6000):
        op = rng.random()
        if op < 0.40:  # a new message: ascending ids, now and then a gap (a txn's ids)
            next_id += 1 if rng.random() < 0.9 else rng.randrange(2, 50)
            loc = _loc(rng, wide and rng.random() < 0.01)
            where[next_id] = loc
            model[next_id] = loc
        elif op < 0.47:  # an out-of-order id (recovery: a relocated copy, its original gone)
            message_id = rng.randrange(1, next_id + 1)
            loc = _loc(rng, wide and rng.random() < 0.05)
            where[message_id] = loc
            model[message_id] = loc
        elif op < 0.75 and model:  # a dequeue: the oldest (FIFO) or any
            if rng.random() < 0.5:
                message_id = min(model)
            else:
                message_id = rng.choice(list(model))
            assert where.pop(message_id, None) == model.pop(message_id)
        elif op < 0.80:  # an unknown id's dequeue is ignored
            message_id = rng.randrange(1, next_id + 2)
            assert where.pop(message_id, None) == model.pop(message_id, None)
        elif op < 0.85 and model:  # relocation: live entries of some segments move
            sparse = {n for n in (loc >> 64 for loc in model.values()) if n % 7 == step % 7}
            moves = where.located_in(sparse)
            assert sorted(moves) == sorted((m, loc) for m, loc in model.items()
                                           if loc >> 64 in sparse)
            for message_id, loc in moves:
                new = _loc(rng)
                where[message_id] = new
                model[message_id] = new
        elif op < 0.87:
            where.settle()  # as after recovery
        else:
            message_id = rng.randrange(0, next_id + 2)
            assert where.get(message_id) == model.get(message_id)
        if step % 500 == 0:
            _check(where, model, rng)
    _check(where, model, rng)
    where.settle()
    assert not where.extra and not where.dead
    assert list(where.ids) == sorted(model)
    _check(where, model, rng)


def test_a_fifo_backlog_is_compacted_and_stays_small():
    where = Where()
    for message_id in range(1, 100_001):
        where[message_id] = (3 << 64) | (1000 << 32) | 500
    for message_id in range(1, 90_001):  # consumed in order
        assert where.pop(message_id) == (3 << 64) | (1000 << 32) | 500
    assert len(where) == 10_000
    assert len(where.ids) - where.dead == 10_000 and len(where.ids) < 20_000
    assert where.get(95_000) == (3 << 64) | (1000 << 32) | 500 and where.get(5) is None


def test_scattered_removals_are_compacted():
    where = Where()
    for message_id in range(1, 50_001):
        where[message_id] = (1 << 64) | message_id
    for message_id in range(2, 50_001, 3):
        where.pop(message_id)
    for message_id in range(3, 50_001, 3):
        where.pop(message_id)
    assert len(where) == 16_667 and len(where.ids) < 30_000
    assert [m for m, _ in where.items()] == list(range(1, 50_001, 3))


def test_recovery_meets_relocated_copies_out_of_id_order(tmp_path, monkeypatch):
    """A long-lived message relocated into a later segment, its first segment deleted: the
    restart meets its id after younger ones. Each live message is found where its record is,
    before and after a restart, and the out-of-order ids end in the arrays."""
    from proxy.journal import format as fmt
    from proxy.journal.journal import Journal

    monkeypatch.setattr(where_module, "_MIN_MERGE", 2)  # merges during the scan, too
    directory = tmp_path / "j"
    journal = Journal(directory, fsync=False, segment_size=4096)
    journal.open()
    slow = [journal.enqueue("slow", b"slow %d" % n)[0] for n in range(8)]
    payloads = {message_id: b"slow %d" % n for n, message_id in enumerate(slow)}
    for round_ in range(60):  # churn: segments roll, the slow ones' segments are sparse
        fast = [journal.enqueue("fast", bytes(180))[0] for _ in range(5)]
        for message_id in fast:
            journal.dequeue(message_id)
        kept = journal.enqueue("kept", b"kept %d" % round_)[0]
        payloads[kept] = b"kept %d" % round_
        journal.sync()
    assert journal.stats.relocated >= len(slow)
    first = min(int(p.name.split(".")[0]) for p in directory.iterdir() if p.suffix == ".seg")
    assert first > 1  # the segment the slow ones were written in is gone
    # nothing kept per relocated message for a segment already deleted
    assert all(number in journal._segments
               for numbers in journal._old_copies.values() for number in numbers)
    assert not any(message_id in journal._old_copies for message_id in slow[:4])

    def read_back(journal):
        for message_id, payload in payloads.items():
            number, offset, length = journal.location(message_id)
            data = journal.segment_path(number).read_bytes()[offset:offset + length]
            records = list(fmt.scan(data, 0, []))
            assert len(records) == 1 and records[0][1] == fmt.ENQUEUE, message_id
            assert data.endswith(payload), message_id

    read_back(journal)
    journal.close()
    merged = []
    settle = where_module.Where.settle
    monkeypatch.setattr(where_module.Where, "settle",
                        lambda self: (merged.append(len(self.extra)), settle(self))[1])
    again = Journal(directory, fsync=False, segment_size=4096)
    recovered = again.open()
    assert sum(merged) >= 1  # out-of-order ids were met (and merged)
    assert not again._where.extra and again.live == len(payloads)
    assert [m for m, _ in recovered.queues["slow"]] == slow
    again.sync()  # (what open relocated into its new segment is written)
    read_back(again)
    for message_id in slow:  # and they go as any other
        again.dequeue(message_id)
    assert again.live == len(payloads) - len(slow) and again.location(slow[0]) is None
    again.close()
