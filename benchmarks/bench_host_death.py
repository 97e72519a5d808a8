#!/usr/bin/env python3
"""Host death: the time from a worker host's death to its idempotent runs queued again, against
the configured recovery grace, measured in the same run.

A fresh PostgreSQL database, real CURVE keys, one `qlactors control --config` replica on
127.0.0.1 (heartbeat 1 s, session lease 5 s, run lease 3 s, recovery grace 35 s: the least a 5 s
session lease allows, session lease + the longest stop grace; cadence tick 1 s) and two workers
as real processes. A task `idem` (`--retry-on-lost --max-attempts 2 --safety idempotent
--backoff 1`) whose jobs wait for a release file; N runs all `running` on worker A; worker B
started. Then the host dies: every process group of A's attempts (`run_attempts.pgid`) and A
itself get SIGKILL, and nothing restarts; the release file is created at once, so attempt 2 on
B ends as soon as it starts.

Per run, from `run_events` (database time, the same clock as the kill's): the kill -> attempt 1
`attempt.lost` (recovery: the session's lease expired, then the grace, then a cadence page), and
the kill -> `run.queued` of attempt 2 (plus the Retry step's 1 s backoff and its page). p50 and
p95 of each, and their ratio to the configured grace. What to expect: at most the session lease
(the last heartbeat was up to 1 s before the kill) + the grace + a cadence tick for `lost`, and
+ the backoff + a tick more for queued again: ~41-43 s, a ratio of ~1.2. Never below the grace
(that would be a run started twice while the dead host's job might still run).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _cluster as k  # noqa: E402
import _common as c  # noqa: E402

TIMINGS = {"session_lease_ms": 5_000, "run_lease_ms": 3_000, "recovery_grace_ms": 35_000}
BACKOFF_MS = 1_000


def sql(database_url: str, query: str, *args) -> list[tuple]:
    import psycopg

    with psycopg.connect(k.libpq(k.with_app_name(database_url, "qlbench-probe")), autocommit=True) as conn:
        return conn.execute(query, args).fetchall()


def db_now_ms(database_url: str) -> int:
    return sql(database_url, "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint")[0][0]


def host_death(runs: int, keep: bool) -> dict:
    root = k.create_scratch("hostdeath", keep)
    cluster = k.Cluster(root=root, database_url=k.create_database("qlbench_hostdeath"), control_extra=TIMINGS)
    release = root / "release"
    # Bounded: a job whose release never comes (the script died) ends by itself after ~10 minutes.
    job = f"i=0; while [ ! -e {release} ] && [ $i -lt 3000 ]; do sleep 0.2; i=$((i+1)); done"
    url = cluster.database_url
    try:
        cluster.setup(1)
        cluster.start_replica(0)
        cluster.cli("task", "add", "idem", "--max-concurrent", str(runs), "--retry-on-lost", "--max-attempts",
                    "2", "--safety", "idempotent", "--backoff", str(BACKOFF_MS // 1000), "--", "sh", "-c", job)
        worker_a = cluster.start_worker("wa", slots=runs)
        k.request_runs(url, "idem", runs)
        c.wait_until(lambda: sql(url, "SELECT count(*) FROM run_attempts WHERE worker_id = 'wa' "
                                      "AND status = 'running'")[0][0] == runs, 120, poll=0.5,
                     what=f"{runs} runs running on worker wa")
        cluster.start_worker("wb", slots=runs)
        time.sleep(2.0)  # a heartbeat or two of both workers, as in steady state
        last_beat = sql(url, "SELECT lease_expires_at_ms FROM worker_sessions WHERE worker_id = 'wa' "
                             "AND status = 'online'")[0][0]
        killed = cluster.kill_host(worker_a, "wa")
        killed_at = db_now_ms(url)
        release.touch()
        if killed != runs:
            raise RuntimeError(f"{killed} of {runs} process groups of wa were alive to kill")

        def done() -> bool:
            return sql(url, "SELECT count(*) FROM runs WHERE status = 'succeeded'")[0][0] == runs
        c.wait_until(done, TIMINGS["recovery_grace_ms"] / 1000 + 90, poll=0.5, what="every run succeeded on wb")
        lost = dict(sql(url, "SELECT run_id, created_at_ms FROM run_events WHERE type = 'attempt.lost'"))
        queued = dict(sql(url, "SELECT run_id, max(created_at_ms) FROM run_events WHERE type = 'run.queued' "
                               "GROUP BY run_id HAVING count(*) = 2"))
        second_on_b = sql(url, "SELECT count(*) FROM run_attempts WHERE number = 2 AND worker_id = 'wb' "
                               "AND status = 'succeeded'")[0][0]
        codes = dict(sql(url, "SELECT error_code, count(*) FROM run_attempts WHERE number = 1 GROUP BY error_code"))
    except BaseException:
        print(cluster.logs_tail(), file=sys.stderr)
        raise
    finally:
        release.touch()
        cluster.close()
        cluster.kill_jobs_left(["wa", "wb"])
    if len(lost) != runs or len(queued) != runs:
        raise RuntimeError(f"{len(lost)} attempt.lost and {len(queued)} second run.queued events for {runs} runs")
    to_lost = [(t - killed_at) / 1000 for t in lost.values()]
    to_queued = [(t - killed_at) / 1000 for t in queued.values()]
    return {"runs": runs, "killed_at_ms": killed_at, "session_lease_expired_after_s": (last_beat - killed_at) / 1000,
            "to_lost_s": sorted(to_lost), "to_queued_s": sorted(to_queued), "second_attempts_on_wb": second_on_b,
            "first_attempt_codes": codes, **TIMINGS, "backoff_ms": BACKOFF_MS,
            "cadence_tick_ms": cluster.cadence_tick_ms}


def main(argv: list[str] | None = None) -> int:
    p = c.parser(__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, help="idempotent runs on the host that dies (default 50, quick 10)")
    args = p.parse_args(argv)
    runs = args.runs or (10 if args.quick else 50)
    result = c.Result("host_death", args.quick)
    try:
        d = host_death(runs, args.keep)
    finally:
        k.drop_databases()
    grace_s = d["recovery_grace_ms"] / 1000
    expected = d["session_lease_ms"] / 1000 + grace_s + d["cadence_tick_ms"] / 1000
    note = (f"{runs} runs; first attempts' codes {d['first_attempt_codes']}; {d['second_attempts_on_wb']} second "
            f"attempts succeeded on wb; wa's session lease ran out {d['session_lease_expired_after_s']:.1f} s "
            f"after the kill; expected at most session lease + grace + tick = {expected:g} s")
    early = min(d["to_lost_s"]) < grace_s
    for pct in (50, 95):
        result.add(f"kill -> attempt lost, p{pct}", c.percentile(d["to_lost_s"], pct), "s", grace_s,
                   "the configured recovery grace", requirement=">= the grace",
                   passed=not early, note=note if pct == 50 else "")
    for pct in (50, 95):
        result.add(f"kill -> queued again (attempt 2), p{pct}", c.percentile(d["to_queued_s"], pct), "s", grace_s,
                   "the configured recovery grace",
                   note=f"+ the Retry step: backoff {d['backoff_ms'] / 1000:g} s and its page" if pct == 50 else "")
    result.details = {**d, "machine": c.machine_notes()}
    return c.report(result, args.json)


if __name__ == "__main__":
    sys.exit(main())
