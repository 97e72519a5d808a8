"""`qlactors web` under bad clients (issue 28): a revoked token's open log stream ends."""

from __future__ import annotations

import time

import pytest

from edge_harness import Home
from web_rigs import WebServer, new_token, wait_state


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bad-clients")
    home = Home(tmp, config="[runtime]\nslots = 2\n")
    server = None
    try:
        home.main("task", "add", "chatty", "--", "echo started; sleep 100")
        home.start_edge()
        admin = new_token(home, "admin")
        server = WebServer(tmp, ["--home", str(home.path)])
        yield home, server, admin
    finally:
        if server is not None:
            server.stop()
        home.close()


def test_an_open_log_stream_ends_within_seconds_of_its_token_being_revoked(site):
    from qlactors.web.api_runs import TOKEN_RECHECK_S

    home, server, admin = site
    watcher = new_token(home, "watcher", read_only=True)
    run = server.request("POST", "/api/v1/tasks/chatty/runs", token=admin).json()
    wait_state(server, admin, run["id"], {"running"})
    seen, revoked_at = [], None
    try:
        for kind, _, data in server.events(f"/api/v1/runs/{run['id']}/logs/stream", token=watcher, timeout=150):
            seen.append(kind)
            if revoked_at is None:
                home.main("token", "revoke", "watcher")
                revoked_at = time.monotonic()
        ended_after = time.monotonic() - revoked_at
        # The job sleeps 100 s: without the check the stream would run on until then.
        assert ended_after < TOKEN_RECHECK_S + 30, ended_after
        assert seen == ["log"], seen  # ended by the revoke, not by the log's end
        assert server.request("GET", f"/api/v1/runs/{run['id']}/logs/stream", token=watcher).status == 401
    finally:
        server.request("POST", f"/api/v1/runs/{run['id']}/cancel", token=admin)

