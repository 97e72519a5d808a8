"""`qlactors web` under bad clients (issue 28): a revoked token's open log stream ends, a client
that stalls in its headers or its body is cut off, and a client gone mid-body is no error."""

from __future__ import annotations

import socket
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


def _closed_within(sock: socket.socket, limit_s: float) -> float:
    """Seconds until the server closed `sock` (read to EOF); fails past `limit_s`."""
    sock.settimeout(limit_s)
    start = time.monotonic()
    try:
        while sock.recv(4096):
            pass
    except socket.timeout:
        raise AssertionError(f"the connection was still open after {limit_s} s") from None
    except ConnectionResetError:
        pass
    return time.monotonic() - start


def test_a_client_stalling_in_its_headers_or_its_body_is_cut_off(site):
    """Half a header, or a tenth of a declared body, and then nothing: the server closes each
    connection at its deadline (uvicorn alone kept both open for ever), and logs no error."""
    from qlactors.web.server import BODY_TIMEOUT_S, HEADERS_TIMEOUT_S

    home, server, admin = site
    headers = socket.create_connection(("127.0.0.1", server.port))
    body = socket.create_connection(("127.0.0.1", server.port))
    try:
        headers.sendall(b"GET /api/v1/status HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthori")
        body.sendall(b"POST /api/v1/tasks HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "
                     + admin.encode() + b"\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
                     + b'{"name": "')
        _closed_within(headers, HEADERS_TIMEOUT_S + 30)
        _closed_within(body, BODY_TIMEOUT_S + 30)
    finally:
        headers.close()
        body.close()
    log = server.log()
    assert " ERROR " not in log and "Traceback" not in log, log
    assert server.request("GET", "/api/v1/status", token=admin).status == 200  # the server serves on


def test_a_client_gone_mid_body_is_no_error_in_the_log(site):
    """Content-Length 1000, 10 bytes, then the socket closed: one INFO line, no ERROR, no traceback."""
    from edge_harness import wait_until

    home, server, admin = site
    sock = socket.create_connection(("127.0.0.1", server.port))
    sock.sendall(b"POST /api/v1/tasks HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + admin.encode()
                 + b"\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n" + b'{"name": "')
    sock.close()
    wait_until(lambda: "client gone" in server.log() or "Traceback" in server.log(), 30,
               lambda: f"the server to notice the client gone; log:\n{server.log()}")
    log = server.log()
    assert " ERROR " not in log and "Traceback" not in log, log
    assert "INFO qlactors.web client gone before its request was read: POST /api/v1/tasks" in log, log
