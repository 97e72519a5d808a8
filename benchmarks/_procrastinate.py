"""The Procrastinate 3.x reference of the cluster benchmarks (a benchmark dependency only:
`pip install 'procrastinate==3.*'`, never a runtime dependency of qlactors).

A fresh database on the same PostgreSQL server, its schema applied, one worker process
(`procrastinate --app=_procrastinate.app worker --concurrency SLOTS`, LISTEN/NOTIFY on) whose
task spawns the same command with `subprocess.run`. All jobs are deferred in one batch once the
worker is up and idle; the clock runs from just before the batch to the last job terminal
(polled every 20 ms). The worker's connections carry `application_name=qlbench-procrastinate`,
so its backends' CPU is read like a replica's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import _cluster as k
import _common as c

DSN_ENV = "QLBENCH_PROCRASTINATE_DSN"
WORKER_APP_NAME = "qlbench-procrastinate"
HERE = Path(__file__).resolve().parent


def make_app(dsn: str):
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))

    @app.task(name="spawn")
    def spawn(argv: list[str]) -> int:
        return subprocess.run(argv, stdin=subprocess.DEVNULL, check=False).returncode

    return app


def _worker_app():
    """What the worker process imports (`--app=_procrastinate.app`); the DSN comes from its env."""
    return make_app(os.environ.get(DSN_ENV, ""))


if os.environ.get(DSN_ENV):  # only inside the worker process
    app = _worker_app()


def job_counts(dsn: str) -> dict[str, int]:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        return dict(conn.execute("SELECT status::text, COUNT(*) FROM procrastinate_jobs GROUP BY status").fetchall())


def run(jobs: int, concurrency: int, argv: list[str], timeout: float) -> tuple[float, dict]:
    """Jobs/s of one Procrastinate worker process, with its CPU and its backends' CPU."""
    url = k.create_database("qlbench_procrastinate")
    client_dsn = k.libpq(k.with_app_name(url, "qlbench-client"))
    worker_dsn = k.libpq(k.with_app_name(url, WORKER_APP_NAME))
    client = make_app(client_dsn)
    with client.open():
        client.schema_manager.apply_schema()
    env = dict(os.environ, **{DSN_ENV: worker_dsn}, PYTHONPATH=str(HERE))
    log_path = Path(k.create_scratch("procrastinate")) / "worker.log"
    with open(log_path, "ab") as out:
        proc = c.track(subprocess.Popen(
            [sys.executable, "-m", "procrastinate", "--app=_procrastinate.app", "worker",
             f"--concurrency={concurrency}", "--listen-notify"],
            cwd=HERE, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT))
    backends = k.Backends(url, [WORKER_APP_NAME])
    try:
        c.wait_until(lambda: backends.pids() or proc.poll() is not None, 60, poll=0.1,
                     what="the Procrastinate worker to connect")
        if proc.poll() is not None:
            raise RuntimeError(f"procrastinate worker exited:\n{log_path.read_text()[-2000:]}")
        time.sleep(1.0)  # up and idle, as the qlactors side is
        backends.start()
        cpu0, children0 = c.cpu_seconds(proc.pid), c.children_cpu_seconds(proc.pid)
        start = time.perf_counter()
        with client.open():
            client.tasks["spawn"].batch_defer(*({"argv": argv} for _ in range(jobs)))
        deferred = time.perf_counter() - start
        done = lambda: sum(n for s, n in job_counts(client_dsn).items() if s in ("succeeded", "failed")) >= jobs
        sampler = k.Sampler(backends.sample)
        with sampler:
            c.wait_until(done, timeout, poll=0.02, what=f"{jobs} Procrastinate jobs terminal")
        elapsed = time.perf_counter() - start
        backends.sample()
        cpu = c.cpu_seconds(proc.pid) - cpu0
        children = c.children_cpu_seconds(proc.pid) - children0
        counts = job_counts(client_dsn)
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        c.untrack(proc)
    return jobs / elapsed, {
        "defer_s": round(deferred, 3), "total_s": round(elapsed, 3), "counts": counts,
        "worker_cpu_ms_per_job": round(cpu * 1000 / jobs, 2),
        "children_cpu_ms_per_job": round(children * 1000 / jobs, 2),
        "backends_cpu_ms_per_job": round(backends.delta() * 1000 / jobs, 2),
        "backends": backends.count()}
