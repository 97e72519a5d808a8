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
    server = uvicorn.Server(config)
    logging.getLogger("qlactors.web").info("qlactors web (%s) on http://%s/", backend.profile, listen)
    notifier = Notifier(Notifications(backend.repo.store), page_url=settings.public_url).start()
    try:
        server.run()
    finally:
        notifier.stop()
    return 0 if server.started else 1
