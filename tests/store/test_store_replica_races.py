"""Two control replicas racing on every pair of operations that share rows (SEMANTICS.md §9): two
Pulls, a Pull and a renewal, a renewal and a Completed, a Completed and a cancel, two recoveries
of one attempt and two retries of one lost run (§10).

"Two replicas" are two `Repository` objects on one fresh PostgreSQL schema, each with its own
connection pool and the server timeouts a replica sets (`DatabaseSettings.store_options()`),
driven from two threads released together. Every round asserts: no error (a deadlock, or a lock
wait beyond `lock_timeout`, would surface as `StoreUnavailable`), no duplicate (one lease per
attempt and offer, one terminal event per run) and no lost update (each run ends in exactly one
of the states the contract allows for that order).
"""

from __future__ import annotations

import secrets
import threading
import time

import pytest
from sqlalchemy import func, select, text, update

from qlactors.config import DatabaseSettings
from qlactors.domain.receipt import Receipt
from qlactors.domain.retry import RetryPolicy
from qlactors.store.cadence.cluster_recovery import ClusterRecoveryCases
from qlactors.store.dispatch.completion import CompletionService
from qlactors.store.cadence.control import Control
from qlactors.store.dispatch.dispatch import Dispatch
from qlactors.store.cadence.lost_retry import LostRetry
from qlactors.store.repository import Repository
from qlactors.store.schema import run_dispatch_leases, run_events
from store_helpers import db_state, new_hash, spec
from session_steps import beat, launch, register

pytestmark = pytest.mark.postgres

ROUNDS = 20
TERMINAL_EVENTS = ("run.succeeded", "run.failed", "run.cancelled", "run.timed_out")


class Replica:
    """What one control replica holds: its own pool and the store objects built on it."""

    def __init__(self, url: str) -> None:
        self.repo = Repository.open(url, **DatabaseSettings(url=url).store_options())
        self.dispatch = Dispatch.open(self.repo.store)
        self.completion = CompletionService(self.repo.store)

    def close(self) -> None:
        self.repo.close()


@pytest.fixture
def replicas(pg_schema_url):
    first = Replica(pg_schema_url)
    second = Replica(pg_schema_url)  # migrates nothing more: the first did, under the advisory lock
    try:
        yield first, second
    finally:
        second.close()
        first.close()


def race(*calls):
    """Run the calls at once, one thread each; their results in order. Any error fails the test."""
    barrier = threading.Barrier(len(calls), timeout=10)
    results: list = [None] * len(calls)
    errors: list = []

    def run(i, fn):
        try:
            barrier.wait()
            results[i] = fn()
        except Exception as err:  # reported below, with the others
            errors.append(err)

    threads = [threading.Thread(target=run, args=(i, fn)) for i, fn in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads), "a racing call did not finish"
    assert errors == [], errors
    return results


def pairs(n):
    return [(secrets.token_hex(8), new_hash()) for _ in range(n)]


def pull(replica, session, the_pairs):
    return replica.dispatch.offers.batch(session.worker_id, session.session_id, session.generation, the_pairs,
                                        log_cap_bytes=0, lease_ttl_ms=30_000)


def receipt(flight, exit_code=0, *, finished_at_ms):
    return Receipt(schema_version=2, run_id=flight.quote.run_id, attempt_id=flight.quote.attempt_id,
                   callback_sequence=1, token=flight.token, started_at_ms=1, finished_at_ms=finished_at_ms,
                   exit_code=exit_code, output_open=0)


def complete(replica, flight, worker_id, *, finished_at_ms=2):
    return replica.completion.complete(flight.quote.run_id, flight.quote.attempt_id,
                                       receipt(flight, finished_at_ms=finished_at_ms), worker_id=worker_id,
                                       final_log_offset=0)


def event_types(repo, run_id) -> list[str]:
    with repo.store.read() as conn:
        return list(conn.execute(select(run_events.c.type).where(run_events.c.run_id == run_id)
                                 .order_by(run_events.c.sequence)).scalars())


def leases_of(repo, run_ids) -> list:
    with repo.store.read() as conn:
        return conn.execute(select(run_dispatch_leases).where(run_dispatch_leases.c.run_id.in_(run_ids))).all()


def test_each_replica_sets_the_server_timeouts_a_replica_sets(replicas):
    settings = DatabaseSettings(url="")
    for replica in replicas:
        with replica.repo.store.read() as conn:
            shown = [conn.execute(text(f"SELECT current_setting('{name}')")).scalar_one()
                     for name in ("lock_timeout", "statement_timeout")]
        assert shown == [f"{settings.lock_timeout_ms // 1000}s", f"{settings.statement_timeout_ms // 1000}s"]


def test_two_pulls_through_two_replicas_lease_each_attempt_once_and_a_repeat_gets_the_same_offers(replicas):
    """Per round: one worker's Pull sent to both replicas at once (a failover repeat, the same
    pairs) and another worker's Pull, all on one task with room for 4."""
    a, b = replicas
    for r in range(ROUNDS):
        task = f"pulls{r}"
        a.repo.tasks.add(spec(task, max_concurrent=4), actor_name="tester")
        run_ids = [a.repo.runs.request(task).run.id for _ in range(5)]
        s = register(a.dispatch, f"ws{r}", capacity=3)
        t = register(b.dispatch, f"wt{r}", capacity=3)
        repeated, other = pairs(3), pairs(3)
        first, again, theirs = race(lambda: pull(a, s, repeated), lambda: pull(b, s, repeated),
                                    lambda: pull(b, t, other))
        assert first == again  # the same offers, whichever replica answered first
        offered = [o.attempt_id for o in first + theirs]
        assert len(offered) == len(set(offered)) == 4  # max_concurrent, never oversold
        leases = leases_of(a.repo, run_ids)
        assert sorted(lease.attempt_id for lease in leases) == sorted(offered)  # no second lease
        assert {lease.offer_id for lease in leases} <= {o for o, _ in repeated + other}


def test_a_pull_racing_a_renewal_of_the_same_session_renews_every_lease_and_never_oversells(replicas):
    """Per round: a session holding 3 running leases (capacity 6) heartbeats through one replica
    while its Pull for 3 more goes through the other: both lock the session row."""
    a, b = replicas
    for r in range(ROUNDS):
        session = register(a.dispatch, f"w{r}", capacity=6)
        flights = [launch(a.repo, a.dispatch, session) for _ in range(3)]
        task = f"more{r}"
        a.repo.tasks.add(spec(task, max_concurrent=3), actor_name="tester")
        queued = [a.repo.runs.request(task).run.id for _ in range(3)]
        answer, offers = race(lambda: beat(a.dispatch, session, 1, *(f.quote for f in flights)),
                              lambda: pull(b, session, pairs(3)))
        assert answer.fenced == () and len(answer.renewed) == 3
        assert sorted(o.run_id for o in offers) == sorted(queued)
        for flight in flights:  # renewed once: version 1 -> 2, still the one lease
            (lease,) = db_state(a.repo, flight.quote.run_id)[2]
            assert (lease["status"], lease["version"]) == ("leased", 2)
        with a.repo.store.read() as conn:
            live = conn.execute(select(func.count()).select_from(run_dispatch_leases).where(
                run_dispatch_leases.c.session_id == session.session_id,
                run_dispatch_leases.c.status == "leased")).scalar_one()
        assert live == 6  # the capacity, not more


def test_a_renewal_racing_completions_of_its_leases_loses_neither(replicas):
    """Per round: a heartbeat renewing 3 leases through one replica, their Completed through the
    other (in the opposite order): each lease is renewed then completed, or fenced as completed."""
    a, b = replicas
    for r in range(ROUNDS):
        session = register(a.dispatch, f"w{r}", capacity=4)
        flights = [launch(a.repo, a.dispatch, session) for _ in range(3)]
        answer, outcomes = race(lambda: beat(a.dispatch, session, 1, *(f.quote for f in flights)),
                                lambda: [complete(b, f, session.worker_id) for f in reversed(flights)])
        assert [o.result for o in outcomes] == ["applied"] * 3
        said = {x[0]: "renewed" for x in answer.renewed} | {x[0]: x[2] for x in answer.fenced}
        assert set(said) == {f.quote.attempt_id for f in flights}
        assert set(said.values()) <= {"renewed", "lease_completed"}
        for flight in flights:
            run, (attempt,), (lease,), _ = db_state(a.repo, flight.quote.run_id)
            assert (run["status"], attempt["status"], lease["status"]) == ("succeeded", "succeeded", "completed")
            # renewed first: version 2, then completed 3; fenced first: completed at 2
            renewed = said[flight.quote.attempt_id] == "renewed"
            assert lease["version"] == (3 if renewed else 2)
            types = event_types(a.repo, flight.quote.run_id)
            assert sum(t in TERMINAL_EVENTS for t in types) == 1


def test_a_completed_racing_a_cancel_ends_in_exactly_one_allowed_outcome(replicas):
    """Per round: a running job's Completed (exit 0, finished after the cancel's commit) through
    one replica and `cancel` through the other. SEMANTICS.md §5, §7 allow exactly two outcomes:
    completion first, `succeeded` and the cancel answered `already_terminal`; or the cancel first,
    recorded as an intent (`requested`, the job has a live process) and the Completed then lands
    as `cancelled` with the job's exit code kept."""
    a, b = replicas
    orders = set()
    for r in range(ROUNDS):
        session = register(a.dispatch, f"w{r}", capacity=1)
        flight = launch(a.repo, a.dispatch, session)
        later = int(time.time() * 1000) + 3_600_000  # after any commit of this test
        done, cancel = race(lambda: complete(a, flight, session.worker_id, finished_at_ms=later),
                            lambda: b.repo.runs.cancel(flight.quote.run_id))
        run, (attempt,), (lease,), _ = db_state(a.repo, flight.quote.run_id)
        types = event_types(a.repo, flight.quote.run_id)
        assert done.result == "applied" and lease["status"] == "completed" and attempt["exit_code"] == 0
        if cancel.result == "already_terminal":
            assert (done.run_state, run["status"], run["cancel_requested_at_ms"]) == ("succeeded", "succeeded", None)
            assert "run.cancel_requested" not in types
        else:
            assert cancel.result == "requested"
            assert (done.run_state, run["status"], run["error_code"]) == ("cancelled", "cancelled",
                                                                         "EXECUTION_CANCELLED")
            assert types.count("run.cancel_requested") == 1
        assert sum(t in TERMINAL_EVENTS for t in types) == 1
        orders.add(cancel.result)
    assert orders <= {"already_terminal", "requested"}


# -- recovery and retry (SEMANTICS.md §10): the same page on both replicas, one winner ----------

def recovery_cases(replica):
    return ClusterRecoveryCases(replica.repo.store, recovery_grace_ms=120_000, drain_grace_ms=900_000)


def test_two_replicas_recovering_the_same_attempt_mark_it_lost_once_and_release_the_lease_once(replicas):
    """Per round: a started attempt whose worker attested `stopped` and whose lease expired; both
    replicas read the same page, then resolve it at once."""
    a, b = replicas
    cases_a, cases_b = recovery_cases(a), recovery_cases(b)
    for r in range(ROUNDS):
        session = register(a.dispatch, f"w{r}")
        flight = launch(a.repo, a.dispatch, session)
        quote = flight.quote
        assert a.dispatch.attestations.apply(session.worker_id, session.session_id, session.generation, quote,
                                 session.session_id, session.generation, "stopped",
                                 run_lease_ms=30_000).result == "applied"
        with a.repo.store.write() as conn:
            conn.execute(update(run_dispatch_leases).where(run_dispatch_leases.c.attempt_id == quote.attempt_id)
                         .values(expires_at_ms=1))
        [seen_a], _ = cases_a.page(16)
        [seen_b], _ = cases_b.page(16)
        assert seen_a == seen_b
        outcomes = race(lambda: cases_a.resolve(seen_a), lambda: cases_b.resolve(seen_b))
        assert sorted(o.result for o in outcomes) == ["already_terminal", "applied"]
        assert event_types(a.repo, quote.run_id).count("attempt.lost") == 1
        [lease] = db_state(a.repo, quote.run_id)[2]
        assert (lease["status"], lease["release_reason"], lease["version"]) == ("released", "lease_expired", 2)


def test_two_replicas_retrying_the_same_lost_run_make_exactly_one_new_attempt(replicas):
    """Per round: a lost run whose idempotent policy allows a retry with no backoff; both replicas
    resolve it at once, then both requeue it at once."""
    a, b = replicas
    policy = RetryPolicy(max_attempts=3, retry_on_lost=True, safety="idempotent", backoff_base_ms=0,
                         backoff_max_ms=0)
    retry_a, retry_b = LostRetry(a.repo.store), LostRetry(b.repo.store)
    for r in range(ROUNDS):
        session = register(a.dispatch, f"w{r}")
        flight = launch(a.repo, a.dispatch, session, retry=policy)
        run_id = flight.quote.run_id
        assert Control.open(a.repo.store).recovery.mark_lost(run_id, flight.quote.attempt_id,
                                               "RECOVERY_PROCESS_STOPPED").result == "applied"
        resolved = race(lambda: retry_a.resolve_lost(run_id), lambda: retry_b.resolve_lost(run_id))
        assert "applied" in [o.result for o in resolved]
        assert event_types(a.repo, run_id).count("run.retry_scheduled") == 1
        requeued = race(lambda: retry_a.requeue(run_id), lambda: retry_b.requeue(run_id))
        assert [o.result for o in requeued].count("applied") == 1
        run, attempts, _leases, _ = db_state(a.repo, run_id)
        assert run["status"] == "queued"
        assert [(x["number"], x["status"]) for x in attempts] == [(1, "lost"), (2, "claimed")]
        assert event_types(a.repo, run_id).count("run.queued") == 2  # admission, then the retry
        assert a.repo.runs.cancel(run_id).result == "cancelled"  # not offered in the next round
