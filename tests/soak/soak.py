"""The cluster soak (issue 11): `tox -e soak` (or `python tests/soak/soak.py --minutes 20`).

A private PostgreSQL, 2 control replicas and 2 workers (4 slots each) on 127.0.0.1; two cron
tasks and manual runs submitted continuously of a mix of tasks (short and long, idempotent with
retry on lost, unknown safety, with a timeout); every 30 s a fault chosen by a seeded random
generator (faults.py); then everything settles and the invariant checker (invariants.py) judges
the whole soak from the database, the jobs' ledger and the faults. The seed is printed first;
the same seed gives the same sequence of faults. Exit status 0 when no invariant was violated.

Each job tells its start and end in a ledger (ledger.py)."""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import asdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "harness"), str(HERE.parent)]

from cluster_harness import TERMINAL, make_cluster  # noqa: E402
from faults import KINDS, Faults, now_ms  # noqa: E402
from invariants import Attempt, Chunk, Confirmation, Run, Withdrawal, check  # noqa: E402
from ledger import JOB, parse  # noqa: E402
from pg_private import PrivatePostgres, available  # noqa: E402

# heartbeat 5 s: the replicas' ZMTP heartbeat follows it (a connection closed 15 s after an
# unanswered PING), so a `replica_delay` of up to 12 s keeps the connection and the late answers
# arrive, as on a slow path; the run lease is the least it allows (2 heartbeats). The session
# lease outlasts the run lease (as the defaults' 45 s and 30 s do), so a run lease can lapse in a
# live session and its worker's renewal can still withdraw an operator's word about it
# (`confirm_stopped_thawed`, issue 26); the recovery grace is the least it allows (+ 30 s).
TIMINGS = dict(heartbeat_ms=5_000, session_lease_ms=15_000, run_lease_ms=10_000,
               recovery_grace_ms=45_000, cadence_tick_ms=200, db_timeout_ms=800,
               request_timeout_ms=1_500)
SLOTS = 4
IDEMPOTENT = ("--retry-on-lost", "--max-attempts", "3", "--safety", "idempotent", "--backoff", "1")
# name, sleep (s), options, weight among manual submissions (0: cron only)
TASKS = (
    ("short-idem", "0.3", IDEMPOTENT, 30),
    ("short-unsafe", "0.8", (), 33),
    ("long-idem", "8", IDEMPOTENT, 12),
    ("long-unsafe", "14", (), 8),
    ("longer-unsafe", "22", (), 6),  # outlive a replica_delay or replica_freeze (issue 17)
    ("longer-idem", "17", IDEMPOTENT, 4),
    ("timeout-unsafe", "20", ("--timeout", "4"), 7),
    ("tick", "0.2", ("--cron", "*/2 * * * * *", "--tz", "UTC", "--max-concurrent", "2"), 0),
    ("tock", "6", ("--cron", "*/20 * * * * *", "--tz", "UTC", *IDEMPOTENT), 0),
    # submitted only by `worker_restart_after_partition` and `confirm_stopped_thawed` just before
    # they strike (faults.SURVIVOR), so the worker holds a job that outlives the fault (issue 26)
    ("survivor", "45", (), 0),
)


def say(msg: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {msg}", flush=True)


class Submitter(threading.Thread):
    """Manual runs at about `rate` a second (exponential gaps), each with an idempotency key so
    a request whose answer a fault lost is asked again and admitted once."""

    def __init__(self, url: str, rng: random.Random, rate: float) -> None:
        super().__init__(daemon=True, name="submitter")
        self.url, self.rng, self.rate = url, rng, rate
        self.halt = threading.Event()
        self.submitted = 0
        self.retries = 0
        names = [t[0] for t in TASKS if t[3]]
        self.choices = (names, [t[3] for t in TASKS if t[3]])

    def run(self) -> None:
        from qlactors.store.engine import Store
        from qlactors.store.repository import Repository

        store = None
        while not self.halt.is_set():
            task = self.rng.choices(*self.choices)[0]
            key = f"soak-{self.submitted}"
            while not self.halt.is_set():
                try:
                    if store is None:
                        store = Store(self.url)
                    Repository(store).runs.request(task, idempotency_key=key)
                    break
                except Exception:  # the database restarting, or frozen: ask again
                    self.retries += 1
                    if store is not None:
                        store.close()
                        store = None
                    self.halt.wait(1)
            self.submitted += 1
            self.halt.wait(self.rng.expovariate(self.rate))
        if store is not None:
            store.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=20)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--interval", type=float, default=30, help="seconds between faults")
    ap.add_argument("--rate", type=float, default=1.0, help="manual runs submitted per second")
    ap.add_argument("--settle", type=float, default=300, help="seconds allowed to settle at the end")
    ap.add_argument("--out", type=Path, default=None, help="where to write the result (JSON)")
    ap.add_argument("--keep", action="store_true", help="keep the soak's directory (logs, ledger)")
    ap.add_argument("--only", "--kinds", dest="only", default=",".join(KINDS), help="the fault kinds to choose from (comma-separated)")
    args = ap.parse_args(argv)
    unknown = set(args.only.split(",")) - set(KINDS)
    if unknown:
        ap.error(f"--only: unknown fault kinds {sorted(unknown)}; the kinds: {', '.join(KINDS)}")
    seed = args.seed if args.seed is not None else int(time.time())
    say(f"seed={seed} qlactors={_qlactors_path()}")
    why = available()
    if why:
        say(f"cannot run: {why}")
        return 2
    rng = random.Random(seed)
    root = Path(tempfile.mkdtemp(prefix="qlt-soak-", dir="/tmp"))
    pg = PrivatePostgres()
    cluster = None
    out = args.out or Path(tempfile.gettempdir()) / f"qlactors-soak-{seed}.json"
    try:
        pg.start()
        (root / "cluster").mkdir()
        cluster = make_cluster(root / "cluster", replicas=2, timings=TIMINGS, admin_url=pg.url())
        result = soak(cluster, pg, rng, seed, args)
        out.write_text(json.dumps(result, indent=2, sort_keys=True))  # kept whatever the cleanup does
    finally:
        try:
            if cluster is not None:
                cluster.close()
        except Exception as e:  # the result stands; the server is stopped below all the same
            say(f"closing the cluster failed: {e!r}")
        finally:
            pg.close()
            if not args.keep:
                shutil.rmtree(root, ignore_errors=True)
    print_summary(result)
    say(f"result written to {out}" + (f"; directory kept: {root}" if args.keep else ""))
    return 0 if not result["violations"] else 1


def soak(cluster, pg, rng: random.Random, seed: int, args) -> dict:
    tag = uuid.uuid4().hex[:12]
    commit = _commit()  # the code that runs (HEAD may move while it does)
    ledger = cluster.root / "ledger"
    for name in ("w1", "w2"):
        cluster.new_key(name)
        cluster.allow(name)
    for name, sleep, options, _weight in TASKS:
        concurrent = () if "--max-concurrent" in options else ("--max-concurrent", "8")
        cluster.cli("task", "add", name, *concurrent, *options, "--env", f"SOAK_TAG={tag}", "--",
                    "sh", "-c", JOB.format(ledger=ledger, sleep=sleep))
    # Every worker reaches every replica through a proxy of its own (replica_delay holds one back).
    proxies = {name: cluster.route_through_proxies(name) for name in ("w1", "w2")}
    faults = Faults(cluster, pg, rng, tag, session_lease_s=TIMINGS["session_lease_ms"] / 1000,
                    run_lease_s=TIMINGS["run_lease_ms"] / 1000, slots=SLOTS, proxies=proxies)
    for name in ("w1", "w2"):
        cluster.start_worker(name, slots=SLOTS)
    began_ms = now_ms()
    faults.began = time.monotonic()
    submitter = Submitter(cluster.database_url, random.Random(rng.random()), args.rate)
    submitter.start()
    duration = args.minutes * 60
    kinds = args.only.split(",")
    say(f"running {args.minutes:g} min, a fault every {args.interval:g} s; cluster in {cluster.root}")
    try:
        k = 1
        while k * args.interval < duration:
            wait = k * args.interval - (time.monotonic() - faults.began)
            if wait > 0:
                time.sleep(wait)
            kind = rng.choice(kinds)
            done = faults.apply(kind)
            say(f"fault {k}: {done.kind} {done.target} at {done.at_s:g} s ({done.detail}); "
                f"{submitter.submitted} submitted")
            k += 1
        rest = duration - (time.monotonic() - faults.began)
        if rest > 0:
            time.sleep(rest)
    finally:
        submitter.halt.set()
        submitter.join(30)
    restarted = faults.ensure_all_up()
    for name, _sleep, options, _weight in TASKS:
        if "--cron" in options:
            cluster.cli("task", "disable", name)
    say(f"settling: {submitter.submitted} manual runs submitted; waiting up to {args.settle:g} s")
    settled = wait_settled(cluster, args.settle)
    ended_ms = now_ms()
    result = judge(cluster, faults, ledger, horizon_ms=ended_ms)
    result.update(seed=seed, minutes=args.minutes, interval_s=args.interval, rate=args.rate,
                  commit=commit, started_at_ms=began_ms, ended_at_ms=ended_ms,
                  settle_s=settled, restarted_at_settle=restarted, submitted=submitter.submitted,
                  submit_retries=submitter.retries, timings=TIMINGS, slots=SLOTS,
                  faults=[asdict(f) for f in faults.applied],
                  faults_by_kind=dict(Counter(f.kind for f in faults.applied)),
                  confirmations=faults.confirmations,
                  confirm_answers=dict(Counter(c["result"] for c in faults.confirmations)),
                  qlactors=_qlactors_path(),
                  process_logs=_process_log_notes(cluster))
    return result


def wait_settled(cluster, timeout: float) -> float:
    """Seconds until every run is terminal (or `timeout`)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            left = cluster.sql("SELECT count(*) FROM runs WHERE status <> ALL(%s)", list(TERMINAL))[0][0]
        except Exception:
            left = -1
        if left == 0:
            break
        time.sleep(2)
    return round(time.monotonic() - t0, 1)


def judge(cluster, faults: Faults, ledger: Path, *, horizon_ms: int) -> dict:
    runs = [Run(r, t, s, safety == "idempotent", code) for r, t, s, safety, code in cluster.sql(
        "SELECT r.id, t.name, r.status, tr.safety, r.error_code FROM runs r JOIN tasks t ON t.id = r.task_id "
        "JOIN task_revisions tr ON tr.task_id = r.task_id AND tr.revision = r.task_revision")]
    attempts = [Attempt(*row) for row in cluster.sql(
        "SELECT id, run_id, number, status, finished_at_ms, log_final_offset, error_code, lease_generation, "
        "evidence, evidence_by, evidence_lease_generation FROM run_attempts")]
    withdrawals = [Withdrawal(a, p.get("fact"), p.get("by"), p.get("lease_generation")) for a, p in (
        (a, json.loads(p)) for a, p in cluster.sql(
            "SELECT attempt_id, payload_json FROM run_events WHERE type = 'attempt.evidence_withdrawn'"))]
    confirmations = [Confirmation(c["attempt_id"], c["run_id"], c["lease_generation"], c["by"])
                     for c in faults.confirmations if c["result"] == "applied"]
    events = cluster.sql("SELECT run_id, type FROM run_events WHERE type LIKE 'run.%%'")
    chunks = [Chunk(*row) for row in cluster.sql("SELECT attempt_id, start_offset, length FROM log_chunks")]
    logs = {a: bytes(d) for a, d in cluster.sql(
        "SELECT attempt_id, string_agg(data, ''::bytea ORDER BY start_offset) FROM log_chunks GROUP BY attempt_id")}
    executions, unreadable = parse(ledger.read_text(errors="replace") if ledger.exists() else "")
    waiting = {}
    if any(r.status not in TERMINAL for r in runs):
        waiting = {w["run_id"]: w["why"] for w in cluster.cli_json("status").get("unresolved_recoveries", [])}
    found = check(runs, attempts, events, executions, chunks, killed_at_ms=faults.killed_at_ms,
                  horizon_ms=horizon_ms, waiting_why=waiting, logs=logs, slots=SLOTS,
                  confirmations=confirmations, withdrawals=withdrawals)
    for line in unreadable:
        found.add("ledger_unreadable", None, line[:200])
    _cli_logs_agree(cluster, found, runs, attempts, logs)
    return dict(runs=len(runs), runs_by_state=found.runs_by_state, runs_by_task=found.runs_by_task,
                attempts=found.attempts, executions=found.executions, retried_runs=found.retried_runs,
                idempotent_overlaps=found.idempotent_overlaps, groups_killed=len(faults.killed_at_ms),
                cron_runs=cluster.sql("SELECT count(*) FROM runs WHERE trigger_type = 'cron'")[0][0],
                not_succeeded=_not_succeeded(cluster),
                lost_attempts=dict(Counter(a.error_code or "-" for a in attempts if a.status == "lost")),
                withdrawals=len(withdrawals), confirm_outcomes=found.confirm_outcomes,
                confirmed=[dict(by=b, attempt_id=a, outcome=o) for b, a, o in found.confirmed],
                excused=[asdict(v) for v in found.excused],
                violations=[asdict(v) for v in found.violations])


def _not_succeeded(cluster) -> dict[str, int]:
    """How the runs that did not succeed ended: "task status error_code" -> how many."""
    rows = cluster.sql("SELECT t.name, r.status, coalesce(r.error_code, '-'), count(*) FROM runs r "
                       "JOIN tasks t ON t.id = r.task_id WHERE r.status <> 'succeeded' GROUP BY 1, 2, 3")
    return {f"{t} {s} {e}": n for t, s, e, n in sorted(rows)}


def _cli_logs_agree(cluster, found, runs, attempts, logs, sample: int = 10) -> None:
    """`qlactors logs RUN` gives back the whole stored log, for a sample of succeeded runs."""
    winner = {a.run_id: a.attempt_id for a in attempts if a.status == "succeeded"}
    ids = sorted(r.run_id for r in runs if r.status == "succeeded" and r.run_id in winner)
    for run_id in random.Random(0).sample(ids, min(sample, len(ids))):
        out = cluster.cli("logs", run_id, check=False)
        if out.returncode != 0 or out.stdout != logs.get(winner[run_id], b""):
            found.add("cli_log_differs", run_id, f"exit {out.returncode}: {out.stdout[:80]!r}")


def _process_log_notes(cluster) -> dict[str, dict[str, int]]:
    notes = {}
    for p in sorted(cluster.root.glob("*.log")):
        text = p.read_text(errors="replace")
        notes[p.stem] = {k: text.count(k) for k in ("event=actor_failed", "Traceback", "event=session_open",
                                                     "event=rebound", "event=stop_term", "event=launched")}
    return notes


def _qlactors_path() -> str:
    """Where the `qlactors` the soak's processes run comes from (they inherit its environment)."""
    import qlactors

    return str(Path(qlactors.__file__).resolve().parent)


def _commit() -> str:
    """HEAD's short hash, `-dirty` when the tree has changes; "unknown" outside a checkout."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=HERE, capture_output=True, text=True, timeout=10).stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        return (head + ("-dirty" if git("status", "--porcelain", "--untracked-files=no") else "")) or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def print_summary(r: dict) -> None:
    print(f"\n=== soak seed={r['seed']} commit={r['commit']} {r['minutes']:g} min ===")
    print(f"runs: {r['runs']} ({r['cron_runs']} cron, {r['submitted']} manual submitted) by state: "
          f"{json.dumps(r['runs_by_state'], sort_keys=True)}")
    for task, states in r["runs_by_task"].items():
        print(f"  {task}: {json.dumps(states, sort_keys=True)}")
    print(f"attempts: {r['attempts']}, executions in the ledger: {r['executions']}, runs retried: "
          f"{r['retried_runs']}, idempotent overlaps: {r['idempotent_overlaps']}, job groups killed: "
          f"{r['groups_killed']}, settled in {r['settle_s']} s")
    print(f"runs not succeeded (task state error): {json.dumps(r['not_succeeded'], sort_keys=True)}")
    print(f"faults by kind: {json.dumps(r['faults_by_kind'], sort_keys=True)}")
    print(f"lost attempts by code: {json.dumps(r['lost_attempts'], sort_keys=True)}")
    if r["confirmations"]:
        print(f"operator confirm-stopped: {len(r['confirmations'])} commands, answered "
              f"{json.dumps(r['confirm_answers'], sort_keys=True)}; recorded ones came to "
              f"{json.dumps(r['confirm_outcomes'], sort_keys=True)} ({r['withdrawals']} evidence_withdrawn events)")
        outcome = {(c["by"], c["attempt_id"]): c["outcome"] for c in r["confirmed"]}
        for c in r["confirmations"]:
            print(f"  {c['by']:<14} {c['worker']} run {c['run_id']} attempt {c['attempt_id']} gen "
                  f"{c['lease_generation']}: {c['result']} after {c['returned_after_s']} s, thawed at "
                  f"{c['thawed_after_s']} s -> {outcome.get((c['by'], c['attempt_id']), '-')}")
    for f in r["faults"]:
        print(f"  {f['at_s']:>7.1f} s  {f['kind']:<26} {f['target']:<18} {f['detail']}")
    bad = {k: v for k, v in r["process_logs"].items() if v["event=actor_failed"] or v["Traceback"]}
    print(f"process logs with actor_failed/Traceback: {json.dumps(bad, sort_keys=True) if bad else 'none'}")
    print(f"excused (an operator's confirm-stopped allowed them): {len(r['excused'])}")
    for v in r["excused"][:50]:
        print(f"  {v['kind']} run={v['run_id']}: {v['detail']}")
    print(f"violations: {len(r['violations'])}")
    for v in r["violations"][:50]:
        print(f"  {v['kind']} run={v['run_id']}: {v['detail']}")


if __name__ == "__main__":
    sys.exit(main())
