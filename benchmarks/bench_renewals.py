#!/usr/bin/env python3
"""Renewal cost: replica CPU spent renewing the leases of 1,000 running jobs, against the same
replica idle, measured in the same run.

Per heartbeat interval H (1 s, then the default 10 s): a fresh PostgreSQL database, real CURVE
keys, one `qlactors control --config` replica on 127.0.0.1 (heartbeat H, cadence 1 s), a task
`true` with room for every job, N runs requested up front. First the replica's CPU is read over
a window W with no client connected: the idle baseline. Then C load clients (processes,
_load_client.py in hold mode; real CURVE connections and messages, spawning nothing), each with
S slots, pull, activate and start N = C x S jobs and never finish them; once every client holds
all its slots, the replica's CPU (utime+stime of the process, /proc) and its PostgreSQL
backends' CPU are read over the same window W, during which the clients only heartbeat, each
heartbeat renewing every lease its client holds (one transaction per heartbeat, SEMANTICS.md §9
Renewal).

Reported: the replica's CPU per second with N running jobs against idle (ratio), the CPU per
1,000 renewals, and the share of one core the renewals of 1,000 running jobs take at heartbeat
H. No requirement is set (issue 11 asks for the figure).
"""

from __future__ import annotations

import multiprocessing
import queue
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _cluster as k  # noqa: E402
import _common as c  # noqa: E402
import _load_client  # noqa: E402


def hold_run(clients: int, slots: int, heartbeat_ms: int, window_s: float, keep: bool) -> dict:
    jobs = clients * slots
    root = k.create_scratch(f"renewals{heartbeat_ms}", keep)
    cluster = k.Cluster(root=root, database_url=k.create_database("qlbench_renewals"), heartbeat_ms=heartbeat_ms)
    mp = multiprocessing.get_context("spawn")
    procs: list = []
    try:
        cluster.setup(1)
        node = cluster.start_replica(0)
        cluster.cli("task", "add", "noop", "--max-concurrent", str(jobs), "--", "true")
        names = [f"hold{i + 1}" for i in range(clients)]
        for name in names:
            cluster.new_key(name)
            cluster.allow(name)
        k.request_runs(cluster.database_url, "noop", jobs)
        time.sleep(2.0)  # the replica's first cycles after the runs arrived
        idle0 = c.cpu_seconds(node.pid)
        time.sleep(window_s)
        idle_cpu = c.cpu_seconds(node.pid) - idle0

        go, stop, done, results = mp.Event(), mp.Event(), mp.Value("i", 0), mp.Queue()
        endpoint = f"tcp://127.0.0.1:{cluster.ports[0]}"
        for name in names:
            proc = mp.Process(target=_load_client.run_client, daemon=True,
                              args=(name, endpoint, str(cluster.keys), slots, heartbeat_ms, go, stop, done,
                                    jobs + 1, results, True))
            proc.start()
            procs.append(proc)
        go.set()
        holding, tallies = set(), {}
        deadline = time.monotonic() + 120
        while len(holding) < clients:
            try:
                item = results.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(f"{len(holding)} of {clients} load clients held all their slots "
                                   "within 120 s") from None
            if item[0] == "holding":
                holding.add(item[1])
            elif item[0] == "tally":
                raise RuntimeError(f"load client {item[1]} ended early: {item[2]['errors']}")
        time.sleep(heartbeat_ms / 1000 + 1.0)  # every client's first heartbeat with all its leases
        backends = k.Backends(cluster.database_url, [cluster.replica_name(0)])
        backends.start()
        cpu0 = c.cpu_seconds(node.pid)
        with k.Sampler(backends.sample):
            time.sleep(window_s)
            busy_cpu = c.cpu_seconds(node.pid) - cpu0
            backends.sample()
        stop.set()
        _load_client.collect_tallies(results, tallies, clients)
        running = k.run_counts(cluster.database_url).get("running", 0)
    except BaseException:
        print(cluster.logs_tail(), file=sys.stderr)
        raise
    finally:
        _load_client.stop_processes(procs)
        cluster.close()
    renewals_per_s = jobs * 1000 / heartbeat_ms
    return {"clients": clients, "slots": slots, "jobs": jobs, "heartbeat_ms": heartbeat_ms, "window_s": window_s,
            "running_at_end": running, "idle_cpu_s": round(idle_cpu, 4), "busy_cpu_s": round(busy_cpu, 4),
            "idle_cpu_per_s": idle_cpu / window_s, "busy_cpu_per_s": busy_cpu / window_s,
            "renewal_cpu_ms_per_1000": max(0.0, busy_cpu - idle_cpu) * 1000 / (renewals_per_s * window_s) * 1000,
            "backends_cpu_per_s": backends.delta() / window_s,
            "errors": {n: t["errors"] for n, t in tallies.items() if t["errors"]},
            "fenced": sum(t["fenced"] for t in tallies.values())}


def main(argv: list[str] | None = None) -> int:
    p = c.parser(__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=4, help="load client processes (default 4)")
    p.add_argument("--slots", type=int, default=250, help="slots per client (default 250: 1,000 jobs)")
    args = p.parse_args(argv)
    window = 10.0 if args.quick else 30.0
    result = c.Result("renewals", args.quick)
    details: dict = {}
    try:
        for heartbeat_ms in (1_000, 10_000):
            tag = f"heartbeat {heartbeat_ms / 1000:g} s"
            d = hold_run(args.clients, args.slots, heartbeat_ms, max(window, 3 * heartbeat_ms / 1000), args.keep)
            details[f"heartbeat_{heartbeat_ms}"] = d
            jobs = d["jobs"]
            note = (f"{d['running_at_end']} of {jobs} runs still running at the end; fenced {d['fenced']}"
                    + (f"; errors {d['errors']}" if d["errors"] else ""))
            result.add(f"{tag}: replica CPU per second, {jobs} running jobs", d["busy_cpu_per_s"] * 1000, "ms/s",
                       d["idle_cpu_per_s"] * 1000, "the same replica idle, same run", note=note,
                       passed=None if d["running_at_end"] == jobs and not d["fenced"] else False)
            result.add(f"{tag}: replica CPU per 1,000 renewals (above idle)", d["renewal_cpu_ms_per_1000"], "ms",
                       note=f"its PostgreSQL backends: {d['backends_cpu_per_s'] * 1000:.1f} ms/s")
            share = d["renewal_cpu_ms_per_1000"] * 1000 / heartbeat_ms / 1000  # of one core, 1,000 jobs
            result.add(f"{tag}: share of one core renewing 1,000 running jobs", share * 100, "%")
    finally:
        k.drop_databases()
    result.details = {**details, "machine": c.machine_notes()}
    return c.report(result, args.json)


if __name__ == "__main__":
    sys.exit(main())
