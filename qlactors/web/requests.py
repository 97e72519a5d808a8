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
    """The request's JSON body (413 when it is too big, 400 when it is not JSON: sent as another
    media type, not UTF-8, malformed, nested past the parser's depth, a number past Python's digit
    limit, or an object with a name given twice). Read with a running cap: a `Content-Length` over
    it is refused before anything is read, and a body that grows past it while read is refused
    without being held whole."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise _too_large()
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise _too_large()
        chunks.append(chunk)
    body = b"".join(chunks)
    if not body:
        return {}
    media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media != "application/json":
        raise ApiError(400, "bad_json", f"send the body as Content-Type: application/json (got {media or 'none'!r}); "
                                        "nothing was written")
    try:
        return json.loads(body, object_pairs_hook=_unique_names)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError, ValueError) as err:
        reason = "nested too deeply" if isinstance(err, RecursionError) else str(err)
        raise ApiError(400, "bad_json", f"the body is not JSON we take ({reason}); nothing was written") from None


def _too_large() -> ApiError:
    return ApiError(413, "too_large", f"the body is over {MAX_BODY_BYTES} bytes; nothing was written")


def _unique_names(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose names are each given once (a name given twice: which value was meant?)."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        twice = next(name for name, _ in pairs if name in seen or seen.add(name))
        raise ValueError(f"the name {twice!r} is given twice in one object")
    return obj


def query_int(request: Request, name: str, default: int | None = None, *, low: int = 0) -> int | None:
    """A whole-number query parameter (400 when it is not one, or below `low`)."""
    text = request.query_params.get(name)
    if text is None or text == "":
        return default
    if not (text.isascii() and text.isdigit()) or (len(text) <= 18 and int(text) < low):
        raise ApiError(400, "bad_query", f"{name} must be a whole number >= {low}, got {text!r}")
    if len(text) > 18:
        raise ApiError(400, "bad_query", f"{name} {text[:24]}{'...' if len(text) > 24 else ''} is too large")
    return int(text)


def query_bool(request: Request, name: str) -> bool:
    text = request.query_params.get(name, "false").lower()
    if text not in ("true", "false", "1", "0"):
        raise ApiError(400, "bad_query", f"{name} must be true or false, got {text!r}")
    return text in ("true", "1")
