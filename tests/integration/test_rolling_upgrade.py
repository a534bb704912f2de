"""A rolling upgrade from the previous release (issue #46, docs/upgrades.md): three nodes of
0.5.0 on etcd, replaced one by one by this code under a steady load.

How this works
--------------
* The previous release is found in the git history: the commit that wrote
  ``version = "<compat.PREVIOUS>"`` into pyproject.toml (the history of that line is the list
  of releases, CHANGELOG.md). It is checked out with ``git worktree add --detach`` into the
  test's temporary directory and run from a virtualenv of its own (``python -m venv
  --without-pip``, the old release's package metadata written from its pyproject.toml,
  a ``.pth`` file naming the old checkout and this checkout's virtualenv's site-packages
  for the dependencies; nothing is fetched over the network). The C fast
  path is the same source in both releases: the built module is copied (without it the old
  code runs its Python path). The worktree is removed at the end.
* Queues: ``orders.a`` replicated (3 copies), ``ledger.a`` replicated and durable (every
  copy journals), ``jobs.a`` fragmented over the three nodes, each fragment replicated on one
  other member; ``stock``, a durable local queue, filled on n1 before the upgrade and
  drained from it after (0.5.0's journal read by this code: every message, once). A sender and a receiver per queue on every node's failover list, at a
  steady rate, for the whole upgrade.
* Each node in turn: stopped (SIGTERM), started on the same configuration, ports and data
  dir with this code, then waited for until it is back in sync: a member again, in the
  in-sync set of both replicated queues, serving its own fragment again (the home member
  gets it back once in sync).
* Checked as a user would: every id whose send was accepted is received; duplicates at most
  what was in flight (sends not yet accepted at each stop, and the receivers' credit at each
  stop); no client error (a reconnect is not one); each node's ``GET /api/v1/node`` version;
  while a 0.5.0 member is live a run-time wiring change is refused (``mixed_versions``, the
  feature negotiated cluster-wide), and once all are upgraded it is made.

lease_ttl is 3 s; every wait is bounded.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import shutil
import subprocess
import sysconfig
import time
import tomllib
from pathlib import Path

import pytest
from admin_client import TOKENS, http, wait_for
from cluster_support import LEASE_TTL, member_ids
from conftest import PYTHON, ROOT, NodeProcess, require
from etcd_servers import cluster_name, etcd_url  # noqa: F401 (fixtures)
from replication_support import (NAMES, Workload, etcd_get, failover_urls, fragment_isr,
                                  fragment_owner, isr_record, queues_of)

from proxy.config import compat
from proxy.config.version import version

pytestmark = pytest.mark.timeout(180)

REPLICATED = {"name": "orders", "match": "orders.*", "kind": "replicated", "replicas": 3}
DURABLE = {"name": "ledger", "match": "ledger.*", "kind": "replicated", "replicas": 3,
           "durable": True}
FRAGMENTED = {"name": "jobs", "match": "jobs.*", "kind": "fragmented", "fragments": list(NAMES),
              "replicas": 2}
QUEUES = ("orders.a", "ledger.a", "jobs.a")
LOCAL = "stock"  # a durable local queue: n1's journal of 0.5.0 read by this code
LOCAL_COUNT = 200
RATE = 25  # per sender
PER_SENDER = 1000  # 40 s at RATE: the whole upgrade runs under load
CREDIT = 10
SYNC_TIMEOUT = 30.0


# -- the previous release ---------------------------------------------------------------------
def git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True,
                          timeout=60, stdin=subprocess.DEVNULL).stdout.strip()


def release_commit(release: str) -> str | None:
    """The commit that made ``release``: the first to write its version into pyproject.toml."""
    try:
        found = git("log", "--format=%H", "--reverse", "-S", f'version = "{release}"', "--",
                    "pyproject.toml").split()
    except (subprocess.CalledProcessError, OSError):
        return None
    return found[0] if found else None


@pytest.fixture(scope="module")
def previous_release(tmp_path_factory):
    """(python, checkout) of the previous release, in a virtualenv of its own."""
    require(shutil.which("git") is not None and (ROOT / ".git").exists(),
            "a git checkout with its history (the previous release is checked out from it)")
    commit = release_commit(compat.PREVIOUS)
    require(commit is not None, f"release {compat.PREVIOUS}'s commit in the git history")
    base = tmp_path_factory.mktemp("previous")
    checkout = base / f"fedgate-{compat.PREVIOUS}"
    git("worktree", "add", "--detach", str(checkout), commit)
    try:
        built = glob.glob(str(ROOT / "proxy" / "amqp" / "_fastpath*.so"))
        same_source = git("diff", "--quiet", commit, "HEAD", "--", "proxy/amqp/_fastpath.c") == ""
        if built and same_source:
            shutil.copy(built[0], checkout / "proxy" / "amqp")
        venv = base / "venv"
        subprocess.run([PYTHON, "-m", "venv", "--without-pip", str(venv)], check=True,
                       timeout=60)
        python = venv / "bin" / "python"
        site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()"
                               "['purelib'])"], capture_output=True, text=True, check=True,
                              timeout=30).stdout.strip()
        deps = sysconfig.get_paths()["purelib"]  # this checkout's virtualenv: the dependencies
        Path(site, "fedgate-previous.pth").write_text(f"{checkout}\n{deps}\n")
        install_metadata(checkout, Path(site))
        said = subprocess.run([str(python), "-m", "proxy", "--version"], cwd=checkout,
                              capture_output=True, text=True, timeout=30)
        assert said.stdout.strip() == f"fedgate {compat.PREVIOUS}", (said.stdout, said.stderr)
        # what the old code reads of its installed package (its member record's version)
        said = subprocess.run([str(python), "-c", "from importlib.metadata import version; "
                               "print(version('fedgate'))"], cwd=base, capture_output=True,
                              text=True, timeout=30)
        assert said.stdout.strip() == compat.PREVIOUS, (said.stdout, said.stderr)
        yield python, checkout
    finally:
        with contextlib.suppress(subprocess.CalledProcessError, OSError):
            git("worktree", "remove", "--force", str(checkout))


def install_metadata(checkout: Path, site: Path) -> None:
    """The old release's package metadata in its virtualenv, from its pyproject.toml: its
    version and its entry points (the plug-ins a node loads). It comes first on that
    virtualenv's path, before this checkout's installed metadata."""
    project = tomllib.loads((checkout / "pyproject.toml").read_text())["project"]
    info = site / f"fedgate-{project['version']}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: fedgate\n"
                                   f"Version: {project['version']}\n")
    groups = {"console_scripts": project.get("scripts", {}), **project.get("entry-points", {})}
    (info / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{name} = {target}\n" for name, target in items.items()) + "\n"
        for group, items in groups.items()))
    (info / "INSTALLER").write_text("tests/integration/test_rolling_upgrade.py\n")


class ReleaseNode(NodeProcess):
    """A node of a given release: its python and the checkout it runs from."""

    def __init__(self, workdir: Path, config: dict, name: str, python, cwd) -> None:
        super().__init__(workdir, config, name)
        self.python, self.cwd = str(python), cwd

    def start(self, timeout: float = 20.0) -> "ReleaseNode":
        import selectors

        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [self.python, "-m", "proxy", "serve", "--config", str(self.config_path)],
            cwd=self.cwd, stdout=subprocess.PIPE, stderr=self.log)
        selector = selectors.DefaultSelector()
        selector.register(self.proc.stdout, selectors.EVENT_READ)
        ready = selector.select(timeout)
        line = self.proc.stdout.readline().decode() if ready else ""
        if "listening on" not in line:
            self.stop()
            raise RuntimeError(f"node did not start: {line!r}\n{self.log_path.read_text()}")
        return self

    def upgrade(self) -> "ReleaseNode":
        """Stop it (SIGTERM) and start this code on the same config, ports and data dir."""
        self.stop(timeout=20.0)
        self.python, self.cwd = PYTHON, ROOT
        return self.start()


def node_version(node) -> str:
    status, body = http("GET", node.admin_url + "/api/v1/node", timeout=3.0)
    assert status == 200, body
    return body["version"]


def back_in_sync(etcd_url, cluster_name, nodes, name: str) -> None:
    """``name`` a member again on every node, in the in-sync set of the replicated queues,
    and serving its own fragment again with a backup in sync."""
    for node in nodes.values():
        wait_for(lambda: member_ids(node) == sorted(NAMES), timeout=SYNC_TIMEOUT, interval=0.1,
                 what=f"{node.config_path.stem} to list every member")
    for address in ("orders.a", "ledger.a"):
        def in_sync(address=address):
            record = isr_record(etcd_url, cluster_name, address) or {}
            copies = {record.get("primary"), *record.get("isr", [])}
            return name in copies and len(copies) == 3
        wait_for(in_sync, timeout=SYNC_TIMEOUT, interval=0.1,
                 what=f"{name} in the in-sync set of {address}")

    def home():
        owner = fragment_owner(etcd_url, cluster_name, "jobs.a", name) or {}
        record = fragment_isr(etcd_url, cluster_name, "jobs.a", name) or {}
        return owner.get("owner") == name and record.get("primary") == name and record.get("isr")
    wait_for(home, timeout=SYNC_TIMEOUT, interval=0.1,
             what=f"{name} serving its fragment of jobs.a again, a backup in sync")


def member_record(etcd_url, cluster_name, name: str) -> dict:
    raw = etcd_get(etcd_url, f"/fedgate/{cluster_name}/members/{name}")
    assert raw is not None, name
    return json.loads(raw)


def wiring_change(node, name: str):
    return http("POST", node.admin_url + "/api/v1/exchanges",
                {"name": name, "type": "fanout"}, timeout=5.0)


def test_a_050_cluster_is_upgraded_node_by_node_under_load(
        tmp_path, previous_release, etcd_url, cluster_name, clients):
    began = time.monotonic()
    old_python, old_checkout = previous_release
    nodes = {}
    for name in NAMES:
        config = {"admin": {"tokens": TOKENS},
                  "cluster": {"name": cluster_name, "etcd": [etcd_url], "lease_ttl": LEASE_TTL,
                              "start_timeout": 20.0},
                  "node": {"log_level": "info"},
                  "rules": [REPLICATED, DURABLE, FRAGMENTED],
                  "queue": [{"name": LOCAL, "durable": True}]}
        nodes[name] = ReleaseNode(tmp_path, config, name, old_python, old_checkout).start()
    try:
        for node in nodes.values():
            wait_for(lambda: member_ids(node) == sorted(NAMES), timeout=15.0, interval=0.1,
                     what="every member listed")
            assert node_version(node) == compat.PREVIOUS
        n1, n2, n3 = (nodes[n] for n in NAMES)
        fill = Workload(clients, LOCAL, senders=[(n1.url, "s")], receivers=[],
                        per_sender=LOCAL_COUNT, rate=0, durable=True)
        stored = set(fill.start_senders().result(timeout=20.0, want=set()).accepted)
        assert len(stored) == LOCAL_COUNT
        loads = {}
        for address in QUEUES:
            prefix = address.split(".")[0]
            loads[address] = Workload(
                clients, address,
                senders=[(failover_urls(n1, n2, n3), f"{prefix}1"),
                         (failover_urls(n2, n3, n1), f"{prefix}2"),
                         (failover_urls(n3, n1, n2), f"{prefix}3")],
                receivers=[failover_urls(n1, n2, n3), failover_urls(n2, n3, n1),
                           failover_urls(n3, n1, n2)],
                per_sender=PER_SENDER, rate=RATE, credit=CREDIT, failover=True,
                durable=address == "ledger.a").start()
        for address in ("orders.a", "ledger.a"):
            wait_for(lambda a=address: len((isr_record(etcd_url, cluster_name, a) or {})
                                           .get("isr", [])) == 2,
                     timeout=SYNC_TIMEOUT, interval=0.1, what=f"{address} with 2 backups in sync")
        for load in loads.values():
            load.wait_accepted(3 * 50, 20.0)

        stops, refused = [], None
        for name in NAMES:
            stops.append(time.time())
            nodes[name].upgrade()
            back_in_sync(etcd_url, cluster_name, nodes, name)
            assert node_version(nodes[name]) == version() != compat.PREVIOUS
            # what each member announces in etcd: the upgraded ones their features, the
            # others (0.5.0) nothing
            records = {n: member_record(etcd_url, cluster_name, n) for n in NAMES}
            upgraded = NAMES[:NAMES.index(name) + 1]
            assert all(set(records[n]["features"]) == compat.FEATURES and
                       records[n]["version"] == version() for n in upgraded), records
            assert all("features" not in records[n] and records[n]["version"] == compat.PREVIOUS
                       for n in NAMES if n not in upgraded), records
            if name != NAMES[-1] and refused is None:  # a 0.5.0 member is still live
                refused = wiring_change(nodes[name], "during-upgrade")
            print(f"\n{name} upgraded: {time.time() - stops[-1]:.1f} s from its stop to in sync")
        status, body = wiring_change(n2, "after-upgrade")
        assert status == 201, body
        for address in ("orders.a", "ledger.a"):  # every link says this release now
            primary = (isr_record(etcd_url, cluster_name, address) or {}).get("primary")
            backups = queues_of(nodes[primary])[address]["replication"]["backups"]
            assert len(backups) == 2 and all(b["version"] == version() for b in backups), backups

        outcomes = {a: load.result(timeout=90.0) for a, load in loads.items()}
        # what n1's 0.5.0 journal held comes back from this code, each message once
        drained = Workload(clients, LOCAL, senders=[], receivers=[n1.url],
                           credit=CREDIT).start_receivers().result(timeout=20.0, quiet=0.5,
                                                                   want=stored)
        assert drained.received_ids == stored and drained.duplicates == 0, \
            (len(drained.received_ids), drained.duplicates)
        in_flight = {a: sum(load.in_flight_sends(t) for t in stops) for a, load in loads.items()}
        resent = {a: load.resent() for a, load in loads.items()}
        for address, outcome in outcomes.items():
            print(f"{address}: accepted {len(outcome.accepted)}, received "
                  f"{len(outcome.received)}, duplicates {outcome.duplicates}, sent again "
                  f"{resent[address]}; bound: {len(stops)} stops x {3 * CREDIT} credit + "
                  f"{in_flight[address]} sends in flight at the stops")
        failovers = sum(s.get("failovers", 0) for o in outcomes.values() for s in o.senders if s)
        print(f"senders' reconnects: {failovers}; the whole test: "
              f"{time.monotonic() - began:.1f} s")

        # the wiring change during the upgrade: refused by name, naming the old members
        assert refused is not None and refused[0] == 409, refused
        assert refused[1]["error"] == "mixed_versions", refused
        assert {m["version"] for m in refused[1]["members"]} == {compat.PREVIOUS}
        assert failovers >= 3  # each stop sent a node's senders elsewhere
        for address, outcome in outcomes.items():
            assert not outcome.corrupt, address
            assert not outcome.lost, (address, sorted(outcome.lost)[:20])
            assert all(s and s["error"] is None and s["accepted"] == PER_SENDER
                       for s in outcome.senders), (address, outcome.senders)
            assert not outcome.receivers or all(code in (0, -9, None) for code, _ in
                                                outcome.receivers), (address, outcome.receivers)
            assert outcome.duplicates <= len(stops) * 3 * CREDIT + in_flight[address], \
                (address, outcome.duplicates, in_flight[address])
        for node in nodes.values():
            log = node.log_path.read_text()
            assert not re.search(r"BatchError|replication batch version|Traceback", log), \
                (node.config_path.stem, log[-3000:])
    finally:
        for node in nodes.values():
            node.stop()


def test_a_data_dir_a_newer_release_wrote_is_refused_at_start(tmp_path):
    """The downgrade check as an operator meets it: ``fedgate serve`` exits 1 before it
    listens, the message naming both versions."""
    data = tmp_path / "data"
    data.mkdir()
    (data / compat.FORMAT_FILE).write_text('{"data_format": 99, "written_by": "9.0.0"}')
    config = tmp_path / "n1.toml"
    config.write_text(f'[node]\nid = "n1"\nlisten = "127.0.0.1:0"\ndata_dir = "{data}"\n')
    proc = subprocess.run([PYTHON, "-m", "proxy", "serve", "--config", str(config)], cwd=ROOT,
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "written by fedgate 9.0.0 (data format 99)" in proc.stderr
    assert f"this is fedgate {version()}" in proc.stderr
    assert "listening" not in proc.stdout


def test_a_worker_of_another_release_than_its_supervisor_exits_naming_both(tmp_path):
    """A worker process started by a supervisor of another release (the package replaced
    under a running node) exits at once: the worker channels carry no version."""
    config = tmp_path / "n1.toml"
    config.write_text(f'[node]\nid = "n1"\nlisten = "127.0.0.1:0"\ndata_dir = "{tmp_path}"\n')
    command = [PYTHON, "-m", "proxy", "_worker", "--index", "1", "--count", "2",
               "--channel-fd", "0", "--config", str(config)]
    for supervisor, said in ((None, "older than 0.6.0"), ("0.7.0", "supervisor fedgate 0.7.0")):
        env = {k: v for k, v in os.environ.items() if k != compat.SUPERVISOR_VERSION}
        if supervisor is not None:
            env[compat.SUPERVISOR_VERSION] = supervisor
        proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=30,
                              env=env, stdin=subprocess.DEVNULL)
        assert proc.returncode == 1, (proc.stdout, proc.stderr)
        assert f"worker 1: this worker runs fedgate {version()}" in proc.stderr, proc.stderr
        assert said in proc.stderr, proc.stderr
