#!/usr/bin/env python3
"""Control-plane capacity: protocol-level load clients against 1 and 2 control replicas, with
statements, transactions and replica CPU per run, against Procrastinate measured in the same run.

Per replica count R: a fresh PostgreSQL database, real CURVE keys, R `qlactors control --config`
processes on 127.0.0.1 (heartbeat 1 s, cadence 1 s), each started with `QLACTORS_COUNT_SQL=FILE`
(the replica counts its statements per kind and its commits and rollbacks, qlactors/store/
sql_counts.py), a task `true`, N runs requested up front. Then C load clients (processes,
_load_client.py; client i talks to replica i mod R), each with its own allowed key and S slots,
register; once all have their Welcome the clock starts and they run the real protocol, spawning
nothing, until N runs are completed. The clock stops at the N-th applied Completed.

Per run (N runs): statements and transactions (commits + rollbacks) of every replica, from 1 s
before the clock starts to 1.5 s after it stops (so the idle cycles at both ends are in, a
cadence's worth), and `pg_stat_database.xact_commit` of the database beside it; replica CPU
(utime+stime of the replica processes, /proc) while the clock runs; their PostgreSQL backends'
CPU beside it (sampled as in bench_cluster.py). Runs/s per replica is reported against
Procrastinate 3.x's end-to-end rate (one worker, concurrency S, spawning `true`), same run.

Requirements (issue 10): <= 25 statements and <= 4 transactions per run on the control side,
<= 2 ms of replica CPU per run.
"""

from __future__ import annotations

import json
import multiprocessing
import queue
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _cluster as k  # noqa: E402
import _common as c  # noqa: E402
import _load_client  # noqa: E402
import _procrastinate  # noqa: E402


def _read_counts(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return {"statements": 0, "commits": 0, "rollbacks": 0, "kinds": {}, "compiled": {}}


def _sum_counts(paths: list[Path]) -> dict:
    total = {"statements": 0, "transactions": 0, "kinds": {}, "compiled": 0}
    for path in paths:
        d = _read_counts(path)
        total["statements"] += d["statements"]
        total["transactions"] += d["commits"] + d["rollbacks"]
        total["compiled"] += sum(d.get("compiled", {}).values())
        for kind, n in d["kinds"].items():
            total["kinds"][kind] = total["kinds"].get(kind, 0) + n
    return total


def capacity_run(replicas: int, clients: int, slots: int, jobs: int, heartbeat_ms: int,
                 timeout: float, keep: bool) -> dict:
    root = k.create_scratch(f"control{replicas}", keep)
    cluster = k.Cluster(root=root, database_url=k.create_database("qlbench_control"), heartbeat_ms=heartbeat_ms)
    mp = multiprocessing.get_context("spawn")
    procs: list = []
    try:
        cluster.setup(replicas)
        count_files = [root / f"sql-r{i}.json" for i in range(replicas)]
        nodes = [cluster.start_replica(i, count_sql=count_files[i]) for i in range(replicas)]
        cluster.cli("task", "add", "noop", "--max-concurrent", str(clients * slots), "--", "true")
        names = [f"lc{i + 1}" for i in range(clients)]
        for name in names:
            cluster.new_key(name)
            cluster.allow(name)
        k.request_runs(cluster.database_url, "noop", jobs)
        go, stop, done, results = mp.Event(), mp.Event(), mp.Value("i", 0), mp.Queue()
        for i, name in enumerate(names):
            endpoint = f"tcp://127.0.0.1:{cluster.ports[i % replicas]}"
            proc = mp.Process(target=_load_client.run_client, daemon=True,
                              args=(name, endpoint, str(cluster.keys), slots, heartbeat_ms, go, stop, done,
                                    jobs, results))
            proc.start()
            procs.append(proc)
        registered, tallies = 0, {}
        deadline = time.monotonic() + 60
        while registered < clients:
            try:
                item = results.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(f"{registered} of {clients} load clients registered within 60 s") from None
            if item[0] == "registered":
                registered += 1
            else:
                raise RuntimeError(f"load client {item[1]} ended before it registered: {item[2]['errors']}")
        time.sleep(1.0)  # idle: the counts' window opens a cadence before the clock
        backends = k.Backends(cluster.database_url, [cluster.replica_name(i) for i in range(replicas)])
        sql0, xact0 = _sum_counts(count_files), k.xact_commits(cluster.database_url)
        backends.start()
        cpu0 = [c.cpu_seconds(n.pid) for n in nodes]
        start = time.perf_counter()
        go.set()
        with k.Sampler(backends.sample):
            c.wait_until(lambda: done.value >= jobs or not all(p.is_alive() for p in procs), timeout,
                         poll=0.01, what=f"{jobs} completed runs")
            elapsed = time.perf_counter() - start
            backends.sample()
            cpu = [c.cpu_seconds(n.pid) - c0 for n, c0 in zip(nodes, cpu0)]
        stop.set()
        _load_client.collect_tallies(results, tallies, clients)
        time.sleep(1.5)  # the replicas' last statements and their counts' files written
        sql1, xact1 = _sum_counts(count_files), k.xact_commits(cluster.database_url)
        counts = k.run_counts(cluster.database_url)
    except BaseException:
        print(cluster.logs_tail(), file=sys.stderr)
        raise
    finally:
        _load_client.stop_processes(procs)
        cluster.close()
    completed = done.value
    runs = max(1, completed)
    kinds = {kind: n - sql0["kinds"].get(kind, 0) for kind, n in sql1["kinds"].items()}
    kinds = {kind: round(n / runs, 2) for kind, n in sorted(kinds.items(), key=lambda kv: -kv[1]) if n > 0}
    return {
        "replicas": replicas, "clients": clients, "slots": slots, "runs": completed, "elapsed_s": round(elapsed, 3),
        "runs_per_s": completed / elapsed, "statements_per_run": (sql1["statements"] - sql0["statements"]) / runs,
        "transactions_per_run": (sql1["transactions"] - sql0["transactions"]) / runs,
        "compiled_per_run": (sql1["compiled"] - sql0["compiled"]) / runs,
        "xact_commit_per_run": (xact1 - xact0) / runs,
        "replica_cpu_ms_per_run": sum(cpu) * 1000 / runs, "replica_cpu_s": [round(x, 3) for x in cpu],
        "backends_cpu_ms_per_run": backends.delta() * 1000 / runs, "backends_seen": backends.count(),
        "statements_per_run_by_kind": kinds, "counts": counts,
        "clients_tally": {n: {key: v for key, v in t.items() if key not in ("first_pull_at", "last_completed_at")}
                          for n, t in tallies.items()}}


def main(argv: list[str] | None = None) -> int:
    p = c.parser(__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, help="runs per replica count (default 1000, quick 200)")
    p.add_argument("--clients", type=int, default=4, help="load client processes (default 4)")
    p.add_argument("--slots", type=int, default=8, help="slots per load client, Procrastinate's concurrency "
                   "(default 8)")
    p.add_argument("--heartbeat-ms", type=int, default=1000, help="the replicas' heartbeat interval (default 1000)")
    args = p.parse_args(argv)
    jobs = args.jobs or (200 if args.quick else 1000)
    timeout = max(120.0, jobs * 0.5)
    result = c.Result("control_plane", args.quick)
    details: dict = {"jobs": jobs, "clients": args.clients, "slots": args.slots, "heartbeat_ms": args.heartbeat_ms}
    try:
        pro_rate, pro = _procrastinate.run(jobs, args.slots, ["true"], timeout)
        details["procrastinate"] = pro
        result.add(f"Procrastinate 3.x end to end, 1 worker, concurrency {args.slots} (the reference)", pro_rate,
                   "jobs/s", note=f"CPU ms/job: worker {pro['worker_cpu_ms_per_job']}, its children "
                                  f"{pro['children_cpu_ms_per_job']}, its backends {pro['backends_cpu_ms_per_job']}")
        for replicas in (1, 2):
            tag = f"{replicas} replica{'s' if replicas > 1 else ''}"
            try:
                d = capacity_run(replicas, args.clients, args.slots, jobs, args.heartbeat_ms, timeout, args.keep)
            except Exception as err:  # the other figures still stand: report this one as not measured
                result.add(f"{tag}: control plane", 0.0, "runs/s", passed=False,
                           note=f"did not run: {type(err).__name__}: {str(err)[:300]}")
                continue
            details[f"replicas_{replicas}"] = d
            top = ", ".join(f"{kind} {n}" for kind, n in list(d["statements_per_run_by_kind"].items())[:8])
            short = d["runs"] < jobs
            m = result.add(f"{tag}: statements per run", d["statements_per_run"], "statements", requirement="<= 25",
                           passed=d["statements_per_run"] <= 25 and not short,
                           note=f"per kind: {top}; compiled (not from SQLAlchemy's cache): "
                                f"{d['compiled_per_run']:.3f} per run")
            if short:
                m.note += f"; only {d['runs']} of {jobs} runs completed: {d['clients_tally']}"
            result.add(f"{tag}: transactions per run", d["transactions_per_run"], "transactions",
                       requirement="<= 4", passed=d["transactions_per_run"] <= 4 and not short,
                       note=f"the server's pg_stat_database xact_commit per run: {d['xact_commit_per_run']:.2f}")
            result.add(f"{tag}: replica CPU per run", d["replica_cpu_ms_per_run"], "ms", requirement="<= 2 ms",
                       passed=d["replica_cpu_ms_per_run"] <= 2 and not short,
                       note=f"its PostgreSQL backends: {d['backends_cpu_ms_per_run']:.2f} ms per run "
                            f"({d['backends_seen']} backends)")
            result.add(f"{tag}: runs/s per replica ({args.clients} clients x {args.slots} slots)",
                       d["runs_per_s"] / replicas, "runs/s", pro_rate,
                       f"Procrastinate end to end, concurrency {args.slots}")
    finally:
        k.drop_databases()
    result.details = {**details, "machine": c.machine_notes()}
    return c.report(result, args.json)


if __name__ == "__main__":
    sys.exit(main())
