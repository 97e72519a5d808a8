"""Web: who may call the API: a bearer token made by `qlactors token new` (only its hash is
stored; `store/admin/api_tokens.py` checks it in constant time), read-only tokens refused on
every change, and changes refused from another origin.

The page keeps its token in the browser and sends it in the `Authorization` header, never in a
cookie or a URL: a browser attaches no such header to a request another site makes, which is
what makes cross-site request forgery impossible here. On top of that, a change whose `Origin`
header names another origin is refused (403), and no CORS header is ever sent, so another
site's script cannot read an answer either.
"""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers

from ..store.admin.api_tokens import ApiTokens
from .errors import ApiError, error_response

READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# Reachable without a token: the API's own description (it holds no data).
PUBLIC_PATHS = frozenset({"/api/v1/openapi.json"})


def bearer_secret(headers: Headers) -> str | None:
    """The secret of an `Authorization: Bearer <secret>` header, else None."""
    value = headers.get("authorization", "")
    scheme, _, secret = value.partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        return None
    return secret.strip()


def same_origin(headers: Headers, scheme: str) -> bool:
    """True unless an `Origin` header names an origin other than the one the request came to."""
    origin = headers.get("origin")
    if origin is None:
        return True  # not sent by a browser's cross-origin request (curl, scripts, same-origin GET)
    return origin == f"{scheme}://{headers.get('host', '')}"


class TokenAuth:
    """ASGI middleware for `/api/v1/*` and `/metrics`: the caller's token (its TokenView goes to
    `scope["state"]["token"]`), or 401; 403 for a read-only token's change or a change from
    another origin."""

    def __init__(self, app, tokens: ApiTokens) -> None:
        self.app, self.tokens = app, tokens

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or not _guarded(scope["path"]):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        try:
            token = await self._caller(scope, headers)
        except ApiError as err:
            await error_response(err)(scope, receive, send)
            return
        scope.setdefault("state", {})["token"] = token
        await self.app(scope, receive, send)

    async def _caller(self, scope, headers: Headers):
        secret = bearer_secret(headers)
        if secret is None:
            raise ApiError(401, "unauthorized", "no bearer token: send `Authorization: Bearer <token>` "
                                                "(make one with `qlactors token new NAME`)")
        token = await run_in_threadpool(self.tokens.check, secret)
        if token is None:
            raise ApiError(401, "unauthorized", "the bearer token is unknown or revoked")
        if scope["method"] not in READ_METHODS:
            if token.read_only:
                raise ApiError(403, "read_only", f"token {token.name!r} is read-only: it cannot change "
                                                 "anything; nothing was written")
            if not same_origin(headers, scope.get("scheme", "http")):
                raise ApiError(403, "cross_origin", "a change must come from this server's own page "
                                                    "(the Origin header names another); nothing was written")
        return token


def _guarded(path: str) -> bool:
    return (path.startswith("/api/") and path not in PUBLIC_PATHS) or path == "/metrics"
