"""AMQP over WebSocket (OASIS AMQP WebSocket Binding 1.0) on the node's AMQP port.

Clients nobody here wrote: rhea over the ``ws`` package (``ws://`` and
``wss://`` URLs of tests/js), and for what a well-behaved client never sends
(bad upgrades, text frames, oversized messages) the ``websockets`` library's
own client, or raw HTTP on a socket. A message set through a local queue and
through a proxy rule to RabbitMQ; SASL PLAIN and the ACL over ``wss://``; every
bad case gets its answer (an HTTP status with a reason, or a WebSocket close
code) while the node goes on serving the others.
"""

from __future__ import annotations

import collections
import socket

import brokers
import pytest
from admin_client import ADMIN_TOKEN, TOKENS, admin, wait_for
from conftest import PYTHON, ROOT

from proxy.auth.sasl import SASL_HEADER

UPGRADE = (b"GET /amqp HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
           b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n")


def ws_url(node, path: str = "/amqp", scheme: str = "ws") -> str:
    return f"{scheme}://127.0.0.1:{node.port}{path}"


def ids_of(lines) -> list:
    return [line["id"] for line in lines if "id" in line]


def http_answer(port: int, request: bytes, timeout: float = 5.0) -> bytes:
    """Everything the node answers to ``request`` until it closes the socket."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(request)
        out = b""
        while chunk := sock.recv(4096):
            out += chunk
    return out


def assert_node_serves(node, clients) -> None:
    (sent,) = clients("rhea", "send", ws_url(node), address="canary", count=1).finish()
    assert sent["accepted"] == 1


def test_rhea_message_set_through_a_local_queue(node, clients):
    senders = [clients("rhea", "send", ws_url(node), address="ws.q", count=500, prefix=p)
               for p in ("a", "b")]
    for sender in senders:
        (sent,) = sender.finish()
        assert sent["accepted"] == 500 and sent["error"] is None
    lines = clients("rhea", "receive", ws_url(node, "/"), address="ws.q", count=1000).finish()
    got = ids_of(lines)
    assert sorted(got) == sorted(f"{p}-{i}" for p in ("a", "b") for i in range(500))
    assert [n for n in collections.Counter(got).values() if n > 1] == []  # no duplicates
    assert lines[-1]["error"] is None


def test_websocket_and_tcp_clients_share_a_queue(node, clients):
    (sent,) = clients("rhea", "send", ws_url(node), address="mixed", count=100, prefix="w").finish()
    assert sent["accepted"] == 100
    (sent,) = clients("proton", "send", node.url, address="mixed", count=100, prefix="t").finish()
    assert sent["accepted"] == 100
    got = ids_of(clients("rhea", "receive", ws_url(node), address="mixed", count=200).finish())
    assert sorted(got) == sorted([f"w-{i}" for i in range(100)] + [f"t-{i}" for i in range(100)])


def test_rhea_message_set_through_a_proxy_rule_to_rabbitmq(start_node, clients):
    import uuid

    rabbit = brokers.ensure_rabbitmq()
    queue = f"fg-ws-{uuid.uuid4().hex[:8]}"
    node = start_node({"rules": [{"name": "rq", "match": "rq.*", "kind": "proxy",
                                  "primary": rabbit, "remote": "/queue/{1}"}]})
    try:
        (sent,) = clients("rhea", "send", ws_url(node), address=f"rq.{queue}", count=300).finish()
        assert sent["accepted"] == 300
        lines = clients("rhea", "receive", ws_url(node), address=f"rq.{queue}", count=300).finish()
        assert sorted(ids_of(lines)) == sorted(f"rhea-{i}" for i in range(300))
    finally:
        brokers.rabbitmq_delete_queue(queue)


def test_wss_with_sasl_plain_and_the_acl(start_node, certs, clients, tmp_path):
    import subprocess

    users = tmp_path / "users.json"
    subprocess.run([PYTHON, "-m", "proxy", "users", "add", "alice", "--file", str(users),
                    "--password-stdin"], input=b"alice pw\n", check=True, cwd=ROOT,
                   capture_output=True, timeout=60)
    node = start_node({
        "tls": {"cert": str(certs.server_cert), "key": str(certs.server_key)},
        "sasl": {"mechanisms": ["PLAIN"], "users_file": str(users), "require": True},
        "acl": [{"user": "alice", "send": ["orders.#"], "receive": ["orders.#"]}]})
    wss = ws_url(node, scheme="wss")
    login = {"username": "alice", "password": "alice pw", "tls_insecure": True}
    (sent,) = clients("rhea", "send", wss, address="orders.ws", count=50, **login).finish()
    assert sent["accepted"] == 50
    lines = clients("rhea", "receive", wss, address="orders.ws", count=50, **login).finish()
    assert sorted(ids_of(lines)) == sorted(f"rhea-{i}" for i in range(50))
    denied = clients("rhea", "send", wss, address="payroll", count=1, **login).finish()
    assert denied[-1]["error"]["condition"] == "amqp:unauthorized-access"
    wrong = clients("rhea", "send", wss, address="orders.ws", count=1, username="alice",
                    password="nope", tls_insecure=True).finish()
    assert wrong[-1]["error"] is not None and wrong[-1]["accepted"] == 0
    # a plain ws:// client on the TLS port gets nowhere: TLS comes first
    plain = clients("rhea", "send", ws_url(node), address="orders.ws", count=1, timeout_ms=5000,
                    **login).finish()
    assert plain[-1]["error"] is not None


BAD_UPGRADES = {
    "missing key": (UPGRADE.replace(b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n", b"")
                    + b"Sec-WebSocket-Protocol: amqp\r\n\r\n", 400, b"missing Sec-WebSocket-Key"),
    "wrong version": (UPGRADE.replace(b"Version: 13", b"Version: 8")
                      + b"Sec-WebSocket-Protocol: amqp\r\n\r\n", 400, b"Sec-WebSocket-Version"),
    "no amqp subprotocol": (UPGRADE + b"Sec-WebSocket-Protocol: mqtt\r\n\r\n", 400,
                            b"subprotocol 'amqp'"),
    "no subprotocol at all": (UPGRADE + b"\r\n", 400, b"subprotocol 'amqp'"),
    "plain GET, no upgrade": (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", 426, b"Connection"),
    "not HTTP": (b"GET nonsense\r\n\r\n", 400, b"malformed HTTP request"),
    "path not served": (UPGRADE.replace(b"/amqp", b"/admin") + b"Sec-WebSocket-Protocol: amqp\r\n\r\n",
                        404, b"no WebSocket endpoint at /admin"),
    "origin not allowed": (UPGRADE + b"Sec-WebSocket-Protocol: amqp\r\nOrigin: https://evil.example\r\n\r\n",
                           403, b"Origin 'https://evil.example' is not allowed"),
}


@pytest.mark.parametrize("case", list(BAD_UPGRADES))
def test_bad_upgrade_gets_an_http_error_with_its_reason(start_node, clients, case):
    node = start_node({"websocket": {"paths": ["/amqp"], "origins": ["https://app.example"]}})
    request, status, reason = BAD_UPGRADES[case]
    answer = http_answer(node.port, request)  # returns once the node has closed the socket
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.split(b"\r\n")[0].startswith(b"HTTP/1.1 %d " % status), answer
    assert reason in body, answer
    assert b"AMQP\x00" not in answer and b"AMQP\x03" not in answer  # nothing reached the
    # AMQP layer (it would have answered with its protocol header)
    assert_node_serves(node, clients)  # ... and the node goes on serving


def test_allowed_origin_is_accepted(start_node, clients):
    from websockets.sync.client import connect

    node = start_node({"websocket": {"origins": ["https://app.example"]}})
    with connect(ws_url(node), subprotocols=["amqp"], origin="https://app.example",
                 open_timeout=10) as ws:
        ws.send(SASL_HEADER)
        assert ws.recv(timeout=5)[:8] == SASL_HEADER


def test_text_frame_closes_with_1003(node, clients):
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    with connect(ws_url(node), subprotocols=["amqp"], open_timeout=10) as ws:
        ws.send("AMQP as text")
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=5)
    assert closed.value.rcvd.code == 1003
    assert_node_serves(node, clients)


def upgraded(port: int, timeout: float = 5.0) -> tuple[socket.socket, bytes]:
    """A socket the node has upgraded (its 101 read), and whatever came after the 101."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sock.sendall(UPGRADE + b"Sec-WebSocket-Protocol: amqp\r\n\r\n")
    answer = b""
    while b"\r\n\r\n" not in answer:
        chunk = sock.recv(4096)
        assert chunk, answer  # closed before the end of its answer
        answer += chunk
    head, _, rest = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 101 "), head
    return sock, rest


def until_closed(sock: socket.socket, data: bytes = b"") -> bytes:
    while chunk := sock.recv(4096):
        data += chunk
    return data


def close_code(stream: bytes) -> int:
    """The code of the close frame ``stream`` starts with (a server's frames are unmasked)."""
    assert stream[:1] == b"\x88", stream  # FIN + opcode 8 (RFC 6455 section 5.5.1)
    length = stream[1] & 0x7F
    assert length >= 2 and len(stream) >= 2 + length, stream
    return int.from_bytes(stream[2:4], "big")


MASK = b"\x01\x02\x03\x04"
BAD_FRAMES = {
    # RFC 6455 section 5.1: a client masks every frame
    "unmasked client frame": b"\x82" + bytes([len(SASL_HEADER)]) + SASL_HEADER,
    # section 5.2: opcodes 0x3-0x7 and 0xB-0xF are reserved
    "reserved data opcode": b"\x83\x80" + MASK,
    "reserved control opcode": b"\x8b\x80" + MASK,
    # section 5.2: RSV1-3 must be 0 unless an extension says otherwise (none is negotiated)
    "RSV1 bit set": b"\xc2\x80" + MASK,
    "RSV3 bit set": b"\x92\x80" + MASK,
    # section 5.5: control frames are not fragmented
    "fragmented ping": b"\x09\x80" + MASK,
}


@pytest.mark.parametrize("case", list(BAD_FRAMES))
def test_a_websocket_protocol_error_closes_with_1002(node, clients, case):
    sock, rest = upgraded(node.port)
    with sock:
        sock.sendall(BAD_FRAMES[case])
        stream = until_closed(sock, rest)  # the node closes the TCP connection after its close
    assert close_code(stream) == 1002, stream
    assert b"AMQP" not in stream  # nothing reached the AMQP layer
    assert_node_serves(node, clients)


def test_oversized_message_closes_with_1009(start_node, clients):
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    node = start_node({"websocket": {"max_message_size": 4096}})
    with connect(ws_url(node), subprotocols=["amqp"], open_timeout=10, max_size=None) as ws:
        ws.send(SASL_HEADER + b"\x00" * 5000)
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                ws.recv(timeout=5)
    assert closed.value.rcvd.code == 1009
    assert_node_serves(node, clients)


def test_amqp_close_ends_with_a_websocket_close_frame(node):
    """The binding's close: after its AMQP close the node closes the WebSocket (1000)."""
    from websockets.exceptions import ConnectionClosedOK
    from websockets.sync.client import connect

    received = []
    with connect(ws_url(node), subprotocols=["amqp"], open_timeout=10) as ws:
        ws.send(b"AMQP\x00\x01\x00\x00")  # the AMQP header, no SASL layer (allowed here)
        ws.send(b"\x00\x00\x00\x08\x07\x00\x00\x00")  # then a frame with a bad data offset
        with pytest.raises(ConnectionClosedOK) as closed:
            while True:
                received.append(ws.recv(timeout=5))
    assert closed.value.rcvd.code == 1000
    stream = b"".join(received)
    assert stream.startswith(b"AMQP\x00\x01\x00\x00")  # the node's header, in binary messages
    assert b"amqp:connection:framing-error" in stream  # then its close frame, then the close


def test_handshake_timeout_covers_the_http_upgrade(start_node, clients):
    node = start_node({"limits": {"handshake_timeout": 1.0}})
    with socket.create_connection(("127.0.0.1", node.port), timeout=10) as sock:
        sock.sendall(b"GET /amqp HTTP/1.1\r\nHost: x\r\n")  # and never the rest
        sock.settimeout(10)
        assert sock.recv(4096) == b""  # closed by the node within its handshake timeout
    assert_node_serves(node, clients)


def test_per_ip_limit_holds_for_websocket_clients(start_node, clients):
    from websockets.sync.client import connect

    node = start_node({"limits": {"max_connections_per_ip": 1}})
    with connect(ws_url(node), subprotocols=["amqp"], open_timeout=10) as ws:
        ws.send(SASL_HEADER)
        assert ws.recv(timeout=5)[:8] == SASL_HEADER
        refused = clients("rhea", "send", ws_url(node), address="x", count=1, timeout_ms=5000).finish()
        assert refused[-1]["error"] is not None and refused[-1]["accepted"] == 0


def test_websocket_can_be_turned_off(start_node):
    node = start_node({"websocket": {"enabled": False}})
    answer = http_answer(node.port, UPGRADE + b"Sec-WebSocket-Protocol: amqp\r\n\r\n")
    assert not answer.startswith(b"HTTP/")  # the AMQP layer's protocol header, then closed
    assert answer[:4] == b"AMQP"


def test_admin_and_metrics_show_the_transport(start_node, clients):
    node = start_node({"admin": {"tokens": TOKENS}})
    waiting = clients("rhea", "receive", ws_url(node), address="idle", count=1, timeout_ms=20000,
                      announce=True)
    assert waiting.readline() == {"attached": "idle"}
    connections = admin(node, "/api/v1/connections")["connections"]
    assert [c["transport"] for c in connections] == ["websocket"]
    import urllib.request

    request = urllib.request.Request(node.admin_url + "/metrics",
                                     headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        metrics = response.read().decode()
    assert 'fedgate_connections_by_transport{transport="websocket"} 1' in metrics
    assert 'fedgate_connections_by_transport{transport="tcp"} 0' in metrics
    (sent,) = clients("proton", "send", node.url, address="idle", count=1).finish()
    assert sent["accepted"] == 1
    assert waiting.finish()[-1]["error"] is None
    wait_for(lambda: not admin(node, "/api/v1/connections")["connections"], 10,
             "the connections to close")


def test_a_real_browser_sends_and_receives_over_websocket(start_node, tmp_path):
    """Headless Chromium loads a page (served over HTTP from another origin) that uses
    rhea's browser build: it connects with ws://, sends 100 numbered messages and gets
    them back; the test reads the page's result. The node allows only that page's origin."""
    import http.server
    import json
    import shutil
    import subprocess
    import threading
    from functools import partial
    from pathlib import Path

    from conftest import NODE_JS, TESTS, free_port, require

    chromium = Path("/usr/bin/chromium")
    require(NODE_JS is not None, "node (Node.js)")
    require((TESTS / "js" / "node_modules" / "playwright-core").is_dir(),
            "playwright-core (npm ci in tests/js)")
    require(chromium.exists(), "chromium (.ci/install/chromium.sh)")
    site = tmp_path / "site"
    site.mkdir()
    shutil.copy(TESTS / "js" / "browser" / "amqp_ws.html", site)
    shutil.copy(TESTS / "js" / "node_modules" / "rhea" / "dist" / "rhea-umd.js", site)
    web_port = free_port()
    origin = f"http://127.0.0.1:{web_port}"
    node = start_node({"websocket": {"paths": ["/amqp"], "origins": [origin]}})
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", web_port), partial(http.server.SimpleHTTPRequestHandler, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        page = f"{origin}/amqp_ws.html?ws={ws_url(node)}&address=browser.q&count=100"
        screenshot = tmp_path / "browser-websocket.png"
        run = subprocess.run([NODE_JS, str(TESTS / "js" / "browser_ws.js"), "--url", page,
                              "--screenshot", str(screenshot), "--chromium", str(chromium)],
                             capture_output=True, text=True, timeout=90)
    finally:
        server.shutdown()
        server.server_close()
    assert run.stdout.strip(), run.stderr
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["error"] is None, out
    result = out["result"]
    assert result["error"] is None, result
    assert result["sent"] == 100 and result["accepted"] == 100
    assert sorted(result["received"]) == sorted(f"b-{i}" for i in range(100))
    assert out["console_errors"] == []
    assert screenshot.stat().st_size > 0  # kept with the test's files (pytest's tmp_path)
