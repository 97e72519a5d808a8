"""Web: the OpenAPI 3.1 document of `/api/v1`, served at `/api/v1/openapi.json`. Written out by
hand from one table (path, method, summary, parameters, answers); tests/web/test_openapi.py
checks it against the application's real routes, both ways."""

from __future__ import annotations

from typing import Any

from .. import __version__

_ERROR = {"$ref": "#/components/schemas/Error"}
_ANY = {"type": "object", "additionalProperties": True}

# The refusals every authenticated route can answer, beside its own.
_COMMON = {"401": "no token, or an unknown or revoked one", "503": "the database cannot be reached"}
_WRITE = {**_COMMON, "403": "a read-only token, or a change from another origin"}


def _q(name: str, description: str, schema: dict | None = None) -> dict:
    return {"name": name, "in": "query", "required": False, "description": description,
            "schema": schema or {"type": "string"}}


def _path(name: str, description: str) -> dict:
    return {"name": name, "in": "path", "required": True, "description": description, "schema": {"type": "string"}}


_NAME = _path("name", "the task's name")
_RUN = _path("run_id", "the run's id")
_ATTEMPT = _q("attempt", "the attempt's number (default: the newest)", {"type": "integer", "minimum": 1})
_IDEMPOTENCY = {"name": "Idempotency-Key", "in": "header", "required": False, "schema": {"type": "string"},
                "description": "the same key again returns the run it admitted (200) instead of a second one"}

# (path, method, summary, parameters, {status: description}, body?)
OPERATIONS: list[tuple[str, str, str, list, dict, bool]] = [
    ("/tasks", "get", "every task, as `task list --json`", [], {"200": "the tasks", **_COMMON}, False),
    ("/tasks", "post", "add a task (the fields of `task show --json`; `name` and `command` required)", [],
     {"201": "the task", "400": "the body is no JSON", "409": "the name is taken",
      "422": "a value is refused (the CLI's words)", **_WRITE}, True),
    ("/tasks/{name}", "get", "one task with its schedule, next fire times and change history", [_NAME],
     {"200": "the task", "404": "no such task", **_COMMON}, False),
    ("/tasks/{name}", "patch", "change a task: the fields given (a new revision when its spec changes; "
     "`trigger: null` removes the schedule)", [_NAME],
     {"200": "the task", "400": "the body is no JSON", "404": "no such task", "422": "a value is refused",
      **_WRITE}, True),
    ("/tasks/{name}", "delete", "remove a task (its runs stay readable); with active runs only with force=true",
     [_NAME, _q("force", "cancel its active runs first", {"type": "boolean"})],
     {"200": "what was removed and cancelled", "404": "no such task", "422": "it has active runs", **_WRITE},
     False),
    ("/tasks/{name}/enable", "post", "enable a task's schedule", [_NAME],
     {"200": "the task", "404": "no such task", **_WRITE}, False),
    ("/tasks/{name}/disable", "post", "disable a task's schedule", [_NAME],
     {"200": "the task", "404": "no such task", **_WRITE}, False),
    ("/tasks/{name}/runs", "post", "request a run of the task now", [_NAME, _IDEMPOTENCY],
     {"201": "the new run", "200": "the run this idempotency key admitted before", "404": "no such task",
      **_WRITE}, False),
    ("/runs", "get", "runs, newest first, one page",
     [_q("task", "only this task's runs"), _q("state", "only runs in this state"),
      _q("since", "created at or after (ISO 8601 or epoch ms)"), _q("until", "created before (ISO 8601 or epoch ms)"),
      _q("limit", "page size, 1..500 (default 50)", {"type": "integer"}),
      _q("cursor", "the next_cursor of the previous page")],
     {"200": "{runs, next_cursor}", "404": "no such task", "422": "a filter is refused", **_COMMON}, False),
    ("/runs/{run_id}", "get", "a run with its attempts and events, as `show --json`", [_RUN],
     {"200": "the run", "404": "no such run, or retired", **_COMMON}, False),
    ("/runs/{run_id}/cancel", "post", "cancel a run", [_RUN],
     {"200": "{result, run}", "404": "no such run", **_WRITE}, False),
    ("/runs/{run_id}/retry", "post", "run a finished run again (same revision)", [_RUN, _IDEMPOTENCY],
     {"201": "the new run", "200": "the run this idempotency key admitted before", "404": "no such run",
      "422": "the run has not finished", **_WRITE}, False),
    ("/runs/{run_id}/logs", "get", "the log's bytes from an offset, exactly as written; headers X-Qlactors-End "
     "and, once known, X-Qlactors-Final-Offset",
     [_RUN, _ATTEMPT, _q("offset", "the first byte (default 0)", {"type": "integer", "minimum": 0}),
      _q("limit", "at most this many bytes (at most 1 MiB)", {"type": "integer", "minimum": 1})],
     {"200": "application/octet-stream", "400": "a bad offset", "404": "no such run or attempt", **_COMMON},
     False),
    ("/runs/{run_id}/logs/stream", "get", "Server-Sent Events from an offset: `log` events (id = the offset "
     "after their bytes, data {offset, end, base64}) until `end` {offset, state}; resume with Last-Event-ID",
     [_RUN, _ATTEMPT, _q("offset", "the first byte (default 0)", {"type": "integer", "minimum": 0}),
      {"name": "Last-Event-ID", "in": "header", "required": False, "schema": {"type": "string"},
       "description": "resume after this event (an offset)"}],
     {"200": "text/event-stream", "400": "a bad offset", "404": "no such run or attempt", **_COMMON}, False),
    ("/status", "get", "the runtime or the replicas and workers, active runs, waiting recoveries, quarantined "
     "receipts, the disk reserve (`status --json`)", [], {"200": "the report", **_COMMON}, False),
    ("/workers", "get", "a cluster's workers and their sessions (none on edge)", [],
     {"200": "the workers", **_COMMON}, False),
    ("/openapi.json", "get", "this document (no token needed)", [], {"200": "the document"}, False),
]


def _operation(summary: str, parameters: list, answers: dict, body: bool, public: bool) -> dict:
    op: dict[str, Any] = {"summary": summary, "parameters": parameters, "responses": {
        status: {"description": text, "content": {"application/json": {"schema": _ANY if status < "400" else _ERROR}}}
        for status, text in answers.items()}}
    if body:
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": _ANY}}}
    if public:
        op["security"] = []
    return op


def document() -> dict:
    paths: dict[str, dict] = {}
    for path, method, summary, parameters, answers, body in OPERATIONS:
        paths.setdefault(f"/api/v1{path}", {})[method] = _operation(
            summary, parameters, answers, body, public=path == "/openapi.json")
    return {
        "openapi": "3.1.0",
        "info": {"title": "qlactors", "version": __version__,
                 "description": "The HTTP API of a qlactors home or cluster (docs/web.md). Field names are "
                                "those of the CLI's --json; a value that is no UTF-8 is {\"base64\": ...}."},
        "paths": paths,
        "security": [{"bearer": []}],
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                           "description": "a token from `qlactors token new NAME`"}},
            "schemas": {"Error": {"type": "object", "required": ["error"], "properties": {"error": {
                "type": "object", "required": ["code", "message"],
                "properties": {"code": {"type": "string"}, "message": {"type": "string"}}}}}},
        },
    }
