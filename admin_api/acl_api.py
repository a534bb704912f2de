"""``/api/v1/acl``: ACL grants at run time (``admin_api.grants``, docs/operations.md).

How this works
--------------
The grants are the wiring record's ``acl`` (``admin_api.wiring``: one version, one ETag,
``If-Match`` as for exchanges; stored and spread as the rest of the record). The path's
``{subject}`` is a user name, or ``group:<name>`` for a group of the users file (or of
``[[oauth.map]]``); ``PUT`` takes that subject's grants as the ``[[acl]]`` keys (``send``,
``receive``, ``dynamic``) and replaces what the API had granted it. A subject with
``[[acl]]`` entries in the configuration file is the file's: 409 ``in_config``.
"""

from __future__ import annotations

from aiohttp import web

from . import grants
from .errors import ApiError, json_response
from .inputs import read_json
from .keys import NODE
from .wiring import _edit, _object, _wiring, etag

KEYS = ("send", "receive", "dynamic")


def _config_entries(config) -> list[dict]:
    found = []
    for entry in config.acl:
        table = {"user": entry.user} if entry.user is not None else {"group": entry.group}
        table.update(send=list(entry.send), receive=list(entry.receive))
        if entry.dynamic is not None:
            table["dynamic"] = entry.dynamic
        found.append({**table, "subject": grants.subject_of(entry), "origin": "config"})
    return found


def _entries(request: web.Request) -> list[dict]:
    wiring = _wiring(request)
    api = [{**table, "subject": grants.table_subject(table), "origin": "api"}
           for table in wiring.record.get("acl", [])]
    return _config_entries(request.app[NODE].config) + api


async def get_acl(request: web.Request) -> web.Response:
    wiring = _wiring(request)
    entries = _entries(request)
    return json_response({"version": wiring.record["version"], "enabled": bool(entries),
                          "entries": entries, "refused": wiring.refused},
                         headers={"ETag": etag(wiring.record)})


async def get_subject(request: web.Request) -> web.Response:
    subject = request.match_info["subject"]
    found = [e for e in _entries(request) if e["subject"] == subject]
    if not found:
        raise ApiError(404, "acl_not_found", f"no [[acl]] entry nor grant for {subject!r}",
                       field="subject")
    wiring = _wiring(request)
    return json_response({"subject": subject, "version": wiring.record["version"],
                          "entries": found}, headers={"ETag": etag(wiring.record)})


def _not_in_config(request: web.Request, subject: str, what: str) -> None:
    if grants.in_config(request.app[NODE].config, subject):
        raise ApiError(409, "in_config", f"{subject!r} has [[acl]] entries in the configuration "
                       f"file: {what} them there", field="subject")


def _subject(request: web.Request) -> str:
    subject = request.match_info["subject"]
    if subject in ("", grants.GROUP):
        raise ApiError(400, "invalid_subject", "a user name, or group:<name>", field="subject")
    return subject


async def put_subject(request: web.Request) -> web.Response:
    subject = _subject(request)
    body = _object(await read_json(request), "grants: send, receive, dynamic")
    for key in body:
        if key not in KEYS:
            raise ApiError(400, "invalid_body", f"unknown key {key!r} (known: {', '.join(KEYS)}; "
                           "the path names the user or group:<name>)", field=key)
    _not_in_config(request, subject, "change")
    table, created = grants.entry_table(subject, body), []

    def edit(record: dict) -> dict:
        for index, item in enumerate(record["acl"]):
            if grants.table_subject(item) == subject:
                record["acl"][index] = table
                return {"grant": table}
        record["acl"].append(table)
        created.append(True)
        return {"grant": table}
    response = await _edit(request, edit)
    if created:
        response.set_status(201)
    return response


async def delete_subject(request: web.Request) -> web.Response:
    subject = _subject(request)
    _not_in_config(request, subject, "remove")

    def edit(record: dict) -> dict:
        before = len(record["acl"])
        record["acl"] = [item for item in record["acl"] if grants.table_subject(item) != subject]
        if len(record["acl"]) == before:
            raise ApiError(404, "acl_not_found", f"no grant for {subject!r} made through the API",
                           field="subject")
        return {"deleted": subject}
    return await _edit(request, edit)
