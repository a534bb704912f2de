"""The real Toxiproxy (Shopify's fault-injecting TCP proxy) for fault tests.

How this works
--------------
* ``.ci/install/toxiproxy.sh`` (run by ``make test``) builds the pinned
  ``toxiproxy-server`` into ``.tools/bin/``. The session fixture
  ``toxiproxy_server`` starts it on a free loopback port (its API and every
  proxy on 127.0.0.1 only); tests drive it with ``toxiproxy-python``, the
  PyPI client. Missing binary or client: skipped on a developer machine, a
  failure under ``CI=true`` (``conftest.require``).
* ``Toxi.proxy(name, port)`` puts a Toxiproxy proxy in front of
  ``127.0.0.1:port``; point a rule's ``primary`` or a ``[peers]`` URL at its
  ``url``. Every proxy made is destroyed when the test ends (``toxi``
  fixture), toxics with it.
* ``FAULTS`` are the faults of the matrix: ``inject`` puts the toxic in
  force (or disables the proxy) for the fault's duration and always removes
  it / re-enables the proxy in ``finally``.
* ``kill_rabbitmq()``: SIGKILL of the RabbitMQ server VM (beam.smp), then a
  start through ``.ci/install/rabbitmq.sh`` (what a crash and a supervisor
  restart look like). ``tests/brokers.py`` has the Artemis counterpart.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import brokers
import pytest
from conftest import ROOT, free_port, require

TOXIPROXY_BIN = ROOT / ".tools" / "bin" / "toxiproxy-server"
START_TIMEOUT = 10.0

try:
    import toxiproxy as toxiproxy_client
    from toxiproxy.exceptions import NotFound
except ImportError:  # pragma: no cover - reported through require()
    toxiproxy_client = None
    NotFound = LookupError


class ToxiServer:
    """A toxiproxy-server process on a free loopback port."""

    def __init__(self, log_path: Path) -> None:
        self.port = free_port()
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None

    def start(self) -> "ToxiServer":
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [str(TOXIPROXY_BIN), "-host", "127.0.0.1", "-port", str(self.port)],
            stdout=self.log, stderr=self.log, stdin=subprocess.DEVNULL,
            env=dict(os.environ, LOG_LEVEL="warn"))
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/version", timeout=1):
                    return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"toxiproxy-server did not start:\n{self.log_path.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.log.close()


@dataclass
class ToxiProxy:
    """One Toxiproxy proxy: clients connect to ``url``, it forwards to the upstream port."""

    name: str
    proxy: object  # toxiproxy.Proxy
    port: int

    @property
    def url(self) -> str:
        return f"amqp://127.0.0.1:{self.port}"

    def toxics(self) -> dict:
        return self.proxy.toxics()


class Toxi:
    """The test's handle on the server: makes proxies, remembers them for clean-up."""

    def __init__(self, server: ToxiServer) -> None:
        self.server = server
        self.client = toxiproxy_client.Toxiproxy()
        self.client.update_api_consumer("127.0.0.1", server.port)
        self.made: list[ToxiProxy] = []
        self._names = itertools.count(1)

    def proxy(self, name: str, upstream_port: int) -> ToxiProxy:
        name = f"{name}-{next(self._names)}"
        proxy = self.client.create(upstream=f"127.0.0.1:{upstream_port}", name=name,
                                   listen="127.0.0.1:0")
        made = ToxiProxy(name, proxy, int(proxy.listen.rsplit(":", 1)[1]))
        self.made.append(made)
        return made

    def destroy_all(self) -> None:
        while self.made:
            made = self.made.pop()
            with contextlib.suppress(Exception):  # the server may be gone at session end
                made.proxy.destroy()


@pytest.fixture(scope="session")
def toxiproxy_server(tmp_path_factory):
    require(TOXIPROXY_BIN.is_file(), f"toxiproxy-server ({TOXIPROXY_BIN.relative_to(ROOT)}, "
                                     "built by .ci/install/toxiproxy.sh)")
    require(toxiproxy_client is not None, "toxiproxy-python (pip install -e '.[test]')")
    server = ToxiServer(tmp_path_factory.mktemp("toxiproxy") / "toxiproxy.log").start()
    yield server
    server.stop()


@pytest.fixture
def toxi(toxiproxy_server):
    handle = Toxi(toxiproxy_server)
    yield handle
    handle.destroy_all()


# -- faults ---------------------------------------------------------------------
@dataclass(frozen=True)
class Fault:
    """One fault of the matrix.

    ``apply(proxy)`` puts it in force, ``remove(proxy)`` takes it away;
    ``inject`` keeps it for ``duration`` seconds unless ``until`` (a callable
    checked every 50 ms) says earlier that it did its work. ``breaks`` tells
    whether it must cost the upstream connection (a reconnect is expected).
    """

    name: str
    apply: Callable
    remove: Callable
    duration: float
    breaks: bool

    def inject(self, proxies: list[ToxiProxy], until: Callable[[], bool] | None = None) -> float:
        """In force on every proxy for ``duration`` seconds, or until ``until()`` is true;
        always removed again. Returns how long it was in force."""
        started = time.monotonic()
        try:
            for proxy in proxies:
                self.apply(proxy)
            deadline = started + self.duration
            while time.monotonic() < deadline:
                if until is not None and until():
                    break
                time.sleep(0.05)
            return time.monotonic() - started
        finally:
            for proxy in proxies:
                self.remove(proxy)


def _toxic(kind: str, attributes: dict, streams=("downstream", "upstream")):
    def apply(proxy: ToxiProxy) -> None:
        for stream in streams:
            proxy.proxy.add_toxic(name=f"{kind}_{stream}", type=kind, stream=stream,
                                  attributes=attributes)

    def remove(proxy: ToxiProxy) -> None:
        for stream in streams:
            with contextlib.suppress(NotFound):  # never added (apply failed half-way)
                proxy.proxy.destroy_toxic(f"{kind}_{stream}")
    return apply, remove


def _disable(proxy: ToxiProxy) -> None:
    proxy.proxy.disable()


def _enable(proxy: ToxiProxy) -> None:
    proxy.proxy.enable()


FAULTS = {
    # 300 ms each way, +-100 ms jitter
    "latency": Fault("latency", *_toxic("latency", {"latency": 300, "jitter": 100}), 3.0, False),
    # 50 KB/s each way
    "bandwidth": Fault("bandwidth", *_toxic("bandwidth", {"rate": 50}), 3.0, False),
    # blackhole: every byte dropped, nothing closed; the heartbeats must notice
    "blackhole": Fault("blackhole", *_toxic("timeout", {"timeout": 0}), 3.0, True),
    # TCP RST on the next bytes in either direction
    "reset_peer": Fault("reset_peer", *_toxic("reset_peer", {"timeout": 0}), 1.0, True),
    # frames cut into 1..31-byte pieces, 20 us apart
    "slicer": Fault("slicer", *_toxic("slicer", {"average_size": 16, "size_variation": 15,
                                                  "delay": 20}), 3.0, False),
    # the primary's side of the stream cut after 10,007 more bytes (mid-frame)
    "limit_data": Fault("limit_data", *_toxic("limit_data", {"bytes": 10007},
                                               streams=("downstream",)), 3.0, True),
    # the proxy stops listening and drops every connection for 5 s
    "disabled": Fault("disabled", _disable, _enable, 5.0, True),
}


# -- RabbitMQ, killed ------------------------------------------------------------
def rabbitmq_pid(version: int = 3) -> int | None:
    """Pid of the RabbitMQ server VM (not of a CLI VM such as rabbitmqctl): 3.10 runs in
    this machine's root, 4.0 in a root of its own (.ci/install/rabbitmq4.sh)."""
    root = "/" if version == 3 else os.path.realpath(brokers.RABBITMQ4_ROOT)
    proc = subprocess.run(["pgrep", "-f", r"beam\.smp .* -s rabbit boot"], capture_output=True,
                          text=True, timeout=10)
    pids = [int(p) for p in proc.stdout.split() if _root_of(int(p)) == root]
    return pids[0] if pids else None


def _root_of(pid: int) -> str | None:
    try:
        return os.path.realpath(f"/proc/{pid}/root")
    except OSError:  # gone, or another user's process
        return None


def kill_rabbitmq(restart: bool = True, version: int = 3) -> str:
    """SIGKILL the RabbitMQ server VM (no shutdown at all), then start it again.

    With ``restart=False`` it stays down; ``brokers.ensure_rabbitmq()`` (or
    ``ensure_rabbitmq4()``) starts it.
    """
    pid = rabbitmq_pid(version)
    if pid is None:
        raise brokers.BrokerError(f"RabbitMQ {version} is not running (no beam.smp ... -s rabbit boot)")
    name = "rabbitmq" if version == 3 else "rabbitmq4"
    if version == 3:
        os.kill(pid, signal.SIGKILL)
    else:  # root's process: kill it as root
        subprocess.run(["kill", "-KILL", str(pid)] if os.geteuid() == 0
                       else ["sudo", "-n", "kill", "-KILL", str(pid)], check=True, timeout=10)
    brokers._wait_gone(pid, 10.0)
    brokers._checked.discard(name)
    if not restart:
        return brokers.RABBITMQ_URL if version == 3 else brokers.RABBITMQ4_URL
    return brokers.ensure_rabbitmq() if version == 3 else brokers.ensure_rabbitmq4()
