"""``fedgate queue (peek | purge | delete | move | resend) QUEUE`` and ``fedgate audit``:
the admin API's queue operations and audit log from the command line (docs/operations.md).

Each prints what was done in one or two lines (``--json``: the API's answer); a refusal
prints the API's error and reason and exits 1, as the other admin commands do.
``admin_api.cli`` registers them and hands in its ``call`` and ``table`` (this module does
not import it: no cycle).
"""

from __future__ import annotations

import argparse
import json
import urllib.parse


MOVE_TIMEOUT = 40.0  # the node waits up to 30 s for a move's targets


def _path(queue: str, action: str = "") -> str:
    return f"/api/v1/queues/{urllib.parse.quote(queue, safe='')}" + (f"/{action}" if action else "")


def _where(result: dict) -> str:
    on = f"on {result.get('node')}"
    if result.get("forwarded_to"):
        on += " (its primary)"
    return f"{result.get('scope', 'local')} queue {result.get('name')} {on}"


def _failures(result: dict) -> None:
    for failure in result.get("failures") or []:
        print(f"  {failure['count']} not taken by {failure['to']}: {failure['reason']} "
              "(back in the queue)")


def cmd_queue(args: argparse.Namespace, call, table) -> int:
    action = args.action
    if action == "peek":
        result = call(args, "GET", _path(args.queue, "messages") + f"?count={args.count}")
    elif action == "purge":
        result = call(args, "POST", _path(args.queue, "purge"))
    elif action == "delete":
        result = call(args, "DELETE", _path(args.queue) + ("?force=true" if args.force else ""))
    elif action == "move":
        body = {"to": args.to}
        if args.count is not None:
            body["count"] = args.count
        if args.selector:
            body["selector"] = args.selector
        result = call(args, "POST", _path(args.queue, "move"), body, timeout=MOVE_TIMEOUT)
    else:
        body = {"count": args.count} if args.count is not None else {}
        result = call(args, "POST", _path(args.queue, "resend"), body, timeout=MOVE_TIMEOUT)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    if action == "peek":
        rows = [{"id": (m.get("properties") or {}).get("message_id"),
                 "subject": (m.get("properties") or {}).get("subject"),
                 "delivery_count": m.get("delivery_count"), "size": m.get("size"),
                 "body": " ".join((m.get("body") or "")[:40].split())} for m in result["messages"]]
        print(f"{_where(result)}: depth {result['depth']}, first {len(rows)}")
        print(table(rows, [("id", "id"), ("subject", "subject"),
                           ("delivery_count", "delivery_count"), ("size", "size"),
                           ("body", "body")]))
    elif action == "purge":
        print(f"{_where(result)}: {result['purged']} messages purged")
    elif action == "delete":
        print(f"{_where(result)}: deleted ({result['purged']} messages purged, "
              f"{result['links_closed']} links closed)")
    elif action == "move":
        print(f"{_where(result)}: {result['moved']} of {result['selected']} messages moved to "
              f"{result['to']}")
        _failures(result)
    else:
        targets = ", ".join(f"{t}: {n}" for t, n in sorted(result["targets"].items())) or "none"
        print(f"{_where(result)}: {result['resent']} of {result['selected']} dead-lettered "
              f"messages resent ({targets})")
        _failures(result)
    return 0


def cmd_audit(args: argparse.Namespace, call, table) -> int:
    result = call(args, "GET", f"/api/v1/audit?limit={args.limit}")
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    rows = [{**e, "what": f"{e['method']} {e['path']}",
             "result": (e.get("result") or {}).get("error") or "ok"} for e in result["entries"]]
    print(table(rows, [("time", "time"), ("who", "who"), ("what", "what"), ("status", "status"),
                       ("result", "result")]))
    return 0


def register_queue_commands(subparsers, run, admin_option, json_option, call, table) -> None:
    queue = subparsers.add_parser("queue", help="operate on a queue of a running node (admin "
                                                "API): peek, purge, delete, move, resend")
    actions = queue.add_subparsers(dest="action", required=True)
    peek = actions.add_parser("peek", help="the first messages, none taken")
    peek.add_argument("--count", type=int, default=10)
    actions.add_parser("purge", help="remove every waiting message; prints the count")
    delete = actions.add_parser("delete", help="delete a local queue (refused while it has "
                                               "consumers or messages)")
    delete.add_argument("--force", action="store_true",
                        help="even with messages and consumers (they are detached)")
    move = actions.add_parser("move", help="move messages to another address (at least once)")
    move.add_argument("--to", required=True, help="the address to move them to")
    move.add_argument("--count", type=int, help="at most this many (default: all, up to 10000)")
    move.add_argument("--selector", help="only those this JMS selector selects")
    resend = actions.add_parser("resend", help="dead-lettered messages back to their queue")
    resend.add_argument("--count", type=int, help="at most this many")
    for parser in (peek, actions.choices["purge"], delete, move, resend):
        parser.add_argument("queue", help="the queue (its address)")
        admin_option(parser)
        json_option(parser)
    queue.set_defaults(func=run(lambda args: cmd_queue(args, call, table)))

    audit = subparsers.add_parser("audit", help="the audit log of admin changes (admin API)")
    audit.add_argument("--limit", type=int, default=50)
    admin_option(audit)
    json_option(audit)
    audit.set_defaults(func=run(lambda args: cmd_audit(args, call, table)))
