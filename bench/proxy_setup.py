"""The processes ``bench/proxy.py`` measures: the primary (a broker or a fedgate node) and
the fedgate node with a proxy rule to it, with the helpers that set them up and clean up.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as h  # noqa: E402

RABBIT_HOST, RABBIT_PORT = "127.0.0.1", int(os.environ.get("RABBITMQ_PORT", "5682"))
ARTEMIS_PORT = int(os.environ.get("ARTEMIS_PORT", "5673"))
RABBIT4_PORT = int(os.environ.get("RABBITMQ4_PORT", "5684"))  # .ci/install/rabbitmq4.sh
ADMIN_TOKEN = "bench-read-token-0123456789"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise h.BenchError(f"no VmRSS for pid {pid}")


class Primary:
    """The broker behind the proxy rule: RabbitMQ 3.10, Artemis, or another fedgate node."""

    def __init__(self, name: str, args) -> None:
        self.name = name
        self.proc = None
        self.tmp = None
        if name == "rabbitmq":
            self.port, self.template = RABBIT_PORT, "/queue/{1}"
            self.pid = h.rabbitmq_pid(RABBIT_PORT)
        elif name == "rabbitmq4":  # address v2: queues exist before an attach (declared below)
            self.port, self.template = RABBIT4_PORT, "/queues/{1}"
            pid = h.listener_pid(RABBIT4_PORT)
            if pid is None:
                raise h.BenchError(f"RabbitMQ 4 is not listening on {RABBIT4_PORT} "
                                   "(bash .ci/install/rabbitmq4.sh)")
            self.pid = pid
        elif name == "artemis":
            self.port, self.template = ARTEMIS_PORT, "{1}"  # an ANYCAST queue, made on first attach
            pid = h.listener_pid(ARTEMIS_PORT)
            if pid is None:
                raise h.BenchError(f"Artemis is not listening on {ARTEMIS_PORT} (make brokers)")
            self.pid = pid
        elif name == "fedgate":
            self.tmp = tempfile.mkdtemp(prefix="fedgate-bench-primary-")
            self.port, self.template = h.free_port(), "{1}"
            extra = []
            if getattr(args, "primary_credit", None):  # the primary's grant to each producer
                config = Path(self.tmp) / "primary.toml"
                config.write_text(f'[node]\nid = "bench-primary"\n'
                                  f'[queues]\ncredit_window = {args.primary_credit}\n')
                extra = ["--config", str(config)]
            self.proc = h.start_fedgate_node(self.port, Path(self.tmp) / "data",
                                             log_path=Path(self.tmp) / "node.log",
                                             extra_args=extra,
                                             ready_timeout=args.node_start_timeout)
            self.pid = self.proc.pid
        else:
            raise h.BenchError(f"unknown primary {name!r} (rabbitmq, rabbitmq4, artemis, fedgate)")
        self.queues: list[str] = []
        log(f"primary {name}: pid {self.pid} on 127.0.0.1:{self.port}")

    def direct_address(self, queue: str) -> str:
        self.queues.append(queue)
        if self.name == "rabbitmq4":
            rabbit4_queues("declare", [queue])
        return self.template.replace("{1}", queue)

    def stop(self) -> None:
        if self.name == "rabbitmq":
            delete_rabbit_queues(self.queues)
        elif self.name == "rabbitmq4":
            rabbit4_queues("delete", self.queues)
        if self.proc is not None:
            h.stop_process(self.proc)
            shutil.rmtree(self.tmp, ignore_errors=True)


class ProxyNode:
    """A fedgate node with one proxy rule to the primary, in a temp dir."""

    def __init__(self, args, rule_match: str, name: str, mirror: bool = False,
                 primary: Primary | None = None, python_path: bool = False) -> None:
        self.args = args
        self.tmp = tempfile.mkdtemp(prefix=f"fedgate-bench-{name}-")
        self.port = h.free_port()
        self.admin = f"127.0.0.1:{h.free_port()}"
        port = primary.port if primary else RABBIT_PORT
        template = primary.template if primary else "/queue/{1}"
        config = Path(self.tmp) / "node.toml"
        config.write_text(
            f'[node]\nid = "bench-{name}"\n'
            f'[admin]\ntokens = [{{ token = "{ADMIN_TOKEN}", role = "read" }}]\n'
            f'[limits]\nmax_links_per_connection = 16\n'
            # --producer-window-growth: the proxied senders' window growth (1: fixed)
            + ('[queues]\n' if getattr(args, "producer_window_growth", None)
               or getattr(args, "node_credit", None) else "")
            + (f'producer_window_growth = {args.producer_window_growth}\n'
               if getattr(args, "producer_window_growth", None) else "")
            # --node-credit: the node's credit_window (its proxied links' windows)
            + (f'credit_window = {args.node_credit}\n' if getattr(args, "node_credit", None) else "")
            + f'[[rules]]\nname = "px"\nmatch = "{rule_match}"\nkind = "proxy"\n'
            f'mirror_auto_delete = {"true" if mirror else "false"}\n'
            f'primary = "amqp://127.0.0.1:{port}"\nremote = "{template}"\n'
            # RabbitMQ 4: the rule declares its queues (management node) on first use
            + "upstream = { " + ", ".join(
                (["declare = true"] if primary and primary.name == "rabbitmq4" else [])
                + ([f"pool_size = {args.pool_size}"] if args.pool_size != 1 else [])) + " }\n"
            # --etcd: the node registers in etcd (issue #34); nothing of it is on a message's path
            + (f'[cluster]\nname = "bench-{name}-{os.getpid()}"\netcd = ["{args.etcd}"]\n'
               if getattr(args, "etcd", None) else ""))
        self.log_path = Path(self.tmp) / "node.log"
        self.proc = h.start_fedgate_node(self.port, Path(self.tmp) / "data", log_path=self.log_path,
                                         extra_args=["--config", str(config)], admin=self.admin,
                                         ready_timeout=args.node_start_timeout,
                                         # python_path: the proxy hop without its C fast path
                                         env={**os.environ, "FEDGATE_NO_FASTPATH": "1"} if python_path
                                         else None)
        self.pid = self.proc.pid
        log(f"fedgate node pid {self.pid} on 127.0.0.1:{self.port} ({name})")

    def _members(self) -> list[dict]:
        import urllib.request

        request = urllib.request.Request(f"http://{self.admin}/api/v1/upstreams",
                                         headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        with urllib.request.urlopen(request, timeout=10) as response:
            body = json.loads(response.read())
        return [m for pool in body.get("upstreams", []) for m in pool.get("members", [])
                if m.get("state") == "up"]

    def upstream_links(self) -> int:
        """Links the node holds on its upstream connections (admin API)."""
        return sum(m.get("links", 0) for m in self._members())

    def upstream_attaching(self) -> int:
        """Upstream attaches not answered yet, or waiting their turn (admin API)."""
        members = self._members()
        return sum(m.get("attaching", 0) for m in members) if members else 1

    def stop(self) -> None:
        h.stop_process(self.proc)
        if self.args.keep_data:
            log(f"node data and log kept in {self.tmp}")
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)


def rabbit4_queues(action: str, names) -> None:
    """Declare (durable classic) or delete queues on RabbitMQ 4 over AMQP 0-9-1 (pika)."""
    import pika

    conn = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", RABBIT4_PORT, credentials=pika.PlainCredentials("guest", "guest")))
    try:
        channel = conn.channel()
        for name in names:
            if action == "declare":
                channel.queue_declare(name, durable=True, arguments={"x-queue-type": "classic"})
            else:
                channel.queue_delete(name)
    finally:
        conn.close()


def delete_rabbit_queues(names) -> None:
    ctl = shutil.which("rabbitmqctl")
    if not ctl:
        return
    env = dict(os.environ, ERL_EPMD_ADDRESS="127.0.0.1")
    for name in names:
        try:
            subprocess.run([ctl, "-n", "rabbit@localhost", "-q", "delete_queue", name],
                           capture_output=True, timeout=60, env=env)
        except (subprocess.TimeoutExpired, OSError):
            pass
