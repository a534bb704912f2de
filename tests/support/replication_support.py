"""Replicated queues on real processes (issue #35): nodes on etcd, who is primary, the in-sync
set as etcd records it, and a numbered message set whose every line carries the time it came.

How this works
--------------
* ``replicated_nodes`` starts nodes on etcd (``cluster_support.etcd_node``) with one
  ``kind = "replicated"`` rule, log level info (the replication service logs who is primary
  and the in-sync set), and waits until every node lists every member. ``restart`` starts a
  node killed with ``-9`` again on the same port and data dir (its config is unchanged).
* What a user checks: ``primary_of`` asks each live node's ``GET /api/v1/queues`` (the
  primary serves the queue as a local one: ``role`` "primary" where the view says roles); ``owner_record`` and
  ``isr_record`` read etcd (``etcdctl get``: ``owners/queue/<address>`` and
  ``state/replication/queue/<address>``, the in-sync set the primary wrote, docs/replication.md);
  ``log_events`` reads a node's log lines with their times (``in-sync backups now [...]``,
  ``this node is its primary now``, ``primary fenced``).
* ``Workload``: proton senders (``send --report-accepted --rate``) and receivers (``receive
  --check-body``, no count) on the URLs given; a thread per client keeps each JSON line
  with the wall-clock time it arrived, so a test can say when the first acceptance or
  delivery after a kill came. ``result()`` stops the receivers once every accepted id was
  seen and nothing came for ``quiet`` seconds (or at the deadline), and says what was
  lost, duplicated, and in flight. With ``failover=True`` each client's URL may be a
  comma-separated list (``failover_urls``): the client goes on at the next URL when its node
  dies, a sender sending again what it had not seen settled (``proton_client.py --failover``).

Every wait is bounded.
"""

from __future__ import annotations

import collections
import json
import os
import re
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime

from admin_client import http, wait_for
from cluster_support import LEASE_TTL, etcd_node, wait_members
from conftest import TESTS, ClientProcess, require

NAMES = ("n1", "n2", "n3")


# -- nodes -------------------------------------------------------------------------------
def replicated_rule(name: str = "orders", match: str = "orders.*", replicas: int = 3,
                    **keys) -> dict:
    return {"name": name, "match": match, "kind": "replicated", "replicas": replicas, **keys}


def replicated_nodes(start_node, etcd: list[str], cluster_name: str, rule: dict,
                     names=NAMES, lease_ttl: float = LEASE_TTL, per_node: dict | None = None,
                     workers: int = 1, **sections) -> dict:
    """``names`` -> NodeProcess, every one a live member seen by every other. ``per_node``:
    name -> {"node": {...}, "cluster": {...}, "etcd": [...]} for that node only. ``workers``:
    each node's ``[node] workers`` (issue #45: replication on every core)."""
    nodes = {}
    for name in names:
        own = (per_node or {}).get(name, {})
        nodes[name] = etcd_node(start_node, name, own.get("etcd", etcd), cluster_name,
                                rules=[rule], lease_ttl=lease_ttl, cluster=own.get("cluster"),
                                node={"log_level": "info", "workers": workers,
                                      **own.get("node", {})}, **sections)
    for item in nodes.values():
        wait_members(item, list(names), 10.0)
    return nodes


def restart(node, timeout: float = 30.0):
    """Start a node killed with -9 again: same port, data dir and config. Its old
    registration is given lease_ttl + 1.5 s to go (cluster.md: the same id twice)."""
    node.log.close()
    return node.start(timeout=timeout)


def restart_all(nodes, timeout: float = 30.0) -> None:
    """Start several killed nodes again at once (each waits for its old registration)."""
    errors = []

    def one(node):
        try:
            restart(node, timeout)
        except Exception as exc:  # reported below, in the test's thread
            errors.append(exc)
    threads = [threading.Thread(target=one, args=(node,)) for node in nodes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout + 5)
    if errors:
        raise errors[0]


def queues_of(node) -> dict:
    status, body = http("GET", node.admin_url + "/api/v1/queues", timeout=3.0)
    assert status == 200, body
    return {q["name"]: q for q in body["queues"]}


def serves(node, address: str) -> bool:
    """Does ``node`` serve ``address`` as its primary? Its queues view lists it as a local queue
    (with ``role`` "primary" where the view tells replicated queues' roles)."""
    item = queues_of(node).get(address)
    return item is not None and item.get("role", "primary") == "primary" and "depth" in item


def view_of(node, address: str) -> dict | None:
    """``address`` as ``node``'s ``GET /api/v1/queues`` shows it: ``role`` (primary,
    catching-up, ready, lagging, proxy), ``replication`` (on a backup: ``copy`` with its
    ``depth``), ``depth`` on the primary. None: the node does not know the queue."""
    return queues_of(node).get(address)


def copy_depth(node, address: str) -> int:
    """The depth of ``node``'s backup copy of ``address`` (-1: it holds none)."""
    view = view_of(node, address) or {}
    return (view.get("replication") or {}).get("copy", {}).get("depth", -1)


def rss_mb(pid: int) -> float:
    """A process's resident memory (``VmRSS``), in MB."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def primary_of(nodes, address: str) -> str | None:
    """The one live node that serves ``address`` (the primary), else None."""
    holders = []
    for name, node in nodes.items():
        if not node.alive():
            continue
        try:
            if serves(node, address):
                holders.append(name)
        except OSError:
            continue
    assert len(holders) <= 1, f"{address} is served by {holders}"
    return holders[0] if holders else None


def wait_primary(nodes, address: str, timeout: float, other_than: str | None = None) -> str:
    return wait_for(lambda: (p := primary_of(nodes, address)) and p != other_than and p,
                    timeout=timeout, interval=0.05, what=f"a primary of {address}"
                    + (f" other than {other_than}" if other_than else ""))


def etcd_get(etcd_url: str, key: str) -> bytes | None:
    proc = subprocess.run(["etcdctl", "--endpoints", etcd_url, "--command-timeout", "5s", "get",
                           key, "--print-value-only"], capture_output=True, timeout=15,
                          env=dict(os.environ, ETCDCTL_API="3"))
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr.decode())
    value = proc.stdout.rstrip(b"\n")
    return value or None


def owner_record(etcd_url: str, cluster_name: str, address: str) -> dict | None:
    value = etcd_get(etcd_url, f"/fedgate/{cluster_name}/owners/queue/{address}")
    return json.loads(value) if value else None


def isr_record(etcd_url: str, cluster_name: str, address: str) -> dict | None:
    """The in-sync set the primary wrote: {"primary", "isr", "epoch"} (the epoch is left out
    of the record a claim writes)."""
    value = etcd_get(etcd_url, f"/fedgate/{cluster_name}/state/replication/queue/{address}")
    return json.loads(value) if value else None


def fragment_owner(etcd_url: str, cluster_name: str, address: str, member: str) -> dict | None:
    """Who serves ``member``'s fragment of the fragmented queue ``address`` (rule ``replicas``
    > 1): the owner record of ``fragment/<address>/<member>``."""
    value = etcd_get(etcd_url, f"/fedgate/{cluster_name}/owners/fragment/{address}/{member}")
    return json.loads(value) if value else None


def fragment_isr(etcd_url: str, cluster_name: str, address: str, member: str) -> dict | None:
    """The in-sync set of ``member``'s fragment as its primary wrote it (as ``isr_record``)."""
    value = etcd_get(etcd_url,
                     f"/fedgate/{cluster_name}/state/replication/fragment/{address}/{member}")
    return json.loads(value) if value else None


def wait_isr(etcd_url: str, cluster_name: str, address: str, isr, timeout: float,
             primary: str | None = None) -> dict:
    wanted = sorted(isr)

    def check():
        record = isr_record(etcd_url, cluster_name, address)
        if record and sorted(record.get("isr", ())) == wanted and \
                (primary is None or record.get("primary") == primary):
            return record
        return None
    return wait_for(check, timeout=timeout, interval=0.1,
                    what=f"in-sync set {wanted} of {address} in etcd")


# a worker's lines name it ("INFO w1 fedgate.replication: ...")
LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) (\w+) (?:w\d+ )?([\w.]+): (.*)$")


def log_events(node, contains: str) -> list[tuple[float, str]]:
    """(wall-clock time, message) of the node's log lines whose message has ``contains``."""
    out = []
    for line in node.log_path.read_text(errors="replace").splitlines():
        match = LOG_LINE.match(line)
        if match and contains in match.group(5):
            stamp = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S").timestamp()
            out.append((stamp + int(match.group(2)) / 1000.0, match.group(5)))
    return out


def promoted_at(node, address: str, after: float = 0.0) -> float | None:
    """When ``node`` logged that it became the primary of ``address`` (after ``after``)."""
    for stamp, _ in log_events(node, f"queue {address}: this node is its primary now"):
        if stamp >= after - 0.001:
            return stamp
    return None


# -- clients -------------------------------------------------------------------------------
class Lines(threading.Thread):
    """A client's JSON lines, each with the wall-clock time it was read."""

    def __init__(self, client, role: str, url: str) -> None:
        super().__init__(daemon=True)
        self.client, self.role, self.url = client, role, url
        self.lines: list[tuple[float, dict]] = []
        self.last = time.time()
        self.closed = False
        self.start()

    def run(self) -> None:
        while True:
            try:
                line = self.client.readline(timeout=3600)
            except (EOFError, TimeoutError, ValueError, OSError):
                break
            self.last = time.time()
            self.lines.append((self.last, line))
        self.closed = True

    def items(self, key: str) -> list[tuple[float, dict]]:
        return [(t, line) for t, line in list(self.lines) if key in line]

    def final(self) -> dict | None:
        return next((line for _, line in reversed(self.lines) if "sent" in line or "done" in line),
                    None)


@dataclass
class Outcome:
    accepted: dict  # id -> time of its acceptance
    received: list  # (time, id, delivery_count), every delivery
    senders: list  # each sender's final line (None: it printed none)
    receivers: list  # (exit status or None, last line) of receivers that ended by themselves
    corrupt: list = field(default_factory=list)

    @property
    def received_ids(self) -> set:
        return {i for _, i, _ in self.received}

    @property
    def lost(self) -> set:
        """Accepted, never received."""
        return set(self.accepted) - self.received_ids

    @property
    def duplicates(self) -> int:
        return len(self.received) - len(self.received_ids)

    def duplicated_ids(self) -> dict:
        return {i: n for i, n in collections.Counter(i for _, i, _ in self.received).items() if n > 1}

    def first_acceptance_after(self, when: float) -> float | None:
        times = [t for t in self.accepted.values() if t >= when]
        return min(times) if times else None

    def first_delivery_after(self, when: float) -> float | None:
        times = [t for t, _, _ in self.received if t >= when]
        return min(times) if times else None

    def accepted_by(self, when: float) -> int:
        return sum(1 for t in self.accepted.values() if t < when)


class Workload:
    """Numbered messages from ``senders`` ([(url, prefix)]) to ``receivers`` ([url]).

    ``kind="go"``: the go-amqp client (tests/clients/goamqp) instead of python-qpid-proton's,
    for volume: about 50,000 messages a second against proton's 5,000 here. It reports no
    acceptance per message: a sender's messages count as accepted when its final line says
    every one was (no ``failover``)."""

    def __init__(self, clients, address: str, *, senders, receivers, per_sender: int = 1000,
                 rate: float = 100.0, credit: int = 20, timeout_s: float = 120.0,
                 durable: bool = False, failover: bool = False, kind: str = "proton") -> None:
        assert kind in ("proton", "go") and not (kind == "go" and failover)
        self.kind = kind
        self.clients, self.address = clients, address
        self.sender_spec, self.receiver_urls = list(senders), list(receivers)
        self.per_sender, self.rate, self.credit = per_sender, rate, credit
        self.timeout_ms = int(timeout_s * 1000)
        self.durable = durable
        self.failover = failover
        self.senders: list[Lines] = []
        self.receivers: list[Lines] = []

    @property
    def expected(self) -> set:
        return {f"{prefix}-{seq}" for _, prefix in self.sender_spec for seq in range(self.per_sender)}

    def start_receivers(self) -> "Workload":
        for url in self.receiver_urls:
            self.add_receiver(url)
        return self

    def add_receiver(self, url: str) -> None:
        client = self.clients(self.kind, "receive", url, address=self.address, count=0,
                              credit=self.credit, check_body=True, timeout_ms=self.timeout_ms,
                              failover=self.failover)
        self.receivers.append(Lines(client, "receiver", url))

    def start_senders(self) -> "Workload":
        for url, prefix in self.sender_spec:
            if self.kind == "go":
                client = self.clients("go", "send", url, address=self.address,
                                      count=self.per_sender, prefix=prefix,
                                      rate=int(self.rate) or None, durable=self.durable,
                                      timeout_ms=self.timeout_ms)
                self.senders.append(Lines(client, "sender", url))
                self.senders[-1].prefix = prefix
                continue
            client = self.clients("proton", "send", url, address=self.address,
                                  count=self.per_sender, prefix=prefix, rate=self.rate or None,
                                  report_accepted=True, report_sent=True, durable=self.durable,
                                  timeout_ms=self.timeout_ms, failover=self.failover)
            self.senders.append(Lines(client, "sender", url))
        return self

    def start(self) -> "Workload":
        return self.start_receivers().start_senders()

    # -- what has happened so far ---------------------------------------------------------
    def accepted(self) -> dict:
        out = {}
        for reader in self.senders:
            if self.kind == "go":  # all or nothing: only the final line tells
                final = reader.final()
                if final and final.get("accepted") == self.per_sender:
                    out.update((f"{reader.prefix}-{seq}", reader.last)
                               for seq in range(self.per_sender))
                continue
            for t, line in reader.items("accepted_id"):
                out.setdefault(line["accepted_id"], t)
        return out

    def received(self) -> list:
        return sorted((t, line["id"], line.get("delivery_count", 0))
                      for reader in self.receivers for t, line in reader.items("id"))

    def corrupt(self) -> list:
        return [line for reader in self.receivers for _, line in reader.items("bad_body")]

    def wait_accepted(self, count: int, timeout: float) -> None:
        wait_for(lambda: len(self.accepted()) >= count, timeout=timeout, interval=0.02,
                 what=f"{count} acceptances")

    def wait_received(self, count: int, timeout: float) -> None:
        wait_for(lambda: len(self.received()) >= count, timeout=timeout, interval=0.02,
                 what=f"{count} deliveries")

    def in_flight_sends(self, at: float, slack: float = 0.05) -> int:
        """Sends handed to the link and not yet accepted at ``at`` (``send --report-sent``);
        a line is read a little after it is printed: sends read up to ``slack`` seconds
        later count too (the bound can only grow)."""
        total = 0
        for reader in self.senders:
            sent = sum(1 for t, _ in reader.items("sent_id") if t <= at + slack)
            accepted = sum(1 for t, _ in reader.items("accepted_id") if t < at)
            total += max(0, sent - accepted)
        return total

    def resent(self) -> int:
        """Messages the senders sent again after a failover (``resent_id`` lines)."""
        return sum(len(reader.items("resent_id")) for reader in self.senders)

    def senders_done(self, timeout: float) -> list:
        deadline = time.monotonic() + timeout
        for reader in self.senders:
            try:
                reader.client.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            reader.join(timeout=max(0.1, deadline - time.monotonic()))
        return [reader.final() for reader in self.senders]

    def result(self, timeout: float, quiet: float = 1.5, want: set | None = None) -> Outcome:
        """Senders' results; receivers stopped once every accepted id (or ``want``) was seen
        and nothing came for ``quiet`` seconds, or at ``timeout``."""
        deadline = time.monotonic() + timeout
        finals = self.senders_done(timeout)
        want = set(self.accepted()) if want is None else want
        while self.receivers and time.monotonic() < deadline and not self.corrupt():
            seen = {i for _, i, _ in self.received()}
            if want <= seen and time.time() - max(r.last for r in self.receivers) >= quiet:
                break
            if all(r.closed for r in self.receivers):
                break
            time.sleep(0.05)
        ended = []
        for reader in self.receivers:
            if reader.client.proc.poll() is not None:
                ended.append((reader.client.proc.returncode, reader.lines[-1:]))
            reader.client.kill()
            reader.join(timeout=5)
        return Outcome(accepted=self.accepted(), received=self.received(), senders=finals,
                       receivers=ended, corrupt=self.corrupt())

    def stop_receivers(self) -> None:
        """Kill the receivers now (what they had not settled goes back to the queue)."""
        for reader in self.receivers:
            reader.client.kill()
            reader.join(timeout=5)

    def stop(self) -> None:
        for reader in self.senders + self.receivers:
            reader.client.kill()


def failover_urls(first, *others) -> str:
    """A ``--failover`` client's URL list: ``first`` (its node), then the others."""
    return ",".join(node.url for node in (first, *others))


# -- Qpid JMS (tests/jms, built by .ci/install/jms.sh) ----------------------------------------
def jms_command(*args) -> list[str]:
    java = shutil.which("java")
    target = TESTS / "jms" / "target"
    require(java is not None, "java")
    require((target / "classes" / "fedgate" / "JmsClient.class").is_file(),
            "the Qpid JMS test client (bash .ci/install/jms.sh)")
    return [java, "-cp", f"{target / 'classes'}:{target / 'lib'}/*", "fedgate.JmsClient",
            *map(str, args)]


def failover_url(urls, **options) -> str:
    """A Qpid JMS ``failover:(...)`` URL over ``urls``, reconnecting quickly."""
    query = {"failover.initialReconnectDelay": 100, "failover.reconnectDelay": 200,
             "failover.maxReconnectAttempts": 100, **options}
    return f"failover:({','.join(urls)})?" + "&".join(f"{k}={v}" for k, v in query.items())


class JmsClient(ClientProcess):
    """``fedgate.JmsClient COMMAND ARGS...`` with stdin open (``send``/``receive`` may pause)."""

    def __init__(self, *args) -> None:  # noqa: super().__init__ runs proton_client
        self.cmd = jms_command(*args)
        self.proc = subprocess.Popen(self.cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, bufsize=0)
        self._pending = b""

    def until_paused(self, timeout: float = 60.0) -> list[dict]:
        lines = [self.readline(timeout=timeout)]
        while "paused" not in lines[-1] and "error" not in lines[-1]:
            lines.append(self.readline(timeout=timeout))
        return lines

    def resume(self) -> None:
        self.proc.stdin.write(b"go\n")
        self.proc.stdin.flush()
