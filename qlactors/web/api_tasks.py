"""Web: `/api/v1/tasks`: list, show (with its next fire times and history), add, update, enable,
disable, remove, and request a run of a task."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse

from ..domain.model import TaskSpec
from ..domain.retention import TaskRetention
from ..domain.retry import RetryPolicy
from ..errors import BadInput
from ..store.intent.last_runs import last_runs
from ..wire.offers import check_revision_fits
from .requests import backend, blocking, caller, json_body, query_bool
from .schedule import schedule_json
from .task_input import read_task


def _task_json(request: Request, view, last_run: dict | None) -> dict:
    """`task show --json`'s fields, with the schedule in words and its next fires, and the last run."""
    data = view.to_json(backend(request).retention_default())
    data["schedule"] = schedule_json(view.trigger, view.enabled)
    data["last_run"] = last_run
    return data


async def list_tasks(request: Request) -> JSONResponse:
    def listing() -> list:
        store = backend(request).repo.store
        views, last = backend(request).repo.tasks.list(), last_runs(store)
        return [_task_json(request, v, last.get(v.id)) for v in views]

    return JSONResponse(await blocking(listing))


async def show_task(request: Request) -> JSONResponse:
    return JSONResponse(await blocking(_detail, request, request.path_params["name"]))


def _detail(request: Request, name: str) -> dict:
    tasks = backend(request).repo.tasks
    view = tasks.get(name)
    data = _task_json(request, view, last_runs(backend(request).repo.store, view.id).get(view.id))
    data["history"] = [e.to_json() for e in tasks.history(name)]
    return data


async def add_task(request: Request) -> JSONResponse:
    body = await json_body(request)
    given = read_task(body, base_retry=RetryPolicy(), creating=True)
    spec = TaskSpec(name=body.get("name"), command=given.changes.pop("command"), **given.changes)

    def add() -> dict:
        view = backend(request).repo.tasks.add(
            spec, enabled=True if given.enabled is None else given.enabled, trigger=given.trigger,
            retention=TaskRetention(**given.retention), check=check_revision_fits, actor_name=caller(request))
        backend(request).changed()
        return _detail(request, view.name)

    return JSONResponse(await blocking(add), status_code=201)


async def update_task(request: Request) -> JSONResponse:
    name = request.path_params["name"]
    body = await json_body(request)

    def update() -> dict:
        tasks = backend(request).repo.tasks
        current = tasks.get(name)
        given = read_task(body, base_retry=current.spec.retry, creating=False, current_env=current.spec.env)
        if given.enabled is not None and given.enabled != current.enabled:
            raise BadInput("`enabled` is not changed by PATCH (one change, one transaction): POST "
                           f"/api/v1/tasks/{name}/{'enable' if given.enabled else 'disable'}; nothing was written")
        if "name" in body and body["name"] != name:
            raise BadInput(f"a task cannot be renamed (from {name!r} to {body['name']!r}); nothing was "
                           "written: add a new task and remove this one")
        tasks.update(name, trigger=given.trigger, remove_trigger=given.remove_trigger,
                     retention=given.retention, check=check_revision_fits, actor_name=caller(request),
                     **given.changes)
        backend(request).changed()
        return _detail(request, name)

    return JSONResponse(await blocking(update))


async def enable_task(request: Request) -> JSONResponse:
    return await _set_enabled(request, True)


async def disable_task(request: Request) -> JSONResponse:
    return await _set_enabled(request, False)


async def _set_enabled(request: Request, enabled: bool) -> JSONResponse:
    name = request.path_params["name"]

    def change() -> dict:
        backend(request).repo.tasks.set_enabled(name, enabled, actor_name=caller(request))
        backend(request).changed()
        return _detail(request, name)

    return JSONResponse(await blocking(change))


async def remove_task(request: Request) -> JSONResponse:
    name, force = request.path_params["name"], query_bool(request, "force")

    def remove() -> dict:
        removal = backend(request).repo.remove_task(name, force=force, actor_name=caller(request))
        backend(request).changed()
        return {"task": removal.task, "cancelled": list(removal.cancelled), "requested": list(removal.requested)}

    return JSONResponse(await blocking(remove))


async def request_run(request: Request) -> JSONResponse:
    """A run of the task now. An `Idempotency-Key` header makes a repeated request (a retry after
    a lost answer) return the first run instead of admitting a second one (200 instead of 201)."""
    from .api_runs import admitted

    name = request.path_params["name"]
    key = request.headers.get("idempotency-key")
    return await admitted(request, lambda k: backend(request).repo.runs.request(
        name, idempotency_key=k, actor_name=caller(request)), key)
