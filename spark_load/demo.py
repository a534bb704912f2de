"""``fedgate-load --demo``: a small local fedgate cluster to load.

How this works
--------------
Two node processes (``python -m proxy serve --config FILE``, the same as
``fedgate serve``) on free loopback ports, each with its admin API on
another free port, peers pointing at each other. The demo address is
``work``. ``DEMO_QUEUE`` picks its rules:

* ``"fragmented"``: ``work.#`` is a fragmented queue with a fragment on each
  node (the target setup);
* ``"proxy"``: ``work`` is a plain local queue on n1, and n2 proxies
  ``work.#`` to n1 (the setup used while fragmented attaches were refused
  with ``amqp:not-implemented``; still the one for a test that restarts the
  node that holds no messages, n2).

Switching is that one constant (or ``--demo-queue``). Readiness is checked
over HTTP (``GET /readyz`` on each node's admin API: listening, and its
configured upstreams reachable). Logs and configs stay in the work
directory.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

DEMO_QUEUE = "fragmented"  # "proxy": the interim setup, before fragmented queues were served
DEMO_ADDRESS = "work"
NODES = ("n1", "n2")

DEMO_RULES = {
    "fragmented": {node: [{"name": "work", "match": "work.#", "kind": "fragmented", "fragments": list(NODES)}]
                   for node in NODES},
    "proxy": {"n1": [], "n2": [{"name": "work", "match": "work.#", "kind": "proxy", "primary": "n1"}]},
}
PACKAGE_ROOT = Path(__file__).resolve().parent.parent  # where `proxy` is importable from


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    raise TypeError(value)


def node_config(name: str, ports: dict, admin_ports: dict, data_dir: Path, queue_kind: str) -> str:
    lines = ["[node]", f"id = {_toml(name)}", f"listen = \"127.0.0.1:{ports[name]}\"",
             f"data_dir = {_toml(str(data_dir))}", 'log_level = "info"', "",
             "[admin]", f"listen = \"127.0.0.1:{admin_ports[name]}\"", "",
             "[peers]"]
    lines += [f"{peer} = \"amqp://127.0.0.1:{ports[peer]}\"" for peer in NODES if peer != name]
    lines += ["", "[queues]", "auto_create = true", ""]
    for rule in DEMO_RULES[queue_kind][name]:
        lines.append("[[rules]]")
        lines += [f"{key} = {_toml(value)}" for key, value in rule.items()]
        lines.append("")
    return "\n".join(lines)


class DemoNode:
    def __init__(self, name: str, config_path: Path, log_path: Path, url: str, admin_url: str) -> None:
        self.name = name
        self.config_path = config_path
        self.log_path = log_path
        self.url = url
        self.admin_url = admin_url
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 20.0) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PACKAGE_ROOT), env.get("PYTHONPATH")) if p)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "proxy", "serve", "--config", str(self.config_path)],
                                         stdout=subprocess.PIPE, stderr=log, env=env,
                                         cwd=self.config_path.parent)
        selector = selectors.DefaultSelector()
        selector.register(self.proc.stdout, selectors.EVENT_READ)
        ready = selector.select(timeout)
        selector.close()
        line = self.proc.stdout.readline().decode() if ready else ""
        if "listening on" not in line:
            self.stop()
            raise RuntimeError(f"demo node {self.name} did not start: {line!r}; see {self.log_path}:\n"
                               + self.log_path.read_text()[-2000:])

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.admin_url + "/readyz", timeout=2) as answer:
                return answer.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def stop(self, timeout: float = 10.0) -> None:
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        if proc.stdout is not None:
            proc.stdout.close()
        self.proc = None


class DemoCluster:
    """Two fedgate nodes on loopback; a context manager."""

    def __init__(self, workdir: Path, queue_kind: str = DEMO_QUEUE) -> None:
        if queue_kind not in DEMO_RULES:
            raise ValueError(f"demo queue kind must be one of {', '.join(DEMO_RULES)}")
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.queue_kind = queue_kind
        ports = {name: free_port() for name in NODES}
        admin_ports = {name: free_port() for name in NODES}
        self.nodes: dict[str, DemoNode] = {}
        for name in NODES:
            config = self.workdir / f"{name}.toml"
            config.write_text(node_config(name, ports, admin_ports, self.workdir / f"data-{name}", queue_kind))
            self.nodes[name] = DemoNode(name, config, self.workdir / f"{name}.log",
                                        f"amqp://127.0.0.1:{ports[name]}", f"http://127.0.0.1:{admin_ports[name]}")

    @property
    def urls(self) -> list[str]:
        return [node.url for node in self.nodes.values()]

    @property
    def address(self) -> str:
        return DEMO_ADDRESS

    def start(self, timeout: float = 30.0) -> "DemoCluster":
        try:
            for node in self.nodes.values():
                node.start()
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not all(node.ready() for node in self.nodes.values()):
            if time.monotonic() > deadline:
                raise RuntimeError(f"demo nodes not ready within {timeout:.0f}s; logs in {self.workdir}")
            time.sleep(0.1)

    def restart(self, name: str, kill: bool = False) -> None:
        """Stop a node (SIGTERM, or SIGKILL: a crash) and start it again on the same ports."""
        node = self.nodes[name]
        if kill and node.proc is not None:
            node.proc.kill()
        node.stop()
        node.start()

    def stop(self) -> None:
        for node in self.nodes.values():
            node.stop()

    def __enter__(self) -> "DemoCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
