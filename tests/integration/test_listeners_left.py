"""The suite's own end-of-run check (tests/support/listeners.py, from tests/conftest.py):
a process a test started that still listens fails the run and is stopped; sockets that are
not listeners, and pytest's own, do not count. Run on small suites in a pytest of their own.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from conftest import TESTS

from listeners import listening_sockets

CONFTEST = """
import pytest

@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    from listeners import check_session

    check_session(session)
"""

# a TCP server on a free loopback port: prints the port, then accepts and closes
SERVER = """
import socket
server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen()
print(server.getsockname()[1], flush=True)
while True:
    conn, _ = server.accept()
    conn.close()
"""

SUITE_HEAD = """
import os, socket, subprocess, sys, time
from pathlib import Path

OUT = Path(os.environ["LISTENERS_OUT"])


def server(tmp_path):
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    return script


def wait_for_file(path):
    deadline = time.monotonic() + 20
    while not path.exists() or not path.read_text().strip():
        assert time.monotonic() < deadline, path
        time.sleep(0.05)
    return int(path.read_text())
"""

LEAKY = """
def test_a_child_left_listening(tmp_path):
    child = subprocess.Popen([sys.executable, str(server(tmp_path))], stdout=subprocess.PIPE)
    (OUT / "child").write_text(child.stdout.readline().decode())


def test_an_orphan_left_listening(tmp_path):
    # started through a shell that exits: no longer pytest's descendant, but its
    # command line names the session's temporary directory
    port_file = tmp_path / "port"
    subprocess.run(["sh", "-c", f"{sys.executable} {server(tmp_path)} > {port_file} 2>/dev/null </dev/null &"], check=True)
    (OUT / "orphan").write_text(str(wait_for_file(port_file)))
"""

CLEAN = """
KEPT = []


def test_stopped_children_time_wait_and_pytest_own_sockets(tmp_path):
    child = subprocess.Popen([sys.executable, str(server(tmp_path))], stdout=subprocess.PIPE)
    port = int(child.stdout.readline())
    for _ in range(3):  # the server closes first: its side ends in TIME_WAIT
        with socket.create_connection(("127.0.0.1", port)) as conn:
            assert conn.recv(1) == b""
    child.terminate()
    child.wait(10)
    own = socket.socket()  # pytest's own listener: it ends with pytest
    own.bind(("127.0.0.1", 0))
    own.listen()
    KEPT.append(own)
    (OUT / "clean").write_text(str(port))
"""


def run_suite(tmp_path, body: str):
    suite = tmp_path / "suite"
    suite.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    (suite / "conftest.py").write_text(CONFTEST)
    (suite / "test_suite.py").write_text(f"SERVER = {SERVER!r}\n" + textwrap.dedent(SUITE_HEAD)
                                         + textwrap.dedent(body))
    env = dict(os.environ, LISTENERS_OUT=str(out),
               PYTHONPATH=os.pathsep.join([str(TESTS / "support"), str(TESTS)]))
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "--basetemp", str(tmp_path / "basetemp"), str(suite)],
                         cwd=suite, env=env, capture_output=True, text=True, timeout=90)
    return run, out


def test_a_listener_left_by_a_test_fails_the_run_and_is_stopped(tmp_path):
    run, out = run_suite(tmp_path, LEAKY)
    child, orphan = int((out / "child").read_text()), int((out / "orphan").read_text())
    assert run.returncode == 1, run.stdout + run.stderr
    assert "2 passed" in run.stdout  # the tests passed: the check failed the run
    assert "processes started by the tests still listen (stopping them):" in run.stdout
    reported = [line for line in run.stdout.splitlines() if " listens on " in line]
    assert sorted(int(line.split(" listens on ")[1].split(":")[0]) for line in reported) == \
        sorted([child, orphan]), run.stdout
    still = set(listening_sockets().values())
    assert child not in still and orphan not in still  # stopped by the check


def test_what_is_not_a_leftover_listener_passes(tmp_path):
    run, out = run_suite(tmp_path, CLEAN)
    assert (out / "clean").read_text().strip()
    assert run.returncode == 0, run.stdout + run.stderr
    assert "still listen" not in run.stdout
