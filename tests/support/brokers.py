"""Real AMQP 1.0 brokers on loopback for tests: RabbitMQ and ActiveMQ Artemis.

How this works
--------------
* ``ensure_rabbitmq()`` / ``ensure_artemis()`` return the broker's AMQP URL.
  The first call in a process, and any call while the broker is down, runs
  the project's idempotent installer (``.ci/install/rabbitmq.sh`` /
  ``.ci/install/artemis.sh``, which ``make test`` runs first as well; ~0.3 s
  when the broker is up); later calls only check the process/port. When a
  broker cannot be started, ``conftest.require`` skips the test on a developer
  machine and fails it under ``CI=true``.
* Fault helpers: ``restart_*()`` (graceful stop + start) and ``kill_artemis()``
  (SIGKILL of the broker's java process, then start again unless told not to).
  Every step is bounded by a subprocess timeout.
* Queue helpers, so tests can start from an empty queue: Artemis is driven by
  AMQP management messages (address ``activemq.management``, ~0.1 s each; the
  ``artemis queue ...`` CLI starts a JVM and takes seconds), RabbitMQ by
  ``rabbitmqctl`` (~1 s each). Deleting or purging a missing queue is not an
  error. ``rabbitmq_declare_durable_queue`` declares one and has RabbitMQ
  write it to disk, so it survives a SIGKILL.

Broker semantics the tests can rely on (as configured by the installers):

=========  ==================================================================
RabbitMQ   amqp://127.0.0.1:5682 (``RABBITMQ_PORT``). Address ``/queue/NAME`` declares and uses
           queue NAME; ``/amq/queue/NAME`` only an existing one. SASL
           ANONYMOUS logs in as guest.
RabbitMQ4  amqp://127.0.0.1:5684 (``RABBITMQ4_PORT``; RabbitMQ 4.0.5 in a Debian 13 root,
           .ci/install/rabbitmq4.sh). Address v2: ``/queues/NAME`` uses an existing queue
           only (a missing one: ``amqp:not-found``; ``rabbitmq4_declare_queue``),
           ``/exchanges/NAME[/KEY]``. SASL is mandatory: ANONYMOUS (as guest) or PLAIN
           guest/guest from anywhere.
Artemis    amqp://127.0.0.1:5673 (``ARTEMIS_PORT``). A plain address ``NAME``
           is an ANYCAST queue NAME, auto-created on the first attach of a
           sender *or* a receiver, durable, never auto-deleted. Under
           ``strict.*`` nothing is auto-created: attaching a sender or a
           receiver to a missing one is refused with ``amqp:not-found``
           (``artemis_create_queue`` makes one exist). SASL ANONYMOUS (and no
           SASL layer) are accepted; PLAIN needs fedgate/fedgate, a wrong
           password fails SASL (``amqp:unauthorized-access``). Messages sent
           with ``durable`` survive a restart or SIGKILL; others do not.
=========  ==================================================================
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from clients.proton_client import DurableTarget
from conftest import require
from proton import Message, ProtonException
from proton.utils import BlockingConnection

ROOT = Path(__file__).resolve().parent.parent.parent
INSTALL = ROOT / ".ci" / "install"

RABBITMQ_PORT = int(os.environ.get("RABBITMQ_PORT", "5682"))  # its own: make run takes 5672
RABBITMQ_URL = f"amqp://127.0.0.1:{RABBITMQ_PORT}"
RABBITMQ_NODE = "rabbit@localhost"

ARTEMIS_PORT = int(os.environ.get("ARTEMIS_PORT", "5673"))
ARTEMIS_URL = f"amqp://127.0.0.1:{ARTEMIS_PORT}"
ARTEMIS_INSTANCE = ROOT / ".tools" / os.environ.get("ARTEMIS_INSTANCE_NAME", "artemis-instance")
ARTEMIS_PID_FILE = ARTEMIS_INSTANCE / "data" / "artemis.pid"
ARTEMIS_USER = ARTEMIS_PASSWORD = "fedgate"
ARTEMIS_MANAGEMENT = "activemq.management"

# Bounds: a first run may download (Maven/apt) before the broker's own 120 s.
INSTALL_TIMEOUT = 420.0
STOP_TIMEOUT = 90.0
MANAGEMENT_TIMEOUT = 10.0
RABBITMQCTL_TIMEOUT = 30.0


class BrokerError(RuntimeError):
    """A broker helper could not do its job (message says which and why)."""


# -- low level ---------------------------------------------------------------
def port_open(port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout):
            return True
    except OSError:
        return False


def _script(name: str, action: str, timeout: float) -> subprocess.CompletedProcess:
    """Run .ci/install/<name>.sh <action>; never longer than ``timeout`` s."""
    cmd = ["bash", str(INSTALL / f"{name}.sh"), action]
    try:
        return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        out = (exc.stderr or b"")
        out = out.decode(errors="replace") if isinstance(out, bytes) else out
        raise BrokerError(f"{name}.sh {action} did not finish in {timeout:.0f}s\n{out[-2000:]}")


# Brokers whose installer ran successfully in this process: the script checks
# config and port ownership (~0.3 s); after that a live process is enough.
_checked: set[str] = set()


def _ensure(name: str, url: str, up: bool) -> str:
    if up and name in _checked:
        return url
    proc = _script(name, "start", INSTALL_TIMEOUT)
    require(proc.returncode == 0,
            f"{name} broker ({name}.sh start exit {proc.returncode}: {proc.stderr.strip()[-600:]})")
    _checked.add(name)
    return url


def _wait_gone(pid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    raise BrokerError(f"process {pid} still alive {timeout}s after SIGKILL")


# -- RabbitMQ ----------------------------------------------------------------
def ensure_rabbitmq() -> str:
    """AMQP URL of the local RabbitMQ (installed and started when needed)."""
    return _ensure("rabbitmq", RABBITMQ_URL, port_open(RABBITMQ_PORT))


def stop_rabbitmq() -> None:
    proc = _script("rabbitmq", "stop", STOP_TIMEOUT)
    if proc.returncode != 0:
        raise BrokerError(f"rabbitmq.sh stop failed: {proc.stderr.strip()[-600:]}")


def restart_rabbitmq() -> str:
    """Graceful stop, then start; returns the URL once AMQP accepts again."""
    stop_rabbitmq()
    return _ensure("rabbitmq", RABBITMQ_URL, False)


def _rabbitmqctl(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, ERL_EPMD_ADDRESS="127.0.0.1")
    try:
        return subprocess.run(["rabbitmqctl", "-n", RABBITMQ_NODE, "-q", *args],
                              capture_output=True, text=True, env=env,
                              timeout=RABBITMQCTL_TIMEOUT, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise BrokerError(f"rabbitmqctl {' '.join(args)} took over {RABBITMQCTL_TIMEOUT}s")


def _rabbitmq_queue_op(op: str, queue: str) -> None:
    proc = _rabbitmqctl(op, queue)
    if proc.returncode == 0:
        return
    text = (proc.stdout + proc.stderr).lower()
    if "not_found" in text or "not found" in text:
        return  # already gone: the state the caller wants
    raise BrokerError(f"rabbitmqctl {op} {queue} exit {proc.returncode}: {text.strip()}")


def rabbitmq_purge_queue(queue: str) -> None:
    """Drop every message of RabbitMQ queue ``queue`` (address /queue/<queue>)."""
    _rabbitmq_queue_op("purge_queue", queue)


def rabbitmq_delete_queue(queue: str) -> None:
    _rabbitmq_queue_op("delete_queue", queue)


def rabbitmq_declare_durable_queue(queue: str) -> None:
    """Declare durable queue ``queue`` and make RabbitMQ write its definition to disk.

    Measured on this machine (RabbitMQ 3.10.8, Erlang 25): a durable queue
    declared through ``/queue/NAME``, filled with 300 durable messages that
    RabbitMQ accepted, and SIGKILLed 0.5 s later was gone after the restart,
    messages and all, in 2 of 12 tries; 0 of 12 when ``mnesia:sync_log()``
    (which writes out Mnesia's transaction log) ran before the kill.
    """
    url = ensure_rabbitmq()
    conn = BlockingConnection(url, timeout=30)
    try:
        # attached means declared; closing the connection ends the link (closing
        # the link alone waited out BlockingConnection's 30 s for RabbitMQ's detach)
        conn.create_sender(f"/queue/{queue}", options=DurableTarget())
    finally:
        conn.close()
    proc = _rabbitmqctl("eval", "mnesia:sync_log().")
    if proc.returncode != 0 or proc.stdout.strip() != "ok":
        raise BrokerError(f"rabbitmqctl eval mnesia:sync_log() failed: {(proc.stdout + proc.stderr).strip()}")
    if rabbitmq_queue_count(queue) is None:
        raise BrokerError(f"RabbitMQ queue {queue} was not declared")


def rabbitmq_queue_count(queue: str) -> int | None:
    """Ready + unacked messages of ``queue``; None when it does not exist."""
    proc = _rabbitmqctl("list_queues", "name", "messages", "--no-table-headers")
    if proc.returncode != 0:
        raise BrokerError(f"rabbitmqctl list_queues failed: {proc.stderr.strip()}")
    for line in proc.stdout.splitlines():
        name, _, count = line.rpartition("\t")
        if name == queue:
            return int(count)
    return None


# -- RabbitMQ 4 (.ci/install/rabbitmq4.sh: Debian 13's 4.0.5 in a root of its own) -----
RABBITMQ4_PORT = int(os.environ.get("RABBITMQ4_PORT", "5684"))
RABBITMQ4_URL = f"amqp://127.0.0.1:{RABBITMQ4_PORT}"


def ensure_rabbitmq4() -> str:
    """AMQP URL of the local RabbitMQ 4.0 (installed and started when needed)."""
    return _ensure("rabbitmq4", RABBITMQ4_URL, port_open(RABBITMQ4_PORT))


def restart_rabbitmq4() -> str:
    proc = _script("rabbitmq4", "stop", STOP_TIMEOUT)
    if proc.returncode != 0:
        raise BrokerError(f"rabbitmq4.sh stop failed: {proc.stderr.strip()[-600:]}")
    return _ensure("rabbitmq4", RABBITMQ4_URL, False)


RABBITMQ4_ROOT = os.environ.get("RABBITMQ4_ROOT", "/opt/fedgate/rabbitmq4-trixie")


def rabbitmq4_ctl(*args: str) -> str:
    """``rabbitmqctl`` of RabbitMQ 4 (in its root); raises BrokerError when it fails."""
    ensure_rabbitmq4()
    cmd = ["chroot", RABBITMQ4_ROOT, "env", "ERL_EPMD_PORT=4370", "HOME=/var/lib/rabbitmq",
           "rabbitmqctl", "-n", "rabbit4@localhost", "-q", *args]
    if os.geteuid() != 0:
        cmd = ["sudo", "-n", *cmd]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=RABBITMQCTL_TIMEOUT,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise BrokerError(f"rabbitmqctl {' '.join(args)} took over {RABBITMQCTL_TIMEOUT}s")
    if proc.returncode != 0:
        raise BrokerError(f"rabbitmqctl {' '.join(args)}: {(proc.stdout + proc.stderr).strip()}")
    return proc.stdout


def _rabbitmq4_channel(vhost: str = "/", user: str = "guest", password: str = "guest"):
    import pika

    ensure_rabbitmq4()
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", RABBITMQ4_PORT, virtual_host=vhost,
        credentials=pika.PlainCredentials(user, password),
        blocked_connection_timeout=30, socket_timeout=10))
    return conn, conn.channel()


def rabbitmq4_declare_queue(queue: str, queue_type: str = "classic", vhost: str = "/") -> None:
    """Declare durable queue ``queue`` on RabbitMQ 4 (AMQP 0-9-1 on the same port): an
    AMQP 1.0 attach to ``/queues/NAME`` only uses an existing queue."""
    conn, channel = _rabbitmq4_channel(vhost)
    try:
        channel.queue_declare(queue, durable=True, arguments={"x-queue-type": queue_type})
    finally:
        conn.close()


def rabbitmq4_declare_durable_queue(queue: str, queue_type: str = "quorum") -> None:
    """Declare durable ``queue`` on RabbitMQ 4 and have its definition written to disk (as
    ``rabbitmq_declare_durable_queue`` does for 3.10: 4.0.5 still keeps it in Mnesia)."""
    rabbitmq4_declare_queue(queue, queue_type)
    out = rabbitmq4_ctl("eval", "mnesia:sync_log().").strip()
    if out != "ok":
        raise BrokerError(f"rabbitmqctl eval mnesia:sync_log() answered {out!r}")


def rabbitmq4_delete_queue(queue: str, vhost: str = "/") -> None:
    conn, channel = _rabbitmq4_channel(vhost)
    try:
        channel.queue_delete(queue)
    finally:
        if conn.is_open:
            conn.close()


def rabbitmq4_queue_count(queue: str, vhost: str = "/") -> int | None:
    import pika.exceptions

    conn, channel = _rabbitmq4_channel(vhost)
    try:
        return channel.queue_declare(queue, passive=True).method.message_count
    except pika.exceptions.ChannelClosedByBroker:
        return None
    finally:
        if conn.is_open:
            conn.close()


# -- Artemis -----------------------------------------------------------------
def artemis_pid() -> int | None:
    """Pid of this checkout's Artemis java process, or None."""
    try:
        pid = int(ARTEMIS_PID_FILE.read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return None
    wanted = f"-Dartemis.instance={ARTEMIS_INSTANCE}".encode()
    return pid if wanted in cmdline else None


def ensure_artemis() -> str:
    """AMQP URL of the local Artemis (installed and started when needed)."""
    return _ensure("artemis", ARTEMIS_URL, artemis_pid() is not None and port_open(ARTEMIS_PORT))


def stop_artemis() -> None:
    proc = _script("artemis", "stop", STOP_TIMEOUT)
    if proc.returncode != 0:
        raise BrokerError(f"artemis.sh stop failed: {proc.stderr.strip()[-600:]}")


def restart_artemis() -> str:
    """Graceful stop (SIGTERM, bounded), then start; returns the URL."""
    stop_artemis()
    return _ensure("artemis", ARTEMIS_URL, False)


def kill_artemis(restart: bool = True) -> str:
    """SIGKILL the broker (no shutdown at all), then start it again.

    With ``restart=False`` the broker stays down; call ensure_artemis() later.
    """
    pid = artemis_pid()
    if pid is None:
        raise BrokerError("Artemis is not running (no live pid in its pid file)")
    os.kill(pid, signal.SIGKILL)
    _wait_gone(pid, 10.0)
    return _ensure("artemis", ARTEMIS_URL, False) if restart else ARTEMIS_URL


def artemis_manage(resource: str, operation: str, *args, timeout: float = MANAGEMENT_TIMEOUT):
    """Call a management operation over AMQP; returns the decoded result.

    ``resource`` is ``"broker"`` or ``"queue.<name>"``; ``args`` are the
    operation's parameters (JSON-encoded in the request body). Raises
    BrokerError with the broker's reason when the operation fails.
    """
    conn = None
    try:
        conn = BlockingConnection(ARTEMIS_URL, timeout=timeout, allowed_mechs="ANONYMOUS")
        replies = conn.create_receiver(None, dynamic=True)  # temporary reply queue
        sender = conn.create_sender(ARTEMIS_MANAGEMENT)
        sender.send(Message(
            body=json.dumps(list(args)), reply_to=replies.remote_source.address,
            properties={"_AMQ_ResourceName": resource, "_AMQ_OperationName": operation}))
        reply = replies.receive(timeout=timeout)
        replies.accept()
    except ProtonException as exc:  # includes proton's Timeout and ConnectionException
        raise BrokerError(f"Artemis management {resource}.{operation} failed: {exc!r}") from exc
    finally:
        if conn is not None:
            conn.close()
    result = json.loads(reply.body) if reply.body else None
    if not (reply.properties or {}).get("_AMQ_OperationSucceeded"):
        raise BrokerError(f"Artemis {resource}.{operation}{args!r} failed: {result}")
    return result[0] if isinstance(result, list) and len(result) == 1 else result


def _missing(exc: BrokerError) -> bool:
    text = str(exc)
    return "AMQ229017" in text or "AMQ229067" in text  # no such queue / resource


def artemis_purge_queue(queue: str) -> int:
    """Remove every message of ``queue``; returns how many (0 when missing)."""
    try:
        return int(artemis_manage(f"queue.{queue}", "removeAllMessages"))
    except BrokerError as exc:
        if _missing(exc):
            return 0
        raise


def artemis_delete_queue(queue: str) -> None:
    """Delete ``queue`` (and its address), even with consumers attached."""
    try:
        artemis_manage("broker", "destroyQueue", queue, True, True)
    except BrokerError as exc:
        if not _missing(exc):
            raise


def artemis_create_queue(queue: str) -> None:
    """Make durable ANYCAST queue ``queue`` on address ``queue`` exist.

    The way to give a ``strict.*`` address (no auto-create) a queue.
    """
    config = {"name": queue, "address": queue, "routing-type": "ANYCAST",
              "durable": True, "auto-create-address": True}
    artemis_manage("broker", "createQueue", json.dumps(config), True)


def artemis_queue_count(queue: str) -> int | None:
    """Messages in ``queue`` (including in-flight ones); None when it does not exist."""
    try:
        return int(artemis_manage(f"queue.{queue}", "getMessageCount"))
    except BrokerError as exc:
        if _missing(exc):
            return None
        raise


# -- either broker -------------------------------------------------------------
def purge_queue(broker: str, queue: str) -> None:
    """``broker`` is "rabbitmq" or "artemis"."""
    {"rabbitmq": rabbitmq_purge_queue, "artemis": artemis_purge_queue}[broker](queue)


def delete_queue(broker: str, queue: str) -> None:
    {"rabbitmq": rabbitmq_delete_queue, "artemis": artemis_delete_queue}[broker](queue)


def queue_count(broker: str, queue: str) -> int | None:
    return {"rabbitmq": rabbitmq_queue_count, "artemis": artemis_queue_count}[broker](queue)
