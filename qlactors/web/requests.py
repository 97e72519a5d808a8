"""Web: what every API handler shares: the backend and caller of a request, its JSON body, its
query numbers, and running the store's (blocking) calls off the event loop."""

from __future__ import annotations

import json
from typing import Any, Callable, TypeVar

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from .backend import Backend
from .errors import ApiError

T = TypeVar("T")
MAX_BODY_BYTES = 1024 * 1024


def backend(request: Request) -> Backend:
    return request.app.state.backend


def caller(request: Request) -> str:
    """The name of the token the request came with (the audit trail's `actor_name`)."""
    return request.scope["state"]["token"].name


async def blocking(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """A store call in the thread pool: the event loop never waits on the database."""
    return await run_in_threadpool(fn, *args, **kwargs)


async def json_body(request: Request) -> Any:
    """The request's JSON body (400 when it is none, too big, or not JSON)."""
    body = await request.body()
    if len(body) > MAX_BODY_BYTES:
        raise ApiError(413, "too_large", f"the body is over {MAX_BODY_BYTES} bytes; nothing was written")
    if not body:
        return {}
    try:
        return json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ApiError(400, "bad_json", f"the body is not JSON ({err}); nothing was written") from None


def query_int(request: Request, name: str, default: int | None = None, *, low: int = 0) -> int | None:
    """A whole-number query parameter (400 when it is not one, or below `low`)."""
    text = request.query_params.get(name)
    if text is None or text == "":
        return default
    if not (text.isascii() and text.isdigit()) or len(text) > 18 or int(text) < low:
        raise ApiError(400, "bad_query", f"{name} must be a whole number >= {low}, got {text!r}")
    return int(text)


def query_bool(request: Request, name: str) -> bool:
    text = request.query_params.get(name, "false").lower()
    if text not in ("true", "false", "1", "0"):
        raise ApiError(400, "bad_query", f"{name} must be true or false, got {text!r}")
    return text in ("true", "1")
