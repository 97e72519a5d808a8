"""A real `qlactors web` process on 127.0.0.1 for the API, page and metrics tests, and a small
HTTP client over http.client (no extra dependency): requests, JSON, and Server-Sent Events."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from edge_harness import QLACTORS, clean_env, wait_until
from wire_harness import free_port


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def code(self) -> str | None:
        """The error code of a JSON error answer."""
        try:
            return self.json()["error"]["code"]
        except (ValueError, KeyError, TypeError):
            return None


class WebServer:
    """`qlactors [--home H | --config F] web --listen 127.0.0.1:PORT`, stopped by its pid."""

    def __init__(self, tmp: Path, where: list[str], env: dict[str, str] | None = None,
                 args: tuple[str, ...] = ()) -> None:
        """`args`: more of `web`'s own options (`--log-level DEBUG`)."""
        self.port = free_port()
        self.log_path = Path(tmp) / f"web-{self.port}.log"
        with open(self.log_path, "wb") as out:
            self.proc = subprocess.Popen([*QLACTORS, *where, "web", "--listen", f"127.0.0.1:{self.port}", *args],
                                         stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                         env=clean_env(**(env or {})))
        wait_until(self._answers, 30, lambda: f"qlactors web to answer; log:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_bytes().decode("utf-8", "replace")

    def _answers(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"qlactors web exited: {self.log()}")
        try:
            return self.request("GET", "/api/v1/openapi.json").status == 200
        except OSError:
            return False

    def connection(self, timeout: float = 30.0) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def request(self, method: str, path: str, *, token: str | None = None, body: Any = None,
                raw: bytes | None = None, headers: dict[str, str] | None = None, timeout: float = 30.0) -> Answer:
        sent = dict(headers or {})
        if token is not None:
            sent["Authorization"] = f"Bearer {token}"
        data = raw
        if body is not None:
            data = json.dumps(body).encode()
            sent.setdefault("Content-Type", "application/json")
        conn = self.connection(timeout)
        try:
            conn.request(method, path, body=data, headers=sent)
            reply = conn.getresponse()
            return Answer(reply.status, {k.lower(): v for k, v in reply.getheaders()}, reply.read())
        finally:
            conn.close()

    def events(self, path: str, *, token: str, headers: dict[str, str] | None = None,
               timeout: float = 60.0) -> Iterator[tuple[str, str | None, Any]]:
        """A Server-Sent Events stream, as (event, id, data parsed as JSON) until it ends."""
        conn = self.connection(timeout)
        try:
            conn.request("GET", path, headers={"Authorization": f"Bearer {token}", **(headers or {})})
            reply = conn.getresponse()
            assert reply.status == 200, (reply.status, reply.read())
            kind, event_id, data = "message", None, []
            while True:
                line = reply.fp.readline()
                if not line:
                    return
                line = line.rstrip(b"\r\n").decode()
                if line == "":
                    if data:
                        yield kind, event_id, json.loads("\n".join(data))
                    kind, event_id, data = "message", None, []
                elif line.startswith(":"):
                    continue
                else:
                    field, _, value = line.partition(":")
                    value = value[1:] if value.startswith(" ") else value
                    if field == "event":
                        kind = value
                    elif field == "id":
                        event_id = value
                    elif field == "data":
                        data.append(value)
        finally:
            conn.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


def new_token(home, name: str, *, read_only: bool = False) -> str:
    """`token new NAME [--read-only]` through the CLI's main(); the secret it printed."""
    return home.main("token", "new", name, *(["--read-only"] if read_only else [])).strip()


def wait_state(server: WebServer, token: str, run_id: str, states: set[str], timeout: float = 30.0) -> dict:
    def reached():
        run = server.request("GET", f"/api/v1/runs/{run_id}", token=token).json()
        return run if run["state"] in states else None
    return wait_until(reached, timeout, f"run {run_id} to reach {states}", interval=0.1)


def elapsed(since: float) -> float:
    return time.monotonic() - since
