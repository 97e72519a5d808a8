#!/usr/bin/env python3
"""`qlactors web`: requests per second for `GET /api/v1/runs` (100 runs), a Server-Sent Events
stream of a job writing 1 MiB/s, and the web process's idle RSS and wake-ups.

One edge home with its runtime and one `qlactors web` on 127.0.0.1, side by side with the CLI doing
the same reads in the same run:
  * list: one client, one kept-alive connection, `GET /api/v1/runs?limit=100` over the window;
    baselines: the same read done in-process as `qlactors runs --json --limit 100` does it (the
    store read and the JSON, no interpreter start), and the `qlactors runs` command itself run
    as a process (what a script polling the CLI pays);
  * stream: a job writing 64 KiB every 1/16 s (1 MiB/s) for 8 s (4 s quick), followed from its
    start by an SSE client and by `qlactors logs -f` at once: bytes each received per second, and
    how long after the run ended each had the last byte;
  * idle: RSS (max), CPU and wake-ups (context switches of every thread, per second) of `qlactors
    web` over 30 s (10 s quick) of no requests, beside the idle `qlactors edge` in the same window.
"""

from __future__ import annotations

import base64
import http.client
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as c  # noqa: E402
from bench_idle import Sampler  # noqa: E402

WRITER = ("import os, time\nchunk = b'x' * 65535 + b'\\n'\nend = time.monotonic() + {seconds}\n"
          "while time.monotonic() < end:\n    os.write(1, chunk)\n    time.sleep(1 / 16)\n")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(conn: http.client.HTTPConnection, path: str, token: str) -> bytes:
    conn.request("GET", path, headers={"Authorization": f"Bearer {token}"})
    answer = conn.getresponse()
    body = answer.read()
    if answer.status != 200:
        raise RuntimeError(f"GET {path}: {answer.status} {body[:200]!r}")
    return body


def _sse_client(port: int, token: str, run_id: str, out: dict) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request("GET", f"/api/v1/runs/{run_id}/logs/stream", headers={"Authorization": f"Bearer {token}"})
    answer = conn.getresponse()
    received, start = 0, time.monotonic()
    for line in answer.fp:
        if line.startswith(b"data: "):
            data = json.loads(line[6:])
            if "base64" in data:
                received += len(base64.b64decode(data["base64"]))
            elif "state" in data:
                break
    out.update(bytes=received, seconds=time.monotonic() - start, done_at=time.monotonic())
    conn.close()


def _cli_follow(home: Path, run_id: str, out: dict) -> None:
    start = time.monotonic()
    done = subprocess.run([*c.qlactors_argv(), "--home", str(home), "logs", "-f", run_id],
                          capture_output=True, timeout=120)
    out.update(bytes=len(done.stdout), seconds=time.monotonic() - start, done_at=time.monotonic())


def main(argv: list[str] | None = None) -> int:
    args = c.parser(__doc__.splitlines()[0]).parse_args(argv)
    window = 5.0 if args.quick else 15.0
    idle_window = 10.0 if args.quick else 30.0
    stream_s = 4 if args.quick else 8
    result = c.Result("web", args.quick)
    home = c.temp_home("web", args.keep)
    c.write_config(home, runtime={"slots": 4})
    c.add_task(home, "noop", ["true"], max_concurrent=4)
    c.add_task(home, "writer", [sys.executable, "-c", WRITER.format(seconds=stream_s)])
    token = c.cli(home, "token", "new", "bench").strip()
    edge = c.Edge(home).start()
    port = _free_port()
    web_log = open(home.parent / "web.log", "ab")
    web = c.track(subprocess.Popen([*c.qlactors_argv(), "--home", str(home), "web", "--listen", f"127.0.0.1:{port}"],
                                   stdin=subprocess.DEVNULL, stdout=web_log, stderr=web_log))
    try:
        edge.wait_up()
        for _ in range(100):
            c.cli(home, "run", "noop")
        c.wait_until(lambda: c.terminal_count(c.run_counts(home)) >= 100, 300, what="100 runs to end")

        def up() -> bool:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                _get(conn, "/api/v1/status", token)
                return True
            except (OSError, RuntimeError):
                return False
        c.wait_until(up, 30, poll=0.1, what="qlactors web to answer")

        # -- list: the API against the CLI's own read ------------------------------------------
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        count, end = 0, time.monotonic() + window
        while time.monotonic() < end:
            assert len(json.loads(_get(conn, "/api/v1/runs?limit=100", token))["runs"]) == 100
            count += 1
        api_rps = count / window
        from qlactors.store.repository import Repository

        repo = Repository.open(c.database_url(home))
        count, end = 0, time.monotonic() + window
        while time.monotonic() < end:
            json.dumps([r.to_json(detail=False) for r in repo.runs.list(limit=100).runs])
            count += 1
        inproc_rps = count / window
        repo.close()
        procs, start = 0, time.monotonic()
        while procs < 5:
            c.cli(home, "runs", "--json", "--limit", "100")
            procs += 1
        cli_rps = procs / (time.monotonic() - start)
        result.add("GET /api/v1/runs (100 runs), one client", api_rps, "requests/s", inproc_rps,
                   "the same read in-process (store + JSON, as `qlactors runs --json`)")
        result.add("GET /api/v1/runs against `qlactors runs --json --limit 100` processes", api_rps, "requests/s",
                   cli_rps, "`qlactors runs --json --limit 100` run as a command")

        # -- stream: SSE against `logs -f` on one job writing 1 MiB/s -----------------------------
        run_id = c.cli(home, "run", "writer").strip()
        sse, cli = {}, {}
        threads = [threading.Thread(target=_sse_client, args=(port, token, run_id, sse)),
                   threading.Thread(target=_cli_follow, args=(home, run_id, cli))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(180)
        expected = 65536 * 16 * stream_s
        result.add("SSE stream of a 1 MiB/s job: bytes received per second", sse["bytes"] / sse["seconds"], "B/s",
                   cli["bytes"] / cli["seconds"], "`qlactors logs -f` on the same run, at the same time",
                   note=f"SSE {sse['bytes']} bytes, logs -f {cli['bytes']} bytes (the job wrote about {expected})")
        result.add("SSE: the last byte after the `logs -f` reader had it", sse["done_at"] - cli["done_at"], "s",
                   note="negative: the stream ended first")

        # -- idle ----------------------------------------------------------------------------------
        time.sleep(3.0)
        samplers = {"web": Sampler(web.pid), "edge": Sampler(edge.pid)}
        for s in samplers.values():
            s.begin()
        end = time.monotonic() + idle_window
        while time.monotonic() < end:
            time.sleep(1.0)
            for s in samplers.values():
                s.sample()
        stats = {name: s.end() for name, s in samplers.items()}
        w, e = stats["web"], stats["edge"]
        result.add("qlactors web idle RSS (max)", c.mib(w["rss_kib_max"]), "MiB", c.mib(e["rss_kib_max"]),
                   "qlactors edge, idle, same window")
        result.add("qlactors web idle wake-ups (all threads)", w["wakeups_per_s"], "per s", e["wakeups_per_s"],
                   "qlactors edge, idle, same window",
                   note=f"{w['threads']} threads; the notifier polls the outbox once a second")
        result.add("qlactors web idle CPU", w["cpu_pct"], "% of one core", e["cpu_pct"], "qlactors edge, idle")
        result.details = {"stats": stats, "sse": sse, "cli": cli, "machine": c.machine_notes()}
    finally:
        web.terminate()
        web.wait(15)
        c.untrack(web)
        edge.stop()
    return c.report(result, args.json)


if __name__ == "__main__":
    sys.exit(main())
