"""Nothing the suite started still listens when it ends (issue #23): `make test` then
`make run` must work on one machine.

How this works
--------------
``check_session`` runs from ``pytest_sessionfinish`` (tests/conftest.py), after every
fixture has been torn down. The processes the tests started are pytest's descendants (the
parent chain in ``/proc/PID/stat``) and any other process whose command line names this
session's temporary directory (one that outlived the process that started it). A TCP socket of theirs in the LISTEN state
(``/proc/net/tcp`` and ``tcp6``, state ``0A``: a TIME_WAIT or established socket is not a
listener) fails the session: the process and its ports are named, and the process is
stopped (SIGTERM, then SIGKILL). A listener being closed by a process that is exiting
gets up to ``SETTLE_S`` seconds first, so only what stays counts.

Not counted:

* pytest's own sockets (in-process nodes): they end with it;
* the PySpark driver JVM and its workers (``SparkContext._gateway.proc``): PySpark keeps
  it for the whole Python process and it exits when pytest's end closes its stdin;
* the test brokers (RabbitMQ, Artemis): they are shared by the whole run, started
  detached, and ``.ci/stop-test-services.sh`` stops them after pytest and fails if any
  of their ports still listens.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's "st" column
SETTLE_S = 10.0
STOP_S = 5.0


def listening_sockets() -> dict[str, int]:
    """Socket inode -> port of every TCP socket in LISTEN state (IPv4 and IPv6)."""
    found: dict[str, int] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == LISTEN:
                found[fields[9]] = int(fields[1].rsplit(":", 1)[1], 16)
    return found


def processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) of every process we can see."""
    found: dict[int, tuple[int, str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:  # gone meanwhile
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])  # after "(comm)": state, ppid
        found[int(entry.name)] = (ppid, cmdline.replace(b"\0", b" ").decode(errors="replace").strip())
    return found


def descendants(root: int, table: dict[int, tuple[int, str]]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def ports_of(pid: int, sockets: dict[str, int]) -> list[int]:
    ports = []
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return ports
    for fd in fds:
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:[") and target[8:-1] in sockets:
            ports.append(sockets[target[8:-1]])
    return sorted(set(ports))


def ending_with_pytest() -> set[int]:
    """Processes that exit when pytest does: the PySpark driver JVM (it reads its stdin
    from pytest until EOF)."""
    spark = sys.modules.get("pyspark")
    gateway = getattr(getattr(spark, "SparkContext", None), "_gateway", None)
    proc = getattr(gateway, "proc", None)
    return {proc.pid} if proc is not None else set()


def left_listeners(root: int, temp_dir: str | None) -> dict[int, tuple[str, list[int]]]:
    """pid -> (command line, ports) of the listeners that root's tests left."""
    table = processes()
    ours = descendants(root, table)
    if temp_dir:
        marker = temp_dir.rstrip("/") + "/"
        ours |= {pid for pid, (_, cmd) in table.items() if marker in cmd}
    for pid in ending_with_pytest():
        ours -= {pid} | descendants(pid, table)
    ours.discard(root)
    sockets = listening_sockets()
    left = {}
    for pid in sorted(ours):
        ports = ports_of(pid, sockets)
        if ports:
            left[pid] = (table[pid][1], ports)
    return left


def _running(pid: int) -> bool:
    """Not gone and not a zombie (its sockets are closed; its parent may never reap it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def _stop(pids) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            if not _running(pid):
                continue
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + STOP_S
        while time.monotonic() < deadline and any(_running(pid) for pid in pids):
            time.sleep(0.05)


def check_session(session) -> None:
    """At the session's end (tests/conftest.py's ``pytest_sessionfinish``)."""
    if not Path("/proc/net/tcp").exists():  # not Linux: nothing to read
        return
    factory = getattr(session.config, "_tmp_path_factory", None)
    try:
        temp_dir = str(factory.getbasetemp()) if factory is not None else None
    except OSError:
        temp_dir = None
    deadline = time.monotonic() + SETTLE_S
    while (left := left_listeners(os.getpid(), temp_dir)) and time.monotonic() < deadline:
        time.sleep(0.1)
    if not left:
        return
    report = session.config.pluginmanager.get_plugin("terminalreporter")
    write = report.write_line if report is not None else (lambda text, **_: print(text))
    write("")
    write("processes started by the tests still listen (stopping them):", red=True, bold=True)
    for pid, (cmdline, ports) in left.items():
        write(f"  pid {pid} listens on {', '.join(map(str, ports))}: {cmdline[:200]}", red=True)
    _stop(list(left))
    if session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
