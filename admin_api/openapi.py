"""The OpenAPI 3.1 description of every admin endpoint (served at /api/v1/openapi.json).

Kept next to the route table by a test: every route the app has appears here
and every path here is a route (``tests/test_admin_api.py``).
"""

from __future__ import annotations

from typing import Any

from proxy.config.rules_store import MAX_TIMESTAMP, MAX_VERSION
from routing import KINDS, ON_CHANGE


def _ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict, description: str) -> dict:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


ERROR = _ref("Error")
ERRORS = {
    "400": _json(ERROR, "Bad input (not JSON, wrong shape, bad parameter)"),
    "401": _json(ERROR, "No or unknown bearer token"),
    "403": _json(ERROR, "The token's role may not do this"),
    "404": _json(ERROR, "Not found"),
    "405": _json(ERROR, "Method not allowed"),
    "409": _json(ERROR, "Conflict"),
    "412": _json(ERROR, "If-Match does not match the current rules version"),
    "413": _json(ERROR, "Request body too large"),
    "422": _json(ERROR, "The rules do not validate; `field` names the first problem"),
    "503": _json(ERROR, "The cluster's rules live in etcd, which cannot be reached now (the "
                        "reason in `detail`; Retry-After)"),
    "502": _json(ERROR, "Another node could not be reached, or refused this node (the reason in "
                        "`detail`)"),
}
AUTH_ERRORS = ("401", "403", "405")


def _errors(*codes: str) -> dict:
    return {code: ERRORS[code] for code in (*codes, *AUTH_ERRORS)}


def _op(summary: str, ok: dict, *, errors: tuple[str, ...] = (), params: list | None = None,
        body: dict | None = None, public: bool = False, ok_code: str = "200",
        extra: dict | None = None, tag: str = "api") -> dict:
    op: dict[str, Any] = {"summary": summary, "tags": [tag],
                          "responses": {ok_code: ok, **(extra or {}), **_errors(*errors)}}
    if public:
        op["security"] = []
        for code in ("401", "403"):
            op["responses"].pop(code)
    if params:
        op["parameters"] = params
    if body:
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": body}}}
    return op


IF_MATCH = {"name": "If-Match", "in": "header", "required": False,
            "description": "ETag from a GET of the rules, or a bare version number",
            "schema": {"type": "string"}}
RULE_NAME = {"name": "name", "in": "path", "required": True,
             "schema": {"type": "string", "pattern": "^[A-Za-z0-9_.-]+$"}}
ETAG_HEADER = {"ETag": {"description": "Rules version and digest", "schema": {"type": "string"}}}

UPSTREAM = {
    "type": "object", "additionalProperties": False,
    "properties": {
        "user": {"type": "string", "minLength": 1},
        "password_file": {"type": "string", "minLength": 1},
        "password_env": {"type": "string", "minLength": 1},
        "vhost": {"type": "string", "minLength": 1},
        "declare": {"oneOf": [
            {"type": "boolean", "enum": [True]},
            {"type": "object", "additionalProperties": False, "properties": {
                "type": {"type": "string", "enum": ["classic", "quorum", "stream"]},
                "durable": {"type": "boolean"},
                "arguments": {"type": "object"}}},
        ]},
        "idle_timeout": {"type": "number", "exclusiveMinimum": 0},
        "pool_size": {"type": "integer", "minimum": 1, "maximum": 16},
        "heartbeat": {"type": "number", "exclusiveMinimum": 0},
        "recheck_interval": {"type": "number", "minimum": 0},
        "split_directions": {"type": "boolean"},
        "max_send_failures": {"type": "integer", "minimum": 1},
        "max_connections": {"type": "integer", "minimum": 0},
        "tls_ca": {"type": "string"}, "tls_cert": {"type": "string"}, "tls_key": {"type": "string"},
    },
}
RULE = {
    "type": "object",
    "required": ["name", "match", "kind"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "pattern": "^[A-Za-z0-9_.-]+$"},
        "match": {"type": "string", "minLength": 1,
                  "description": "address pattern; words separated by '.', '*' one word, '#' any"},
        "kind": {"type": "string", "enum": list(KINDS)},
        "primary": {"type": "string", "description": "amqp(s):// URL or peer id (proxy/fragmented)"},
        "remote": {"type": "string", "description": "remote address template, default {address}"},
        "upstream": UPSTREAM,
        "fragments": {"type": "array", "items": {"oneOf": [
            {"type": "string"},
            {"type": "object", "additionalProperties": False, "properties": {
                "peer": {"type": "string"}, "url": {"type": "string"}, "address": {"type": "string"}}},
        ]}},
        "prefer": {"type": "array", "items": {"type": "string"}},
        "on_change": {"type": "string", "enum": list(ON_CHANGE)},
        "mirror_auto_delete": {"type": "boolean"},
        "dead_letter": {"type": "string"},
        "max_depth": {"type": "integer", "minimum": 1},
        "durable": {"type": "boolean"},
        "replicas": {"type": "integer", "minimum": 1, "maximum": 5,
                     "description": "copies of the queue, the primary's included (replicated: "
                                    "2-5; fragmented: 1-5)"},
        "nodes": {"type": "array", "items": {"type": "string", "minLength": 1},
                  "description": "the replica set's candidates (replicated), preferred first"},
        "min_in_sync": {"type": "integer", "minimum": 1},
        "catchup_timeout": {"type": "number", "exclusiveMinimum": 0},
    },
}
RECORD = {
    "type": "object",
    "required": ["version", "updated_at", "origin", "rules"],
    "properties": {
        "version": {"type": "integer", "minimum": 0, "maximum": MAX_VERSION},
        "updated_at": {"type": "number", "minimum": 0, "maximum": MAX_TIMESTAMP},
        "origin": {"type": "string", "minLength": 1},
        "rules": {"type": "array", "items": _ref("Rule")},
    },
}
RULES_DOC = {
    "type": "object",
    "required": ["version", "rules"],
    "properties": {
        "version": {"type": "integer"}, "updated_at": {"type": "number"},
        "origin": {"type": "string"}, "source": {"type": "string", "enum": ["config", "api"]},
        "digest": {"type": "string"}, "rules": {"type": "array", "items": _ref("Rule")},
    },
}
ONE_RULE = {"type": "object", "properties": {
    "version": {"type": "integer"}, "position": {"type": "integer"}, "rule": _ref("Rule")}}
LISTING = {"type": "object", "properties": {"count": {"type": "integer"}}}
BACKUP = {"type": "object", "properties": {
    "node": {"type": "string"},
    "state": {"type": "string", "enum": ["catching-up", "ready", "lagging", "absent"]},
    "lag_messages": {"type": "integer"}, "lag_ms": {"type": "number"},
    "catchup_left": {"type": "integer"},
    "stream_bytes": {"type": "integer",
                     "description": "memory the events waiting for it hold at the primary; "
                                    "past 64 MiB it is dropped (docs/replication.md)"},
    "version": {"type": ["string", "null"],
                "description": "the backup's release, as its replication link said (0.5.0: "
                               "it says none); null before its link attached"}}}
REPLICATION = {
    "type": "object",
    "description": "A replicated queue as this node sees it (docs/replication.md)",
    "properties": {
        "role": {"type": "string", "description": "this node's: primary, catching-up, ready, "
                                                  "lagging (a backup), proxy (no copy here)"},
        "primary": {"type": ["string", "null"], "description": "the primary this node knows"},
        "epoch": {"type": ["integer", "null"]},
        "replicas": {"type": "integer"},
        "placement": {"type": "array", "items": {"type": "string"},
                      "description": "the replica set, preferred primary first"},
        "failovers": {"type": "integer"},
        "waiting_links": {"type": "integer"},
        "in_sync": {"type": "array", "items": {"type": "string"}, "description": "primary only"},
        "in_sync_backups": {"type": "integer"},
        "waiting_acceptance": {"type": "integer"},
        "lag_messages": {"type": "integer", "description": "the largest of the backups'"},
        "lag_ms": {"type": "number", "description": "the largest of the backups'"},
        "backups": {"type": "array", "items": BACKUP},
        "depth": {"type": "integer"},
        "copy": {"type": "object", "description": "a backup's copy: state, primary, epoch, "
                                                  "depth, bytes, catching_up, in_sync"},
    },
}
QUEUES = {"type": "object", "properties": {
    "count": {"type": "integer"}, "depth": {"type": "integer"},
    "replicated": {"type": "integer"},
    "queues": {"type": "array", "items": {"type": "object", "required": ["name"], "properties": {
        "name": {"type": "string"}, "depth": {"type": "integer"},
        "scheduled": {"type": "integer", "description": "held until their delivery time"},
        "by_priority": {"type": "object", "additionalProperties": {"type": "integer"},
                        "description": "waiting messages by priority"},
        "delivery_limit": {"type": "integer"},
        "selective_consumers": {"type": "integer", "description": "consumers with a selector"},
        "paged_messages": {"type": "integer", "description": "bodies on disk only"},
        "paged_bytes": {"type": "integer", "description": "bytes of bodies on disk only"},
        "memory_bytes": {"type": "integer", "description": "bytes of bodies in memory"},
        "scheduled_paged": {"type": "integer", "description": "scheduled messages on disk"},
        "scheduled_paged_bytes": {"type": "integer",
                                  "description": "bytes of scheduled bodies on disk only"},
        "paging": {"type": "boolean"}, "reading": {"type": "boolean",
                                                   "description": "a read-ahead under way"},
        "role": {"type": "string", "description": "replicated queues only"},
        "replication": REPLICATION}}}}}
PROMOTED = {"type": "object", "properties": {
    "name": {"type": "string"}, "node": {"type": "string"}, "role": {"type": "string"},
    "forced": {"type": "boolean"}, "replication": REPLICATION,
    "told": {"type": "object", "additionalProperties": {"type": "string"},
             "description": "static clusters: each other node told of the new primary "
                            "(learned, ignored, or failed: why)"}}}

QUEUE_NAME = {"name": "name", "in": "path", "required": True,
              "schema": {"type": "string", "minLength": 1}}
OPERATED = {"name": {"type": "string"}, "node": {"type": "string", "description": "the node "
                                                 "that did it (a replicated queue's primary)"},
            "scope": {"type": "string", "enum": ["local", "fragment", "replicated"]},
            "forwarded_to": {"type": "string", "description": "the primary this request was "
                                                              "forwarded to"},
            "depth": {"type": "integer"}}
FAILURES = {"type": "array", "items": {"type": "object", "properties": {
    "to": {"type": "string"}, "reason": {"type": "string"}, "count": {"type": "integer"}}}}
OPS_ERRORS = ("400", "404", "409", "413", "502")


def _queue_ops() -> dict[str, dict]:
    """Queue operations (admin_api.queue_ops, docs/operations.md)."""
    def answer(description: str, **properties) -> dict:
        return _json({"type": "object", "properties": {**OPERATED, **properties}}, description)

    return {
        "/api/v1/queues/{name}": {"delete": _op(
            "Delete a local queue; refused (409 queue_in_use) while it has consumers or "
            "messages unless `force` (its links are then detached with amqp:resource-deleted)",
            answer("deleted", deleted={"type": "boolean"}, purged={"type": "integer"},
                   links_closed={"type": "integer"}),
            errors=OPS_ERRORS, params=[QUEUE_NAME, {
                "name": "force", "in": "query", "required": False,
                "schema": {"type": "string", "enum": ["true", "false", "1", "0"]}}])},
        "/api/v1/queues/{name}/purge": {"post": _op(
            "Remove every waiting message (a replicated queue: by its primary, the backups "
            "follow); messages out with consumers stay theirs",
            answer("purged", purged={"type": "integer"}, unacked={"type": "integer"}),
            errors=OPS_ERRORS, params=[QUEUE_NAME])},
        "/api/v1/queues/{name}/messages": {"get": _op(
            "The first `count` waiting messages, decoded, none taken: header, properties, "
            "application properties, annotations, delivery-count, a body preview",
            answer("messages", messages={"type": "array", "items": {"type": "object"}},
                   scheduled={"type": "integer"}, unacked={"type": "integer"}),
            errors=OPS_ERRORS, params=[QUEUE_NAME, {
                "name": "count", "in": "query", "required": False,
                "schema": {"type": "integer", "minimum": 1, "maximum": 10000}}])},
        "/api/v1/queues/{name}/move": {"post": _op(
            "Move up to `count` waiting messages (those `selector` selects) to the address "
            "`to`, at least once: each leaves the queue once `to` accepted it; one refused, or "
            "not answered in 30 s, is back at the head",
            answer("moved", to={"type": "string"}, selected={"type": "integer"},
                   moved={"type": "integer"}, returned={"type": "integer"}, failures=FAILURES),
            errors=OPS_ERRORS, params=[QUEUE_NAME],
            body={"type": "object", "required": ["to"], "additionalProperties": False,
                  "properties": {"to": {"type": "string", "minLength": 1},
                                 "count": {"type": "integer", "minimum": 1, "maximum": 10000},
                                 "selector": {"type": "string"}}})},
        "/api/v1/queues/{name}/resend": {"post": _op(
            "Send dead-lettered messages (up to `count`) back to the queue each came from "
            "(its x-opt-dead-letter-address), at least once, the dead-letter annotations taken off",
            answer("resent", selected={"type": "integer"}, resent={"type": "integer"},
                   returned={"type": "integer"}, failures=FAILURES,
                   targets={"type": "object", "additionalProperties": {"type": "integer"}}),
            errors=OPS_ERRORS, params=[QUEUE_NAME],
            body={"type": "object", "additionalProperties": False, "properties": {
                "count": {"type": "integer", "minimum": 1, "maximum": 10000}}})},
        "/api/v1/audit": {"get": _op(
            "The audit log of admin changes, newest last: time, node, who, role, method, path, "
            "body (the start), status, result",
            _json({"type": "object", "properties": {
                "node": {"type": "string"}, "entries": {"type": "array", "items": {
                    "type": "object", "required": ["time", "who", "method", "path", "status"]}},
                "kept": {"type": "integer"}, "recorded": {"type": "integer"},
                "file": {"type": ["string", "null"]}}}, "entries"),
            errors=("400",), params=[{"name": "limit", "in": "query", "required": False,
                                      "schema": {"type": "integer", "minimum": 1}}])},
    }

EXCHANGE_BODY = {"type": "object", "properties": {
    "name": {"type": "string", "minLength": 1},
    "type": {"type": "string", "enum": ["fanout", "direct", "topic"]},
    "upstream_fanout": {"type": "object", "properties": {
        "primary": {"type": "string"}, "address": {"type": "string"},
        "upstream": {"type": "object"}}}}}
BINDING_BODY = {"type": "object", "required": ["queue"], "properties": {
    "exchange": {"type": "string", "minLength": 1}, "queue": {"type": "string", "minLength": 1},
    "key": {"type": "string"},
    "source": {"type": "object", "required": ["primary", "address"], "properties": {
        "primary": {"type": "string", "minLength": 1}, "address": {"type": "string", "minLength": 1},
        "window": {"type": "integer", "minimum": 1, "maximum": 100000},
        "upstream": {"type": "object"}}}},
    "description": "exchange (and key) binds a local exchange to a queue; source binds a remote "
                   "source to a local queue"}
GRANT_BODY = {"type": "object", "additionalProperties": False, "properties": {
    "send": {"type": "array", "items": {"type": "string"}},
    "receive": {"type": "array", "items": {"type": "string"}},
    "dynamic": {"type": "boolean"}}}
ACL_ENTRY = {"type": "object", "properties": {
    "user": {"type": "string"}, "group": {"type": "string"}, "subject": {"type": "string"},
    "origin": {"type": "string", "enum": ["config", "api"]}, **GRANT_BODY["properties"]}}
WIRED = {"type": "object", "properties": {"version": {"type": "integer"}}}
QUEUE_BODY = {"type": "object", "properties": {
    "name": {"type": "string", "minLength": 1}, "max_depth": {"type": "integer", "minimum": 0},
    "max_bytes": {"type": "integer", "minimum": 0},
    "overflow": {"type": "string", "enum": ["reject-publish", "drop-head"]},
    "dead_letter": {"type": "string"}, "delivery_limit": {"type": "integer", "minimum": 0},
    "durable": {"type": "boolean"}}}
WIRING_ERRORS = ("400", "409", "412", "413", "422", "503")


def _wiring_paths() -> dict[str, dict]:
    """Exchanges, bindings, queues and ACL grants at run time (admin_api.wiring, acl_api,
    docs/operations.md)."""
    name = {"name": "name", "in": "path", "required": True,
            "schema": {"type": "string", "minLength": 1}}
    subject = {"name": "subject", "in": "path", "required": True,
               "schema": {"type": "string", "minLength": 1},
               "description": "a user name, or group:<name>"}
    etag = {"headers": ETAG_HEADER}
    return {
        "/api/v1/exchanges": {
            "get": _op("Exchanges with counters, remote sources, the anonymous relay; `declared`: "
                       "the configuration's and the run-time exchanges and bindings (ETag)",
                       {**_json(LISTING, "exchanges"), **etag}),
            "post": _op("Declare an exchange (the [[exchanges]] keys), stored cluster-wide",
                        {**_json(WIRED, "declared"), **etag}, ok_code="201",
                        errors=WIRING_ERRORS, params=[IF_MATCH], body=EXCHANGE_BODY)},
        "/api/v1/exchanges/{name}": {
            "get": _op("One exchange: its declaration, bindings, counters",
                       {**_json({"type": "object"}, "the exchange"), **etag},
                       errors=("404",), params=[name]),
            "put": _op("Declare or change a run-time exchange",
                       {**_json(WIRED, "changed"), **etag}, errors=WIRING_ERRORS,
                       params=[name, IF_MATCH], body=EXCHANGE_BODY,
                       extra={"201": _json(WIRED, "declared")}),
            "delete": _op("Delete a run-time exchange and its bindings (its senders detached "
                          "with amqp:resource-deleted)", {**_json(WIRED, "deleted"), **etag},
                          errors=("404", "409", "412", "422", "503"), params=[name, IF_MATCH])},
        "/api/v1/bindings": {
            "get": _op("Bindings of exchanges to queues, with their id and origin",
                       {**_json({"type": "object"}, "bindings"), **etag}),
            "post": _op("Bind a queue to an exchange (the [[bindings]] keys)",
                        {**_json(WIRED, "bound"), **etag}, ok_code="201",
                        errors=WIRING_ERRORS, params=[IF_MATCH], body=BINDING_BODY)},
        "/api/v1/bindings/{id}": {"delete": _op(
            "Delete a run-time binding", {**_json(WIRED, "deleted"), **etag},
            errors=("404", "409", "412", "422", "503"),
            params=[{"name": "id", "in": "path", "required": True,
                     "schema": {"type": "string", "minLength": 1}}, IF_MATCH])},
        "/api/v1/queues": {"post": _op(
            "Declare a queue (the [[queue]] keys: name, max_depth, max_bytes, overflow, "
            "dead_letter, delivery_limit, durable), stored cluster-wide, made on the nodes "
            "where it is local", {**_json(WIRED, "declared"), **etag}, ok_code="201",
            errors=WIRING_ERRORS, params=[IF_MATCH], body=QUEUE_BODY)},
        "/api/v1/queues/{name}": {
            "get": _op("One queue: its figures on this node and its declaration (origin config "
                       "or api)", {**_json({"type": "object"}, "the queue"), **etag},
                       errors=("404",), params=[name]),
            "put": _op("Declare or change a run-time queue's settings (applied in place)",
                       {**_json(WIRED, "changed"), **etag}, errors=WIRING_ERRORS,
                       params=[name, IF_MATCH], body=QUEUE_BODY,
                       extra={"201": _json(WIRED, "declared")})},
        "/api/v1/acl": {"get": _op(
            "ACL entries: the configuration's [[acl]] and the grants made through the API, each "
            "with its subject and origin (ETag)",
            {**_json({"type": "object", "properties": {
                "version": {"type": "integer"}, "enabled": {"type": "boolean"},
                "entries": {"type": "array", "items": ACL_ENTRY}}}, "entries"), **etag})},
        "/api/v1/acl/{subject}": {
            "get": _op("One subject's entries (a user name, or group:<name>)",
                       {**_json({"type": "object"}, "entries"), **etag}, errors=("404",),
                       params=[subject]),
            "put": _op("Grant a user or group:<name> (send, receive, dynamic: the [[acl]] keys), "
                       "replacing what the API had granted it; applied to the next attach, links "
                       "no longer allowed detached with amqp:unauthorized-access",
                       {**_json(WIRED, "changed"), **etag}, errors=WIRING_ERRORS,
                       params=[subject, IF_MATCH], body=GRANT_BODY,
                       extra={"201": _json(WIRED, "granted")}),
            "delete": _op("Take a subject's grants made through the API away (its links "
                          "detached with amqp:unauthorized-access)",
                          {**_json(WIRED, "deleted"), **etag},
                          errors=("400", "404", "409", "412", "422", "503"),
                          params=[subject, IF_MATCH])},
        "/api/v1/cluster/wiring": {"get": _op(
            "Node to node (static clusters): the run-time wiring record this node holds (what "
            "its peers pull)", _json({"type": "object", "required": ["version"]}, "the record"),
            errors=("409", "503"), tag="cluster"), "post": _op(
            "Node to node (static clusters): offer a run-time wiring record (adopted if newer)",
            _json({"type": "object", "properties": {"accepted": {"type": "boolean"}}}, "result"),
            errors=("400", "409", "413", "422"), tag="cluster",
            body={"type": "object", "required": ["version", "exchanges", "bindings"],
                  "properties": {"version": {"type": "integer"},
                                 "updated_at": {"type": "number"},
                                 "origin": {"type": ["string", "null"]},
                                 "exchanges": {"type": "array", "items": EXCHANGE_BODY},
                                 "bindings": {"type": "array", "items": BINDING_BODY},
                                 "queues": {"type": "array", "items": QUEUE_BODY},
                                 "acl": {"type": "array", "items": {"type": "object"}}}})},
    }


def spec() -> dict[str, Any]:
    rules_put_body = {"oneOf": [
        {"type": "array", "items": _ref("Rule")},
        {"type": "object", "required": ["rules"],
         "properties": {"rules": {"type": "array", "items": _ref("Rule")}}},
    ]}
    text = {"content": {"text/plain": {"schema": {"type": "string"}}}}
    html = {"content": {"text/html": {"schema": {"type": "string"}}}}
    paths: dict[str, dict] = {
        "/": {"get": _op("Web console (HTML)", {"description": "the console page", **html},
                         public=True, tag="console")},
        "/ui/{file}": {"get": _op(
            "Web console assets (JavaScript, CSS)",
            {"description": "the file", "content": {"text/javascript": {"schema": {"type": "string"}},
                                                    "text/css": {"schema": {"type": "string"}}}},
            errors=("404",), public=True, tag="console",
            params=[{"name": "file", "in": "path", "required": True, "schema": {"type": "string"}}])},
        "/healthz": {"get": _op("Liveness: the node's loop answers", _json(
            {"type": "object", "properties": {"status": {"type": "string"}}}, "alive"),
            public=True, tag="health")},
        "/readyz": {"get": _op("Readiness: listening, configured upstreams reachable", _json(
            {"type": "object", "properties": {"status": {"type": "string"}}}, "ready"),
            public=True, tag="health", extra={"503": _json(ERROR, "not ready")})},
        "/metrics": {"get": _op("Prometheus metrics (text format 0.0.4)",
                                {"description": "metrics", **text}, tag="health")},
        "/api/v1/openapi.json": {"get": _op("This document", _json({"type": "object"}, "OpenAPI 3.1"))},
        "/api/v1/node": {"get": _op("This node: id, URLs, rules version, counters",
                                    _json(_ref("Node"), "the node"))},
        "/api/v1/connections": {"get": _op("Open client connections", _json(LISTING, "connections"))},
        "/api/v1/connections/{id}": {"delete": _op(
            "Close a client connection (amqp:connection:forced)", _json({"type": "object"}, "closed"),
            errors=("400", "404"),
            params=[{"name": "id", "in": "path", "required": True, "schema": {"type": "integer"}}])},
        "/api/v1/links": {"get": _op("Attached links", _json(LISTING, "links"))},
        "/api/v1/queues": {"get": _op(
            "Local queues with depth and counters; replicated queues this node knows, with "
            "its role, the primary, epoch, backups and their lag, failovers",
            _json(QUEUES, "queues"))},
        "/api/v1/queues/{name}/promote": {"post": _op(
            "Make `node` (default: this node) the primary of a replicated queue; another node's "
            "request is forwarded to its admin API. Refused (409) unless that node's copy is a "
            "ready backup, or `force`",
            _json(PROMOTED, "promoted (or the primary already)"),
            errors=("400", "404", "409", "413", "502"),
            params=[{"name": "name", "in": "path", "required": True,
                     "schema": {"type": "string", "minLength": 1}}],
            body={"type": "object", "additionalProperties": False, "properties": {
                "node": {"type": "string", "minLength": 1},
                "force": {"type": "boolean", "description": "promote a catching-up or lagging "
                                                            "copy (it may lack messages)"}}})},
        "/api/v1/fragments": {"get": _op("Fragments of fragmented queues", _json(LISTING, "fragments"))},
        "/api/v1/history": {"get": _op("The last hour, sampled every 5 s: message rates, connections, "
                                       "queued bytes, deepest queues, upstreams up", _json(LISTING, "samples"))},
        "/api/v1/upstreams": {"get": _op("Upstream connections and their state",
                                         _json(LISTING, "upstreams"))},
        "/api/v1/exchanges": {"get": _op(
            "Local exchanges and remote sources with counters; the anonymous relay's counters",
            _json(LISTING, "exchanges"))},
        "/api/v1/subscriptions": {"get": _op(
            "Topic subscriptions on this node's exchanges: durable, shared, selector, depth, "
            "consumers", _json(LISTING, "subscriptions"))},
        "/api/v1/subscriptions/{name}": {"delete": _op(
            "Remove a subscription and the messages it holds (409 while a consumer is attached)",
            _json({"type": "object"}, "deleted"), errors=("404", "409"),
            params=[{"name": "name", "in": "path", "required": True,
                     "schema": {"type": "string", "minLength": 1}}])},
        "/api/v1/rules": {
            "get": _op("The routing rules and their version (ETag)",
                       {**_json(RULES_DOC, "the rules"), "headers": ETAG_HEADER}),
            "put": _op("Replace the whole rule list", {**_json(RULES_DOC, "the new rules"),
                                                       "headers": ETAG_HEADER},
                       errors=("400", "409", "412", "413", "422", "503"), params=[IF_MATCH],
                       body=rules_put_body),
            "post": _op("Add one rule (at `position`, default: last)", _json(ONE_RULE, "added"),
                        ok_code="201", errors=("400", "409", "412", "413", "422", "503"),
                        body=_ref("Rule"),
                        params=[IF_MATCH, {"name": "position", "in": "query", "required": False,
                                           "schema": {"type": "integer", "minimum": 0}}]),
        },
        "/api/v1/rules/{name}": {
            "get": _op("One rule", _json(ONE_RULE, "the rule"), errors=("404",), params=[RULE_NAME]),
            "put": _op("Replace one rule in place (or add it last)", _json(ONE_RULE, "replaced"),
                       errors=("400", "409", "412", "413", "422", "503"), params=[RULE_NAME, IF_MATCH],
                       body=_ref("Rule"), extra={"201": _json(ONE_RULE, "added")}),
            "delete": _op("Delete one rule", _json({"type": "object"}, "deleted"),
                          errors=("404", "409", "412", "422", "503"), params=[RULE_NAME, IF_MATCH]),
        },
        "/api/v1/resolve": {"get": _op(
            "Which rule an address matches, the decision and why; for a replicated queue its "
            "primary (the one this node knows, else the preferred node: `replication."
            "primary_known`)", _json({"type": "object", "properties": {
                "address": {"type": "string"}, "decision": {"type": "string", "enum": list(KINDS)},
                "reason": {"type": "string"}, "rule": {"oneOf": [_ref("Rule"), {"type": "null"}]},
                "primary": {"type": ["string", "null"]},
                "worker": {"type": "integer", "description": "with workers: the one that "
                           "holds the local or replicated queue (decided now if nobody asked yet)"},
                "replication": {"type": "object", "properties": {
                    "primary": {"type": "string"}, "primary_known": {"type": "boolean"},
                    "epoch": {"type": ["integer", "null"]}, "preferred": {"type": "string"},
                    "placement": {"type": "array", "items": {"type": "string"}},
                    "role": {"type": "string"}}}}},
                "the decision"),
            errors=("400",),
            params=[{"name": "address", "in": "query", "required": True,
                     "schema": {"type": "string", "minLength": 1}}])},
        "/api/v1/cluster": {"get": _op(
            "Every node's rules version and any divergence; the live members and the "
            "coordinator (static, or etcd: healthy, revision, this node acting or fenced)",
            _json({"type": "object", "properties": {
                "members": {"type": "array", "items": {"type": "object", "required": [
                    "id", "amqp", "admin", "lease_age_s"]}},
                "coordinator": {"type": "object", "required": [
                    "kind", "endpoints", "healthy", "revision"], "properties": {
                        "kind": {"type": "string", "enum": ["etcd", "static"]}}}}},
                "cluster view"))},
        "/api/v1/cluster/rules": {"post": _op(
            "Node to node: offer a rules record (adopted if it wins and validates; static "
            "clusters only: on etcd the record lives there, 409)",
            _json({"type": "object", "properties": {"accepted": {"type": "boolean"}}}, "result"),
            errors=("400", "409", "413", "422"), body=_ref("RulesRecord"), tag="cluster")},
        "/api/v1/replication/owner": {"post": _op(
            "Node to node: `owner` is the primary of the replicated queue `address` at `epoch` "
            "(sent by a node promoted by hand in a static cluster); this node's proxies go there. "
            "A lower epoch than the one known is ignored (`learned`: false)",
            _json({"type": "object", "properties": {"learned": {"type": "boolean"},
                                                    "node": {"type": "string"},
                                                    "replication": {"oneOf": [REPLICATION,
                                                                              {"type": "null"}]}}},
                  "result"),
            errors=("400", "404", "413"), tag="cluster",
            body={"type": "object", "required": ["address", "owner", "epoch"], "properties": {
                "address": {"type": "string", "minLength": 1},
                "owner": {"type": "string", "minLength": 1},
                "epoch": {"type": "integer", "minimum": 1}}})},
    }
    for extra in (_queue_ops(), _wiring_paths()):
        for path, item in extra.items():
            paths.setdefault(path, {}).update(item)
    return {
        "openapi": "3.1.0",
        "info": {"title": "fedgate admin API", "version": "1",
                 "description": "Inspect a fedgate node and change its routing rules. "
                                "Errors are {\"error\", \"detail\", \"field\"}."},
        "servers": [{"url": "/"}],
        "security": [{"bearer": []}],
        "paths": paths,
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                           "description": "a token from [admin] tokens"}},
            "schemas": {
                "Error": {"type": "object", "required": ["error", "detail"], "properties": {
                    "error": {"type": "string"}, "detail": {"type": "string"},
                    "field": {"type": "string"}}},
                "Rule": RULE,
                "RulesRecord": RECORD,
                "Node": {"type": "object", "properties": {
                    "id": {"type": "string"}, "rules_version": {"type": "integer"},
                    "version": {"type": "string", "description": "the release (semver, "
                                                                  "CHANGELOG.md)"},
                    "counters": {"type": "object"},
                    "memory": {"type": "object", "properties": {
                        "queued_bytes": {"type": "integer"}, "max_memory": {"type": "integer"},
                        "resident_bytes": {"type": "integer"}, "paged_bytes": {"type": "integer"},
                        "bound": {"type": ["string", "null"], "enum": [
                            "memory", "disk", "free-disk", "error", None],
                            "description": "the bound that stops producers now, if any"},
                        "paging": {"type": ["object", "null"],
                                   "description": "the page store (docs/paging.md)"}}}}},
            },
        },
    }


def operations(document: dict) -> set[tuple[str, str]]:
    """(METHOD, path) of every operation in ``document``."""
    return {(method.upper(), path) for path, item in document["paths"].items() for method in item}
