"""Web: serving the application with uvicorn on HOST:PORT until SIGTERM or SIGINT, and the
notification outbox's deliverer beside it (web/notifier.py).

uvicorn's access log is off: a request line holds task names and run ids only, but a server log
is where secrets leak from (a token pasted into a URL by mistake), so it says nothing per request
(docs/web.md). Proxy headers are trusted from 127.0.0.1 only, for a TLS reverse proxy on the
same host (the page's same-origin check then sees the scheme the browser used).
"""

from __future__ import annotations

import logging
import sys

from ..config.web import WebSettings
from .backend import Backend


def serve(backend: Backend, settings: WebSettings, *, log_level: str = "INFO") -> int:
    """Serve until SIGTERM or SIGINT, delivering the notification outbox meanwhile."""
    import uvicorn

    from ..store.admin.notifications import Notifications
    from .app import build_app
    from .notifier import Notifier

    listen = settings.listen
    logging.basicConfig(stream=sys.stderr, level=getattr(logging, log_level),
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    config = uvicorn.Config(build_app(backend), host=listen.host, port=listen.port, log_level=log_level.lower(),
                            access_log=False, proxy_headers=True, forwarded_allow_ips="127.0.0.1",
                            server_header=False, date_header=False, lifespan="off", loop="asyncio",
                            http="h11", ws="none")
    server = _quiet_server(uvicorn)(config)
    logging.getLogger("qlactors.web").info("qlactors web (%s) on http://%s/", backend.profile, listen)
    notifier = Notifier(Notifications(backend.repo.store), page_url=settings.public_url).start()
    try:
        server.run()
    finally:
        notifier.stop()
    return 0 if server.started else 1


def _quiet_server(uvicorn):
    """uvicorn's Server, waking once a second instead of ten times to see whether it should stop
    (its tick only refreshes default headers and checks for a stop): an idle `qlactors web` then
    costs about 2 wake-ups a second instead of 12 (docs/performance.md); a stop takes up to 1 s."""
    import asyncio

    class QuietServer(uvicorn.Server):
        async def main_loop(self) -> None:
            while not await self.on_tick(0):
                await asyncio.sleep(TICK_S)

    return QuietServer


TICK_S = 1.0
