"""Reusable pieces for fedgate benchmarks.

Only the standard library is used, so a benchmark can run from the project's
venv without importing fedgate itself. Everything that waits is bounded by a
timeout, and every process started here is stopped by the caller's ``finally``
(see :func:`stop_process`) or by :func:`run_concurrently` itself.

Pieces:
  * paths: :data:`REPO_ROOT`, :data:`SEND_BIN`, :data:`RECEIVE_BIN` (quiet C
    clients built by ``.ci/install/c-clients.sh``), :func:`fedgate_bin`
  * ports: :func:`free_port`, :func:`port_open`, :func:`wait_for_port`,
    :func:`listener_pid`
  * node: :func:`start_fedgate_node`, :func:`stop_process`
  * clients: :func:`sender_cmd`, :func:`receiver_cmd`, :func:`run_concurrently`,
    :func:`run_client_pair`
  * CPU: :func:`proc_cpu_seconds`, :func:`tree_cpu_seconds`, :class:`CpuMeter`,
    :func:`rabbitmq_pid`
  * stats: :func:`median`
"""

from __future__ import annotations

import dataclasses
import os
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterable, Sequence

REPO_ROOT = Path(__file__).resolve().parent.parent
BUILD_DIR = REPO_ROOT / ".build" / "bench"
SEND_BIN = BUILD_DIR / "send"
RECEIVE_BIN = BUILD_DIR / "receive"
CLK_TCK = os.sysconf("SC_CLK_TCK")

DEFAULT_BODY_BYTES = 100
DEFAULT_CREDIT_WINDOW = 1000


class BenchError(RuntimeError):
    """A benchmark step failed (timeout, early exit, missing tool...)."""


# ---------------------------------------------------------------- paths


def rel(path: Path | str) -> str:
    """Path relative to the repo root when inside it (keeps output portable)."""
    p = Path(path).resolve()
    try:
        return str(p.relative_to(REPO_ROOT))
    except ValueError:
        return str(p)


def fedgate_bin() -> Path:
    """The ``fedgate`` console script of the project's venv (or of PATH)."""
    cands = [REPO_ROOT / ".venv" / "bin" / "fedgate",
             Path(sys.executable).parent / "fedgate"]
    for c in cands:
        if c.is_file() and os.access(c, os.X_OK):
            return c
    found = shutil.which("fedgate")
    if found:
        return Path(found)
    raise BenchError("fedgate executable not found (expected .venv/bin/fedgate; "
                     "install the project into the venv: .venv/bin/pip install -e .)")


def require_c_clients() -> None:
    for b in (SEND_BIN, RECEIVE_BIN):
        if not (b.is_file() and os.access(b, os.X_OK)):
            raise BenchError(f"{rel(b)} missing: run bash .ci/install/c-clients.sh")


# ---------------------------------------------------------------- ports


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free right now on ``host`` (small race window)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_open(host: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_for_port(host: str, port: int, timeout: float = 30.0,
                  proc: subprocess.Popen | None = None, interval: float = 0.1) -> float:
    """Wait until ``host:port`` accepts TCP connections; return seconds waited.

    Raises :class:`BenchError` on timeout, or at once if ``proc`` exits first.
    """
    t0 = time.monotonic()
    deadline = t0 + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            raise BenchError(f"process {proc.pid} exited with {proc.returncode} "
                             f"before {host}:{port} accepted connections")
        if port_open(host, port, timeout=min(1.0, max(0.05, deadline - time.monotonic()))):
            return time.monotonic() - t0
        if time.monotonic() >= deadline:
            raise BenchError(f"{host}:{port} did not accept connections within {timeout:.0f}s")
        time.sleep(interval)


def tcp_sockets():
    """(local port, remote port, state, inode) of every TCP socket in /proc/net/tcp{,6}.

    States are the kernel's hex codes: "0A" listening, "01" established.
    """
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    parts = line.split()
                    yield (int(parts[1].rsplit(":", 1)[1], 16), int(parts[2].rsplit(":", 1)[1], 16),
                           parts[3], parts[9])
        except FileNotFoundError:
            continue


def _listen_inodes(port: int) -> set[str]:
    return {inode for local, _, state, inode in tcp_sockets() if state == "0A" and local == port}


def established_to(pid: int, port: int) -> int:
    """TCP connections of process ``pid`` established to remote ``port``."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return sum(1 for _, remote, state, inode in tcp_sockets()
               if state == "01" and remote == port and inode in inodes)


def listener_pid(port: int) -> int | None:
    """Pid of the process holding a listening TCP socket on ``port``."""
    inodes = _listen_inodes(port)
    if not inodes:
        return None
    targets = {f"socket:[{i}]" for i in inodes}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        fd_dir = f"/proc/{d}/fd"
        try:
            for fd in os.listdir(fd_dir):
                try:
                    if os.readlink(f"{fd_dir}/{fd}") in targets:
                        return int(d)
                except OSError:
                    continue
        except OSError:
            continue
    return None


# ---------------------------------------------------------------- CPU time


def _stat_fields(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as f:
        data = f.read()
    # comm (field 2) may contain spaces/parens: fields after the last ')'.
    return data[data.rindex(")") + 2:].split()


def proc_comm(pid: int) -> str:
    with open(f"/proc/{pid}/comm") as f:
        return f.read().strip()


def proc_cpu_seconds(pid: int) -> float:
    """utime + stime of one process (fields 14 and 15 of /proc/PID/stat)."""
    f = _stat_fields(pid)
    # f[0] is field 3 (state): utime = field 14 -> f[11], stime = field 15 -> f[12]
    return (int(f[11]) + int(f[12])) / CLK_TCK


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    task_dir = f"/proc/{pid}/task"
    try:
        for tid in os.listdir(task_dir):
            try:
                with open(f"{task_dir}/{tid}/children") as f:
                    kids.extend(int(x) for x in f.read().split())
            except OSError:
                continue
    except OSError:
        pass
    return kids


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of ``pid`` plus its live descendants (worker processes)."""
    total = 0.0
    stack, seen = [pid], set()
    while stack:
        p = stack.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            total += proc_cpu_seconds(p)
        except (OSError, ValueError, IndexError):
            if p == pid:
                raise
            continue
        stack.extend(_children(p))
    return total


class CpuMeter:
    """CPU-time delta of a process tree between ``start()`` and ``stop()``."""

    def __init__(self, pid: int, tree: bool = True):
        self.pid = pid
        self.tree = tree
        self._t0 = 0.0
        self.seconds = 0.0

    def _read(self) -> float:
        return tree_cpu_seconds(self.pid) if self.tree else proc_cpu_seconds(self.pid)

    def start(self) -> "CpuMeter":
        self._t0 = self._read()
        return self

    def stop(self) -> float:
        self.seconds = self._read() - self._t0
        return self.seconds


def rabbitmq_pid(port: int = int(os.environ.get("RABBITMQ_PORT", "5682"))) -> int:
    """Pid of RabbitMQ's Erlang VM (beam.smp) listening on ``port``."""
    pid = listener_pid(port)
    if pid is None:
        raise BenchError(f"nothing listens on port {port}: run bash .ci/install/rabbitmq.sh")
    comm = proc_comm(pid)
    if not comm.startswith("beam"):
        raise BenchError(f"port {port} is held by pid {pid} ({comm}), not RabbitMQ's beam.smp")
    return pid


# ---------------------------------------------------------------- processes


_serve_opts_cache: dict[str, frozenset[str]] = {}


def serve_options(exe: Path | str) -> frozenset[str]:
    """Long options that ``EXE serve --help`` lists (empty set if it fails)."""
    key = str(exe)
    if key not in _serve_opts_cache:
        import re
        try:
            out = subprocess.run([key, "serve", "--help"], capture_output=True, text=True,
                                 timeout=30, stdin=subprocess.DEVNULL).stdout
        except (OSError, subprocess.TimeoutExpired):
            out = ""
        _serve_opts_cache[key] = frozenset(re.findall(r"(--[a-z][a-z0-9-]*)", out))
    return _serve_opts_cache[key]


def start_fedgate_node(port: int, data_dir: Path | str, host: str = "127.0.0.1",
                       extra_args: Sequence[str] = (), log_path: Path | str | None = None,
                       ready_timeout: float = 30.0, exe: Path | str | None = None,
                       env: dict | None = None, admin: str | None = "auto") -> subprocess.Popen:
    """Start ``fedgate serve --listen HOST:PORT --data-dir DIR`` and wait until
    the port accepts connections. The caller must :func:`stop_process` it.

    ``admin="auto"``: if the CLI has ``--admin``, give the admin API a free
    port (its default port may be taken by another node); ``None``: leave the
    default; any other value is passed as ``--admin VALUE``.
    """
    exe = Path(exe) if exe else fedgate_bin()
    Path(data_dir).mkdir(parents=True, exist_ok=True)
    cmd = [str(exe), "serve", "--listen", f"{host}:{port}", "--data-dir", str(data_dir)]
    if admin == "auto":
        if "--admin" in serve_options(exe) and "--admin" not in extra_args:
            cmd += ["--admin", f"{host}:{free_port(host)}"]
    elif admin is not None:
        cmd += ["--admin", admin]
    cmd += list(extra_args)
    out = open(log_path, "ab") if log_path else subprocess.DEVNULL
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                cwd=str(REPO_ROOT), env=env)
    finally:
        if log_path:
            out.close()
    try:
        wait_for_port(host, port, timeout=ready_timeout, proc=proc)
    except BaseException:
        stop_process(proc)
        raise
    return proc


def stop_process(proc: subprocess.Popen | None, timeout: float = 10.0) -> int | None:
    """SIGTERM, wait up to ``timeout``, then SIGKILL. Signals the process group
    when the process leads its own session (started with start_new_session)."""
    if proc is None:
        return None
    if proc.poll() is not None:
        return proc.returncode

    def _signal(sig: int) -> None:
        try:
            if os.getpgid(proc.pid) == proc.pid:
                os.killpg(proc.pid, sig)
            else:
                proc.send_signal(sig)
        except ProcessLookupError:
            pass

    _signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _signal(signal.SIGKILL)
        try:
            return proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return None


# ---------------------------------------------------------------- C clients


_BURNER = """
import sys, time
share = float(sys.argv[1])
period = 0.002
while True:
    start = time.perf_counter()
    while time.perf_counter() - start < share * period:
        pass
    time.sleep(max(0.0, period - (time.perf_counter() - start)))
"""


def start_burner(share: float) -> subprocess.Popen:
    """A process keeping ``share`` (0..1) of one CPU busy: a 2 ms busy/sleep cycle."""
    return subprocess.Popen([sys.executable, "-c", _BURNER, f"{min(share, 1.0):.3f}"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)


def stop_burner(proc: subprocess.Popen) -> float:
    """Stop a burner; the CPU seconds it used."""
    cpu = proc_cpu_seconds(proc.pid)
    proc.kill()
    proc.wait(timeout=10)
    return cpu


def sender_cmd(host: str, port: int, address: str, count: int,
               body_bytes: int = DEFAULT_BODY_BYTES, rate: float = 0) -> list[str]:
    """``rate`` > 0 paces the sender to that many messages per second."""
    cmd = [str(SEND_BIN), host, str(port), address, str(count), str(body_bytes)]
    return cmd + [f"{rate:.1f}"] if rate > 0 else cmd


def receiver_cmd(host: str, port: int, address: str, count: int,
                 credit_window: int = DEFAULT_CREDIT_WINDOW) -> list[str]:
    return [str(RECEIVE_BIN), host, str(port), address, str(count), str(credit_window)]


@dataclasses.dataclass
class ClientRun:
    cmd: list[str]
    returncode: int | None
    output: str
    elapsed: float          # seconds from the start of the batch until this one exited


@dataclasses.dataclass
class BatchResult:
    elapsed: float          # seconds from the first start until the last exit
    runs: list[ClientRun]
    timed_out: bool
    clients_cpu: float      # CPU seconds used by the client processes (rusage)

    @property
    def ok(self) -> bool:
        return not self.timed_out and all(r.returncode == 0 for r in self.runs)

    def describe_failure(self) -> str:
        parts = []
        if self.timed_out:
            parts.append("timed out")
        for r in self.runs:
            if r.returncode != 0:
                name = Path(r.cmd[0]).name
                tail = r.output.strip().splitlines()[-3:]
                parts.append(f"{name} rc={r.returncode}: {' | '.join(tail)}")
        return "; ".join(parts) or "ok"


def run_concurrently(cmds: Iterable[Sequence[str]], timeout: float,
                     stagger: float = 0.0, lead: int = 0, lead_gap: float = 0.1) -> BatchResult:
    """Start all ``cmds`` (in order, ``stagger`` s apart) and wait until all exit.

    ``lead``: the first ``lead`` commands (receivers, say) start ``lead_gap`` s
    apart before the clock starts, so they connect one after the other (a node
    with workers gives each to the worker with the fewest connections); the
    clock starts ``lead_gap`` after the last of them, with the rest.
    Bounded by ``timeout`` seconds; any process still running then is killed.
    Output (stdout+stderr) of each process is captured in a temp file.
    """
    import tempfile

    cmds = [list(map(str, c)) for c in cmds]
    procs: list[subprocess.Popen] = []
    files = []
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    for c in cmds[:lead]:
        f = tempfile.TemporaryFile()
        files.append(f)
        procs.append(subprocess.Popen(c, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT))
        time.sleep(lead_gap)
    t0 = time.monotonic()
    ended: dict[int, float] = {}
    timed_out = False
    try:
        for i, c in enumerate(cmds):
            if i < lead:
                continue
            if i > lead and stagger:
                time.sleep(stagger)
            f = tempfile.TemporaryFile()
            files.append(f)
            procs.append(subprocess.Popen(c, stdin=subprocess.DEVNULL, stdout=f,
                                          stderr=subprocess.STDOUT))
        deadline = t0 + timeout
        while len(ended) < len(procs):
            for i, p in enumerate(procs):
                if i not in ended and p.poll() is not None:
                    ended[i] = time.monotonic() - t0
            if len(ended) == len(procs):
                break
            if time.monotonic() >= deadline:
                timed_out = True
                break
            time.sleep(0.005)
        elapsed = (max(ended.values()) if ended and not timed_out
                   else time.monotonic() - t0)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for p in procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    runs = []
    for i, (c, p, f) in enumerate(zip(cmds, procs, files)):
        f.seek(0)
        out = f.read().decode(errors="replace")
        f.close()
        rc = p.returncode if i in ended else None
        runs.append(ClientRun(cmd=c, returncode=rc, output=out,
                              elapsed=ended.get(i, elapsed)))
    cpu = (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime)
    return BatchResult(elapsed=elapsed, runs=runs, timed_out=timed_out, clients_cpu=cpu)


def run_client_pair(host: str, port: int, address: str, count: int, timeout: float,
                    body_bytes: int = DEFAULT_BODY_BYTES,
                    credit_window: int = DEFAULT_CREDIT_WINDOW,
                    send_address: str | None = None,
                    send_host: str | None = None, send_port: int | None = None) -> BatchResult:
    """One quiet C receiver and one C sender of ``count`` messages, concurrently.

    The receiver is started first. ``send_*`` let the sender use another
    endpoint (e.g. send through a proxy, receive directly).
    """
    require_c_clients()
    return run_concurrently([
        receiver_cmd(host, port, address, count, credit_window),
        sender_cmd(send_host or host, send_port or port, send_address or address,
                   count, body_bytes),
    ], timeout=timeout)


# ---------------------------------------------------------------- stats


def median(values: Sequence[float]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def speed_probe(repeat: int = 5) -> float:
    """µs one CPU takes for a fixed piece of pure Python work (best of ``repeat``).

    This VM's speed moves by up to half within an hour; a run's CPU figures are
    comparable with another run's only at a similar probe (lower is faster).
    """
    best = float("inf")
    for _ in range(repeat):
        start = time.thread_time()
        table: dict = {}
        for i in range(20_000):
            table[i & 255] = table.get(i & 255, 0) + i
        best = min(best, time.thread_time() - start)
    return round(best * 1e6, 1)


def machine_info() -> dict:
    info = {"cpus": os.cpu_count(), "speed_probe_us": speed_probe()}
    try:
        info["loadavg_1m"] = os.getloadavg()[0]
    except OSError:
        pass
    return info
