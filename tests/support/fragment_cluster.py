"""Start a group of fedgate nodes sharing a fragmented queue (real processes)."""

from __future__ import annotations

from admin_client import ADMIN_TOKEN as TOKEN
from admin_client import admin
from conftest import free_port

__all__ = ["TOKEN", "admin", "cpu_seconds", "fragments", "start_cluster"]


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


def fragments(node) -> list[dict]:
    body = admin(node, "/api/v1/fragments")
    return body if isinstance(body, list) else body.get("fragments", [])


def cpu_seconds(pid: int) -> float:
    import os

    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
