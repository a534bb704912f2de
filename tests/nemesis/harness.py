"""The nemesis (issue #42): three fedgate nodes on etcd, every link through a Toxiproxy of its
own, a seeded schedule of faults under a logged workload, then Jepsen's total-queue check.

How this works
--------------
* ``NemesisCluster`` starts a private etcd (one member, or three with ``etcd_size = 3``: the
  combined mode, whose faults include the etcd leader killed), and three nodes ``n1..n3``.
  Every node -> etcd member link, every node -> node link (one proxy per ordered pair: ``[cluster] reach``
  points each node at its own proxy for each peer) and every client -> node link goes
  through its own Toxiproxy proxy, so a fault can cut exactly one link, or one direction
  of it. A partition is a blackhole (the ``timeout`` toxic with timeout 0: bytes dropped,
  connections left open and silent), never a disabled proxy.
* Queues (``QUEUES``): ``nem.r3`` replicated, 3 copies, ``min_in_sync = 2``; ``nem.r2``
  replicated, 2 copies; ``nem.d`` replicated and durable (3 copies); ``nem.f`` a fragmented
  queue whose fragments are replicated (2 copies). The control run uses ``ctl.local``: a
  plain local queue on one node, which a kill -9 is allowed to lose.
* ``Workload``: per queue a producer and a consumer on every node, each given every node's
  URL (its own first): python-qpid-proton Container clients (``client.py``) on n1 and n3,
  rhea clients (``tests/js/nemesis_client.js``, the same history) on n2, and Qpid JMS
  (``failover:`` URL, ``tests/jms``'s ``nemesis-produce`` / ``nemesis-consume``) for
  ``nem.r3`` on n3; a message's value is its body (a JMS producer cannot set the id); their histories are merged into one JSON-lines
  file in Jepsen's operation shape.
* ``FAULTS``: each a function ``(cluster, target, rng) -> heal``, where the target is a
  role resolved when the fault starts (``primary`` / ``backup`` of ``nem.r3``, or
  ``random``). ``schedule(seed, seconds, mode)`` draws episodes (fault, target, length);
  ``single``: one fault at a time with quiet time between; ``combined``: two faults
  overlapping. Every episode is logged with its wall-clock start and end.
* After the schedule: everything healed and every node up, producers stop, and the
  consumers drain until every accepted value was seen (bounded), then the checker runs.
  The run's files (history, faults, report, node logs) stay in its directory.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import threading
import time
from contextlib import suppress
from pathlib import Path

from admin_client import http, wait_for
from cluster_support import etcd_node, wait_members
from conftest import PYTHON, TESTS
from etcd_servers import EtcdCluster, EtcdMember

import checker

NAMES = ("n1", "n2", "n3")
LEASE_TTL = 3
CLIENT = TESTS / "nemesis" / "client.py"
JS_CLIENT = TESTS / "js" / "nemesis_client.js"  # the same client on rhea (reconnect: true)
# which client library each node's clients use: proton's Container, rhea and Qpid JMS
# (failover:), none of which attaches again a link the server ended; JMS on n3 for one queue
# only (a JVM per client)
CLIENT_LIBRARY = {"n1": "proton", "n2": "rhea", "n3": "proton"}
# opt-in (NEMESIS_JMS=1): once, in the combined seed 10 run alone, a JMS producer's send had no
# outcome for over a minute and the run timed out waiting for it (docs/nemesis.md, not yet found)
JMS_CLIENTS = {("n3", "nem.r3")} if os.environ.get("NEMESIS_JMS") == "1" else set()
# opt-in (NEMESIS_PAGING=BUDGET,READ_AHEAD, e.g. 20000,20): every node with [limits] max_memory
# BUDGET bytes and [paging] read_ahead: backlogs, primaries' and backups', page to disk
# under the faults (docs/paging.md)
PAGING = os.environ.get("NEMESIS_PAGING", "")


def paging_sections() -> dict:
    if not PAGING:
        return {}
    budget, read_ahead = (int(v) for v in PAGING.split(","))
    return {"limits": {"max_memory": budget}, "paging": {"read_ahead": read_ahead}}


def library(node: str, address: str) -> str:
    return "jms" if (node, address) in JMS_CLIENTS else CLIENT_LIBRARY[node]
QUEUES = {
    "nem.r3": {"name": "r3", "match": "nem.r3", "kind": "replicated", "replicas": 3, "min_in_sync": 2},
    "nem.r2": {"name": "r2", "match": "nem.r2", "kind": "replicated", "replicas": 2},
    "nem.d": {"name": "d", "match": "nem.d", "kind": "replicated", "replicas": 3, "durable": True},
    "nem.f": {"name": "f", "match": "nem.f", "kind": "fragmented", "fragments": list(NAMES),
              "replicas": 2},
}


def _toxics(proxy, kind: str, attributes: dict, streams):
    """Toxics of ``kind`` on ``streams`` of ``proxy``; returns the heal (removes them)."""
    names = []
    for stream in streams:
        name = f"{kind}_{stream}_{time.monotonic_ns()}"
        proxy.proxy.add_toxic(name=name, type=kind, stream=stream, attributes=attributes)
        names.append(name)

    def heal() -> None:
        for name in names:
            with suppress(Exception):
                proxy.proxy.destroy_toxic(name)
    return heal


def blackhole(proxy, streams=("upstream", "downstream")):
    """Every byte dropped, in ``streams``; connections stay open and silent. Returns the heal."""
    return _toxics(proxy, "timeout", {"timeout": 0}, streams)


def latency(proxy, ms: int = 100, jitter: int = 50):
    return _toxics(proxy, "latency", {"latency": ms, "jitter": jitter}, ("upstream", "downstream"))


class NemesisCluster:
    def __init__(self, workdir: Path, start_node, toxi, cluster_name: str, *,
                 queues: dict = QUEUES, etcd_size: int = 1) -> None:
        self.workdir = workdir
        self.toxi = toxi
        self.etcd_cluster = None
        if etcd_size > 1:
            self.etcd_cluster = EtcdCluster(workdir, etcd_size).start()
            self.etcd_members = list(self.etcd_cluster.members)
        else:
            self.etcd_members = [EtcdMember(workdir, "e1").start()]
        self.nodes = {}
        ports = {name: _free_port() for name in NAMES}
        self.client_proxy = {n: toxi.proxy(f"client-{n}", ports[n]) for n in NAMES}
        # every node reaches every etcd member through a proxy of its own
        self.etcd_proxies = {n: [toxi.proxy(f"etcd{k}-{n}", m.client_port)
                                 for k, m in enumerate(self.etcd_members)] for n in NAMES}
        self.pair = {(a, b): toxi.proxy(f"{a}-to-{b}", ports[b]) for a in NAMES for b in NAMES if a != b}
        self.queues = queues
        for name in NAMES:
            reach = {b: self.pair[(name, b)].url for b in NAMES if b != name}
            self.nodes[name] = etcd_node(
                start_node, name, [f"http://127.0.0.1:{p.port}" for p in self.etcd_proxies[name]],
                cluster_name,
                rules=list(queues.values()), lease_ttl=LEASE_TTL,
                cluster={"reach": reach}, node={"log_level": "info", "listen": f"127.0.0.1:{ports[name]}"},
                **paging_sections())
        for node in self.nodes.values():
            wait_members(node, list(NAMES), 20.0)

    # -- who is who ------------------------------------------------------------------------
    def client_urls(self, first: str) -> str:
        order = [first] + [n for n in NAMES if n != first]
        return ",".join(self.client_proxy[n].url for n in order)

    def primary_of(self, address: str) -> str | None:
        for name, node in self.nodes.items():
            if not node.alive():
                continue
            with suppress(Exception):
                status, body = http("GET", node.admin_url + "/api/v1/queues", timeout=1.0)
                if status == 200:
                    for q in body["queues"]:
                        if q["name"] == address and q.get("role") == "primary" and "depth" in q:
                            return name
        return None

    def resolve(self, target: str, rng: random.Random) -> str:
        if target in self.nodes:
            return target
        primary = self.primary_of("nem.r3") or rng.choice(NAMES)
        if target == "primary":
            return primary
        if target == "backup":
            return rng.choice([n for n in NAMES if n != primary])
        return rng.choice(NAMES)

    # -- processes ---------------------------------------------------------------------------
    def kill(self, name: str) -> None:
        self.nodes[name].kill()

    def restart(self, name: str) -> None:
        node = self.nodes[name]
        if node.alive():
            return
        node.log.close()
        node.start(timeout=30.0)

    def signal(self, name: str, sig) -> None:
        node = self.nodes[name]
        if node.alive():
            os.kill(node.proc.pid, sig)

    def heal_all(self) -> None:
        for proxy in [*self.client_proxy.values(), *self.all_etcd_proxies(), *self.pair.values()]:
            with suppress(Exception):
                for toxic in list(proxy.proxy.toxics()):
                    proxy.proxy.destroy_toxic(toxic)
        for member in self.etcd_members:
            with suppress(Exception):
                os.kill(member.proc.pid, signal.SIGCONT)
            if not member.alive():
                member.start()
        for name in NAMES:
            self.signal(name, signal.SIGCONT)
            self.restart(name)

    def wait_settled(self, timeout: float = 30.0) -> None:
        """Every node a member again and every replicated queue served."""
        for node in self.nodes.values():
            wait_members(node, list(NAMES), timeout)
        for address, rule in self.queues.items():
            if rule["kind"] == "replicated":
                wait_for(lambda a=address: self.primary_of(a) is not None, timeout=timeout,
                         interval=0.2, what=f"a primary of {address}")

    def all_in_sync(self) -> bool:
        """Every replicated queue and fragment served, each primary with its whole replica set
        in sync (what an operator checks before restarting the next node)."""
        served = set()
        for node in self.nodes.values():
            if not node.alive():
                return False
            with suppress(Exception):
                status, body = http("GET", node.admin_url + "/api/v1/queues", timeout=1.0)
                for q in body["queues"] if status == 200 else ():
                    r = q.get("replication") or {}
                    if r.get("role") != "primary":
                        continue
                    if len(r.get("in_sync") or []) < len(r.get("placement") or []) - 1:
                        return False
                    served.add(q["name"])
        return all(a in served for a, rule in self.queues.items() if rule["kind"] == "replicated")

    def all_etcd_proxies(self) -> list:
        return [p for proxies in self.etcd_proxies.values() for p in proxies]

    def stop(self) -> None:
        for node in self.nodes.values():
            with suppress(Exception):
                self.signal(node.config_path.stem, signal.SIGCONT)
        for member in self.etcd_members:
            with suppress(Exception):
                os.kill(member.proc.pid, signal.SIGCONT)
                member.stop()


def _free_port() -> int:
    from conftest import free_port
    return free_port()


# -- faults: (cluster, target, rng, length) -> heal ------------------------------------------
def f_kill(c, t, rng, length):
    c.kill(t)
    return lambda: c.restart(t)


def f_pause(c, t, rng, length):
    c.signal(t, signal.SIGSTOP)  # held for the episode's length (2.5 x lease_ttl)
    return lambda: c.signal(t, signal.SIGCONT)


def f_isolate(c, t, rng, length):
    heals = [blackhole(p) for p in c.etcd_proxies[t]]
    heals += [blackhole(p) for (a, b), p in c.pair.items() if t in (a, b)]
    return lambda: [h() for h in heals]


def f_etcd_cut(c, t, rng, length):
    heals = [blackhole(p) for p in c.etcd_proxies[t]]
    return lambda: [h() for h in heals]


def f_peers_cut(c, t, rng, length):
    heals = [blackhole(p) for (a, b), p in c.pair.items() if t in (a, b)]
    return lambda: [h() for h in heals]


def f_one_way(c, t, rng, length):
    """The target hears nothing back from etcd and from its peers (what it sends arrives)."""
    heals = [blackhole(p, streams=("downstream",)) for p in c.etcd_proxies[t]]
    heals += [blackhole(p, streams=("downstream",)) for (a, b), p in c.pair.items() if a == t]
    return lambda: [h() for h in heals]


def f_etcd_pause(c, t, rng, length):
    """Every etcd member paused (a frozen VM holding the whole etcd cluster)."""
    pids = [m.proc.pid for m in c.etcd_members if m.alive()]
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    return lambda: [os.kill(pid, signal.SIGCONT) for pid in pids]


def f_etcd_leader_kill(c, t, rng, length):
    """With three members: the etcd leader killed -9, started again at the heal (the other
    two elect a new leader meanwhile; leases carry over)."""
    if c.etcd_cluster is None:
        return lambda: None
    leader = c.etcd_cluster.leader()
    leader.kill()
    return lambda: leader.alive() or leader.start()


def f_latency_kill(c, t, rng, length):
    heals = [latency(p) for p in [*c.all_etcd_proxies(), *c.pair.values(), *c.client_proxy.values()]]
    primary = c.resolve("primary", rng)
    c.kill(primary)

    def heal():
        for h in heals:
            h()
        c.restart(primary)
    return heal


def f_pause_backup_kill_primary(c, t, rng, length):
    primary = c.resolve("primary", rng)
    backup = rng.choice([n for n in NAMES if n != primary])
    c.signal(backup, signal.SIGSTOP)
    c.kill(primary)
    threading.Timer(length / 2, lambda: c.signal(backup, signal.SIGCONT)).start()

    def heal():
        c.signal(backup, signal.SIGCONT)
        c.restart(primary)
    return heal


def f_power_loss(c, t, rng, length):
    for name in NAMES:
        c.kill(name)

    def heal():
        threads = [threading.Thread(target=c.restart, args=(n,)) for n in NAMES]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    return heal


def f_rolling_restart(c, t, rng, length):
    """SIGTERM and start again, node by node, as an upgrade is done: the next one only once
    every copy is in sync again (bounded: 30 s, then on all the same)."""
    for name in NAMES:
        node = c.nodes[name]
        node.stop(timeout=10.0)
        c.restart(name)
        wait_members(node, list(NAMES), 20.0)
        with suppress(AssertionError, TimeoutError):
            wait_for(c.all_in_sync, timeout=30.0, interval=0.3, what="every copy in sync")
    return lambda: None


FAULTS = {
    "kill": (f_kill, 4.0),
    "pause": (f_pause, 2.5 * LEASE_TTL),
    "isolate": (f_isolate, 6.0),
    "etcd-cut": (f_etcd_cut, 6.0),
    "peers-cut": (f_peers_cut, 6.0),
    "one-way": (f_one_way, 6.0),
    "etcd-pause": (f_etcd_pause, 10.0),
    "etcd-leader-kill": (f_etcd_leader_kill, 6.0),
    "latency-kill": (f_latency_kill, 6.0),
    "pause-backup-kill-primary": (f_pause_backup_kill_primary, 6.0),
    "power-loss": (f_power_loss, 1.0),
    "rolling-restart": (f_rolling_restart, 0.0),
}
TARGETED = ("kill", "pause", "isolate", "etcd-cut", "peers-cut", "one-way")
SINGLE = TARGETED  # one fault at a time, on the primary, a backup or any node
COMBINED = ("latency-kill", "pause-backup-kill-primary", "etcd-pause", "power-loss",
            "rolling-restart", "kill", "isolate", "etcd-leader-kill")  # with 3 etcd members


def schedule(seed: int, seconds: float, *, kinds=None, quiet: float = 6.0) -> list[dict]:
    """Episodes for ``seconds`` of faults: ``{"fault", "target", "at", "length"}``, the kinds in
    a seeded order, each once before any comes again. A kind may name its target
    (``"one-way@primary"``)."""
    rng = random.Random(seed)
    kinds = list(kinds or FAULTS)
    rng.shuffle(kinds)  # every kind once before any comes again: a short run covers the most
    out, at = [], quiet
    while at < seconds:
        fault, _, target = kinds[len(out) % len(kinds)].partition("@")  # "one-way@primary": fixed
        if fault in TARGETED:
            target = target or rng.choice(("primary", "backup", "random"))
        else:
            target = "-"
        length = FAULTS[fault][1]
        out.append({"fault": fault, "target": target, "at": round(at, 2), "length": length})
        at += length + quiet
    return out


class Run:
    """One nemesis run: workload, episodes, drain, check. Everything it did is in ``workdir``."""

    def __init__(self, cluster: NemesisCluster, workdir: Path, *, seed: int, run_id: str,
                 rate: float = 20.0, addresses=None, consumers: bool = True) -> None:
        self.cluster = cluster
        self.workdir = workdir
        self.seed = seed
        self.run_id = run_id
        self.rate = rate
        self.addresses = list(addresses or cluster.queues)
        self.producers: list = []
        self.consumers: list = []
        self.faults: list[dict] = []
        self.rng = random.Random(seed ^ 0x5EED)
        self.consume_first = consumers  # False: consumers only for the final drain

    def _client(self, mode: str, address: str, node: str, seconds: float) -> subprocess.Popen:
        process = f"{mode[0]}-{address}-{node}"
        kind = library(node, address)
        if kind == "jms" and address in self.cluster.queues:
            args = self._jms(mode, address, node, process, seconds)
            out = open(self.workdir / f"{process}.jsonl", "wb")
            return subprocess.Popen(args, stdout=out, stderr=subprocess.DEVNULL)
        program = [PYTHON, str(CLIENT)] if kind != "rhea" else ["node", str(JS_CLIENT)]
        args = [*program, mode, "--urls", self.cluster.client_urls(node), "--address",
                address, "--process", process, "--run", self.run_id]
        if mode == "produce":
            args += ["--rate", str(self.rate), "--seconds", str(seconds), "--grace", "20"]
            if self.cluster.queues.get(address, {}).get("durable"):
                args.append("--durable")
        out = open(self.workdir / f"{process}.jsonl", "wb")
        return subprocess.Popen(args, stdout=out, stderr=subprocess.DEVNULL)

    def _jms(self, mode: str, address: str, node: str, process: str, seconds: float) -> list[str]:
        from replication_support import failover_url, jms_command

        urls = self.cluster.client_urls(node).split(",")
        url = failover_url(urls, **{"failover.maxReconnectAttempts": -1,
                                    "jms.prefetchPolicy.all": 50,
                                    # heartbeats, as the other clients (finding 21)
                                    "failover.nested.amqp.idleTimeout": 3000})
        if mode == "produce":
            return jms_command("nemesis-produce", url, address, process, self.run_id, self.rate,
                               seconds)
        return jms_command("nemesis-consume", url, address, process)

    def run(self, episodes: list[dict], *, drain_timeout: float = 60.0) -> dict:
        seconds = max((e["at"] + e["length"] for e in episodes), default=10.0) + 6.0
        if self.consume_first:
            for address in self.addresses:
                for node in NAMES:
                    self.consumers.append(self._client("consume", address, node, seconds))
            time.sleep(1.0)
        for address in self.addresses:
            for node in NAMES:
                self.producers.append(self._client("produce", address, node, seconds))
        started = time.time()
        try:
            for episode in episodes:
                delay = started + episode["at"] - time.time()
                if delay > 0:
                    time.sleep(delay)
                self._episode(episode)
        finally:
            self.cluster.heal_all()
        for proc in self.producers:
            proc.wait(timeout=seconds + 60)
        self.cluster.wait_settled()
        if not self.consume_first:
            for address in self.addresses:
                for node in NAMES:
                    self.consumers.append(self._client("consume", address, node, 0))
        report = self._drain(drain_timeout)
        return report

    def _episode(self, episode: dict) -> None:
        make, _ = FAULTS[episode["fault"]]
        target = self.cluster.resolve(episode["target"], self.rng) if episode["target"] != "-" else "-"
        record = {"fault": episode["fault"], "target": episode["target"], "node": target,
                  "start": time.time()}
        heal = make(self.cluster, target, self.rng, episode["length"])
        time.sleep(episode["length"])
        heal()
        record["end"] = time.time()
        self.faults.append(record)
        with open(self.workdir / "faults.jsonl", "a") as out:
            out.write(json.dumps(record) + "\n")

    def history(self) -> list[dict]:
        ops = []
        for path in sorted(self.workdir.glob("*.jsonl")):
            if path.name in ("faults.jsonl", "history.jsonl"):
                continue
            for line in path.read_text().splitlines():
                with suppress(ValueError):
                    ops.append(json.loads(line))
        ops.sort(key=lambda op: op.get("time", 0))
        return ops

    def may_lose(self, op: dict) -> bool:
        """docs/replication.md promises a queue that is not durable nothing when every copy
        is lost: a message of one, accepted before the end of a power loss (every node
        killed at once), may be gone with it."""
        process = op.get("process", "")
        address = process[2:].rsplit("-", 1)[0] if process.startswith("p-") else ""
        if self.cluster.queues.get(address, {}).get("durable", False):  # the rules' default
            return False
        # accepted in the 10 s before it (a message left unconsumed longer is a finding)
        return any(f["fault"] == "power-loss" and f["start"] - 10.0 <= op.get("time", 0) <= f["end"]
                   for f in self.faults)

    def _drain(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            result = checker.check(self.history(), self.may_lose)
            if result["lost"] == 0:
                break
            time.sleep(1.0)
        for proc in self.consumers:
            proc.send_signal(signal.SIGTERM)
        for proc in self.consumers:
            with suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
            if proc.poll() is None:
                proc.kill()
        history = self.history()
        (self.workdir / "history.jsonl").write_text("".join(json.dumps(op) + "\n" for op in history))
        result = checker.check(history, self.may_lose)
        result["episodes"] = checker.episodes(history, self.faults)
        result["link_closed"] = sum(1 for op in history if op.get("event") == "link-closed")
        result["seed"] = self.seed
        (self.workdir / "report.json").write_text(json.dumps(result, indent=1))
        return result
