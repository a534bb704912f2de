"""``/api/v1/rules`` and ``/api/v1/resolve``: read and change the routing rules.

Every change goes through ``RulesManager.change`` (validate the whole new
list, persist, swap, push to the cluster); a change that does not validate
answers 422 naming the field and leaves the rules as they were.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from proxy.config.rules_store import RulesRecord
from routing import RuleError

from . import replication
from .errors import ApiError, invalid_rules, json_response
from .inputs import query_int, read_json
from .rules_manager import RulesManager, VersionMismatch, etag_of

MANAGER = web.AppKey("rules_manager", RulesManager)
RECORD_KEYS = ("rules", "version", "updated_at", "origin", "digest", "source")


def rules_body(record: RulesRecord) -> dict[str, Any]:
    return {
        "version": record.version,
        "updated_at": record.updated_at,
        "origin": record.origin,
        "source": "config" if record.version == 0 else "api",
        "digest": record.digest,
        "rules": list(record.rules),
    }


def _with_etag(body: dict, record: RulesRecord, status: int = 200, **headers: str) -> web.Response:
    return json_response(body, status=status, headers={"ETag": etag_of(record), **headers})


async def _change(request: web.Request, edit, *, rename: tuple[str, str] | None = None) -> RulesRecord:
    manager = request.app[MANAGER]
    try:
        return await manager.change(edit, request.headers.get("If-Match"))
    except VersionMismatch as exc:
        etag = etag_of(exc.current)
        raise ApiError(412, "version_conflict",
                       f"If-Match {exc.expected} does not match the current rules "
                       f"(version {exc.current.version}, ETag {etag})",
                       field="If-Match", version=exc.current.version, etag=etag,
                       headers={"ETag": etag}) from None
    except RuleError as exc:
        raise invalid_rules(exc, rename=rename() if callable(rename) else rename) from None


def _rule_object(body: Any, field: str = "rule") -> dict:
    if not isinstance(body, dict):
        raise ApiError(400, "invalid_body", "expected a rule object", field=field)
    return body


def _index_of(rules: list[dict], name: str) -> int | None:
    for index, rule in enumerate(rules):
        if rule.get("name") == name:
            return index
    return None


async def get_rules(request: web.Request) -> web.Response:
    record = request.app[MANAGER].current
    return _with_etag(rules_body(record), record)


async def put_rules(request: web.Request) -> web.Response:
    body = await read_json(request)
    if isinstance(body, dict):
        for key in body:
            if key not in RECORD_KEYS:
                raise ApiError(400, "invalid_body", f"unknown key {key!r} (expected 'rules')", field=key)
        if "rules" not in body:
            raise ApiError(400, "invalid_body", "missing 'rules'", field="rules")
        body = body["rules"]
    if not isinstance(body, list):
        raise ApiError(400, "invalid_body", "expected an array of rules or {\"rules\": [...]}",
                       field="rules")
    record = await _change(request, lambda current: list(body))
    return _with_etag(rules_body(record), record)


async def post_rule(request: web.Request) -> web.Response:
    rule = _rule_object(await read_json(request))
    position = query_int(request, "position")
    placed: dict[str, int] = {}

    def edit(rules: list[dict]) -> list:
        name = rule.get("name")
        if isinstance(name, str) and _index_of(rules, name) is not None:
            raise ApiError(409, "rule_exists", f"a rule named {name!r} exists; PUT /api/v1/rules/{name} "
                           "replaces it", field="rule.name")
        index = len(rules) if position is None else position
        if index > len(rules):
            raise ApiError(400, "invalid_parameter",
                           f"position {index} is past the end (there are {len(rules)} rules)",
                           field="position")
        rules.insert(index, rule)
        placed["index"] = index
        return rules

    record = await _change(request, edit, rename=lambda: (f"rules[{placed.get('index')}]", "rule"))
    index = placed["index"]
    name = record.rules[index]["name"]
    body = {"version": record.version, "position": index, "rule": record.rules[index]}
    return _with_etag(body, record, 201, Location=f"/api/v1/rules/{name}")


async def get_rule(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    record = request.app[MANAGER].current
    index = _index_of(list(record.rules), name)
    if index is None:
        raise ApiError(404, "rule_not_found", f"no rule named {name!r}", field="name")
    return _with_etag({"version": record.version, "position": index, "rule": record.rules[index]},
                      record)


async def put_rule(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    rule = dict(_rule_object(await read_json(request)))
    if "name" not in rule:
        rule["name"] = name
    elif rule["name"] != name:
        raise ApiError(400, "name_mismatch",
                       f"the body names rule {rule['name']!r} but the path names {name!r}",
                       field="rule.name")
    placed: dict[str, Any] = {}

    def edit(rules: list[dict]) -> list:
        index = _index_of(rules, name)
        placed["created"] = index is None
        if index is None:
            index = len(rules)
            rules.append(rule)
        else:
            rules[index] = rule
        placed["index"] = index
        return rules

    record = await _change(request, edit, rename=lambda: (f"rules[{placed.get('index')}]", "rule"))
    index = placed["index"]
    body = {"version": record.version, "position": index, "rule": record.rules[index]}
    return _with_etag(body, record, 201 if placed["created"] else 200)


async def delete_rule(request: web.Request) -> web.Response:
    name = request.match_info["name"]

    def edit(rules: list[dict]) -> list:
        index = _index_of(rules, name)
        if index is None:
            raise ApiError(404, "rule_not_found", f"no rule named {name!r}", field="name")
        del rules[index]
        return rules

    record = await _change(request, edit)
    return _with_etag({"version": record.version, "deleted": name}, record)


async def resolve(request: web.Request) -> web.Response:
    address = request.query.get("address")
    if not address:
        raise ApiError(400, "invalid_parameter", "address is required", field="address")
    manager = request.app[MANAGER]
    try:
        decision = manager.node.routing.resolve(address)
    except RuleError as exc:
        raise ApiError(400, "invalid_parameter", exc.detail, field="address") from None
    body = {
        "address": address,
        "decision": decision.kind,
        "reason": decision.reason,
        "rule": decision.rule.to_dict() if decision.rule is not None else None,
        "remote_address": decision.remote_address,
        "primary": decision.primary,
        "primary_url": decision.primary_url,
        "captures": list(decision.captures),
        "version": manager.current.version,
    }
    worker = getattr(manager.node, "worker", None)
    if worker is not None and worker.count > 1 and decision.kind in ("local", "replicated"):
        body["worker"] = worker.owners.owner(address)  # the worker that holds the queue (issue #45)
    if decision.kind == "replicated":
        replicated = replication.owner(manager.node, address, decision)
        if replicated is not None:  # the primary this node knows, else the preferred node
            body.update(primary=replicated["primary"], primary_url=replicated["primary_url"],
                        replication=replicated)
            body["reason"] += (f"; primary {replicated['primary']} (epoch {replicated['epoch']})"
                               if replicated["primary_known"] else
                               f"; no primary known here yet: {replicated['primary']} is the "
                               "preferred node (the first of the replica set)")
    return json_response(body)

