#!/usr/bin/env python3
"""Cluster end to end: N no-op jobs (`true`) through one control replica with 1 and with 2
workers, against Procrastinate 3.x and the launcher ceiling, measured in the same run.

qlactors side, once per worker count: a fresh PostgreSQL database, real CURVE keys, one
`qlactors control --config` and W `qlactors worker --config` processes on 127.0.0.1 (slots S
each, heartbeat 1 s, cadence 1 s), a task `true` with `--max-concurrent W*S`, the cluster up
and idle for 1 s. The clock starts before the first request; N runs are requested in this
process with `Repository.runs.request` (what `qlactors run` does, without N CLI start-ups);
it stops when the database shows N terminal runs (polled every 20 ms).

Procrastinate 3.x (reference), same run, same PostgreSQL server, its own fresh database: one
worker process, concurrency S, a task that runs `true` with `subprocess.run`; the N jobs are
deferred in one batch (see _procrastinate.py). Launcher ceiling, same run: the launchers alone
(no database, no actors), S and 2*S at a time (`bench_throughput.launcher_ceiling`).

CPU per run, from the same run (/proc/<pid>/stat, utime+stime of every thread): the replica;
its PostgreSQL backends (the pids `pg_stat_activity` lists under the replica's
`application_name`, sampled every 0.5 s: a backend that ends between samples loses its last
<0.5 s); the workers; the launchers: the workers' cutime+cstime (the CPU of the children they
reaped, with their jobs), read 0.5 s after the last run ended so the last launchers are reaped.

Reported, not judged (issue 10: the ratio to the ceiling is a target for a later issue).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _cluster as k  # noqa: E402
import _common as c  # noqa: E402
import _procrastinate  # noqa: E402
from bench_throughput import launcher_ceiling  # noqa: E402

TERMINAL = ("succeeded", "failed", "cancelled", "timed_out", "lost")


def cluster_run(workers: int, slots: int, jobs: int, timeout: float, keep: bool) -> tuple[float, dict]:
    """Jobs/s through one replica and `workers` workers, with the per-process CPU breakdown."""
    root = k.create_scratch(f"cluster{workers}", keep)
    cluster = k.Cluster(root=root, database_url=k.create_database("qlbench_cluster"))
    try:
        cluster.setup(replicas=1)
        replica = cluster.start_replica(0)
        nodes = [cluster.start_worker(f"w{i + 1}", slots=slots) for i in range(workers)]
        cluster.cli("task", "add", "noop", "--max-concurrent", str(workers * slots), "--", "true")
        time.sleep(1.0)  # up and idle
        backends = k.Backends(cluster.database_url, [cluster.replica_name(0)])
        backends.start()
        replica0 = c.cpu_seconds(replica.pid)
        workers0 = [c.cpu_seconds(n.pid) for n in nodes]
        children0 = [c.children_cpu_seconds(n.pid) for n in nodes]
        start = time.perf_counter()
        with k.Sampler(backends.sample):
            requested = k.request_runs(cluster.database_url, "noop", jobs)
            c.wait_until(lambda: sum(k.run_counts(cluster.database_url).get(s, 0) for s in TERMINAL) >= jobs,
                         timeout, poll=0.02, what=f"{jobs} terminal cluster runs")
            elapsed = time.perf_counter() - start
            backends.sample()
            replica_cpu = c.cpu_seconds(replica.pid) - replica0
            worker_cpu = sum(c.cpu_seconds(n.pid) - w0 for n, w0 in zip(nodes, workers0))
        time.sleep(0.5)  # the last launchers reaped
        launcher_cpu = sum(c.children_cpu_seconds(n.pid) - c0 for n, c0 in zip(nodes, children0))
        counts = k.run_counts(cluster.database_url)
    except BaseException:
        print(cluster.logs_tail(), file=sys.stderr)
        raise
    finally:
        cluster.close()
    per_run = lambda s: round(s * 1000 / jobs, 2)  # noqa: E731
    return jobs / elapsed, {
        "requests_s": round(requested, 3), "total_s": round(elapsed, 3), "counts": counts,
        "cpu_ms_per_run": {"replica": per_run(replica_cpu), "replica_backends": per_run(backends.delta()),
                           "workers": per_run(worker_cpu), "launchers": per_run(launcher_cpu)},
        "replica_backends_seen": backends.count()}


def main(argv: list[str] | None = None) -> int:
    p = c.parser(__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, help="runs per configuration (default 1000, quick 100)")
    p.add_argument("--slots", type=int, default=4, help="slots per worker, Procrastinate's concurrency (default 4)")
    args = p.parse_args(argv)
    jobs = args.jobs or (100 if args.quick else 1000)
    slots = args.slots
    timeout = max(120.0, jobs * 0.5)
    result = c.Result("cluster", args.quick)
    details: dict = {"jobs": jobs, "slots": slots}
    try:
        ceilings: dict[int, float] = {}
        for parallel in (slots, 2 * slots):
            scratch = k.create_scratch(f"ceiling{parallel}")
            ceilings[parallel], cpu = launcher_ceiling(scratch / "ceiling", jobs, parallel)
            details[f"launcher_ceiling_{parallel}"] = {"jobs_per_s": round(ceilings[parallel], 1),
                                                       "launcher_cpu_ms_per_run": round(cpu, 2)}
            result.add(f"launcher ceiling: the launchers alone, no runtime, {parallel} at a time",
                       ceilings[parallel], "jobs/s", note=f"launcher trees {cpu:.1f} ms CPU per job")
        pro_rate, pro = _procrastinate.run(jobs, slots, ["true"], timeout)
        details["procrastinate"] = pro
        result.add(f"Procrastinate 3.x, 1 worker, concurrency {slots} (the reference: its task spawns `true` "
                   "directly, no launcher)", pro_rate, "jobs/s",
                   note=f"CPU ms/job: worker {pro['worker_cpu_ms_per_job']}, its children "
                        f"{pro['children_cpu_ms_per_job']}, its backends {pro['backends_cpu_ms_per_job']}")
        for workers in (1, 2):
            label = f"qlactors, 1 replica + {workers} worker{'s' if workers > 1 else ''} x {slots} slots"
            try:
                rate, d = cluster_run(workers, slots, jobs, timeout, args.keep)
            except Exception as err:  # the other figures still stand: report this one as not measured
                result.add(label, 0.0, "jobs/s", passed=False, note=f"did not run: {type(err).__name__}: "
                           f"{str(err)[:300]}")
                continue
            details[f"qlactors_{workers}_worker"] = d
            ok = d["counts"].get("succeeded", 0) >= jobs
            cpu = d["cpu_ms_per_run"]
            note = (f"CPU ms/run: replica {cpu['replica']}, its backends {cpu['replica_backends']} "
                    f"({d['replica_backends_seen']} seen), workers {cpu['workers']}, launchers {cpu['launchers']}"
                    + ("" if ok else f"; NOT all succeeded: {d['counts']}"))
            result.add(f"{label} vs Procrastinate", rate, "jobs/s", pro_rate,
                       f"Procrastinate, concurrency {slots}", note=note)
            result.add(f"{label} vs launcher ceiling", rate, "jobs/s", ceilings[workers * slots],
                       f"launcher ceiling, {workers * slots} at a time")
            if not ok:
                result.metrics[-2].passed = False
    finally:
        k.drop_databases()
    result.details = {**details, "machine": c.machine_notes()}
    return c.report(result, args.json)


if __name__ == "__main__":
    sys.exit(main())
