"""Start a group of fedgate nodes sharing a fragmented queue (real processes)."""

from __future__ import annotations

import json
import urllib.request

from conftest import free_port

TOKEN = "fragments-test-token-0001"


def start_cluster(start_node, names=("n1", "n2", "n3"), *, members=None, rule=None,
                  match="work.#") -> dict:
    """Nodes wired as peers, each with the same `fragmented` rule. Returns {name: node}."""
    ports = {name: free_port() for name in names}
    urls = {name: f"amqp://127.0.0.1:{port}" for name, port in ports.items()}
    fragment_rule = {"name": "work", "match": match, "kind": "fragmented",
                     "fragments": list(members or names), **(rule or {})}
    nodes = {}
    for name in names:
        nodes[name] = start_node({
            "node": {"listen": f"127.0.0.1:{ports[name]}"},
            "admin": {"tokens": [{"token": TOKEN, "role": "admin"}]},
            "peers": {peer: url for peer, url in urls.items() if peer != name},
            "rules": [fragment_rule],
        }, name=name)
    return nodes


def admin(node, path: str, *, method: str = "GET", body=None, headers=None):
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(node.admin_url + path, data=data, method=method, headers={
        "Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json", **(headers or {})})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read() or b"null")


def fragments(node) -> list[dict]:
    body = admin(node, "/api/v1/fragments")
    return body if isinstance(body, list) else body.get("fragments", [])


def cpu_seconds(pid: int) -> float:
    import os

    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
