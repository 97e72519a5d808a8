#!/usr/bin/env python3
"""Cron admission: N triggers due in the same second, and the idle cost of N triggers not due.

Burst: a fresh home (default `edge` profile: cron page 4, 5 s tick), N tasks `true`, each with
the six-field schedule `S M H * * *` (UTC) naming one second T about 15 s after set-up; the
runtime is started and idle before T. The clock runs from T until the database holds N cron
runs (polled every 20 ms). Baseline, same run: N runs admitted through the Python API
(`Repository.runs.request`, one transaction each) on another fresh home: the cost of the same
admissions without the scheduler.

Idle: a second fresh home with N tasks scheduled `0 0 1 1 *` (once a year; a fresh home, so no
runs of the burst are left to execute), the runtime started, left 5 s to settle, then its CPU
(utime + stime, all threads) over 60 s (20 s quick). Baseline: the same runtime on a home with
one task and no schedule, measured side by side.
Target (issue): an idle runtime with 1,000 triggers stays under 1% of one core.

Lateness: a third fresh home with one task `true` scheduled `* * * * * *` (UTC), the runtime up,
then S seconds (30, quick 10) of fires; per run, created_at_ms - scheduled_for_ms (how long after
its occurrence the cadence admitted it), median and max, plus the seconds folded into `missed`.
Baseline, same run: this script sleeping to each whole second and admitting a run through the
Python API on another fresh home, timed from the second until the call returned: the same
admission, woken by a plain sleep instead of the cadence. (tests/profiles/test_scheduling_e2e.py asserts each occurrence admitted once; how late is here.)
"""

from __future__ import annotations

import contextlib
import io
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as c  # noqa: E402


def add_scheduled_tasks(home: Path, count: int, cron: str) -> float:
    """`task add tN --cron CRON --tz UTC -- true`, through the CLI's own main() in this process."""
    from qlactors.cli import main

    start = time.perf_counter()
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    with contextlib.redirect_stdout(io.StringIO()):
        for i in range(count):
            status = main(["--home", str(home), "task", "add", f"t{i}", "--cron", cron, "--tz", "UTC",
                           "--", "true"])
            if status != 0:
                raise RuntimeError(f"task add t{i} failed with {status}")
    return time.perf_counter() - start


def cron_run_count(home: Path) -> int:
    import sqlite3

    with sqlite3.connect(f"file:{c.database_path(home)}?mode=ro", uri=True, timeout=5) as conn:
        return conn.execute("SELECT COUNT(*) FROM runs WHERE trigger_type = 'cron'").fetchone()[0]


def api_admissions(home: Path, count: int) -> float:
    """Seconds to admit `count` runs through the Python API (the baseline)."""
    from qlactors.store.repository import Repository

    c.add_task(home, "noop", ["true"])
    repo = Repository.open(c.database_url(home))
    try:
        start = time.perf_counter()
        for _ in range(count):
            repo.runs.request("noop")
        return time.perf_counter() - start
    finally:
        repo.close()


def burst(home: Path, count: int) -> tuple[float, dict]:
    fire = int(time.time()) + 15 + count // 15  # room for the set-up below (~25 ms per task here)
    setup_s = add_scheduled_tasks(home, count, "{} {} {} * * *".format(*reversed(
        datetime.fromtimestamp(fire, timezone.utc).strftime("%H %M %S").split())))
    if time.time() > fire - 4:
        raise RuntimeError(f"set-up took {setup_s:.1f} s, past the fire time; use a smaller --triggers")
    edge = c.Edge(home).start()
    try:
        edge.wait_up()
        time.sleep(max(0.0, fire - time.time()))
        start = time.perf_counter()
        c.wait_until(lambda: cron_run_count(home) >= count, 300, poll=0.02, what=f"{count} cron runs")
        elapsed = time.perf_counter() - start
        admitted_lines = edge.log_text().count("event=cron_admitted")
    finally:
        edge.stop()
    return elapsed, {"setup_s": round(setup_s, 2), "fire_epoch_s": fire, "admitted_log_lines": admitted_lines}


def cron_lateness(home: Path, seconds: float) -> tuple[list[int], int]:
    """Per admitted run of a per-second schedule, ms from its occurrence to its admission; and
    how many occurrences the cadence recorded `missed` instead (it folds a late second)."""
    import sqlite3

    add_scheduled_tasks(home, 1, "* * * * * *")
    edge = c.Edge(home, log_name="edge-lateness.log").start()
    try:
        edge.wait_up()
        time.sleep(1.5)  # past the catch-up of the seconds before the runtime was up
        since_ms = int(time.time() * 1000)
        time.sleep(seconds)
        until_ms = int(time.time() * 1000)
    finally:
        edge.stop()
    with sqlite3.connect(f"file:{c.database_path(home)}?mode=ro", uri=True, timeout=5) as conn:
        rows = conn.execute("SELECT scheduled_for_ms, created_at_ms FROM runs WHERE trigger_type = 'cron' "
                            "AND scheduled_for_ms >= ? AND scheduled_for_ms < ?", (since_ms, until_ms)).fetchall()
        missed = conn.execute("SELECT COALESCE(SUM(occurrences), 0) FROM trigger_events WHERE type = 'missed' "
                              "AND scheduled_for_ms >= ? AND scheduled_for_ms < ?", (since_ms, until_ms)).fetchone()[0]
    return [created - scheduled for scheduled, created in rows], missed


def api_lateness(home: Path, seconds: float) -> list[float]:
    """The baseline: sleep to each whole second, admit a run through the API; ms (to the µs,
    where created_at_ms has whole ms only) from the second until the admission returned."""
    from qlactors.store.repository import Repository

    c.add_task(home, "noop", ["true"])
    repo = Repository.open(c.database_url(home))
    late = []
    try:
        for _ in range(int(seconds)):
            boundary_s = int(time.time()) + 1
            time.sleep(max(0.0, boundary_s - time.time()))
            repo.runs.request("noop")
            late.append((time.time() - boundary_s) * 1000)
    finally:
        repo.close()
    return late


def idle_cpu(home: Path, empty: Path, window: float) -> tuple[float, float]:
    """CPU % of one core of the runtime on `home` and on `empty`, side by side over `window`."""
    edges = [c.Edge(home, log_name="edge-idle.log").start(), c.Edge(empty, log_name="edge-empty.log").start()]
    try:
        for e in edges:
            e.wait_up()
        time.sleep(5.0)
        cpu0 = [c.cpu_seconds(e.pid) for e in edges]
        t0 = time.monotonic()
        time.sleep(window)
        elapsed = time.monotonic() - t0
        cpu1 = [c.cpu_seconds(e.pid) for e in edges]
    finally:
        for e in edges:
            e.stop()
    return tuple(100 * (b - a) / elapsed for a, b in zip(cpu0, cpu1))  # type: ignore[return-value]


def burst_and_idle(args, count: int, window: float, result) -> dict:
    """The burst of `count` schedules due in one second, then the idle CPU of as many not due."""
    home = c.temp_home("cron", args.keep)
    elapsed, details = burst(home, count)
    api_s = api_admissions(c.temp_home("cron-api", args.keep), count)
    result.add(f"{count} schedules due in one second -> all runs queued", elapsed, "s", api_s,
               f"{count} runs admitted through the Python API, one transaction each",
               note=f"{count / elapsed:.0f} admissions/s; cron page 4, edge profile")

    idle_home = c.temp_home("cron-idle", args.keep)
    add_scheduled_tasks(idle_home, count, "0 0 1 1 *")
    empty = c.temp_home("cron-empty", args.keep)
    c.add_task(empty, "noop", ["true"])
    busy_pct, empty_pct = idle_cpu(idle_home, empty, window)
    result.add(f"idle CPU with {count} enabled schedules not due", busy_pct, "% of one core", empty_pct,
               "the same runtime with one task and no schedule", requirement="< 1%", passed=busy_pct < 1.0,
               note=f"{busy_pct * 600:.0f} ms of CPU per minute")
    return {**details, "triggers": count, "window_s": window}


def lateness(args, result) -> dict:
    """A per-second schedule's admission lateness against a plain sleep-and-admit loop."""
    late_window = args.lateness_seconds or (10.0 if args.quick else 30.0)
    late, missed = cron_lateness(c.temp_home("cron-late", args.keep), late_window)
    if not late:
        raise RuntimeError(f"no cron run admitted in {late_window:g} s ({missed} occurrences missed)")
    floor = api_lateness(c.temp_home("cron-late-api", args.keep), late_window)
    result.add("per-second schedule: occurrence -> run admitted, median", c.median(late), "ms", c.median(floor),
               "a sleep to each whole second, then one admission through the Python API, until it returned",
               note=f"{len(late)} runs in {late_window:g} s, {missed} occurrence(s) folded into missed")
    result.add("per-second schedule: occurrence -> run admitted, max", max(late), "ms", max(floor),
               "the same loop's worst second")
    return {"lateness_window_s": late_window, "lateness_ms": late, "lateness_missed": missed,
            "baseline_lateness_ms": floor}


def main(argv: list[str] | None = None) -> int:
    p = c.parser(__doc__.splitlines()[0])
    p.add_argument("--triggers", type=int, help="schedules (default 1000, quick 200)")
    p.add_argument("--seconds", type=float, help="idle window (default 60, quick 20)")
    p.add_argument("--lateness-seconds", type=float, help="per-second schedule observed (default 30, quick 10)")
    p.add_argument("--lateness-only", action="store_true", help="only the per-second schedule's lateness")
    args = p.parse_args(argv)
    count = args.triggers or (200 if args.quick else 1000)
    window = args.seconds or (20.0 if args.quick else 60.0)
    result = c.Result("cron", args.quick)
    details = {} if args.lateness_only else burst_and_idle(args, count, window, result)
    details.update(lateness(args, result))
    result.details = {**details, "machine": c.machine_notes()}
    return c.report(result, args.json)


if __name__ == "__main__":
    sys.exit(main())
