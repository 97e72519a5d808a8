#!/usr/bin/env python3
"""Cluster recovery throughput: one replica marking 1,000 expired attempts with evidence lost,
against the store's own recovery calls on an identical database, measured in the same run.

Setup, through the store API (store/dispatch/sessions.py, store/dispatch/offers.py, store/dispatch/fenced_reports.py,
store/dispatch/attestations.py) as a worker's reports would write it: a fresh PostgreSQL database, a task
`true` (`--retry-on-lost --max-attempts 2 --safety idempotent --backoff 1`), N runs, one worker
session that is offered, activates and starts all N, then attests each `stopped` (a trusted
fact, SEMANTICS.md §10 step 1) as a worker's Attest after a restart would. Only the leases'
expiry is direct SQL (`expires_at_ms = 1`, as tests/harness/session_steps.py `expire_lease`
does): waiting out a real run lease would only add time. That database is the template of two
copies (`CREATE DATABASE ... TEMPLATE`), so both sides start from the same rows.

Measured: on copy 1, one `qlactors control --config` replica (real process, cadence tick 1 s,
recovery page 16, the default) is started and timed until all N attempts are `lost`, and until
their runs are queued again as attempt 2 (the Retry step; no worker is connected, so they stay
queued). Baseline: on copy 2, this script makes the store calls of the two cadence steps that do
this work, a page of each per round as one cycle of the replica does: the recovery step's
(store/cadence/cluster_recovery.py `ClusterRecoveryCases.page(16)`, then `resolve` for each candidate)
and the Retry step's (store/cadence/lost_retry.py `lost_runs` + `resolve_lost`, `due_retries` +
`requeue`, 16 each), in one thread, with no actors and no cadence, until every run is queued
again: the floor for the same work on the same server. Why this baseline rather than the edge
startup pass (bench_recovery.py, SQLite, another code path) or cancels (another transaction):
it is the very same SQL on the very same rows, so the ratio is exactly what the replica's cycle
adds: the Scheduler round trips, the rest of each cycle (cron page, timeouts and stops,
admission, retention), and the continuation (`StepDone.more` asks for the next cycle at once
instead of waiting for the tick).

Rates and page times come from the `attempt.lost` events (database time) on both sides: the
attempts/s is (N - 1) / (last - first), and a page's time is the gap between the first events
of consecutive pages of 16 (a round: the recovery page and the retry page; on the replica,
the rest of its cycle too). No requirement is set (issue 11 asks for the figure).
"""

from __future__ import annotations

import math
import secrets
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _cluster as k  # noqa: E402
import _common as c  # noqa: E402

PAGE = 16
GRACE_MS, DRAIN_MS = 120_000, 900_000  # the defaults; a trusted fact needs no grace
BOOT = "boot-bench"


def fresh_hash() -> str:
    from qlactors.domain.receipt import token_hash

    return token_hash(secrets.token_urlsafe(32))


def seed(url: str, attempts: int) -> float:
    """`attempts` running attempts of one session, each attested `stopped`, leases expired.
    Returns the seconds it took."""
    from sqlalchemy import update

    from qlactors.domain.model import Command, TaskSpec
    from qlactors.domain.retry import RetryPolicy
    from qlactors.domain.states import RetrySafety
    from qlactors.store.dispatch.dispatch import Dispatch
    from qlactors.store.records import LeaseQuote
    from qlactors.store.repository import Repository
    from qlactors.store.schema import run_dispatch_leases

    start = time.perf_counter()
    repo = Repository.open(k.with_app_name(url, "qlbench-seed"))
    try:
        policy = RetryPolicy(max_attempts=2, retry_on_lost=True, safety=RetrySafety.IDEMPOTENT, backoff_base_ms=1_000)
        repo.tasks.add(TaskSpec(name="idem", command=Command.from_words(["true"]), max_concurrent=attempts,
                                retry=policy), actor_name="tester")
        for _ in range(attempts):
            repo.runs.request("idem")
        dispatch = Dispatch.open(repo.store)
        session = dispatch.sessions.register("wseed", attempts, boot_id=BOOT, session_lease_ms=600_000,
                                            resume_secret_hash=fresh_hash())
        flights = []
        while len(flights) < attempts:
            pairs = [(secrets.token_hex(8), fresh_hash()) for _ in range(min(200, attempts - len(flights)))]
            offers = dispatch.offers.batch(session.worker_id, session.session_id, session.generation, pairs,
                                          log_cap_bytes=0, lease_ttl_ms=600_000)
            if not offers:
                raise RuntimeError(f"only {len(flights)} of {attempts} runs could be offered")
            lease_hash = dict(pairs)
            flights += [(offer, lease_hash[offer.offer_id]) for offer in offers]
        for i, (offer, lease_hash) in enumerate(flights):
            fence = offer.fence(lease_hash)
            if dispatch.reports.activate(fence, fresh_hash(), "log").result != "applied":
                raise RuntimeError(f"activate of {offer.attempt_id} not applied")
            if dispatch.reports.started(fence, BOOT, 100_000 + i, 100_000 + i, 1).result != "applied":
                raise RuntimeError(f"started of {offer.attempt_id} not applied")
            quote = LeaseQuote(offer.run_id, offer.attempt_id, offer.offer_id, offer.lease_generation, lease_hash)
            answer = dispatch.attestations.apply(session.worker_id, session.session_id, session.generation, quote,
                                     session.session_id, session.generation, "stopped", run_lease_ms=30_000)
            if answer.result != "applied":
                raise RuntimeError(f"attest stopped of {offer.attempt_id}: {answer.result}")
        with repo.store.write() as conn:  # the leases' expiry: direct SQL, as expire_lease in the tests
            conn.execute(update(run_dispatch_leases).where(run_dispatch_leases.c.status == "leased")
                         .values(expires_at_ms=1))
    finally:
        repo.close()
    return time.perf_counter() - start


def sql(url: str, query: str, *args) -> list[tuple]:
    import psycopg

    with psycopg.connect(k.libpq(k.with_app_name(url, "qlbench-probe")), autocommit=True) as conn:
        return conn.execute(query, args).fetchall()


def lost_times(url: str) -> list[int]:
    """The `attempt.lost` events' database times, in the order they were written."""
    return [row[0] for row in sql(url, "SELECT created_at_ms FROM run_events WHERE type = 'attempt.lost' "
                                       "ORDER BY created_at_ms, id")]


def figures(times: list[int]) -> dict:
    span_s = (times[-1] - times[0]) / 1000
    starts = times[::PAGE]
    gaps = [(b - a) for a, b in zip(starts, starts[1:])]
    return {"lost": len(times), "span_s": span_s, "per_s": (len(times) - 1) / span_s if span_s else math.inf,
            "pages": len(starts), "page_ms_p50": c.percentile(gaps, 50) if gaps else 0,
            "page_ms_p95": c.percentile(gaps, 95) if gaps else 0}


def floor(url: str, attempts: int) -> dict:
    """The store calls of a replica's cycle's recovery and retry steps (a page of each), in this
    process, until every run is queued again."""
    from qlactors.store.cadence.cluster_recovery import ClusterRecoveryCases
    from qlactors.store.cadence.lost_retry import LostRetry
    from qlactors.store.repository import Repository

    repo = Repository.open(k.with_app_name(url, "qlbench-floor"))
    try:
        cases = ClusterRecoveryCases(repo.store, recovery_grace_ms=GRACE_MS, drain_grace_ms=DRAIN_MS)
        retries = LostRetry(repo.store)
        start, applied, refused, requeued = time.perf_counter(), 0, 0, 0
        deadline = time.monotonic() + 300
        while requeued < attempts and time.monotonic() < deadline:
            page, _more = cases.page(PAGE)
            for candidate in page:
                if cases.resolve(candidate).result == "applied":
                    applied += 1
                else:
                    refused += 1
            for run_id in retries.lost_runs(PAGE):
                retries.resolve_lost(run_id)
            due = retries.due_retries(PAGE)
            for run_id in due:
                requeued += retries.requeue(run_id).result == "applied"
            if not page and not due:
                time.sleep(0.05)  # only backoffs left to run out
        elapsed = time.perf_counter() - start
    finally:
        repo.close()
    return {"applied": applied, "refused": refused, "requeued": requeued, "wall_s": elapsed,
            **requeue_figures(url), **figures(lost_times(url))}


def requeue_figures(url: str) -> dict:
    first_lost, last_queued = sql(url, "SELECT (SELECT min(created_at_ms) FROM run_events "
                                       "WHERE type = 'attempt.lost'), (SELECT max(created_at_ms) FROM run_events "
                                       "WHERE type = 'run.queued')")[0]
    return {"first_lost_to_last_requeued_s": (last_queued - first_lost) / 1000}


def replica(url: str, attempts: int, keep: bool) -> dict:
    root = k.create_scratch("recoverycluster", keep)
    cluster = k.Cluster(root=root, database_url=url, control_extra={"recovery_grace_ms": GRACE_MS})
    try:
        cluster.setup(1)
        spawned = time.monotonic()
        cluster.start_replica(0)
        up_s = time.monotonic() - spawned

        def lost() -> int:
            return sql(url, "SELECT count(*) FROM run_attempts WHERE number = 1 AND status = 'lost'")[0][0]
        c.wait_until(lambda: lost() == attempts, 300, poll=0.2, what=f"{attempts} attempts lost")
        all_lost_s = time.monotonic() - spawned
        c.wait_until(lambda: sql(url, "SELECT count(*) FROM runs r JOIN run_attempts a ON a.run_id = r.id "
                                      "AND a.number = 2 WHERE r.status = 'queued'")[0][0] == attempts,
                     120, poll=0.2, what=f"{attempts} runs queued again")
        requeued_s = time.monotonic() - spawned
        log = cluster.replicas[0].log()
    except BaseException:
        print(cluster.logs_tail(), file=sys.stderr)
        raise
    finally:
        cluster.close()
    return {"up_s": up_s, "all_lost_s": all_lost_s, "requeued_s": requeued_s, **requeue_figures(url),
            "recovered_lines": log.count("event=attempt_recovered"),
            "refused_lines": log.count("event=recovery_refused"),
            **figures(lost_times(url))}


def main(argv: list[str] | None = None) -> int:
    p = c.parser(__doc__.splitlines()[0])
    p.add_argument("--attempts", type=int, help="expired attempts with evidence (default 1000, quick 200)")
    args = p.parse_args(argv)
    attempts = args.attempts or (200 if args.quick else 1000)
    result = c.Result("recovery_cluster", args.quick)
    try:
        seed_url = k.create_database("qlbench_rcseed")
        seed_s = seed(seed_url, attempts)
        measured_url = k.create_database("qlbench_rc", template=seed_url)
        floor_url = k.create_database("qlbench_rcfloor", template=seed_url)
        base = floor(floor_url, attempts)
        d = replica(measured_url, attempts, args.keep)
    finally:
        k.drop_databases()
    if base["applied"] != attempts or base["requeued"] != attempts or d["lost"] != attempts:
        raise RuntimeError(f"lost: replica {d['lost']}, floor {base['applied']} (refused {base['refused']}, "
                           f"requeued {base['requeued']}) of {attempts}")
    floor_name = "the two steps' store calls alone, same rows, same run"
    result.add(f"replica: {attempts} expired attempts with evidence marked lost", d["per_s"], "attempts/s",
               base["per_s"], floor_name,
               note=f"first to last lost {d['span_s']:.2f} s (floor {base['span_s']:.2f} s); spawn -> all lost "
                    f"{d['all_lost_s']:.1f} s (start-up {d['up_s']:.1f} s); {d['pages']} pages")
    result.add(f"replica: time per page of {PAGE}, p50", d["page_ms_p50"], "ms", base["page_ms_p50"], floor_name,
               note=f"p95 {d['page_ms_p95']:.0f} ms (floor {base['page_ms_p95']:.0f} ms); the cadence tick is "
                    "1000 ms: a page per tick would be 1000")
    result.add(f"replica: first lost -> all {attempts} runs queued again (attempt 2)",
               d["first_lost_to_last_requeued_s"], "s", base["first_lost_to_last_requeued_s"], floor_name,
               note=f"backoff 1 s; spawn -> all queued {d['requeued_s']:.1f} s")
    result.details = {"attempts": attempts, "page": PAGE, "seed_s": round(seed_s, 1), "replica": d, "floor": base,
                      "machine": c.machine_notes()}
    return c.report(result, args.json)


if __name__ == "__main__":
    sys.exit(main())
