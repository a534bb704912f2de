"""The durable-queue journal on its own: round trip, recovery, torn and corrupt records, cleaning.

Recovery is always checked against what a user would expect: the set of
messages enqueued and not dequeued, per queue, in the order they were
journaled. A "crash" is a copy of the journal directory taken after
``sync()`` while the journal is still open (no graceful close).
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import threading
from pathlib import Path

import pytest
from proton import Message

from proxy.journal import format as fmt
from proxy.journal.journal import Journal, JournalError
from proxy.queues.durable import header_durable


def open_journal(directory: Path, **options) -> tuple[Journal, dict]:
    options.setdefault("fsync", False)
    journal = Journal(directory, **options)
    recovered = journal.open()
    return journal, recovered


def live_set(recovered) -> dict[str, list[bytes]]:
    return {queue: [payload for _, payload in messages]
            for queue, messages in recovered.queues.items() if messages}


def recover_copy(source: Path, target: Path, **options):
    """Recover a copy of a journal directory (the original stays untouched)."""
    shutil.copytree(source, target)
    journal, recovered = open_journal(target, **options)
    journal.close()
    return recovered


def segment_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if fmt.segment_number(p.name) is not None)


def record_offsets(path: Path) -> list[tuple[int, int]]:
    """(offset, end) of every record in a segment file."""
    data = path.read_bytes()
    return [(offset, end) for offset, _, _, end in fmt.scan(data)]


class Model:
    """What the journal should hold: queue -> {message id: payload}, in id order."""

    def __init__(self) -> None:
        self.queues: dict[str, dict[int, bytes]] = {}
        self.where: dict[int, str] = {}

    def enqueue(self, journal: Journal, queue: str, payload: bytes) -> int:
        message_id, _ = journal.enqueue(queue, payload)
        self.queues.setdefault(queue, {})[message_id] = payload
        self.where[message_id] = queue
        return message_id

    def dequeue(self, journal: Journal, message_id: int) -> None:
        journal.dequeue(message_id)
        del self.queues[self.where.pop(message_id)][message_id]

    def expected(self) -> dict[str, list[bytes]]:
        return {queue: [messages[i] for i in sorted(messages)]
                for queue, messages in self.queues.items() if messages}


# -- round trip ---------------------------------------------------------------------
def test_round_trip_two_queues(tmp_path):
    journal, recovered = open_journal(tmp_path / "j")
    assert recovered.messages == 0 and recovered.queues == {}
    model = Model()
    payloads = [b"", b"x" * 100_000, bytes(range(256))] + [f"m{i}".encode() for i in range(50)]
    ids = [model.enqueue(journal, "orders" if i % 2 else "réservé.q", p)
           for i, p in enumerate(payloads)]
    for message_id in ids[::3]:
        model.dequeue(journal, message_id)
    journal.close()

    again, recovered = open_journal(tmp_path / "j")
    assert live_set(recovered) == model.expected()
    assert recovered.torn_tail is None and recovered.corrupt is None
    # message ids keep going up after a restart
    new_id, _ = again.enqueue("orders", b"after restart")
    assert new_id > max(ids)
    again.close()


def test_dequeue_of_unknown_id_is_ignored(tmp_path):
    journal, _ = open_journal(tmp_path / "j")
    kept, _ = journal.enqueue("q", b"kept")
    journal.dequeue(kept + 1000)
    journal.dequeue(kept)
    journal.dequeue(kept)  # twice: still one dequeue
    assert journal.stats.dequeued == 1
    journal.close()
    assert live_set(recover_copy(tmp_path / "j", tmp_path / "copy")) == {}


def test_enqueue_after_close_is_refused(tmp_path):
    journal, _ = open_journal(tmp_path / "j")
    journal.close()
    with pytest.raises(JournalError):
        journal.enqueue("q", b"late")


# -- recovery of exactly the live set -------------------------------------------
def test_recovery_matches_model_over_crashes_and_restarts(tmp_path):
    """Random enqueues/dequeues over many small segments; a crash copy after each sync."""
    rng = random.Random(7)
    directory = tmp_path / "j"
    model = Model()
    crash = 0
    for restart in range(4):
        journal, recovered = open_journal(directory, segment_size=4096)
        assert live_set(recovered) == model.expected(), f"after restart {restart}"
        for step in range(6):
            for _ in range(rng.randrange(50, 300)):
                live = list(model.where)
                if live and rng.random() < 0.45:
                    # mostly the oldest (a queue), sometimes any (competing consumers)
                    victim = live[0] if rng.random() < 0.7 else rng.choice(live)
                    model.dequeue(journal, victim)
                else:
                    queue = rng.choice(["a", "b", "c"])
                    model.enqueue(journal, queue, os.urandom(rng.randrange(0, 300)))
            journal.sync()
            crash += 1
            recovered = recover_copy(directory, tmp_path / f"crash{crash}", segment_size=4096)
            assert live_set(recovered) == model.expected(), f"crash copy {crash}"
            assert recovered.torn_tail is None and recovered.corrupt is None
        if restart % 2:
            journal.close()
        else:  # go on from a crash copy: what a SIGKILL would leave after sync()
            journal.sync()
            crashed = tmp_path / f"killed{restart}"
            shutil.copytree(directory, crashed)
            journal.close()
            directory = crashed
    assert journal.stats.segments_deleted > 0, "the cleaner ran"


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_recovery_with_mixed_lifetimes_over_crashes(tmp_path, seed):
    """Most messages die young, a few live long: the cleaner deletes and relocates a lot."""
    rng = random.Random(seed)
    directory = tmp_path / "j"
    journal, _ = open_journal(directory, segment_size=4096)
    model = Model()
    due: dict[int, list[int]] = {}
    for tick in range(150):
        for _ in range(rng.randrange(1, 12)):
            payload = os.urandom(rng.randrange(20, 200))
            message_id = model.enqueue(journal, rng.choice("ab"), payload)
            lifetime = rng.choice([1, 1, 2, 3, 5, 40, 400])
            due.setdefault(tick + lifetime, []).append(message_id)
        for message_id in due.pop(tick, []):
            model.dequeue(journal, message_id)
        journal.sync()
        if tick % 5 == 0:
            recovered = recover_copy(directory, tmp_path / f"crash{tick}", segment_size=4096)
            assert live_set(recovered) == model.expected(), f"tick {tick}"
            shutil.rmtree(tmp_path / f"crash{tick}")
    assert journal.stats.relocated > 0 and journal.stats.segments_deleted > 0
    journal.close()


def test_recovered_order_is_enqueue_order(tmp_path):
    journal, _ = open_journal(tmp_path / "j", segment_size=4096)
    ids = [journal.enqueue("q", f"{i:04d}".encode())[0] for i in range(400)]
    for message_id in ids[:-1:2]:
        journal.dequeue(message_id)
    journal.close()
    recovered = recover_copy(tmp_path / "j", tmp_path / "c")
    assert [p for _, p in recovered.queues["q"]] == [f"{i:04d}".encode() for i in range(1, 400, 2)]


# -- torn tails -------------------------------------------------------------------
@pytest.mark.parametrize("last", ["enqueue", "dequeue"])
def test_torn_tail_at_every_byte_of_the_last_record(tmp_path, last):
    directory = tmp_path / "j"
    journal, _ = open_journal(directory)
    model = Model()
    ids = [model.enqueue(journal, "q", f"message {i}".encode()) for i in range(20)]
    model.dequeue(journal, ids[3])
    journal.sync()
    expected_before = model.expected()
    (path,) = segment_files(directory)
    start = path.stat().st_size
    if last == "enqueue":
        model.enqueue(journal, "q", b"the last one " * 5)
    else:
        model.dequeue(journal, ids[0])
    journal.close()
    end = path.stat().st_size
    assert end > start
    assert record_offsets(path)[-1] == (start, end)

    whole = recover_copy(directory, tmp_path / "whole")
    assert live_set(whole) == model.expected() and whole.torn_tail is None

    for cut in range(start, end):
        copy = tmp_path / f"cut{cut}"
        shutil.copytree(directory, copy)
        os.truncate(copy / path.name, cut)
        journal, recovered = open_journal(copy)
        assert live_set(recovered) == expected_before, f"cut at {cut}"
        assert recovered.corrupt is None
        assert (recovered.torn_tail is not None) == (cut > start), f"cut at {cut}"
        assert (copy / path.name).stat().st_size == start, "torn bytes truncated away"
        # the journal goes on: later records survive the next recovery
        journal.enqueue("q", b"after repair")
        journal.close()
        again = recover_copy(copy, tmp_path / f"again{cut}")
        assert live_set(again)["q"] == expected_before["q"] + [b"after repair"]
        assert again.torn_tail is None and again.corrupt is None
        shutil.rmtree(copy)
        shutil.rmtree(tmp_path / f"again{cut}")


def test_zero_filled_tail_is_torn(tmp_path):
    """A crash can leave the file longer than what was written, filled with zeros."""
    directory = tmp_path / "j"
    journal, _ = open_journal(directory)
    for i in range(5):
        journal.enqueue("q", f"m{i}".encode())
    journal.close()
    (path,) = segment_files(directory)
    offset, end = record_offsets(path)[-1]
    with open(path, "r+b") as handle:
        handle.seek(offset)
        handle.write(b"\0" * (end - offset) + b"\0" * 4096)
    recovered = recover_copy(directory, tmp_path / "c")
    assert live_set(recovered) == {"q": [b"m0", b"m1", b"m2", b"m3"]}
    assert recovered.torn_tail and recovered.corrupt is None


def test_half_created_last_segment_is_dropped(tmp_path):
    directory = tmp_path / "j"
    journal, _ = open_journal(directory)
    journal.enqueue("q", b"kept")
    journal.close()
    last = segment_files(directory)[-1]
    number = fmt.segment_number(last.name) + 1
    (directory / fmt.segment_name(number)).write_bytes(fmt.FILE_MAGIC[:5])  # crash mid-header
    recovered = recover_copy(directory, tmp_path / "c")
    assert live_set(recovered) == {"q": [b"kept"]}
    assert recovered.torn_tail is not None and recovered.corrupt is None


# -- corruption in the middle -------------------------------------------------------
def test_corrupt_checksum_in_the_middle_stops_recovery_there(tmp_path):
    """Documented choice: nothing after a damaged record is applied, later segments
    are quarantined, and the journal goes on from the record before it."""
    directory = tmp_path / "j"
    journal, _ = open_journal(directory, segment_size=4096)
    payloads = [f"message {i:03d} ".encode() * 4 for i in range(300)]
    for payload in payloads:
        journal.enqueue("q", payload)
    journal.close()
    files = segment_files(directory)
    assert len(files) >= 4
    victim = files[1]
    offsets = record_offsets(victim)
    offset, end = offsets[len(offsets) // 2]
    data = bytearray(victim.read_bytes())
    data[end - 3] ^= 0xFF  # one flipped bit pattern inside the body
    victim.write_bytes(bytes(data))
    before = sum(len(record_offsets(f)) for f in files[:1]) + len(offsets) // 2

    copy = tmp_path / "c"
    shutil.copytree(directory, copy)
    journal, recovered = open_journal(copy, segment_size=4096)
    assert live_set(recovered) == {"q": payloads[:before]}
    assert recovered.corrupt is not None and "checksum" in recovered.corrupt
    assert recovered.torn_tail is None
    assert recovered.quarantined == [f.name for f in files[2:]]
    quarantine = [p for p in copy.iterdir() if p.is_dir() and p.name.startswith("quarantine-")]
    assert len(quarantine) == 1 and sorted(p.name for p in quarantine[0].iterdir()) == \
        [f.name for f in files[2:]]
    journal.enqueue("q", b"after repair")
    journal.close()
    again = recover_copy(copy, tmp_path / "again")
    assert live_set(again) == {"q": payloads[:before] + [b"after repair"]}
    assert again.corrupt is None


def test_corrupt_segment_header_sets_the_rest_aside(tmp_path):
    directory = tmp_path / "j"
    journal, _ = open_journal(directory, segment_size=4096)
    payloads = [f"m{i:03d}".encode() * 20 for i in range(200)]
    for payload in payloads:
        journal.enqueue("q", payload)
    journal.close()
    files = segment_files(directory)
    first_count = len(record_offsets(files[0]))
    data = bytearray(files[1].read_bytes())
    data[0] ^= 0xFF
    files[1].write_bytes(bytes(data))
    recovered = recover_copy(directory, tmp_path / "c", segment_size=4096)
    assert live_set(recovered) == {"q": payloads[:first_count]}
    assert recovered.corrupt is not None
    assert recovered.quarantined == [f.name for f in files[1:]]


# -- cleaning ------------------------------------------------------------------------
def test_cleaner_deletes_dead_segments_and_recovery_is_the_same(tmp_path):
    directory = tmp_path / "j"
    journal, _ = open_journal(directory, segment_size=4096)
    model = Model()
    ids = [model.enqueue(journal, "q", os.urandom(100)) for i in range(600)]
    journal.sync()
    full = len(segment_files(directory))
    assert full >= 15
    for message_id in ids[:-5]:
        model.dequeue(journal, message_id)
    journal.sync()
    files = segment_files(directory)
    assert len(files) <= 3, [f.name for f in files]
    assert journal.segment_count == len(files)
    assert journal.stats.segments_deleted >= full - 3
    crash = recover_copy(directory, tmp_path / "crash", segment_size=4096)
    assert live_set(crash) == model.expected() and len(model.expected()["q"]) == 5
    journal.close()
    assert live_set(recover_copy(directory, tmp_path / "closed")) == model.expected()


def test_long_lived_message_does_not_pin_the_journal(tmp_path):
    """Its record is copied out of a sparse segment, so the old segments can go."""
    directory = tmp_path / "j"
    journal, _ = open_journal(directory, segment_size=4096)
    keeper, _ = journal.enqueue("slow", b"keep me")
    for round_ in range(60):
        ids = [journal.enqueue("fast", os.urandom(200))[0] for _ in range(10)]
        for message_id in ids:
            journal.dequeue(message_id)
        journal.sync()
    files = segment_files(directory)
    assert journal.stats.relocated >= 1
    assert len(files) <= 4, [f.name for f in files]
    recovered = recover_copy(directory, tmp_path / "crash", segment_size=4096)
    assert live_set(recovered) == {"slow": [b"keep me"]}
    assert recovered.queues["slow"][0][0] == keeper, "same message id after relocation"
    journal.dequeue(keeper)
    journal.close()
    assert live_set(recover_copy(directory, tmp_path / "closed")) == {}


def test_dequeue_of_a_relocated_message_outlives_its_old_copy(tmp_path):
    """The old copy's segment is pinned (its own dequeues point into a live segment):
    the segment holding the relocated message's dequeue must not go before it."""
    directory = tmp_path / "j"
    journal, _ = open_journal(directory, segment_size=4096)
    model = Model()
    # 18 records of 225 bytes after the 24-byte file header: 22 bytes left in segment 1
    backlog = [model.enqueue(journal, "backlog", os.urandom(198)) for _ in range(18)]
    journal.sync()
    assert len(segment_files(directory)) == 1  # a dense segment of live messages
    slow = model.enqueue(journal, "slow", b"slow one")  # rolls: first in the next segment
    model.dequeue(journal, backlog[0])  # that segment now points into the dense one
    journal.sync()

    def churn(rounds):
        for _ in range(rounds):
            for message_id in [model.enqueue(journal, "fast", os.urandom(180)) for _ in range(5)]:
                model.dequeue(journal, message_id)
            journal.sync()

    churn(12)  # two more segments: the slow one's old segment is sparse, it is relocated
    assert journal.stats.relocated >= 1
    model.dequeue(journal, slow)
    journal.sync()
    churn(20)
    recovered = recover_copy(directory, tmp_path / "crash", segment_size=4096)
    assert live_set(recovered) == model.expected()
    assert "slow" not in live_set(recovered)
    # the dense backlog segment does not pin the segments written after it
    assert len(segment_files(directory)) <= 3, [f.name for f in segment_files(directory)]
    assert journal.stats.carried >= 1
    journal.close()


def test_relocation_then_crash_before_the_old_segment_is_gone(tmp_path):
    """Both copies on disk at once: recovered once, dequeued once."""
    directory = tmp_path / "j"
    journal, _ = open_journal(directory, segment_size=4096)
    model = Model()
    model.enqueue(journal, "slow", b"one")
    model.enqueue(journal, "slow", b"two")
    for _ in range(40):
        for message_id in [model.enqueue(journal, "fast", os.urandom(150)) for _ in range(5)]:
            model.dequeue(journal, message_id)
        journal.sync()
        recovered = recover_copy(directory, tmp_path / f"c{_}", segment_size=4096)
        assert live_set(recovered) == model.expected()
    assert journal.stats.relocated >= 2
    journal.close()


# -- group commit and the event loop ------------------------------------------------------
def test_group_commit_reports_on_the_loop_without_blocking_it(tmp_path):
    async def main():
        loop = asyncio.get_running_loop()
        journal = Journal(tmp_path / "j", fsync=True, loop=loop)
        journal.open()
        durable = loop.create_future()
        seen = []

        class Waiter:
            def journal_progress(self, batch, error):
                seen.append((batch, error, threading.get_ident()))
                if batch >= last_batch and not durable.done():
                    durable.set_result(batch)
                return batch < last_batch

        journal.wait(Waiter())
        last_batch = 0
        for chunk in range(20):
            for i in range(100):
                _, last_batch = journal.enqueue("q", b"m" * 64)
            assert journal.durable_batch < last_batch, "enqueue does not wait for the disk"
            await asyncio.sleep(0)  # one loop iteration: one hand-off to the writer
        await asyncio.wait_for(durable, 10)
        assert all(error is None and thread == threading.get_ident() for _, error, thread in seen)
        writes = journal._writer.writes
        journal.close()
        return writes

    writes = asyncio.run(main())
    assert writes < 2000 / 50, f"{writes} fsyncs for 2000 records: group commit expected"


def test_records_written_meanwhile_share_one_fsync(tmp_path):
    journal, _ = open_journal(tmp_path / "j", fsync=True, batch_delay=0.05)
    for _ in range(5000):
        journal.enqueue("q", b"x" * 32)
    journal.sync()
    assert journal._writer.writes <= 6  # the open's segment + a few 1024-record hand-offs
    journal.close()


# -- the durable header check ------------------------------------------------------------
@pytest.mark.parametrize("message,durable", [
    (Message(body="x", durable=True), True),
    (Message(body="x", durable=True, priority=9, ttl=5000, delivery_count=3), True),
    (Message(body="x", durable=False, priority=9), False),
    (Message(body="x"), False),
    (Message(body="x", properties={"durable": True}), False),
])
def test_header_durable_from_proton_encodings(message, durable):
    assert header_durable(bytes(message.encode())) is durable


@pytest.mark.parametrize("raw,durable", [
    (b"\x00\x53\x70\xc0\x02\x01\x41", True),  # list8, true
    (b"\x00\x53\x70\xc0\x03\x01\x56\x01", True),  # boolean 0x56 0x01
    (b"\x00\x53\x70\xc0\x03\x01\x56\x00", False),
    (b"\x00\x53\x70\xd0\x00\x00\x00\x05\x00\x00\x00\x01\x41", True),  # list32
    (b"\x00\x80" + (0x70).to_bytes(8, "big") + b"\xc0\x02\x01\x41", True),  # long descriptor
    (b"\x00\x53\x70\x45", False),  # list0
    (b"\x00\x53\x70\xc0\x01\x00", False),  # no fields
    (b"\x00\x53\x70\xc0", False),  # cut short
    (b"\x00\x53\x73\xc0\x02\x01\x41", False),  # properties, not header
    (b"", False),
])
def test_header_durable_byte_level(raw, durable):
    assert header_durable(raw) is durable


def test_one_process_per_journal(tmp_path):
    journal, _ = open_journal(tmp_path / "j")
    with pytest.raises(JournalError, match="in use"):
        Journal(tmp_path / "j").open()
    journal.close()
    again, _ = open_journal(tmp_path / "j")  # free again once closed
    again.close()


def test_queue_name_too_long_for_the_journal(tmp_path):
    journal, _ = open_journal(tmp_path / "j")
    with pytest.raises(JournalError, match="queue name"):
        journal.enqueue("q" * 70000, b"x")
    journal.enqueue("q" * 65535, b"x")
    journal.close()
