#!/usr/bin/env python3
"""`GET /metrics` and `GET /api/v1/status` with 10,000 active runs against 100 (issue 28): the
time of each (median of repeated calls of the handlers' own functions, in-process, no HTTP) and
the work the database did for it (SQLite's virtual-machine steps, from a progress handler).

Two edge homes, no runtime (every admitted run stays queued), the runs admitted through the
store in batches; the calls alternate between the two homes so that both see the same machine.
The figure is the ratio of the 10,000-run time to the 100-run time.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as c  # noqa: E402


def _admit(repo, total: int) -> None:
    from qlactors.store.intent.runs import _LIVE_TASK

    done = 0
    while done < total:
        with repo.store.write() as conn:
            head = conn.execute(_LIVE_TASK, {"name": "noop"}).first()
            for _ in range(min(500, total - done)):
                repo.runs.admit_in(conn, head, head.current_revision)
                done += 1


def _steps(repo):
    """A counter of SQLite VM steps (every 100) on each pooled connection the repo opens."""
    from sqlalchemy import event

    counted = [0]

    def tick() -> int:
        counted[0] += 100
        return 0

    @event.listens_for(repo.store.engine, "connect")
    def _on_connect(dbapi_conn, _record):
        dbapi_conn.set_progress_handler(tick, 100)

    repo.store.engine.dispose()  # connections made from now on count
    return counted


def _timed(fn, request) -> float:
    start = time.perf_counter()
    fn(request)
    return (time.perf_counter() - start) * 1000


def main(argv: list[str] | None = None) -> int:
    args = c.parser(__doc__.splitlines()[0]).parse_args(argv)
    repeat = 20 if args.quick else 60
    from qlactors.config.home import load
    from qlactors.store.repository import Repository
    from qlactors.web.api_status import status_report
    from qlactors.web.backend import EdgeBackend
    from qlactors.web.metrics import _scrape

    result = c.Result("web_status", args.quick)
    sides = {}
    for active in (100, 10_000):
        home = c.temp_home(f"web-status-{active}", args.keep)
        c.write_config(home)
        c.add_task(home, "noop", ["true"])
        repo = Repository.open(c.database_url(home))
        _admit(repo, active)
        request = SimpleNamespace(app=SimpleNamespace(state=SimpleNamespace(
            backend=EdgeBackend(repo, load(str(home))))))
        sides[active] = (repo, _steps(repo), request)
    handlers = {"metrics": _scrape, "status": status_report}
    figures: dict[int, dict[str, list]] = {active: {} for active in sides}
    for active, (_repo, steps, request) in sides.items():
        for name, fn in handlers.items():
            fn(request)  # warm: compiled statements, the pool
            before = steps[0]
            fn(request)
            figures[active][name] = [steps[0] - before, []]
    for _ in range(repeat):  # alternated, so that both sizes see the same machine
        for active, (_repo, _steps_, request) in sides.items():
            for name, fn in handlers.items():
                figures[active][name][1].append(_timed(fn, request))
    for repo, _steps_, _request in sides.values():
        repo.close()
    figures = {active: {name: (statistics.median(times), visited) for name, (visited, times) in by.items()}
               for active, by in figures.items()}
    for name, what in (("metrics", "GET /metrics"), ("status", "GET /api/v1/status")):
        (small_ms, small_steps), (big_ms, big_steps) = figures[100][name], figures[10_000][name]
        result.add(f"{what} with 10,000 active runs", big_ms, "ms", small_ms, "the same with 100 active runs",
                   note=f"ratio {big_ms / small_ms:.2f}; SQLite VM steps {big_steps} against {small_steps}")
    result.details = {"figures": figures, "machine": c.machine_notes()}
    return c.report(result, args.json)


if __name__ == "__main__":
    sys.exit(main())
