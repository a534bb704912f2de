"""The fedgate command line and config file contract."""

from __future__ import annotations

import subprocess

import pytest
from conftest import PYTHON, ROOT, to_toml

from proxy.config import settings as config_mod
from proxy.config.errors import ConfigError


def fedgate(*args, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "proxy", *args], input=stdin, capture_output=True,
                          cwd=ROOT, timeout=60)


def test_check_config_accepts_the_examples():
    for example in sorted((ROOT / "deploy" / "examples").glob("*.toml")):
        result = fedgate("check-config", str(example))
        assert result.returncode == 0, result.stderr.decode()
        assert b"ok" in result.stdout


@pytest.mark.parametrize("raw, key", [
    ({"node": {"idd": "x"}}, "node.idd"),
    ({"limits": {"max_frame_size": "big"}}, "limits.max_frame_size"),
    ({"limits": {"max_frame_size": 100}}, "limits.max_frame_size"),
    ({"node": {"listen": "nowhere"}}, "node.listen"),
    ({"sasl": {"mechanisms": ["KERBEROS"]}}, "sasl.mechanisms[0]"),
    ({"sasl": {"mechanisms": ["PLAIN"]}}, "sasl.users_file"),
    ({"queues": {"auto_create": "yes"}}, "queues.auto_create"),
    ({"peers": {"n2": "http://x"}}, "peers.n2"),
    ({"bogus": {}}, "bogus"),
    ({"rules": [{"name": "a", "match": "x", "kind": "teleport"}]}, "rules[0].kind"),
])
def test_bad_values_name_the_key(raw, key):
    with pytest.raises(ConfigError) as info:
        config_mod.from_dict(raw)
    assert info.value.key == key


def test_check_config_reports_the_key_and_fails(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text(to_toml({"limits": {"idle_timeuot": 5}}))
    result = fedgate("check-config", str(path))
    assert result.returncode == 2
    assert b"limits.idle_timeuot" in result.stderr


def test_serve_fails_at_start_on_a_bad_config(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text(to_toml({"node": {"colour": "blue"}}))
    result = fedgate("serve", "--config", str(path))
    assert result.returncode == 2 and b"node.colour" in result.stderr


def test_second_node_on_the_same_data_dir_is_refused_without_a_traceback(start_node):
    first = start_node({"queues": {"durable": True}}, name="first")
    data_dir = first.workdir / "data-first"
    result = fedgate("serve", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0",
                     "--data-dir", str(data_dir))
    assert result.returncode == 1
    assert b"is in use by another process" in result.stderr
    assert b"Traceback" not in result.stderr
    assert first.alive()


def test_flags_override_the_file():
    config = config_mod.apply_overrides(
        config_mod.from_dict({"node": {"id": "a", "listen": "127.0.0.1:1"}}),
        listen="127.0.0.1:2", node_id="b", data_dir="d", log_level="debug", admin="127.0.0.1:3",
    )
    assert (config.node.id, config.listen, config.node.data_dir, config.node.log_level) == (
        "b", ("127.0.0.1", 2), "d", "debug")
    assert config.admin_listen == ("127.0.0.1", 3)


def test_users_add_list_remove(tmp_path):
    users = tmp_path / "users.json"
    assert fedgate("users", "add", "bob", "--file", str(users), "--password-stdin",
                   stdin=b"hunter2\n").returncode == 0
    assert b"hunter2" not in users.read_bytes()
    listed = fedgate("users", "list", "--file", str(users))
    assert listed.stdout.split() == [b"bob"]
    assert fedgate("users", "remove", "bob", "--file", str(users)).returncode == 0
    assert fedgate("users", "remove", "bob", "--file", str(users)).returncode == 1


def test_plain_is_offered_only_with_tls_unless_allowed(tmp_path):
    from proxy.node import offered_mechanisms

    plain = {"mechanisms": ["ANONYMOUS", "PLAIN"], "users_file": "u.json"}
    assert offered_mechanisms(config_mod.from_dict({"sasl": plain})) == ("ANONYMOUS",)
    allowed = config_mod.from_dict({"sasl": {**plain, "allow_plain_without_tls": True}})
    assert offered_mechanisms(allowed) == ("ANONYMOUS", "PLAIN")
    with_tls = config_mod.from_dict({"sasl": plain, "tls": {"cert": "c.pem", "key": "k.pem"}})
    assert offered_mechanisms(with_tls) == ("ANONYMOUS", "PLAIN")
