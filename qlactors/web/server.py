"""Web: serving the application with uvicorn on HOST:PORT until SIGTERM or SIGINT, and the
notification outbox's deliverer beside it (web/notifier.py).

uvicorn's access log is off: a request line holds task names and run ids only, but a server log
is where secrets leak from (a token pasted into a URL by mistake), so it says nothing per request
(docs/web.md). Proxy headers are trusted from 127.0.0.1 only, for a TLS reverse proxy on the
same host (the page's same-origin check then sees the scheme the browser used).

Bad clients are bounded (docs/web.md): at most LIMIT_CONCURRENCY connections and requests at
once (uvicorn answers 503 past it), a request's line and headers within HEADERS_TIMEOUT_S and its
body within BODY_TIMEOUT_S (uvicorn has neither deadline: `_ReadDeadlines` adds them), headers of
at most MAX_HEADER_BYTES (h11 answers 400 past it), an idle kept-alive connection closed after
KEEP_ALIVE_S.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys

from ..config.web import WebSettings
from ..errors import QlactorsError
from .backend import Backend


class CannotListen(QlactorsError):
    """The address to serve on cannot be bound (in use, not this host's, not allowed): exit 1,
    before anything says it serves."""


def serve(backend: Backend, settings: WebSettings, *, log_level: str = "INFO") -> int:
    """Serve until SIGTERM or SIGINT, delivering the notification outbox meanwhile."""
    import uvicorn

    from ..store.admin.notifications import Notifications
    from .app import build_app
    from .notifier import Notifier

    listen = settings.listen
    sock = _bound(listen.host, listen.port, str(listen))
    logging.basicConfig(stream=sys.stderr, level=getattr(logging, log_level),
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    config = uvicorn.Config(build_app(backend), host=listen.host, port=listen.port, log_level=log_level.lower(),
                            access_log=False, proxy_headers=True, forwarded_allow_ips="127.0.0.1",
                            server_header=False, date_header=False, lifespan="off", loop="asyncio",
                            http=_read_deadlines(), ws="none", limit_concurrency=LIMIT_CONCURRENCY,
                            timeout_keep_alive=KEEP_ALIVE_S, h11_max_incomplete_event_size=MAX_HEADER_BYTES)
    server = _quiet_server(uvicorn)(config)
    logging.getLogger("qlactors.web").info("qlactors web (%s) on http://%s/", backend.profile, listen)
    notifier = Notifier(Notifications(backend.repo.store), page_url=settings.public_url).start()
    # uvicorn ends by raising the signal that stopped it again with the handler it found: with the
    # default one the process dies there, before any `finally` below. So it finds ours, which only
    # notes the signal (a second one, while the deliverer stops, exits at once); the signal is
    # raised again once the notifier has released its claims, for the exit status to say it.
    caught: list[int] = []

    def noted(sig: int, frame) -> None:
        if caught:
            os._exit(128 + sig)
        caught.append(sig)

    previous = {sig: signal.signal(sig, noted) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run(sockets=[sock])
    finally:
        notifier.stop()
        sock.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    for sig in caught:
        signal.raise_signal(sig)
    return 0 if server.started else 1


def _bound(host: str, port: int, shown: str) -> socket.socket:
    """A listening socket on HOST:PORT, bound here so that an address in use is one line and
    exit 1 (uvicorn would log that it serves first, then its own error, and exit 3)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as err:
        sock.close()
        raise CannotListen(f"cannot listen on {shown}: {(err.strerror or str(err)).lower()}") from None
    sock.set_inheritable(True)
    return sock


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
LIMIT_CONCURRENCY = 128  # open connections (log streams included) and requests in progress
KEEP_ALIVE_S = 5
HEADERS_TIMEOUT_S = 10.0  # from the connection's start, or the previous answer's end
BODY_TIMEOUT_S = 30.0  # from the headers' end: a 1 MiB body at 35 KB/s or more
MAX_HEADER_BYTES = 16 * 1024


def _read_deadlines():
    """uvicorn's h11 protocol with deadlines on reading a request (uvicorn has none: a client
    sending half a header and nothing more would hold its connection for ever): its line and
    headers within HEADERS_TIMEOUT_S of when the server began waiting for it, its body within
    BODY_TIMEOUT_S of its headers. Past one the connection is closed; a handler reading that body
    sees the client gone (app.py). Once a request is in whole, nothing limits its answer (a log
    stream lasts as long as its job)."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    limits = {h11.IDLE: HEADERS_TIMEOUT_S, h11.SEND_BODY: BODY_TIMEOUT_S}

    class ReadDeadlines(H11Protocol):
        _phase: object = None
        _deadline = None

        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._reading(h11.IDLE)

        def handle_events(self) -> None:
            super().handle_events()
            self._reading(self.conn.their_state)

        def on_response_complete(self) -> None:
            self._reading(h11.IDLE)  # first: a pipelined request is read inside the call
            super().on_response_complete()

        def connection_lost(self, exc) -> None:
            self._reading(None)
            super().connection_lost(exc)

        def _reading(self, phase) -> None:
            """Start the deadline of `phase` (the client's h11 state) when it changed."""
            if phase is self._phase:
                return
            self._phase = phase
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None
            if phase in limits:
                self._deadline = self.loop.call_later(limits[phase], self._expired)

        def _expired(self) -> None:
            logging.getLogger("qlactors.web").debug("a request not read in time: connection closed")
            self._deadline = None
            if not self.transport.is_closing():
                self.transport.close()

    return ReadDeadlines
