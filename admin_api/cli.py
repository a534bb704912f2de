"""``fedgate status | queues | connections | rules [get | apply FILE | resolve ADDRESS] |
promote QUEUE [--node N] [--force] | queue (peek | purge | delete | move | resend) QUEUE |
audit``.

``status``, ``queues``, ``connections`` and ``rules`` print tables (as
``rabbitmqctl`` and ``qdstat`` do), or the admin API's JSON with ``--json``;
``queues`` prints a second table for the replicated queues the node knows.

They talk to a node's admin API (``--admin URL``, default ``$FEDGATE_ADMIN``
or ``http://127.0.0.1:8080``) with the bearer token in ``$FEDGATE_TOKEN``, else the one
a node made in its data dir (``--config``/``--data-dir``; default ``var/fedgate``, the
data dir of ``deploy/examples/standalone.toml``, which ``make run`` starts: after it, a
plain ``fedgate status`` from the checkout gets in). A 401 without a token says which
file was looked for.
Registered through the ``fedgate.commands`` entry point. Plain ``urllib``:
a command makes one or two requests and exits.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tomllib
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

DEFAULT_ADMIN = "http://127.0.0.1:8080"
TIMEOUT = 10.0


class ApiFailure(Exception):
    def __init__(self, status: int, body: Any) -> None:
        self.status = status
        self.body = body
        self.hint: str | None = None  # what to do about it, when the CLI knows
        if isinstance(body, dict) and "error" in body:
            where = f" (field {body['field']})" if body.get("field") else ""
            text = f"{status} {body['error']}{where}: {body.get('detail', '')}"
        else:
            text = f"HTTP {status}: {body}"
        super().__init__(text)


def call(args: argparse.Namespace, method: str, path: str, body: Any = None,
         headers: dict[str, str] | None = None, *, timeout: float = TIMEOUT) -> Any:
    url = args.admin.rstrip("/") + path
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers=dict(headers or {}))
    token = os.environ.get("FEDGATE_TOKEN") or _local_token(args)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            parsed = json.loads(raw)
        except ValueError:
            parsed = raw.decode(errors="replace")
        failure = ApiFailure(exc.code, parsed)
        if exc.code == 401 and not token:
            failure.hint = (f"no admin token: $FEDGATE_TOKEN is not set and there is none in "
                            f"{_token_file(args)}; pass the node's --config FILE or --data-dir DIR")
        raise failure from None


def _token_file(args: argparse.Namespace) -> Path:
    from .first_run import token_path

    return token_path(_data_dir(args)).absolute()


def _local_token(args: argparse.Namespace) -> str | None:
    """The token a node on this machine made for its loopback admin API (admin_api.first_run)."""
    from .first_run import read_token

    return read_token(_data_dir(args))


def _data_dir(args: argparse.Namespace) -> str:
    from proxy.config import settings as config_mod

    if getattr(args, "data_dir", None):
        return args.data_dir
    config = config_mod.load(args.config) if getattr(args, "config", None) else config_mod.from_dict({})
    return str(config.node.data_dir)


def cmd_admin_token(args: argparse.Namespace) -> int:
    from .first_run import load_or_create, token_path

    data_dir = _data_dir(args)
    token, created = load_or_create(data_dir)
    print(token)
    if created:
        print(f"(made now in {token_path(data_dir)}; a node with this data dir and no [admin] tokens "
              "uses it on a loopback admin listener)", file=sys.stderr)
    return 0


def load_rules_file(path: str) -> list:
    """JSON (a list, or {"rules": [...]}) or TOML ([[rules]] tables)."""
    text = Path(path).read_text()
    if path.endswith(".toml"):
        try:
            raw = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"{path}: invalid TOML: {exc}") from None
    else:
        try:
            raw = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"{path}: invalid JSON: {exc}") from None
    rules = raw.get("rules") if isinstance(raw, dict) else raw
    if not isinstance(rules, list):
        raise ValueError(f"{path}: expected a list of rules or a 'rules' key holding one")
    return rules


def table(rows: list[dict], columns: list[tuple[str, str]]) -> str:
    """Rows as aligned columns: ``columns`` is [(heading, key)]; numbers right-aligned."""
    cells = [[heading.upper() for heading, _ in columns]]
    for row in rows:
        cells.append(["-" if row.get(key) is None else str(row.get(key)) for _, key in columns])
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    numeric = [all(isinstance(row.get(key), (int, float)) for row in rows) and rows
               for _, key in columns]
    lines = []
    for line in cells:
        parts = [value.rjust(width) if number else value.ljust(width)
                 for value, width, number in zip(line, widths, numeric)]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def _print_table(args, body: dict, key: str, columns: list[tuple[str, str]]) -> None:
    if args.json:
        print(json.dumps(body, indent=2))
    else:
        print(table(body[key], columns))


QUEUE_COLUMNS = [("name", "name"), ("depth", "depth"), ("scheduled", "scheduled"), ("unacked", "unacked"),
                 ("consumers", "consumers"), ("producers", "producers"), ("bytes", "bytes"),
                 ("paged", "paged_messages"), ("on_disk", "paged_bytes"), ("max_depth", "max_depth"), ("max_bytes", "max_bytes"), ("temporary", "temporary")]
CONNECTION_COLUMNS = [("id", "id"), ("peer", "peer"), ("user", "user"), ("mechanism", "mechanism"),
                      ("links", "links"), ("sent", "sent"), ("received", "received"),
                      ("stalled_s", "output_stalled_s")]
RULE_COLUMNS = [("name", "name"), ("match", "match"), ("kind", "kind"), ("primary", "primary"),
                ("remote", "remote")]


REPLICATED_COLUMNS = [("queue", "name"), ("role", "role"), ("primary", "primary"),
                      ("epoch", "epoch"), ("depth", "depth"), ("backups", "backups"),
                      ("in_sync", "in_sync"), ("lag_msgs", "lag_messages"), ("lag_ms", "lag_ms"),
                      ("failovers", "failovers")]


def replicated_row(item: dict) -> dict:
    """One replicated queue as a row: backups as ``node:state``, the largest lag of them; on a
    backup its copy's depth, and its own state as the role."""
    r = item.get("replication") or {}
    backups = r.get("backups") or []
    row = {"name": item["name"], "role": r.get("role"), "primary": r.get("primary"),
           "epoch": r.get("epoch"), "failovers": r.get("failovers")}
    if r.get("role") == "primary":
        row.update(depth=r.get("depth"),
                   backups=",".join(f"{b['node']}:{b['state']}" for b in backups) or "none",
                   in_sync=f"{len(r.get('in_sync') or [])}/{len(backups)}",
                   lag_messages=max((b.get("lag_messages") or 0 for b in backups), default=0),
                   lag_ms=max((b.get("lag_ms") or 0 for b in backups), default=0))
    elif r.get("copy"):
        row["depth"] = r["copy"].get("depth")
    if row["primary"] is None and r.get("placement"):
        row["primary"] = f"({r['placement'][0]}?)"  # none known here yet: the preferred node
    return row


def cmd_queues(args: argparse.Namespace) -> int:
    body = call(args, "GET", "/api/v1/queues")
    if args.json:
        print(json.dumps(body, indent=2))
        return 0
    local = [q for q in body["queues"] if "depth" in q]
    print(table(local, QUEUE_COLUMNS))
    replicated = [replicated_row(q) for q in body["queues"] if q.get("replication")]
    if replicated:
        print("\nreplicated queues")
        print(table(replicated, REPLICATED_COLUMNS))
    return 0


def cmd_promote(args: argparse.Namespace) -> int:
    body = {"force": args.force}
    if args.node:
        body["node"] = args.node
    path = f"/api/v1/queues/{urllib.parse.quote(args.queue, safe='')}/promote"
    result = call(args, "POST", path, body)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    r = result.get("replication") or {}
    print(f"queue {result['name']}: primary {result['node']} (epoch {r.get('epoch')})"
          + (" -- forced: it may lack messages the old primary had accepted" if result.get("forced")
             else ""))
    backups = r.get("backups") or []
    print("  backups: " + (", ".join(f"{b['node']} {b['state']}" for b in backups) or "none yet"))
    for node, answer in sorted((result.get("told") or {}).items()):
        print(f"  told {node}: {answer}")
    return 0


SUBSCRIPTION_COLUMNS = [("name", "name"), ("exchange", "exchange"), ("durable", "durable"),
                        ("shared", "shared"), ("selector", "selector"), ("depth", "depth"),
                        ("consumers", "consumers")]


def cmd_subscriptions(args: argparse.Namespace) -> int:
    _print_table(args, call(args, "GET", "/api/v1/subscriptions"), "subscriptions",
                 SUBSCRIPTION_COLUMNS)
    return 0


def cmd_connections(args: argparse.Namespace) -> int:
    _print_table(args, call(args, "GET", "/api/v1/connections"), "connections", CONNECTION_COLUMNS)
    return 0


def cmd_rules(args: argparse.Namespace) -> int:
    if args.action is None:
        body = call(args, "GET", "/api/v1/rules")
        if not args.json:
            print(f"rules version {body['version']} ({body['source']}, {len(body['rules'])} rules)")
        _print_table(args, body, "rules", RULE_COLUMNS)
    elif args.action == "get":
        print(json.dumps(call(args, "GET", "/api/v1/rules"), indent=2))
    elif args.action == "apply":
        rules = load_rules_file(args.file)
        headers = {"If-Match": str(args.if_version)} if args.if_version is not None else {}
        result = call(args, "PUT", "/api/v1/rules", {"rules": rules}, headers)
        print(f"rules version {result['version']} applied ({len(result['rules'])} rules)")
    else:
        query = urllib.parse.urlencode({"address": args.address})
        result = call(args, "GET", f"/api/v1/resolve?{query}")
        rule = result["rule"]["name"] if result.get("rule") else "-"
        print(f"{result['address']}: {result['decision']} (rule {rule}) {result['reason']}")
        if result.get("remote_address"):
            print(f"  remote address {result['remote_address']} at {result.get('primary_url')}")
        replicated = result.get("replication")
        if replicated:
            known = (f"epoch {replicated['epoch']}" if replicated["primary_known"]
                     else "none known here yet: the preferred node")
            print(f"  primary {replicated['primary']} ({known}); replica set "
                  f"{', '.join(replicated['placement'])}; this node: {replicated['role']}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    node = call(args, "GET", "/api/v1/node")
    if args.json:
        print(json.dumps({"node": node, "cluster": call(args, "GET", "/api/v1/cluster")}, indent=2))
        return 0
    counters = node["counters"]
    print(f"node {node['id']} amqp {node['url']} admin {node['admin_url']} "
          f"up {node['uptime_s']:.0f}s rules v{node['rules_version']}")
    print("  " + " ".join(f"{k}={v}" for k, v in counters.items()))
    cluster = call(args, "GET", "/api/v1/cluster")
    print("  " + coordinator_line(cluster.get("coordinator") or {"kind": "static"}))
    if cluster.get("members"):
        print("\n".join("  " + line for line in table(
            [dict(m, draining="yes" if m.get("draining") else None) for m in cluster["members"]],
            MEMBER_COLUMNS).splitlines()))
    if (cluster.get("coordinator") or {}).get("kind") != "etcd":
        for item in cluster["nodes"]:
            state = (f"rules v{item['version']} {item['digest'][:12]}" if item["reachable"]
                     else f"unreachable ({item['error']})")
            print(f"  {item['id']:<12} {state}")
    elif cluster.get("etcd_rules"):
        held = cluster["etcd_rules"]
        print(f"  rules in etcd: v{held['version']} (revision {held['revision']})"
              + ("; this node serves other rules" if cluster["divergent"] else ""))
    if cluster["divergent"]:
        print(f"  divergent: {', '.join(cluster['divergent'])}")
    if cluster.get("rejected"):
        rejected = cluster["rejected"]
        print(f"  rejected v{rejected['version']} from {rejected['from']}: {rejected['detail']}")
    return 0


MEMBER_COLUMNS = [("member", "id"), ("amqp", "amqp"), ("admin", "admin"), ("workers", "workers"),
                  ("lease_age_s", "lease_age_s"), ("draining", "draining")]


def coordinator_line(coordinator: dict) -> str:
    """One line: where the cluster state lives, whether it answers, whether this node acts."""
    if coordinator.get("kind") != "etcd":
        return "cluster: static ([peers]; no etcd)"
    endpoint = coordinator.get("endpoint") or ", ".join(coordinator.get("endpoints") or [])
    if coordinator.get("healthy"):
        health = f"etcd {endpoint} healthy, revision {coordinator.get('revision')}"
    else:
        health = (f"etcd UNREACHABLE ({coordinator.get('last_error') or 'connecting'}), "
                  f"reconnecting with backoff (attempt {coordinator.get('reconnects', 0)})")
    lease = coordinator.get("lease") or {}
    if coordinator.get("error"):
        acting = f"FENCED: {coordinator['error']}"
    elif coordinator.get("acting"):
        acting = f"acting (lease ttl {lease.get('ttl'):g} s, renewed {lease.get('renewed_s_ago')} s ago)"
    elif lease:
        acting = f"FENCED (lease {lease.get('state')}; no renewal for {lease.get('renewed_s_ago')} s)"
    else:
        acting = "watching (a worker of the node)"
    return f"cluster {coordinator.get('name')}: {health}; this node {acting}"


def _run(func):
    def run(args: argparse.Namespace) -> int:
        try:
            return func(args)
        except ApiFailure as exc:
            print(f"fedgate: {exc}", file=sys.stderr)
            if exc.hint:
                print(f"fedgate: {exc.hint}", file=sys.stderr)
            return 1
        except ValueError as exc:
            print(f"fedgate: {exc}", file=sys.stderr)
            return 2
        except urllib.error.URLError as exc:
            print(f"fedgate: cannot reach the admin API at {args.admin}: {exc.reason}", file=sys.stderr)
            return 1
    return run


def _admin_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--admin", default=os.environ.get("FEDGATE_ADMIN", DEFAULT_ADMIN),
                        help="admin API URL (default $FEDGATE_ADMIN or %(default)s); "
                             "token from $FEDGATE_TOKEN, else the data dir's admin-token file")
    _data_dir_options(parser)


def _json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="the admin API's JSON instead of a table")


def _data_dir_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="the node's config file (for its data dir)")
    parser.add_argument("--data-dir", help="the node's data dir (default: the config's, var/fedgate)")


def register(subparsers) -> None:
    rules = subparsers.add_parser("rules", help="routing rules of a running node (admin API); "
                                                "a table without an action")
    _admin_option(rules)
    _json_option(rules)
    actions = rules.add_subparsers(dest="action")
    get = actions.add_parser("get", help="print the rules and their version")
    _admin_option(get)
    apply = actions.add_parser("apply", help="replace the rules with those in FILE (JSON or TOML)")
    apply.add_argument("file")
    apply.add_argument("--if-version", type=int, help="only if the node is at this rules version")
    _admin_option(apply)
    resolve = actions.add_parser("resolve", help="which rule ADDRESS matches, and why")
    resolve.add_argument("address")
    _admin_option(resolve)
    rules.set_defaults(func=_run(cmd_rules))

    status = subparsers.add_parser("status", help="a running node and its cluster (admin API)")
    _admin_option(status)
    _json_option(status)
    status.set_defaults(func=_run(cmd_status))

    promote = subparsers.add_parser(
        "promote", help="make a node the primary of a replicated queue (admin API); refused "
                        "unless its copy is a ready backup")
    promote.add_argument("queue", help="the replicated queue (its address)")
    promote.add_argument("--node", help="the node to promote (default: the one --admin reaches); "
                                        "another node is asked through this one")
    promote.add_argument("--force", action="store_true",
                         help="promote a catching-up or lagging copy too (it may lack messages "
                              "the primary accepted)")
    _admin_option(promote)
    _json_option(promote)
    promote.set_defaults(func=_run(cmd_promote))

    for name, func, what in (("queues", cmd_queues, "local and replicated queues"),
                             ("subscriptions", cmd_subscriptions, "topic subscriptions"),
                             ("connections", cmd_connections, "client connections")):
        command = subparsers.add_parser(name, help=f"{what} of a running node (admin API)")
        _admin_option(command)
        _json_option(command)
        command.set_defaults(func=_run(func))

    from .cli_queues import register_queue_commands

    register_queue_commands(subparsers, _run, _admin_option, _json_option, call, table)

    token = subparsers.add_parser("admin-token", help="print the admin token of a node's data dir "
                                                      "(made if there is none)")
    _data_dir_options(token)
    token.set_defaults(func=cmd_admin_token)
