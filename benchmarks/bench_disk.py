#!/usr/bin/env python3
"""Bytes written to disk per run (runtime plus launchers), from /proc/PID/io, against a floor loop.

What is counted. `write_bytes` of /proc/PID/io is what a process (all its threads) caused to be
sent to the storage layer, charged when a page-cache page is dirtied, and Linux ADDS A REAPED
CHILD'S COUNTERS TO ITS PARENT'S (wait_task_zombie). The runtime reaps every launcher it spawns,
and each launcher reaps its helpers (head, mv, ln, sync, rm ...) and its job, so the runtime's
`write_bytes` delta over N runs, read once the N runs are terminal and their journal rows are
cleared, is runtime + launcher trees + jobs (`true` writes nothing). Also reported:
  * the launcher trees' share alone: N launchers run directly from this process with the
    executor's environment (same launcher.sh, same shell, log cap on), via
    qlactors.process.launch.spawn, reaped here, delta of this process's own counters;
  * `cancelled_write_bytes` (dirty pages dropped before writeback by truncate/unlink, e.g. a
    receipt deleted within seconds): `write_bytes - cancelled` is the net estimate;
  * whole-device sectors written (/sys/block/DEV/stat) over the same window: this includes the
    ext4 journal (jbd2) and metadata writes that no process is charged for, and EVERYTHING
    else the machine wrote meanwhile (shared machine: an upper bound, noisy).
Not counted by write_bytes: filesystem metadata/journal blocks (directory entries and inodes
of the log, receipt, marker, FIFO and temp files), which the device figure shows.

Runtime: default `edge` profile on a fresh home, task `true`, N runs (default 100, quick 30),
each requested through the API, nudged and awaited before the next (a backlog would drain at one
run per 5 s cadence tick on this profile: see bench_throughput's backlog figure). Baseline (same run): the floor loop of
bench_throughput (SQLite row insert + update around `subprocess` `true`, WAL, synchronous=FULL),
N jobs, bytes per job from this process's own counters. No requirement: reported.
"""

from __future__ import annotations

import os
import sqlite3
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as c  # noqa: E402
from bench_throughput import floor_loop  # noqa: E402


def device_sectors(path: Path) -> tuple[str, int] | None:
    """(device name, sectors written) of the block device holding `path`, if readable."""
    try:
        dev = os.stat(path).st_dev
        major, minor = os.major(dev), os.minor(dev)
        for name in os.listdir("/sys/block"):
            with open(f"/sys/block/{name}/dev") as fh:
                if fh.read().strip() == f"{major}:{minor}":
                    with open(f"/sys/block/{name}/stat") as st:
                        return name, int(st.read().split()[6])
    except OSError:
        return None
    return None


def journal_rows(home: Path) -> int:
    conn = sqlite3.connect(f"file:{c.database_path(home)}?mode=ro", uri=True, timeout=5)
    try:
        return conn.execute("SELECT COUNT(*) FROM executor_journal").fetchone()[0]
    finally:
        conn.close()


def runtime_bytes(home: Path, n: int) -> dict:
    from qlactors.runtime.home import nudge
    from qlactors.store.repository import Repository

    c.add_task(home, "noop", ["true"])
    edge = c.Edge(home).start()
    try:
        edge.wait_up()
        time.sleep(1.0)
        repo = Repository.open(c.database_url(home))
        try:
            io0 = c.io_counters(edge.pid)
            req0 = c.io_counters()
            dev0 = device_sectors(home)
            for i in range(n):  # one at a time, like `qlactors run --wait` (see the README on why)
                run_id = repo.runs.request("noop").run.id
                nudge(home)
                c.wait_until(lambda: repo.runs.get(run_id).state in c.TERMINAL, 30, poll=0.01,
                             what=f"run {i + 1} of {n}")
            req1 = c.io_counters()  # this process wrote the requests (what `qlactors run` would)
            c.wait_until(lambda: journal_rows(home) == 0, 30, what="journal cleared")
            time.sleep(0.5)
            io1 = c.io_counters(edge.pid)
            dev1 = device_sectors(home)
        finally:
            repo.close()
    finally:
        edge.stop()
    out = {k: io1[k] - io0[k] for k in io0}
    out["device"] = None if not dev0 or not dev1 else {"name": dev0[0], "bytes": (dev1[1] - dev0[1]) * 512}
    out["requests"] = {k: req1[k] - req0[k] for k in req0}
    return out


def launcher_bytes(root: Path, n: int, shell: str = "/bin/sh") -> dict:
    """N launcher trees run directly (the executor's environment), reaped by this process."""
    from qlactors.process.launch import job_environment, spawn, uptime_ms

    receipts, logs = root / "receipts" / "ab", root / "logs" / "cd"
    receipts.mkdir(parents=True, mode=0o700)
    logs.mkdir(parents=True, mode=0o700)
    io0 = c.io_counters()
    for i in range(n):
        attempt = f"0000-attempt-{i:05d}"
        env = job_environment(os.environ, {})
        env.update({
            "QLACTORS_RUN_ID": f"0000-run-{i:05d}", "QLACTORS_ATTEMPT_ID": attempt,
            "QLACTORS_RECEIPT_DIR": str(receipts),
            "QLACTORS_MARKER": str(receipts / f"{attempt}.start"),
            "QLACTORS_LOG": str(logs / attempt), "QLACTORS_LOG_CAP": str(4 * 1024 * 1024),
            "QLACTORS_DROPPED": str(receipts / f"{attempt}.dropped"),
            "QLACTORS_CLOCK_BASE_MS": str(time.time_ns() // 1_000_000 - uptime_ms()),
        })
        (logs / attempt).touch(mode=0o600)
        pid = spawn(["true"], env, token="tok" + "x" * 40, shell=shell)
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise RuntimeError(f"launcher exited {os.waitstatus_to_exitcode(status)}")
    io1 = c.io_counters()
    receipts_made = len(list(receipts.glob("*.json")))
    if receipts_made != n:
        raise RuntimeError(f"expected {n} receipts, found {receipts_made}")
    return {k: io1[k] - io0[k] for k in io0}


def main(argv: list[str] | None = None) -> int:
    p = c.parser(__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, help="runs (default 100, quick 30)")
    args = p.parse_args(argv)
    n = args.runs or (30 if args.quick else 100)
    result = c.Result("disk", args.quick)
    home = c.temp_home("disk", args.keep)
    home.mkdir(parents=True)

    floor_dir = home.parent / "floor"
    floor_dir.mkdir()
    io0 = c.io_counters()
    floor_loop(floor_dir / "floor.db", n, 1)
    io1 = c.io_counters()
    floor = {k: io1[k] - io0[k] for k in io0}

    launchers = launcher_bytes(home.parent / "direct", n)
    runtime = runtime_bytes(home, n)

    per = lambda d, k="write_bytes": d[k] / n  # noqa: E731
    net = lambda d: (d["write_bytes"] - d["cancelled_write_bytes"]) / n  # noqa: E731
    req = runtime["requests"]
    total = (runtime["write_bytes"] + req["write_bytes"]) / n
    total_net = net(runtime) + net(req)
    result.add("total per run: request + runtime + launchers (write_bytes)", total / 1024, "KiB",
               per(floor) / 1024, "floor loop write_bytes per job")
    result.add("total per run, net of cancelled_write_bytes", total_net / 1024, "KiB", net(floor) / 1024,
               "floor loop, net")
    result.add("runtime process incl. its reaped launchers, per run", per(runtime) / 1024, "KiB",
               per(floor) / 1024, "floor loop write_bytes per job")
    result.add("  of which launcher tree (measured apart), per run", per(launchers) / 1024, "KiB",
               per(floor) / 1024, "floor loop write_bytes per job",
               note=f"net of cancelled: {net(launchers) / 1024:.1f} KiB; "
                    f"{per(launchers, 'syscw'):.0f} write calls/run")
    result.add("  of which runtime process alone (difference), per run",
               (runtime["write_bytes"] - launchers["write_bytes"]) / n / 1024, "KiB", per(floor) / 1024,
               "floor loop write_bytes per job")
    result.add("request side (the run request transaction, what `qlactors run` writes), per run",
               per(req) / 1024, "KiB", per(floor) / 1024, "floor loop write_bytes per job")
    if runtime.get("device"):
        result.add(f"whole device {runtime['device']['name']} during the runtime phase, per run "
                   "(includes ext4 journal + other processes)", runtime["device"]["bytes"] / n / 1024, "KiB",
                   note="shared machine: upper bound")
    result.details = {"runs": n, "runtime_io": runtime, "launcher_io": launchers, "floor_io": floor,
                      "machine": c.machine_notes()}
    return c.report(result, args.json)


if __name__ == "__main__":
    sys.exit(main())
