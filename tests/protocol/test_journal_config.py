"""Durable-queue configuration: keys, bad values by name, and what a node opens at start."""

from __future__ import annotations

import asyncio

import pytest

from proxy.config import settings as config_mod
from proxy.config.errors import ConfigError
from proxy.journal.journal import Journal
from proxy.node import Node


def node_config(tmp_path, **sections) -> config_mod.Config:
    raw = {"node": {"data_dir": str(tmp_path / "data"), "listen": "127.0.0.1:0"}}
    raw.update(sections)
    return config_mod.from_dict(raw)


def test_journal_defaults_and_keys(tmp_path):
    config = node_config(tmp_path)
    assert (config.queues.durable, config.journal.fsync) == (False, True)
    assert config.journal.segment_size == 64 * 1024 * 1024 and config.journal.batch_delay == 0.0
    config = node_config(tmp_path, queues={"durable": True},
                         journal={"fsync": False, "segment_size": 1 << 20, "batch_delay": 0.002},
                         queue=[{"name": "a", "durable": False}, {"name": "b"}])
    assert config.queues.durable and not config.journal.fsync
    assert [q.durable for q in config.queue] == [False, None]


@pytest.mark.parametrize("sections,key", [
    ({"journal": {"segment_size": 100}}, "journal.segment_size"),
    ({"journal": {"segment_size": 2 ** 31}}, "journal.segment_size"),
    ({"journal": {"fsync": "yes"}}, "journal.fsync"),
    ({"journal": {"batch_delay": -1}}, "journal.batch_delay"),
    ({"journal": {"group_commit": True}}, "journal.group_commit"),
    ({"queues": {"durable": 1}}, "queues.durable"),
    ({"queue": [{"name": "q", "durable": "true"}]}, "queue[0].durable"),
])
def test_bad_journal_settings_fail_naming_the_key(tmp_path, sections, key):
    with pytest.raises(ConfigError) as error:
        node_config(tmp_path, **sections)
    assert error.value.key == key


async def started(config: config_mod.Config) -> dict:
    node = Node(config)
    await node.start()
    try:
        return {
            "journal": node.broker.journal is not None,
            "queues": {name: (queue.durable, [m.payload for m in queue.messages])
                       for name, queue in node.queues.queues.items()},
        }
    finally:
        await node.stop()


def test_no_durable_queue_no_journal(tmp_path):
    state = asyncio.run(started(node_config(tmp_path)))
    assert state["journal"] is False
    assert not (tmp_path / "data" / "journal").exists()


def test_declared_durable_queue_opens_the_journal(tmp_path):
    config = node_config(tmp_path, queue=[{"name": "orders", "durable": True}, {"name": "other"}])
    state = asyncio.run(started(config))
    assert state["journal"] is True
    assert state["queues"] == {"orders": (True, []), "other": (False, [])}


def test_journaled_messages_come_back_even_after_durable_is_switched_off(tmp_path):
    journal = Journal(tmp_path / "data" / "journal", fsync=False)
    journal.open()
    for n in range(3):
        journal.enqueue("left.over", f"m{n}".encode())
    journal.close()
    config = node_config(tmp_path, queues={"auto_create": False})
    state = asyncio.run(started(config))
    assert state["journal"] is True
    assert state["queues"]["left.over"] == (False, [b"m0", b"m1", b"m2"])
