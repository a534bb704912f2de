"""Rolling upgrades (issue #46, docs/upgrades.md): what 0.5.0 wrote is read, what a newer
release wrote is refused with a message naming both versions, and each link uses the
features both sides have.

0.5.0's formats are built here byte by byte from its documentation (its batch header, its
member record, its journal segment header), not with this release's encoders, so a change
of the encoders that breaks them fails here. The replication playbooks run a primary and a
backup on the virtual clock, one side announcing nothing, as 0.5.0 does.
"""

from __future__ import annotations

import json
import struct
import zlib

import pytest
from playbook import World, run

from proxy.cluster.model import Member, member_value, parse_member
from proxy.config import compat
from proxy.config.version import version
from proxy.journal import format as fmt
from proxy.journal.journal import Journal, JournalError
from proxy.replication import events, links

pytestmark = pytest.mark.timeout(60)

RULE = {"name": "orders", "match": "orders.*", "kind": "replicated", "replicas": 2}
PEERS = {"a": "amqp://a:5672", "b": "amqp://b:5672"}


# -- replication batches ------------------------------------------------------------------
def batch_050(epoch: int, number: int, payload: bytes) -> bytes:
    """A batch as 0.5.0 sends it: version 1, one enqueue and one dequeue."""
    head = struct.pack(">BQQI", 1, epoch, number, 2)
    enqueue = struct.pack(">BQI", ord("E"), events.rid(epoch, 1), len(payload)) + payload
    dequeue = struct.pack(">BQ", ord("D"), events.rid(epoch, 0))
    return head + enqueue + dequeue


def test_a_050_batch_is_read_and_this_release_sends_the_same_bytes():
    data = batch_050(3, 7, b"hello")
    batch = events.decode(data)
    assert (batch.epoch, batch.number) == (3, 7)
    assert [(e.kind, e.rid, bytes(e.payload or b"")) for e in batch.events] == [
        (ord("E"), events.rid(3, 1), b"hello"), (ord("D"), events.rid(3, 0), b"")]
    # what a 0.6.0 primary sends a backup that announced nothing: 0.5.0's bytes exactly
    again = [events.Event(ord("E"), events.rid(3, 1), b"hello"),
             events.Event(ord("D"), events.rid(3, 0))]
    assert bytes(events.encode(3, 7, again, compat.batch_version(compat.BASELINE))) == data


def test_a_batch_of_an_unknown_version_is_refused_by_name():
    data = bytearray(batch_050(1, 1, b"x"))
    data[0] = 9
    with pytest.raises(events.BatchError, match="replication batch version 9, this node reads 1"):
        events.decode(bytes(data))


# -- negotiation -----------------------------------------------------------------------------
def test_negotiation_uses_only_what_both_sides_have():
    assert compat.features_of(None) == compat.BASELINE  # 0.5.0 announces nothing
    assert compat.negotiate(compat.FEATURES, compat.features_of(None)) == compat.BASELINE
    assert compat.negotiate(compat.FEATURES, compat.FEATURES) == compat.FEATURES
    # a later release with more: only the common ones
    later = compat.FEATURES | {"replication-batch-2", "something-new"}
    assert compat.negotiate(compat.FEATURES, later) == compat.FEATURES
    assert compat.batch_version(compat.negotiate(compat.FEATURES, later)) == 1
    assert compat.BASELINE <= compat.FEATURES and "wiring" not in compat.BASELINE


def test_a_cluster_wide_feature_waits_for_every_member():
    new = Member("n1", "amqp://n1", None, 1, version(), None, features=tuple(compat.FEATURES))
    old = Member("n2", "amqp://n2", None, 1, "0.5.0", None)  # its record had no features
    static_peer = Member("n3", "amqp://n3", None, 1, "", None)  # not known: not counted
    assert compat.cluster_lacks("wiring", [new, static_peer]) == []
    assert compat.cluster_lacks("wiring", [new, old, static_peer]) == [old]


def test_no_selective_stealing_from_a_member_without_fragment_selectors():
    """0.5.0 refuses a consumer with a selector on a fragmented queue: a 0.6.0 member steals
    from it without selectors only (fragments.selective)."""
    from types import SimpleNamespace

    from fragments.selective import lacks_selectors
    from routing.rules import FragmentMember

    members = [Member("n2", "amqp://n2", None, 1, "0.5.0", None),
               Member("n3", "amqp://n3", None, 1, version(), None,
                      features=tuple(compat.FEATURES))]
    group = SimpleNamespace(
        members={"n2": FragmentMember(peer="n2"), "n3": FragmentMember(peer="n3"),
                 "n1/w1": None},  # a sibling worker: one release with this one
        node=SimpleNamespace(coordinator=SimpleNamespace(members=lambda: members)))
    assert lacks_selectors(group, "n2") is True
    assert lacks_selectors(group, "n3") is False
    assert lacks_selectors(group, "n1/w1") is False
    members[0] = Member("n2", "amqp://n2", None, 1, "", None)  # static: release unknown
    assert lacks_selectors(group, "n2") is False


# -- etcd member records -----------------------------------------------------------------------
def test_a_050_member_record_is_read_and_ours_keeps_its_keys():
    record_050 = json.dumps({"id": "n2", "amqp": "amqp://n2:5672", "admin": None, "workers": 1,
                             "version": "0.5.0", "draining": False,
                             "registered_at": 100.0}).encode()
    member = parse_member(record_050, now=101.0)
    assert (member.id, member.version, member.features) == ("n2", "0.5.0", None)
    assert compat.features_of(member.features) == compat.BASELINE

    ours = Member("n1", "amqp://n1:5672", "http://n1:8080", 2, version(), None,
                  features=tuple(sorted(compat.FEATURES)))
    body = json.loads(member_value(ours, registered_at=50.0))
    # every key 0.5.0's parse_member reads is there as it reads it
    assert {k: body[k] for k in ("id", "amqp", "admin", "workers", "version", "draining",
                                 "registered_at")} == {
        "id": "n1", "amqp": "amqp://n1:5672", "admin": "http://n1:8080", "workers": 2,
        "version": version(), "draining": False, "registered_at": 50.0}
    assert body["format"] == compat.MEMBER_FORMAT
    back = parse_member(member_value(ours, registered_at=50.0), now=51.0)
    assert set(back.features) == compat.FEATURES


# -- the journal -------------------------------------------------------------------------------
def segment_050(number: int, first_id: int, queue: str, payloads: list[bytes]) -> bytes:
    """A journal segment as 0.5.0 wrote it: its 24-byte header, ENQUEUE records."""
    out = b"FGJRNL\x00\x01" + struct.pack("<QQ", number, first_id)
    for offset, payload in enumerate(payloads):
        body = struct.pack("<QH", first_id + offset, len(queue)) + queue.encode() + payload
        prefix = struct.pack("<BBI", 0xA5, 1, len(body))
        crc = zlib.crc32(body, zlib.crc32(prefix))
        out += prefix + struct.pack("<I", crc) + body
    return out


def test_a_050_journal_is_recovered(tmp_path):
    directory = tmp_path / "journal"
    directory.mkdir()
    (directory / fmt.segment_name(1)).write_bytes(segment_050(1, 1, "orders", [b"m1", b"m2"]))
    journal = Journal(directory, fsync=False)
    recovered = journal.open()
    assert [payload for _, payload in recovered.queues["orders"]] == [b"m1", b"m2"]
    assert recovered.corrupt is None and recovered.torn_tail is None
    journal.close()


def test_a_journal_of_a_newer_format_is_refused_not_repaired(tmp_path):
    directory = tmp_path / "journal"
    directory.mkdir()
    newer = bytearray(segment_050(1, 1, "orders", [b"m1"]))
    newer[6:8] = (2).to_bytes(2, "big")  # journal format 2: a later release's
    path = directory / fmt.segment_name(1)
    path.write_bytes(bytes(newer))
    with pytest.raises(JournalError, match="journal format 2.*reads journal formats up to 1"):
        Journal(directory, fsync=False).open()
    assert path.read_bytes() == bytes(newer)  # left as it was, not cut as a damaged segment


# -- the data dir ---------------------------------------------------------------------------------
def test_a_050_data_dir_is_read_and_marked(tmp_path):
    (tmp_path / "rules.json").write_text("{}")  # what 0.5.0 leaves: no marker
    found = compat.check_data_dir(tmp_path)
    assert found == {"data_format": 1, "written_by": "0.5.0", "marked": False}
    marker = json.loads((tmp_path / compat.FORMAT_FILE).read_text())
    assert marker == {"data_format": compat.DATA_FORMAT, "written_by": version()}
    assert compat.check_data_dir(tmp_path)["written_by"] == version()


def test_a_data_dir_of_a_newer_format_is_refused_naming_both_versions(tmp_path):
    (tmp_path / compat.FORMAT_FILE).write_text(
        json.dumps({"data_format": 2, "written_by": "0.7.0"}))
    with pytest.raises(compat.DataDirRefused) as refused:
        compat.check_data_dir(tmp_path)
    text = str(refused.value)
    assert "written by fedgate 0.7.0 (data format 2)" in text
    assert f"this is fedgate {version()}" in text and "downgrade is refused" in text
    # the marker is left as it was
    assert json.loads((tmp_path / compat.FORMAT_FILE).read_text())["written_by"] == "0.7.0"


def test_a_data_dir_a_newer_release_wrote_in_the_same_format_is_read(tmp_path):
    (tmp_path / compat.FORMAT_FILE).write_text(
        json.dumps({"data_format": compat.DATA_FORMAT, "written_by": "0.6.9"}))
    assert compat.check_data_dir(tmp_path)["written_by"] == "0.6.9"


# -- worker channels -------------------------------------------------------------------------------
def test_a_worker_runs_only_under_a_supervisor_of_its_release():
    assert compat.worker_release_problem({compat.SUPERVISOR_VERSION: version()}) is None
    problem = compat.worker_release_problem({})
    assert f"fedgate {version()}" in problem and "older than 0.6.0" in problem
    problem = compat.worker_release_problem({compat.SUPERVISOR_VERSION: "0.7.0"})
    assert "supervisor fedgate 0.7.0" in problem


# -- the replication link, on the virtual clock -------------------------------------------------------
def service(node):
    return next(s for s in node.services if type(s).__name__ == "ReplicationService")


def view(node, address: str) -> dict:
    return next((item for item in service(node).describe() if item["address"] == address), {})


def pushers(node, address: str) -> list:
    copy = service(node).entries["queue/" + address].primary
    return list(copy.pushers.values())


def real_properties(link, properties: dict) -> None:
    """0.5.0's attach: the properties it always sent, nothing more."""
    data = links.Data(links.engine._lib.pn_link_properties(link._impl))
    data.clear()
    data.put_object(properties)


async def replicate(world: World, nodes: dict, address: str, count: int) -> tuple[str, str]:
    """a is the preferred primary; ``count`` messages accepted (so the backup holds them)."""
    primary = service(nodes["a"]).placement(
        address, service(nodes["a"]).entry(address, nodes["a"].routing.resolve(address).rule)
        .settings)[0]
    backup = "b" if primary == "a" else "a"
    producer = await world.client(primary, "producer")
    sender = producer.sender(address)
    await world.until(lambda: view(nodes[primary], address).get("role") == "primary",
                      what="a primary")
    await world.until(lambda: len(view(nodes[primary], address).get("in_sync", [])) == 1,
                      what="the backup in sync")
    await world.until(lambda: sender.credit > 0, what="credit")
    for i in range(count):
        sender.send(f"m{i}", message_id=i)
    await world.until(lambda: sender.accepted() == count, what="accepted with the backup")
    return primary, backup


@pytest.mark.parametrize("silent", ["backup", "primary", "neither"])
def test_a_replication_link_with_a_side_that_announces_nothing_uses_050s_batches(
        tmp_path, monkeypatch, silent):
    """One side announces nothing on the replication link (as 0.5.0): the other takes it for
    0.5.0, the primary sends version-1 batches, and the backup holds every message."""
    async def play():
        world = World(tmp_path)
        nodes = {n: await world.node(n, peers=PEERS, rules=[RULE]) for n in "ab"}
        # the nodes share this process: the silent role's attaches go without the announcement
        # (the backup's answer is ``copies.announce``, the primary's attach ``links.announce``)
        if silent == "backup":
            monkeypatch.setattr("proxy.replication.copies.announce", lambda link: None)
        elif silent == "primary":
            real = links.announce
            monkeypatch.setattr("proxy.replication.copies.announce", lambda link: real(link))
            monkeypatch.setattr(links, "announce", lambda link, properties: real_properties(
                link, properties))
        primary, backup = await replicate(world, nodes, "orders.x", 5)
        assert view(nodes[backup], "orders.x")["copy"]["depth"] == 5
        (pusher,) = pushers(nodes[primary], "orders.x")
        if silent == "backup":
            assert pusher.peer_version == compat.PREVIOUS
            assert pusher.features == compat.BASELINE
        else:
            assert pusher.peer_version == version()
            assert pusher.features == compat.FEATURES
        assert pusher.batch_version == 1
        # what the primary's admin view says of its backup
        assert view(nodes[primary], "orders.x")["backups"][0]["version"] == pusher.peer_version
        await world.close()

    run(play)
