"""Web: the application: every route of the API and the page, the token check in front of them,
and the errors answered as JSON. `routes()` is the one list the OpenAPI document is checked
against (tests/web/test_openapi.py)."""

from __future__ import annotations

import logging

from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..errors import QlactorsError
from ..store.admin.api_tokens import ApiTokens
from . import api_runs, api_status, api_tasks, metrics, page
from .auth import TokenAuth
from .backend import Backend
from .errors import ApiError, answer_for, error_response
from .openapi import document

log = logging.getLogger("qlactors.web")
API = "/api/v1"


def routes() -> list[Route]:
    return [
        Route(f"{API}/openapi.json", openapi, methods=["GET"]),
        Route(f"{API}/tasks", api_tasks.list_tasks, methods=["GET"]),
        Route(f"{API}/tasks", api_tasks.add_task, methods=["POST"]),
        Route(f"{API}/tasks/{{name}}", api_tasks.show_task, methods=["GET"]),
        Route(f"{API}/tasks/{{name}}", api_tasks.update_task, methods=["PATCH"]),
        Route(f"{API}/tasks/{{name}}", api_tasks.remove_task, methods=["DELETE"]),
        Route(f"{API}/tasks/{{name}}/enable", api_tasks.enable_task, methods=["POST"]),
        Route(f"{API}/tasks/{{name}}/disable", api_tasks.disable_task, methods=["POST"]),
        Route(f"{API}/tasks/{{name}}/runs", api_tasks.request_run, methods=["POST"]),
        Route(f"{API}/runs", api_runs.list_runs, methods=["GET"]),
        Route(f"{API}/runs/{{run_id}}", api_runs.show_run, methods=["GET"]),
        Route(f"{API}/runs/{{run_id}}/cancel", api_runs.cancel_run, methods=["POST"]),
        Route(f"{API}/runs/{{run_id}}/retry", api_runs.retry_run, methods=["POST"]),
        Route(f"{API}/runs/{{run_id}}/logs", api_runs.read_log, methods=["GET"]),
        Route(f"{API}/runs/{{run_id}}/logs/stream", api_runs.stream_log, methods=["GET"]),
        Route(f"{API}/status", api_status.status, methods=["GET"]),
        Route(f"{API}/workers", api_status.workers, methods=["GET"]),
        Route("/metrics", metrics.metrics, methods=["GET"]),
        *page.routes(),
    ]


async def openapi(_request: Request) -> JSONResponse:
    return JSONResponse(document())


async def _refused(_request: Request, err: Exception) -> JSONResponse:
    return error_response(err)  # type: ignore[arg-type]


async def _qlactors_error(_request: Request, err: Exception) -> JSONResponse:
    answer = answer_for(err)  # type: ignore[arg-type]
    if answer is None:
        raise err
    return error_response(answer)


async def _not_found(request: Request, err: Exception) -> JSONResponse:
    status = getattr(err, "status_code", 404)
    code = {404: "no_route", 405: "method_not_allowed"}.get(status, "http_error")
    return error_response(ApiError(status, code, f"{request.method} {request.url.path}: "
                                                 f"{getattr(err, 'detail', 'not found')}"))


async def _gone(request: Request, _err: Exception) -> Response:
    # The client left (or was cut off) before its body was read: not the server's failure, and
    # no one is there to read an answer.
    log.info("client gone before its request was read: %s %s", request.method, request.url.path)
    return Response(status_code=400)


async def _bug(request: Request, err: Exception) -> JSONResponse:
    # The traceback goes to the log: names of code, never a request's body or a job's output.
    log.error("%s %s failed: %s", request.method, request.url.path, type(err).__name__, exc_info=err)
    return error_response(ApiError(500, "internal", "the server failed on this request; its log says where"))


def build_app(backend: Backend) -> Starlette:
    """The ASGI application over `backend` (the edge home or a cluster database)."""
    from starlette.exceptions import HTTPException

    app = Starlette(routes=routes(), exception_handlers={
        ApiError: _refused, QlactorsError: _qlactors_error, HTTPException: _not_found,
        ClientDisconnect: _gone, Exception: _bug})
    app.state.backend = backend
    app.add_middleware(TokenAuth, tokens=ApiTokens(backend.repo.store))
    app.add_middleware(SecurityHeaders)
    return app


class SecurityHeaders:
    """Headers on every answer: nothing cached, no sniffing, no framing, no referrer, and a page
    that loads only from this server."""

    HEADERS = [(b"x-content-type-options", b"nosniff"), (b"x-frame-options", b"DENY"),
               (b"referrer-policy", b"no-referrer"), (b"cache-control", b"no-store"),
               (b"content-security-policy",
                b"default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                b"connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'")]

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message) -> None:
            if message["type"] == "http.response.start":
                present = {k.lower() for k, _ in message.get("headers", [])}
                message["headers"] = list(message.get("headers", [])) + [
                    (k, v) for k, v in self.HEADERS if k not in present]
            await send(message)

        await self.app(scope, receive, with_headers)
