"""The DMZ attack table: a live node with mutual TLS, SASL and ACLs, attacked case by case.

Each row is one attack; it must be refused with the named condition (an AMQP
error condition, a SASL outcome code, a TLS refusal or a close at a deadline)
while a legitimate client (``canary``: mutual TLS + PLAIN as alice, one
connection kept open across all rows) keeps sending and receiving.
"""

from __future__ import annotations

import socket
import ssl
import subprocess
import time

import pytest
from conftest import PYTHON, ROOT, NodeProcess
from dmz_support import AMQP_HEADER, SASL_HEADER, SASL_OUTCOME, RawClient, condition_of
from proton import Message, SSLDomain
from proton.utils import BlockingConnection

pytestmark = pytest.mark.dmz  # the DMZ gateway's tests: pytest -m dmz

DEADLINE = 1.0  # handshake_timeout: protocol header + TLS + SASL + open
PER_IP = 6
PER_USER = 2
MAX_MESSAGE = 64 * 1024
SASL_AUTH = "sasl-outcome:auth"


def add_user(users, name: str, password: str) -> None:
    subprocess.run([PYTHON, "-m", "proxy", "users", "add", name, "--file", str(users),
                    "--password-stdin"], input=password.encode() + b"\n", check=True, cwd=ROOT,
                   capture_output=True)


# one process, and two workers behind one listener (issue #18): the limits are the node's
@pytest.fixture(scope="module", params=[1, 2], ids=["1-worker", "2-workers"])
def dmz(request, tmp_path_factory, certs):
    workdir = tmp_path_factory.mktemp("dmz")
    users = workdir / "users.json"
    add_user(users, "alice", "alice pw")
    add_user(users, "bob", "bob pw")
    node = NodeProcess(workdir, {
        "tls": {"cert": str(certs.server_cert), "key": str(certs.server_key), "ca": str(certs.ca),
                "verify_client": True},
        "sasl": {"mechanisms": ["PLAIN", "SCRAM-SHA-256", "EXTERNAL"], "users_file": str(users),
                 "require": True},
        "limits": {"handshake_timeout": DEADLINE, "max_connections_per_ip": PER_IP,
                   "max_connections_per_user": PER_USER, "max_message_size": MAX_MESSAGE},
        "acl": [
            {"user": "alice", "send": ["orders.#", "canary"], "receive": ["orders.#", "canary"]},
            {"user": "bob", "send": ["bob.#"], "receive": ["bob.#"]},
        ],
        "node": {"workers": request.param},
    }).start()
    yield node
    node.stop()


@pytest.fixture(scope="module")
def plaintext(tmp_path_factory):
    """A listener without TLS that is configured for PLAIN (not allowed there)."""
    workdir = tmp_path_factory.mktemp("plaintext")
    users = workdir / "users.json"
    add_user(users, "alice", "alice pw")
    node = NodeProcess(workdir, {"sasl": {"mechanisms": ["PLAIN", "SCRAM-SHA-256"],
                                          "users_file": str(users)}}).start()
    yield node
    node.stop()


def tls_domain(certs, cert: str | None = "client") -> SSLDomain:
    domain = SSLDomain(SSLDomain.MODE_CLIENT)
    domain.set_trusted_ca_db(str(certs.ca))
    domain.set_peer_authentication(SSLDomain.VERIFY_PEER_NAME)
    if cert:
        domain.set_credentials(str(getattr(certs, f"{cert}_cert")), str(getattr(certs, f"{cert}_key")), None)
    return domain


def connect(node, certs, user: str, password: str, *, cert: str | None = "client") -> BlockingConnection:
    return BlockingConnection(f"amqps://localhost:{node.port}", ssl_domain=tls_domain(certs, cert),
                              allowed_mechs="PLAIN", user=user, password=password, timeout=10)


def tls_context(certs, cert: str | None = "client") -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(certs.ca))
    if cert:
        context.load_cert_chain(str(getattr(certs, f"{cert}_cert")), str(getattr(certs, f"{cert}_key")))
    return context


@pytest.fixture(scope="module")
def canary(dmz, certs):
    conn = connect(dmz, certs, "alice", "alice pw")
    receiver = conn.create_receiver("canary", credit=10)
    sender = conn.create_sender("canary")
    yield sender, receiver
    conn.close()


def canary_works(canary, marker: str) -> None:
    sender, receiver = canary
    sender.send(Message(id=marker, body=marker))
    assert receiver.receive(timeout=5).id == marker
    receiver.accept()


def sasl_code(outcome) -> str:
    code, fields = outcome
    assert code == SASL_OUTCOME
    return {0: "sasl-outcome:ok", 1: SASL_AUTH}.get(fields[0], f"sasl-outcome:{fields[0]}")


def amqp_error(action) -> str | None:
    try:
        action()
    except Exception as exc:  # proton-python raises several types; the condition is what counts
        return condition_of(exc) or f"{type(exc).__name__}: {exc}"
    return None


# -- the attacks ------------------------------------------------------------------------
def no_sasl_layer(dmz, plaintext, certs):
    """A client that skips SASL where it is required: §2.2 reply with our header, then close."""
    client = RawClient("127.0.0.1", dmz.port, context=tls_context(certs))
    try:
        client.sock.sendall(AMQP_HEADER)
        reply = client.read_until_closed(5)
        return "protocol-header:sasl" if reply == SASL_HEADER else repr(reply)
    finally:
        client.close()


def no_credentials(dmz, plaintext, certs):
    """PLAIN with nothing: the node asks (empty challenge), the client answers nothing."""
    client = RawClient("127.0.0.1", dmz.port, context=tls_context(certs))
    try:
        client.start_sasl()
        code, fields = client.init("PLAIN", None)
        return sasl_code(client.respond(b"")) if code != SASL_OUTCOME else sasl_code((code, fields))
    finally:
        client.close()


def wrong_password_plain(dmz, plaintext, certs):
    return amqp_error(lambda: connect(dmz, certs, "alice", "not alice pw").close())


def wrong_password_scram(dmz, plaintext, certs):
    client = RawClient("127.0.0.1", dmz.port, context=tls_context(certs))
    try:
        client.start_sasl()
        code, _ = client.scram("alice", "not alice pw")
        return sasl_code((SASL_OUTCOME, [code]))
    finally:
        client.close()


def unknown_user(dmz, plaintext, certs):
    return amqp_error(lambda: connect(dmz, certs, "mallory", "guess").close())


def anonymous_when_disabled(dmz, plaintext, certs):
    client = RawClient("127.0.0.1", dmz.port, context=tls_context(certs))
    try:
        assert "ANONYMOUS" not in client.start_sasl()
        return sasl_code(client.init("ANONYMOUS", b"anonymous"))
    finally:
        client.close()


def plain_without_tls(dmz, plaintext, certs):
    client = RawClient("127.0.0.1", plaintext.port)
    try:
        offered = client.start_sasl()
        assert "PLAIN" not in offered and "SCRAM-SHA-256" in offered
        return sasl_code(client.init("PLAIN", b"\x00alice\x00alice pw"))
    finally:
        client.close()


def tls_refused(port, context) -> str:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
            with context.wrap_socket(raw, server_hostname="localhost") as sock:
                sock.sendall(SASL_HEADER)
                if sock.recv(8) == b"":  # TLS 1.3: the alert arrives after the handshake
                    return "tls:refused"
                return "tls:accepted"
    except (ssl.SSLError, ConnectionResetError, BrokenPipeError):
        return "tls:refused"


def untrusted_client_certificate(dmz, plaintext, certs):
    return tls_refused(dmz.port, tls_context(certs, "rogue"))


def no_client_certificate(dmz, plaintext, certs):
    return tls_refused(dmz.port, tls_context(certs, None))


def send_outside_acl(dmz, plaintext, certs):
    conn = connect(dmz, certs, "alice", "alice pw")
    try:
        return amqp_error(lambda: conn.create_sender("bob.jobs").send(Message(body="x")))
    finally:
        conn.close()


def receive_outside_acl(dmz, plaintext, certs):
    conn = connect(dmz, certs, "alice", "alice pw")
    try:
        return amqp_error(lambda: conn.create_receiver("bob.jobs", credit=1).receive(timeout=2))
    finally:
        conn.close()


def too_many_connections_from_one_ip(dmz, plaintext, certs):
    """From 127.0.0.2 (the canary is on 127.0.0.1): PER_IP connections are served, the next refused."""
    held = []
    try:
        for _ in range(PER_IP):
            client = RawClient("127.0.0.1", dmz.port, context=tls_context(certs), source="127.0.0.2")
            client.start_sasl()  # admitted and served
            held.append(client)
        # refused at accept, before any TLS work: the handshake itself meets a closed socket
        try:
            extra = RawClient("127.0.0.1", dmz.port, context=tls_context(certs), source="127.0.0.2")
        except (ConnectionError, ssl.SSLError, OSError):
            reply = b""
        else:
            held.append(extra)
            extra.sock.sendall(SASL_HEADER)
            reply = extra.read_until_closed(5)
        dmz.wait_log("refused before TLS")
        dmz.wait_log("max_connections_per_ip")
        return "closed-at-accept" if reply == b"" else repr(reply)
    finally:
        for client in held:
            client.close()


def too_many_connections_for_one_user(dmz, plaintext, certs):
    """SASL succeeds, then the AMQP open is answered with close(resource-limit-exceeded).

    The refused connection is made with Python's ssl and a bare proton transport:
    proton's own TLS client, in one process, lets a failed connection's OpenSSL
    error leak into its other TLS connections (the canary).
    """
    held = [connect(dmz, certs, "bob", "bob pw") for _ in range(PER_USER)]
    extra = RawClient("127.0.0.1", dmz.port, context=tls_context(certs))
    try:
        extra.start_sasl()
        assert sasl_code(extra.init("PLAIN", b"\x00bob\x00bob pw")) == "sasl-outcome:ok"
        amqp = extra.amqp()
        result = amqp.send("bob.jobs", "one too many")
        return result if result != "accepted" else "accepted"
    finally:
        extra.close()
        for conn in held:
            conn.close()


def oversized_message(dmz, plaintext, certs):
    conn = connect(dmz, certs, "alice", "alice pw")
    try:
        sender = conn.create_sender("orders.big")
        return amqp_error(lambda: sender.send(Message(body=b"x" * (MAX_MESSAGE * 2))))
    finally:
        conn.close()


def slow_loris_header(dmz, plaintext, certs):
    client = RawClient("127.0.0.1", dmz.port, context=tls_context(certs))
    try:
        start = time.monotonic()
        client.sock.sendall(b"AM")
        reply = client.read_until_closed(DEADLINE + 4)
        return "closed-at-deadline" if reply == b"" and time.monotonic() - start < DEADLINE + 2 else repr(reply)
    finally:
        client.close()


def slow_loris_sasl(dmz, plaintext, certs):
    client = RawClient("127.0.0.1", dmz.port, context=tls_context(certs))
    try:
        client.start_sasl()  # then never answers
        start = time.monotonic()
        reply = client.read_until_closed(DEADLINE + 4)
        return "closed-at-deadline" if reply == b"" and time.monotonic() - start < DEADLINE + 2 else repr(reply)
    finally:
        client.close()


def slow_loris_tls_handshake(dmz, plaintext, certs):
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", dmz.port), timeout=DEADLINE + 4) as sock:
        try:
            data = sock.recv(1)  # never starts TLS
        except ConnectionResetError:
            data = b""
    return "closed-at-deadline" if data == b"" and time.monotonic() - start < DEADLINE + 2 else repr(data)


ATTACKS = [
    ("no SASL layer", no_sasl_layer, "protocol-header:sasl"),
    ("no credentials", no_credentials, SASL_AUTH),
    ("wrong password (PLAIN)", wrong_password_plain, "amqp:unauthorized-access"),
    ("wrong password (SCRAM)", wrong_password_scram, SASL_AUTH),
    ("unknown user", unknown_user, "amqp:unauthorized-access"),
    ("ANONYMOUS when disabled", anonymous_when_disabled, SASL_AUTH),
    ("PLAIN without TLS", plain_without_tls, SASL_AUTH),
    ("untrusted client certificate", untrusted_client_certificate, "tls:refused"),
    ("no client certificate", no_client_certificate, "tls:refused"),
    ("send outside the ACL", send_outside_acl, "amqp:unauthorized-access"),
    ("receive outside the ACL", receive_outside_acl, "amqp:unauthorized-access"),
    ("too many connections from one IP", too_many_connections_from_one_ip, "closed-at-accept"),
    ("too many connections for one user", too_many_connections_for_one_user,
     "amqp:resource-limit-exceeded"),
    ("oversized message", oversized_message, "amqp:link:message-size-exceeded"),
    ("slow-loris protocol header", slow_loris_header, "closed-at-deadline"),
    ("slow-loris SASL", slow_loris_sasl, "closed-at-deadline"),
    ("slow-loris TLS handshake", slow_loris_tls_handshake, "closed-at-deadline"),
]


@pytest.mark.parametrize("attack, expected", [(a[1], a[2]) for a in ATTACKS], ids=[a[0] for a in ATTACKS])
def test_attack_is_refused_and_the_legitimate_client_keeps_working(dmz, plaintext, certs, canary,
                                                                  attack, expected):
    canary_works(canary, f"before-{attack.__name__}")
    assert attack(dmz, plaintext, certs) == expected
    canary_works(canary, f"after-{attack.__name__}")


def test_denials_are_logged_with_user_address_direction_and_source(dmz, certs, canary):
    send_outside_acl(dmz, None, certs)
    log = dmz.log_path.read_text()
    assert "access denied: user alice from 127.0.0.1:" in log and "send 'bob.jobs'" in log


def test_the_legitimate_paths_work(dmz, certs):
    """Sanity for the table: the same node serves alice by PLAIN, SCRAM and EXTERNAL."""
    conn = connect(dmz, certs, "alice", "alice pw")
    conn.create_sender("orders.eu").send(Message(body="plain"))
    conn.close()
    client = RawClient("127.0.0.1", dmz.port, context=tls_context(certs))
    try:
        client.start_sasl()
        assert client.scram("alice", "alice pw")[0] == 0
        assert client.amqp().send("orders.eu", "scram") == "accepted"
    finally:
        client.close()
    client = RawClient("127.0.0.1", dmz.port, context=tls_context(certs))
    try:
        client.start_sasl()
        assert sasl_code(client.init("EXTERNAL", b"")) == "sasl-outcome:ok"  # CN=alice
        assert client.amqp().send("orders.eu", "external") == "accepted"
    finally:
        client.close()
    receiver = connect(dmz, certs, "alice", "alice pw")
    link = receiver.create_receiver("orders.eu", credit=10)
    bodies = []
    for _ in range(3):
        bodies.append(link.receive(timeout=5).body)
        link.accept()
    receiver.close()
    assert sorted(bodies) == ["external", "plain", "scram"]


def test_node_survived_and_logged_no_traceback(dmz, plaintext, canary):
    canary_works(canary, "at-the-end")
    assert dmz.alive() and plaintext.alive()
    assert "Traceback" not in dmz.log_path.read_text()
