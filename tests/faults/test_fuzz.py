"""Fuzzing a live node with malformed AMQP and SASL frames (see tests/fuzz/).

The short run (5,000 cases) is part of ``make test``; ``make fuzz`` runs the
long one (``fuzz_long``: 100,000 cases by default). ``FUZZ_SEED`` and
``FUZZ_CASES`` override the seed and the long run's size; a failure names
the seed, so a run can be repeated byte for byte.

Passing means: the node process is alive, its log has no traceback (every
unexpected exception is logged with one, see proxy/server.py), no connection
was left hanging after its stream, a canary client kept sending and
receiving between batches, and resident memory grew by less than a bound.
"""

from __future__ import annotations

import os
import subprocess

import pytest
from conftest import PYTHON, ROOT, NodeProcess
from fuzz import runner

SHORT_CASES = 5_000
LONG_CASES = int(os.environ.get("FUZZ_CASES", "100000"))
RSS_GROWTH_BOUND_KIB = 64 * 1024


@pytest.fixture
def fuzz_node(tmp_path):
    users = tmp_path / "users.json"
    subprocess.run([PYTHON, "-m", "proxy", "users", "add", "alice", "--file", str(users),
                    "--password-stdin"], input=b"secret\n", check=True, cwd=ROOT, capture_output=True)
    node = NodeProcess(tmp_path, {
        "node": {"log_level": "warning"},
        "sasl": {"mechanisms": ["ANONYMOUS", "PLAIN", "SCRAM-SHA-256"], "users_file": str(users),
                 "allow_plain_without_tls": True},
        "limits": {"handshake_timeout": 2.0, "max_frame_size": 16384, "max_message_size": 100_000,
                   "idle_timeout": 120.0},  # the canary is idle while a batch runs
        "queues": {"auto_create": False},
        "queue": [{"name": "fuzz", "max_depth": 200}, {"name": "canary"}],
        "acl": [{"user": "anonymous", "send": ["fuzz", "canary"], "receive": ["fuzz", "canary"],
                 "dynamic": True}],
    }).start()
    yield node
    node.stop()


@pytest.fixture
def token_fuzz_node(tmp_path):
    """[oauth] with a JWKS issuer (keys made per run): PLAIN and OAUTHBEARER take tokens; the
    canary stays ANONYMOUS."""
    from oauth_issuer import Issuer

    issuer = Issuer().serve()
    node = NodeProcess(tmp_path, {
        "node": {"log_level": "warning"},
        "sasl": {"mechanisms": ["ANONYMOUS", "PLAIN", "OAUTHBEARER"], "allow_plain_without_tls": True},
        "oauth": {"issuer": issuer.issuer, "audience": issuer.audience, "jwks_url": issuer.jwks_url},
        "limits": {"handshake_timeout": 2.0, "max_frame_size": 16384, "max_message_size": 100_000,
                   "idle_timeout": 120.0},
        "queues": {"auto_create": False},
        "queue": [{"name": "fuzz", "max_depth": 200}, {"name": "canary"}],
        "acl": [{"user": "anonymous", "send": ["fuzz", "canary"], "receive": ["fuzz", "canary"],
                 "dynamic": True}],
    }).start()
    tokens = tuple(issuer.token(f"fuzz{i}", "fedgate.send:fuzz fedgate.receive:fuzz", kind=kind)
                   for i, kind in enumerate(("rsa", "ec", "ed")))
    yield node, tokens
    node.stop()
    issuer.stop()


def fuzz(node: NodeProcess, seed: int, cases: int, tokens=()) -> runner.Report:
    def check(report: runner.Report) -> None:
        assert node.alive(), f"node died: {report.summary()}\n{node.log_path.read_text()[-4000:]}"

    report = runner.run(host="127.0.0.1", port=node.port, pid=node.proc.pid, url=node.url,
                        seed=seed, cases=cases, check=check, tokens=tokens)
    print(report.summary())
    log = node.log_path.read_text()
    assert "Traceback" not in log, f"{report.summary()}\n{log[-6000:]}"
    assert node.alive(), report.summary()
    assert report.hung == 0 and report.refused_connects == 0, report.summary()
    assert report.cases >= cases and report.canary_checks > 0
    assert report.rss_after_kib - report.rss_before_kib < RSS_GROWTH_BOUND_KIB, report.summary()
    return report


def test_fuzz_short(fuzz_node):
    fuzz(fuzz_node, int(os.environ.get("FUZZ_SEED", "8080")), SHORT_CASES)


TOKEN_CASES = 2_000


def test_fuzz_token_path(token_fuzz_node):
    """The token path (docs/oauth.md): mutated JWTs over PLAIN and OAUTHBEARER (tests/fuzz/tokens.py),
    among the usual streams."""
    node, tokens = token_fuzz_node
    fuzz(node, int(os.environ.get("FUZZ_SEED", "4747")), TOKEN_CASES, tokens)


@pytest.mark.fuzz_long
@pytest.mark.timeout(3600)
def test_fuzz_long(fuzz_node):
    fuzz(fuzz_node, int(os.environ.get("FUZZ_SEED", "20240611")), LONG_CASES)
