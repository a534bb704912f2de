"""A transaction's commit in the journal: one TXN record, recovered whole or not at all.

As in ``test_journal.py``, a "crash" is a copy of the journal directory taken
while the journal is open, and recovery is checked against what a user would
expect: per queue, the messages enqueued (by plain records or by commits) and
not dequeued, in journal order.
"""

from __future__ import annotations

import os
import random
import shutil

import pytest

from proxy.journal import format as fmt
from test_journal import Model, live_set, open_journal, record_offsets, recover_copy, segment_files


def commit(journal, model: Model, enqueues: list[tuple[str, bytes]], dequeues: list[int]) -> list[int]:
    """``journal.commit`` and the same change in the model."""
    ids, _ = journal.commit(enqueues, dequeues)
    for message_id, (queue, payload) in zip(ids, enqueues):
        model.queues.setdefault(queue, {})[message_id] = payload
        model.where[message_id] = queue
    for message_id in dequeues:
        del model.queues[model.where.pop(message_id)][message_id]
    return ids


def test_a_commit_round_trips_with_its_enqueues_and_dequeues(tmp_path):
    directory = tmp_path / "j"
    journal, _ = open_journal(directory)
    model = Model()
    before = [model.enqueue(journal, "orders", f"o{i}".encode()) for i in range(4)]
    commit(journal, model, [("orders", b"t1"), ("audit", b"t1-audit"), ("orders", b"t2")],
           [before[0], before[2]])
    journal.sync()
    recovered = recover_copy(directory, tmp_path / "crash")
    assert live_set(recovered) == {"orders": [b"o1", b"o3", b"t1", b"t2"], "audit": [b"t1-audit"]}
    assert live_set(recovered) == model.expected()
    # one TXN record for the whole commit, after the four plain enqueues
    kinds = [rtype for _, rtype, _, _ in fmt.scan(segment_files(directory)[-1].read_bytes())]
    assert kinds == [fmt.ENQUEUE] * 4 + [fmt.TXN]
    journal.close()


def test_a_commit_of_unknown_ids_only_writes_nothing(tmp_path):
    journal, _ = open_journal(tmp_path / "j")
    ids, batch = journal.commit([], [12345])
    assert ids == [] and batch == journal.durable_batch
    journal.close()


def test_torn_tail_at_every_byte_of_a_commit_leaves_none_of_it(tmp_path):
    directory = tmp_path / "j"
    journal, _ = open_journal(directory)
    model = Model()
    ids = [model.enqueue(journal, "q", f"message {i}".encode()) for i in range(10)]
    journal.sync()
    expected_before = model.expected()
    (path,) = segment_files(directory)
    start = path.stat().st_size
    commit(journal, model, [("q", b"tx-a" * 20), ("other", b"tx-b" * 20)], [ids[1], ids[5]])
    journal.close()
    end = path.stat().st_size
    assert record_offsets(path)[-1] == (start, end)
    whole = recover_copy(directory, tmp_path / "whole")
    assert live_set(whole) == model.expected() and whole.torn_tail is None

    for cut in range(start, end):
        copy = tmp_path / f"cut{cut}"
        shutil.copytree(directory, copy)
        os.truncate(copy / path.name, cut)
        journal, recovered = open_journal(copy)
        # nothing of the transaction: no enqueue of it, and both dequeued messages still there
        assert live_set(recovered) == expected_before, f"cut at {cut}"
        assert recovered.corrupt is None
        assert (recovered.torn_tail is not None) == (cut > start), f"cut at {cut}"
        journal.close()
        shutil.rmtree(copy)


def test_a_damaged_nested_record_drops_the_whole_commit(tmp_path):
    """A TXN record whose own checksum is right but whose content is not records (a bug, not a
    crash) is corruption: none of it is applied, neither the enqueue before the bad part."""
    directory = tmp_path / "j"
    journal, _ = open_journal(directory)
    journal.enqueue("q", b"kept")
    journal.close()
    (path,) = segment_files(directory)
    good = fmt.encode_enqueue(99, b"q", b"must not appear")
    bad = fmt.encode_transaction([good, b"\xa5\x02\x03\x00\x00\x00garbage"])
    with open(path, "ab") as handle:
        handle.write(bad + fmt.encode_enqueue(100, b"q", b"after"))
    recovered = recover_copy(directory, tmp_path / "c")
    assert live_set(recovered) == {"q": [b"kept"]}
    assert recovered.corrupt is not None and "transaction" in recovered.corrupt


def test_committed_messages_relocated_and_dequeued_survive_crashes(tmp_path):
    """Small segments and churn: a committed message's nested record is copied out of its
    sparse segment like a plain one; the commit's dequeues keep pointing into older segments."""
    directory = tmp_path / "j"
    journal, _ = open_journal(directory, segment_size=4096)
    model = Model()
    backlog = [model.enqueue(journal, "backlog", os.urandom(150)) for _ in range(3)]
    slow = commit(journal, model, [("slow", b"committed one"), ("slow", b"committed two")],
                  [backlog[0], backlog[1]])
    journal.sync()
    for round_ in range(40):
        fast = commit(journal, model, [("fast", os.urandom(120)) for _ in range(4)], [])
        commit(journal, model, [], fast)
        journal.sync()
        if round_ % 8 == 0:
            recovered = recover_copy(directory, tmp_path / f"c{round_}", segment_size=4096)
            assert live_set(recovered) == model.expected()
    assert journal.stats.relocated >= 1
    commit(journal, model, [], [slow[0]])
    journal.sync()
    recovered = recover_copy(directory, tmp_path / "end", segment_size=4096)
    assert live_set(recovered) == model.expected()
    assert live_set(recovered)["slow"] == [b"committed two"]
    assert len(segment_files(directory)) <= 4
    journal.close()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_commits_and_plain_records_over_crashes(tmp_path, seed):
    rng = random.Random(seed)
    directory = tmp_path / "j"
    journal, _ = open_journal(directory, segment_size=8192)
    model = Model()
    for step in range(300):
        live = [i for messages in model.queues.values() for i in messages]
        roll = rng.random()
        if roll < 0.3:
            model.enqueue(journal, rng.choice("ab"), os.urandom(rng.randint(1, 200)))
        elif roll < 0.5 and live:
            model.dequeue(journal, rng.choice(live))
        else:
            enqueues = [(rng.choice("abc"), os.urandom(rng.randint(1, 200)))
                        for _ in range(rng.randint(0, 5))]
            dequeues = rng.sample(live, min(len(live), rng.randint(0, 4)))
            commit(journal, model, enqueues, dequeues)
        if step % 50 == 49:
            journal.sync()
            recovered = recover_copy(directory, tmp_path / f"crash{step}", segment_size=8192)
            assert live_set(recovered) == model.expected(), f"step {step}"
    journal.close()
    again = recover_copy(directory, tmp_path / "closed", segment_size=8192)
    assert live_set(again) == model.expected()
