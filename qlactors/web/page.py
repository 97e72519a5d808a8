"""Web: the page at `/`: three static files shipped in the package (web/page/), no build step.
They hold no data and need no token; the page asks for one and sends it with each API call."""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

FILES = {"/": ("index.html", "text/html; charset=utf-8"),
         "/page.js": ("page.js", "text/javascript; charset=utf-8"),
         "/page.css": ("page.css", "text/css; charset=utf-8")}


@lru_cache(maxsize=None)
def _content(name: str) -> bytes:
    return (resources.files(__package__) / "page" / name).read_bytes()


async def _serve(request: Request) -> Response:
    name, media_type = FILES[request.url.path]
    return Response(_content(name), media_type=media_type)


def routes() -> list[Route]:
    return [Route(path, _serve, methods=["GET"]) for path in FILES]
