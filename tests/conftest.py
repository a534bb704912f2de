"""Shared fixtures: real node processes on free loopback ports, client runners.

Prerequisites (node, npm packages, brokers) are installed by ``make test``.
When one is missing, a test is skipped on a developer machine but fails under
CI (``CI=true``): CI must never pass by skipping.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
PYTHON = sys.executable
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require(condition: bool, what: str) -> None:
    if condition:
        return
    if IN_CI:
        pytest.fail(f"prerequisite missing in CI: {what}")
    pytest.skip(f"prerequisite missing: {what} (run `make test` to install)")


def _port_range() -> range:
    """The ports this pytest process hands out: below the kernel's ephemeral range (32768 and
    up), so no client's outgoing connection takes a port between free_port() and the node's
    bind; .ci/run-tests.sh gives its two streams disjoint halves (FEDGATE_TEST_PORTS=lo-hi)."""
    lo, _, hi = os.environ.get("FEDGATE_TEST_PORTS", "20000-32000").partition("-")
    return range(int(lo), int(hi))


_PORTS = _port_range()
_FIXED = {25672, 25684}  # the RabbitMQs' Erlang distribution ports, free while one restarts
_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A loopback port nothing listens on and this process has not handed out before (bind(0)
    may give the same port twice, and a node's AMQP and admin ports must differ)."""
    import random

    for _ in range(2000):
        port = random.choice(_PORTS)
        if port in _HANDED_OUT or port in _FIXED:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    raise RuntimeError(f"no free port left in {_PORTS}")


def toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(value)


def to_toml(config: dict) -> str:
    """Enough TOML writing for test configs: tables, arrays of tables, scalars."""
    lines = []
    for section, body in config.items():
        if isinstance(body, list):
            for item in body:
                lines.append(f"[[{section}]]")
                lines += [f"{k} = {toml_value(v)}" for k, v in item.items()]
        else:
            lines.append(f"[{section}]")
            lines += [f"{k} = {toml_value(v)}" for k, v in body.items()]
    return "\n".join(lines) + "\n"


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (from /proc): a node's workers."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rpartition(")")[2].split()[1])
        parents.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), ()):
            out.append(child)
            todo.append(child)
    return out


class NodeProcess:
    """A `fedgate serve` process; ``url`` once it says it listens."""

    def __init__(self, workdir: Path, config: dict | None = None, name: str = "n1") -> None:
        self.workdir = workdir
        self.port = free_port()
        config = {k: (dict(v) if isinstance(v, dict) else v) for k, v in (config or {}).items()}
        node = config.setdefault("node", {})
        node.setdefault("id", name)
        node.setdefault("listen", f"127.0.0.1:{self.port}")
        self.port = int(node["listen"].rsplit(":", 1)[1])  # a test may choose the port
        node.setdefault("data_dir", str(workdir / f"data-{name}"))
        # the admin API (a fedgate.services plugin) gets its own free port too
        admin = config.setdefault("admin", {})
        admin.setdefault("listen", f"127.0.0.1:{free_port()}")
        self.admin_url = "http://" + admin["listen"]
        self.config_path = workdir / f"{name}.toml"
        self.config_path.write_text(to_toml(config))
        self.log_path = workdir / f"{name}.log"
        self.url = f"amqp://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 15.0) -> "NodeProcess":
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [PYTHON, "-m", "proxy", "serve", "--config", str(self.config_path)],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=self.log,
        )
        import selectors

        selector = selectors.DefaultSelector()
        selector.register(self.proc.stdout, selectors.EVENT_READ)
        ready = selector.select(timeout)
        line = self.proc.stdout.readline().decode() if ready else ""  # "listening on ..."
        if "listening on" not in line:
            self.stop()
            raise RuntimeError(f"node did not start: {line!r}\n{self.log_path.read_text()}")
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_log(self, text: str, timeout: float = 10.0) -> str:
        """The node's log once it holds ``text`` (bounded): a line the node writes when it
        notices a connection gone comes after the client saw the close, not before."""
        deadline = time.monotonic() + timeout
        while True:
            log = self.log_path.read_text()
            if text in log:
                return log
            if time.monotonic() >= deadline:
                raise AssertionError(f"{text!r} not in {self.log_path.name} within {timeout} s:\n{log[-2000:]}")
            time.sleep(0.05)

    def kill(self) -> None:
        """kill -9 of the node: with workers, of every process of it at once (the supervisor
        held still first, so it restarts none of them), as a machine's crash would."""
        if self.alive():
            workers = descendants(self.proc.pid)
            if workers:
                self.proc.send_signal(signal.SIGSTOP)
            for pid in workers:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def signal_all(self, signum: int) -> None:
        """A signal to the node's every process (SIGSTOP / SIGCONT: a pause of the machine)."""
        if self.alive():
            for pid in [self.proc.pid, *descendants(self.proc.pid)]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signum)

    def stop(self, timeout: float = 10.0) -> int | None:
        if self.proc is None:
            return None
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.log.close()
        return self.proc.returncode


@pytest.fixture
def start_node(tmp_path):
    nodes: list[NodeProcess] = []

    def start(config: dict | None = None, name: str = "n1") -> NodeProcess:
        node = NodeProcess(tmp_path, config, name).start()
        nodes.append(node)
        return node

    yield start
    for node in nodes:
        node.stop()


@pytest.fixture
def node(start_node):
    return start_node()


# -- client processes ------------------------------------------------------
NODE_JS = shutil.which("node")
# go-amqp (Azure's Go client), built by .ci/install/go-client.sh from tests/clients/goamqp
GO_CLIENT = ROOT / ".build" / "goamqp-client"


def client_command(kind: str, mode: str, url: str, **options) -> list[str]:
    if kind == "rhea":
        require(NODE_JS is not None, "node (Node.js)")
        require((TESTS / "js" / "node_modules" / "rhea").is_dir(), "rhea (npm ci in tests/js)")
        cmd = [NODE_JS, str(TESTS / "js" / f"{mode}.js"), "--url", url]
    elif kind == "go":
        require(GO_CLIENT.is_file(), "goamqp-client (.ci/install/go-client.sh)")
        cmd = [str(GO_CLIENT), mode, "--url", url]
    else:
        cmd = [PYTHON, str(TESTS / "clients" / "proton_client.py"), mode, "--url", url]
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            cmd.append(flag)
        elif value is not None and value is not False:
            cmd += [flag, str(value)]
    return cmd


class ClientProcess:
    def __init__(self, kind: str, mode: str, url: str, **options) -> None:
        self.cmd = client_command(kind, mode, url, **options)
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     bufsize=0)
        self._pending = b""  # bytes read by readline() beyond the last line

    def readline(self, timeout: float = 20.0) -> dict:
        """Next JSON line, waiting at most ``timeout`` seconds."""
        import select

        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                raise TimeoutError(f"no output from {self.cmd[1]} within {timeout}s")
            chunk = os.read(fd, 65536)
            if not chunk:
                raise EOFError(self.proc.stderr.read().decode())
            self._pending += chunk
        line, _, self._pending = self._pending.partition(b"\n")
        return json.loads(line)

    def finish(self, timeout: float = 60.0) -> list[dict]:
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
            raise AssertionError(f"client did not finish in {timeout}s: {self.cmd}\n{err.decode()}")
        out = self._pending + out
        lines = [json.loads(line) for line in out.decode().splitlines() if line.strip()]
        if not lines:
            raise AssertionError(f"client printed nothing: {self.cmd}\n{err.decode()}")
        return lines

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def rest(self) -> list[dict]:
        """After ``kill``: the lines it printed that were not read yet (a line cut short by
        the kill is left out)."""
        out, _ = self.proc.communicate(timeout=10)
        lines = []
        for raw in (self._pending + (out or b"")).decode(errors="replace").splitlines():
            try:
                lines.append(json.loads(raw))
            except ValueError:
                pass
        self._pending = b""
        return lines


@pytest.fixture
def clients():
    started: list[ClientProcess] = []

    def run(kind: str, mode: str, url: str, **options) -> ClientProcess:
        client = ClientProcess(kind, mode, url, **options)
        started.append(client)
        return client

    yield run
    for client in started:
        client.kill()


def error_of(lines):
    return next((line["error"] for line in lines if line.get("error")), None)


@pytest.fixture(scope="module")
def issuer():
    """A token issuer with a JWKS endpoint and keys made for this module (tests/support/
    oauth_issuer.py): the OAuth tests' identity provider."""
    from oauth_issuer import Issuer

    issuer = Issuer().serve()
    yield issuer
    issuer.stop()


@pytest.fixture(scope="session")
def certs(tmp_path_factory):
    """A CA, a server and a client certificate, and a rogue pair (tests/support/certs.py)."""
    require(shutil.which("openssl") is not None, "openssl")
    from certs import make_certs

    return make_certs(tmp_path_factory.mktemp("certs"))


# modules that use the shared test brokers (RabbitMQ 3.10 and 4, Artemis), some of which restart
# or kill them: marked ``brokers``; make test runs them one after the other in a pytest process
# of their own (``side``, with tests/faults: about half the run), beside the process that runs
# everything else (.ci/run-tests.sh)
BROKERS = ("rabbitmq", "artemis", "ensure_rabbit")
NEMESIS = ROOT / "tests" / "nemesis"
_BROKER_MODULES: dict[str, bool] = {}


def _uses_brokers(path) -> bool:
    key = str(path)
    if key not in _BROKER_MODULES:
        try:
            text = Path(key).read_text().lower()
        except OSError:
            text = ""
        _BROKER_MODULES[key] = any(word in text for word in BROKERS)
    return _BROKER_MODULES[key]


FAULTS = ROOT / "tests" / "faults"
# modules of the other process that balance the two (the side one was the shorter by about
# 1.5 minutes before the rolling upgrade's 46 s came)
SIDE_MODULES = ("test_rolling_upgrade.py",
                # the seventh session's (about 1.5 minutes): the other process was the longer one
                "test_replication_fragments_workers.py", "test_paging_replicated_tcp.py",
                # the ninth session's (about 2 minutes, mostly waiting for delivery times):
                # the other process was the longer one by 3.3 minutes
                "test_paging_scheduled_tcp.py")


def pytest_itemcollected(item):
    if _uses_brokers(item.path):
        item.add_marker(pytest.mark.brokers)
    # about half the run's time: the brokers' tests and tests/faults, but for the replication
    # faults (no broker in them; 2.5 minutes), which balance the other process
    if _uses_brokers(item.path) or (FAULTS in item.path.parents
                                    and item.path.name != "test_replication_faults.py") \
            or item.path.name in SIDE_MODULES:
        item.add_marker(pytest.mark.side)
    # its gap limits are timed: alone, after the rest; the control run times nothing and runs
    # with everything else (the side process is the longer one since the token fuzz came)
    if NEMESIS in item.path.parents and getattr(item, "originalname", item.name) == "test_nemesis":
        item.add_marker(pytest.mark.serial)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    """Nothing the tests started still listens (tests/support/listeners.py): a leftover
    fails the run, so `make test` then `make run` works."""
    from listeners import check_session

    check_session(session)
