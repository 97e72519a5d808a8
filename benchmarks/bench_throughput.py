#!/usr/bin/env python3
"""Throughput: N no-op jobs (`true`) end to end through `qlactors edge`, against a floor loop.

qlactors side: a fresh home, `[runtime] slots = P` and `cadence_tick_ms = 1000`, a task
`true` with `--max-concurrent P`, the runtime up and idle. The clock starts before the first
request; N runs are requested through the Python API (one transaction each, no CLI start-ups),
the runtime is nudged once after the first request and once after the last, and the clock
stops when the database shows all N runs terminal (polled every 20 ms).

Floor (baseline), measured in the same run, same N: a loop that inserts a row in SQLite (its
own transaction), spawns `true` (subprocess), waits for it and updates the row (a second
transaction). The SQLite file gets the same durability as qlactors' (WAL, synchronous=FULL).
It runs twice: sequentially (the loop the issue describes) and with P threads (the same
parallelism as the runtime). The ratio is judged against the FASTER floor (the stricter one).

Launcher ceiling (reported, not judged), same run, same N and parallelism: a loop that does
nothing but what no runtime can avoid, i.e. it spawns qlactors' own launcher the way the executor
does (new session, log FIFO, receipt directory, cap), waits for it through a pidfd, reads and
deletes its receipt. No database, no actors. It is the fastest any runtime built on this
launcher can go on this machine, so `ceiling / floor` bounds the judged ratio from above, and
`qlactors / ceiling` is the share of that bound the runtime reaches.

Also (reported, not judged): a backlog of a few runs queued at once on the default `edge`
profile (no config file: slots 1, 5 s cadence), which shows how fast a queue drains there.

Requirement: qlactors' throughput at least 25% of the floor loop.
"""

from __future__ import annotations

import os
import select
import sqlite3
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as c  # noqa: E402

FLOOR_PRAGMAS = ("PRAGMA journal_mode=WAL", "PRAGMA synchronous=FULL", "PRAGMA busy_timeout=5000")


def floor_loop(path: Path, jobs: int, parallel: int) -> float:
    """Jobs per second of the minimal loop: insert, spawn `true`, wait, update."""
    conn = sqlite3.connect(path, isolation_level=None)
    for pragma in FLOOR_PRAGMAS:
        conn.execute(pragma)
    conn.execute("CREATE TABLE IF NOT EXISTS jobs (id INTEGER PRIMARY KEY, status TEXT, "
                 "exit_code INTEGER, created_ms INTEGER, finished_ms INTEGER)")
    conn.close()
    local = threading.local()

    def connection() -> sqlite3.Connection:
        if getattr(local, "conn", None) is None:
            local.conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            for pragma in FLOOR_PRAGMAS[1:]:
                local.conn.execute(pragma)
        return local.conn

    def one(_i: int) -> None:
        db = connection()
        db.execute("BEGIN IMMEDIATE")
        row = db.execute("INSERT INTO jobs (status, created_ms) VALUES ('running', ?)",
                         (time.time_ns() // 1_000_000,)).lastrowid
        db.execute("COMMIT")
        code = subprocess.Popen(["true"]).wait()
        db.execute("BEGIN IMMEDIATE")
        db.execute("UPDATE jobs SET status = 'done', exit_code = ?, finished_ms = ? WHERE id = ?",
                   (code, time.time_ns() // 1_000_000, row))
        db.execute("COMMIT")

    start = time.perf_counter()
    if parallel <= 1:
        for i in range(jobs):
            one(i)
    else:
        with ThreadPoolExecutor(parallel) as pool:
            list(pool.map(one, range(jobs)))
    elapsed = time.perf_counter() - start
    done = sqlite3.connect(path).execute("SELECT COUNT(*) FROM jobs WHERE status = 'done'").fetchone()[0]
    assert done >= jobs, f"floor loop finished {done} of {jobs}"
    return jobs / elapsed


def launcher_ceiling(root: Path, jobs: int, parallel: int) -> tuple[float, float]:
    """Jobs per second and launcher-tree CPU ms per job of a loop that only runs launchers."""
    from qlactors.process.launch import job_environment, spawn, uptime_ms

    receipts = root / "receipts"
    receipts.mkdir(parents=True)
    base_env = job_environment(os.environ, {})

    def launch(i: int) -> int:
        fifo = root / f"{i}.fifo"
        os.mkfifo(fifo, 0o600)
        env = dict(base_env, QLACTORS_RUN_ID=f"run{i}", QLACTORS_ATTEMPT_ID=f"att{i}",
                   QLACTORS_RECEIPT_DIR=str(receipts),
                   QLACTORS_MARKER=str(root / f"{i}.marker"), QLACTORS_LOG=str(root / f"{i}.log"),
                   QLACTORS_LOG_CAP=str(1 << 20), QLACTORS_FIFO=str(fifo),
                   QLACTORS_DROPPED=str(root / f"{i}.dropped"),
                   QLACTORS_CLOCK_BASE_MS=str(time.time_ns() // 1_000_000 - uptime_ms()))
        return os.pidfd_open(spawn(["true"], env, token="t" * 43))

    poller, live, started, done = select.epoll(), {}, 0, 0
    cpu0 = c.children_cpu_seconds(os.getpid())
    start = time.perf_counter()
    try:
        while done < jobs:
            while len(live) < parallel and started < jobs:
                fd = launch(started)
                live[fd] = started
                poller.register(fd, select.EPOLLIN)
                started += 1
            for fd, _ in poller.poll():
                i = live.pop(fd)
                poller.unregister(fd)
                os.waitid(os.P_PIDFD, fd, os.WEXITED)
                os.close(fd)
                receipt = receipts / f"att{i}.json"
                assert '"exitCode":0' in receipt.read_text(), f"launcher {i} published no good receipt"
                receipt.unlink()
                (root / f"{i}.fifo").unlink()
                done += 1
        elapsed = time.perf_counter() - start
    finally:  # on a failure, reap the launchers still running (each runs `true`: they end at once)
        for fd in live:
            os.waitid(os.P_PIDFD, fd, os.WEXITED)
            os.close(fd)
        poller.close()
    return jobs / elapsed, (c.children_cpu_seconds(os.getpid()) - cpu0) * 1000 / jobs


def qlactors_run(home: Path, jobs: int, slots: int, timeout: float) -> tuple[float, dict]:
    from qlactors.runtime.home import nudge
    from qlactors.store.repository import Repository

    c.write_config(home, runtime={"slots": slots, "cadence_tick_ms": 1000})
    c.add_task(home, "noop", ["true"], max_concurrent=slots)
    edge = c.Edge(home).start()
    try:
        edge.wait_up()
        time.sleep(1.0)  # let the start-up cycle settle: measure a runtime that is up and idle
        repo = Repository.open(c.database_url(home))
        cpu0, children0 = c.cpu_seconds(edge.pid), c.children_cpu_seconds(edge.pid)
        try:
            start = time.perf_counter()
            for i in range(jobs):
                repo.runs.request("noop")
                if i == 0:
                    nudge(home)
            requested = time.perf_counter() - start
            nudge(home)
        finally:
            repo.close()
        c.wait_until(lambda: c.terminal_count(c.run_counts(home)) >= jobs, timeout, poll=0.02,
                     what=f"{jobs} terminal runs")
        elapsed = time.perf_counter() - start
        cpu = c.cpu_seconds(edge.pid) - cpu0
        children = c.children_cpu_seconds(edge.pid) - children0
        counts = c.run_counts(home)
    finally:
        edge.stop()
    return jobs / elapsed, {"requests_s": round(requested, 3), "total_s": round(elapsed, 3),
                            "runtime_cpu_s": round(cpu, 2), "launchers_cpu_s": round(children, 2),
                            "runtime_cpu_ms_per_run": round(cpu * 1000 / jobs, 1),
                            "launcher_cpu_ms_per_run": round(children * 1000 / jobs, 1),
                            "counts": counts, "edge_log_tail": edge.log_text()[-600:] if
                            counts.get("succeeded", 0) < jobs else ""}


def backlog_run(home: Path, jobs: int) -> tuple[float, dict]:
    """The default `edge` profile (slots 1, 5 s cadence, no config file): a backlog of `jobs` runs."""
    from qlactors.runtime.home import nudge
    from qlactors.store.repository import Repository

    c.add_task(home, "noop", ["true"])
    edge = c.Edge(home).start()
    try:
        edge.wait_up()
        time.sleep(1.0)
        repo = Repository.open(c.database_url(home))
        try:
            start = time.perf_counter()
            for _ in range(jobs):
                repo.runs.request("noop")
            nudge(home)
        finally:
            repo.close()
        c.wait_until(lambda: c.terminal_count(c.run_counts(home)) >= jobs, 30 + jobs * 10, poll=0.05,
                     what=f"{jobs} terminal runs")
        elapsed = time.perf_counter() - start
    finally:
        edge.stop()
    launched = [line[:23] for line in edge.log_text().splitlines() if "event=launched" in line]
    return jobs / elapsed, {"total_s": round(elapsed, 3), "launch_times": launched}


def main(argv: list[str] | None = None) -> int:
    p = c.parser(__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, help="runs to push through (default 500, quick 100)")
    p.add_argument("--slots", type=int, default=8, help="runtime slots and floor threads (default 8)")
    p.add_argument("--backlog", type=int, help="runs queued at once on the default edge profile "
                   "(default 6, quick 4; 0 skips it)")
    args = p.parse_args(argv)
    jobs = args.jobs or (100 if args.quick else 500)
    result = c.Result("throughput", args.quick)
    home = c.temp_home("throughput", args.keep)
    home.mkdir(parents=True)

    floor_dir = home.parent / "floor"
    floor_dir.mkdir()
    seq = floor_loop(floor_dir / "seq.db", jobs, 1)
    par = floor_loop(floor_dir / "par.db", jobs, args.slots)
    ceiling, ceiling_cpu = launcher_ceiling(home.parent / "ceiling", jobs, args.slots)
    rate, details = qlactors_run(home, jobs, args.slots, timeout=max(120, jobs * 0.5))
    floor = max(seq, par)
    which = "sequential" if seq >= par else f"{args.slots} threads"
    result.add(f"qlactors edge, {jobs} x `true`, slots={args.slots}", rate, "jobs/s", floor,
               f"floor loop, faster of sequential/{args.slots} threads = {which}",
               requirement=">= 25% of floor (ratio >= 0.25)", passed=rate >= 0.25 * floor)
    result.add("vs sequential floor loop", rate, "jobs/s", seq, "floor loop, sequential")
    result.add(f"vs parallel floor loop ({args.slots} threads)", rate, "jobs/s", par,
               f"floor loop, {args.slots} threads")
    result.add(f"launcher ceiling: launchers only, no runtime, {args.slots} at a time", ceiling, "jobs/s",
               floor, "floor loop (as judged)", note=f"launcher trees {ceiling_cpu:.1f} ms CPU per job; "
               "the highest ratio any runtime on this launcher can reach here")
    result.add("qlactors vs the launcher ceiling", rate, "jobs/s", ceiling, "launcher ceiling")
    backlog = args.backlog if args.backlog is not None else (4 if args.quick else 6)
    if backlog > 0:
        b_rate, b_details = backlog_run(c.temp_home("backlog", args.keep), backlog)
        details["backlog"] = b_details
        result.add(f"default edge profile (slots=1, no config), backlog of {backlog} x `true`", b_rate,
                   "jobs/s", seq, "floor loop, sequential",
                   note="launches at " + ", ".join(t[-12:] for t in b_details["launch_times"]))
    succeeded = details["counts"].get("succeeded", 0)
    if succeeded < jobs:
        result.metrics[0].passed = False
        result.metrics[0].note = f"only {succeeded} of {jobs} runs succeeded: {details['counts']}"
    details["launcher_ceiling"] = {"jobs_per_s": round(ceiling, 1), "launcher_cpu_ms_per_run": round(ceiling_cpu, 1)}
    result.details = {**details, "jobs": jobs, "slots": args.slots, "machine": c.machine_notes()}
    print(f"requests took {details['requests_s']} s of {details['total_s']} s; counts {details['counts']}")
    print(f"runtime CPU {details['runtime_cpu_s']} s ({details['runtime_cpu_ms_per_run']} ms/run), reaped "
          f"launcher trees CPU {details['launchers_cpu_s']} s ({details['launcher_cpu_ms_per_run']} ms/run)")
    return c.report(result, args.json)


if __name__ == "__main__":
    sys.exit(main())
