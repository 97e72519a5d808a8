"""Web: `/api/v1/runs`: list (task, state and time filters, a cursor), show, cancel, retry, and an
attempt's log: a window of bytes from an offset, or a Server-Sent Events stream from an offset
that follows the job as it writes and ends at the log's final offset (ADR-0007 §2.3: read on
demand, no reader while nobody watches, a slow client never blocks the job)."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from typing import AsyncIterator, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from ..errors import NotFound
from ..ids import new_id
from ..store.admin.api_tokens import ApiTokens
from ..store.intent.runs import DEFAULT_PAGE
from .auth import bearer_secret
from .backend import MAX_LOG_READ, LogWindow
from .errors import ApiError
from .requests import backend, blocking, caller, query_int

# How often a followed log is read again while the job runs, and how often an idle stream says
# it is alive (a comment line: proxies close connections that stay silent).
FOLLOW_POLL_S = 0.25
KEEPALIVE_S = 15.0
STREAM_CHUNK = 64 * 1024
# How long a stream waits, once its attempt has ended, for bytes the final offset says exist
# (a cluster worker still shipping its tail) before it ends without them.
END_WAIT_S = 60.0
# How often an open stream checks its token again: a revoked token's stream ends within about this
# long, not when the job does (one indexed read per stream per period).
TOKEN_RECHECK_S = 5.0


async def list_runs(request: Request) -> JSONResponse:
    q = request.query_params

    def page() -> dict:
        from ..domain.times import parse_when_ms

        since = q.get("since")
        until = q.get("until")
        found = backend(request).repo.runs.list(
            task=q.get("task") or None, state=q.get("state") or None,
            limit=query_int(request, "limit", DEFAULT_PAGE, low=1), cursor=q.get("cursor") or None,
            created_since_ms=None if not since else parse_when_ms("since", since),
            created_before_ms=None if not until else parse_when_ms("until", until))
        return {"runs": [r.to_json(detail=False) for r in found.runs], "next_cursor": found.next_cursor}

    return JSONResponse(await blocking(page))


async def show_run(request: Request) -> JSONResponse:
    def show() -> dict:
        from ..store.admin.notifications import Notifications

        view = backend(request).repo.runs.get(request.path_params["run_id"])
        return {**view.to_json(), "notifications": Notifications(backend(request).repo.store).of_run(view.id)}

    return JSONResponse(await blocking(show))


async def cancel_run(request: Request) -> JSONResponse:
    run_id = request.path_params["run_id"]

    def cancel() -> dict:
        outcome = backend(request).repo.runs.cancel(run_id, actor_name=caller(request))
        backend(request).changed()
        return {"result": outcome.result.value, "run": outcome.value.to_json()}

    return JSONResponse(await blocking(cancel))


async def retry_run(request: Request) -> JSONResponse:
    run_id = request.path_params["run_id"]
    key = request.headers.get("idempotency-key")
    return await admitted(request, lambda k: backend(request).repo.runs.retry(
        run_id, idempotency_key=k, actor_name=caller(request)), key)


async def admitted(request: Request, admit: Callable, key: str | None) -> JSONResponse:
    """Admit a run (`admit(idempotency_key)`), nudge the runtime, answer 201 with the run (200
    when the key named a run admitted before)."""
    def run() -> tuple[dict, bool]:
        admission = admit(key if key else f"api:{new_id()}")
        backend(request).changed()
        return admission.run.to_json(), admission.created

    data, created = await blocking(run)
    return JSONResponse(data, status_code=201 if created else 200)


def _event_id(text: str) -> tuple[int, int]:
    """`K:OFFSET` (attempt K's log, up to OFFSET) -> (K, OFFSET)."""
    number, sep, offset = text.partition(":")
    if not sep or not all(p.isascii() and p.isdigit() and len(p) <= 18 for p in (number, offset)) or int(number) < 1:
        raise ApiError(400, "bad_query", f"Last-Event-ID must be ATTEMPT:OFFSET as a `log` event's id, got {text!r}")
    return int(number), int(offset)


def _attempt(request: Request, number: int | None = None):
    """The run and the attempt a log request reads: `number` (a resumed stream's), else
    `?attempt=N`, else the newest."""
    run_id = request.path_params["run_id"]
    if number is None:
        number = query_int(request, "attempt", None, low=1)
    view = backend(request).repo.runs.get(run_id)
    attempts = [a for a in view.attempts if number is None or a.number == number]
    if not attempts:
        raise NotFound(f"run {run_id} has no attempt {number}")
    return view, attempts[-1]


async def read_log(request: Request) -> Response:
    """`GET …/logs?offset=N[&limit=M][&attempt=K]`: the log's bytes from N, exactly as written.
    Headers say where this window ends and, once the attempt has ended, where the log ends."""
    offset = query_int(request, "offset", 0)
    limit = query_int(request, "limit", MAX_LOG_READ, low=1)

    def window() -> tuple[LogWindow, int]:
        view, attempt = _attempt(request)
        return backend(request).read_log(view.id, attempt, offset, limit), attempt.number

    found, number = await blocking(window)
    headers = {"X-Qlactors-Attempt": str(number), "X-Qlactors-Offset": str(found.offset),
               "X-Qlactors-End": str(found.end), "X-Qlactors-Complete": "true" if found.complete else "false"}
    if found.final_offset is not None:
        headers["X-Qlactors-Final-Offset"] = str(found.final_offset)
    return Response(found.data, media_type="application/octet-stream", headers=headers)


async def stream_log(request: Request) -> StreamingResponse:
    """`GET …/logs/stream?offset=N[&attempt=K]`: Server-Sent Events of one attempt's log. Each
    `log` event's id is `K:OFFSET` (the attempt, and the offset after its bytes), its data
    `{"offset", "end", "base64"}`; a reconnect sends that id back as `Last-Event-ID` and resumes
    there, in the same attempt, without a gap or a repeated byte. The last event is `end`,
    `{"attempt": K, "offset": final, "state": ..., "complete": ...}`, sent once every byte up to
    the final offset went out (`complete` false: the attempt ended and the rest never arrived
    within END_WAIT_S, a cluster worker that never shipped its tail). The token is checked again
    every TOKEN_RECHECK_S: once it is revoked, the stream ends without an `end` event (a reconnect
    gets 401)."""
    resume = request.headers.get("last-event-id")
    if resume is not None:
        number, offset = _event_id(resume)
        view, attempt = await blocking(_attempt, request, number)
    else:
        offset = query_int(request, "offset", 0)
        view, attempt = await blocking(_attempt, request)
    return StreamingResponse(_events(request, view.id, attempt, offset), media_type="text/event-stream",
                             headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})


async def _events(request: Request, run_id: str, attempt, offset: int) -> AsyncIterator[str]:
    source, number = backend(request), attempt.number
    tokens, secret = ApiTokens(source.repo.store), bearer_secret(request.headers)
    yield f"retry: 2000\n: attempt {number}\n\n"
    quiet = stalled = 0.0
    recheck_at = time.monotonic() + TOKEN_RECHECK_S
    while True:
        if time.monotonic() >= recheck_at:
            if await blocking(tokens.check, secret) is None:
                return  # revoked since the stream began
            recheck_at = time.monotonic() + TOKEN_RECHECK_S
        found = await blocking(source.read_log, run_id, attempt, offset, STREAM_CHUNK)
        if found.data:
            offset = found.end
            quiet = stalled = 0.0
            yield _event("log", f"{number}:{found.end}", {"offset": found.offset, "end": found.end,
                                                         "base64": base64.b64encode(found.data).decode("ascii")})
            continue  # more may be there already: read again before sleeping
        if found.complete or (found.final_offset is not None and stalled >= END_WAIT_S):
            state = (await blocking(source.repo.runs.get, run_id)).state
            yield _event("end", f"{number}:{offset}", {"attempt": number, "offset": offset, "state": state,
                                                      "complete": found.complete})
            return
        if await request.is_disconnected():
            return
        await asyncio.sleep(FOLLOW_POLL_S)
        quiet += FOLLOW_POLL_S
        stalled += FOLLOW_POLL_S if found.final_offset is not None else 0.0
        if quiet >= KEEPALIVE_S:
            quiet = 0.0
            yield ": keep-alive\n\n"


def _event(kind: str, event_id: str, data: dict) -> str:
    return f"event: {kind}\nid: {event_id}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


