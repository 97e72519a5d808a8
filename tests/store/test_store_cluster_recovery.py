"""Cluster recovery of `starting|running` attempts whose lease expired, on evidence (SEMANTICS.md
§10 step 1), on SQLite and PostgreSQL: what is trusted, the idempotent grace, what waits and why,
and the re-checks under the locks."""

from __future__ import annotations

import pytest
from sqlalchemy import select, update

from qlactors.domain.retry import RetryPolicy
from qlactors.domain.states import RetrySafety
from qlactors.domain.transitions import ErrorCode
from qlactors.store.cadence.cluster_recovery import ClusterRecoveryCases
from qlactors.store.cadence.lost_retry import LostRetry
from qlactors.store.schema import run_attempts, worker_sessions
from store_helpers import db_state
from session_steps import attest, beat, expire_lease, expire_session, launch, register
from cluster_recovery_steps import GRACE_MS, DRAIN_MS, IDEMPOTENT, page_ids


@pytest.fixture
def worker(dispatch):
    return register(dispatch, "w1")


@pytest.fixture
def cases(repo):
    return ClusterRecoveryCases(repo.store, recovery_grace_ms=GRACE_MS, drain_grace_ms=DRAIN_MS)


def now_ms(repo) -> int:
    with repo.store.read() as conn:
        return repo.store.now_ms(conn)


def set_evidence(repo, attempt_id, fact):
    """Record `fact` about the attempt's current lease generation."""
    with repo.store.write() as conn:
        conn.execute(update(run_attempts).where(run_attempts.c.id == attempt_id).values(
            evidence=fact, evidence_lease_generation=run_attempts.c.lease_generation))


def set_session(repo, session_id, **values):
    with repo.store.write() as conn:
        conn.execute(update(worker_sessions).where(worker_sessions.c.session_id == session_id).values(**values))


def evidence_of(repo, attempt_id):
    with repo.store.read() as conn:
        return conn.execute(select(run_attempts.c.evidence).where(run_attempts.c.id == attempt_id)).scalar_one()


def assert_lost(repo, flight, code):
    run, attempts, leases, _ = db_state(repo, flight.quote.run_id)
    assert run["status"] == "lost" and attempts[-1]["status"] == "lost"
    assert attempts[-1]["error_code"] == code
    lease = leases[-1]
    assert (lease["status"], lease["release_reason"], lease["version"]) == ("released", "lease_expired", 2)
    # One transaction, one database time: the lease ended when the attempt did.
    assert lease["updated_at_ms"] == attempts[-1]["finished_at_ms"]
    assert attempts[-1]["lease_version"] == 2


def resolve_one(cases, flight):
    page, more = cases.page(16)
    assert [c.attempt_id for c in page] == [flight.quote.attempt_id] and not more
    return cases.resolve(page[0])


@pytest.mark.parametrize("fact, code", [
    ("stopped", ErrorCode.RECOVERY_PROCESS_STOPPED),
    ("ended", ErrorCode.RECOVERY_PROCESS_EXITED_WITHOUT_RECEIPT),
    ("ended_with_receipt", ErrorCode.RECOVERY_PROCESS_ENDED_WITH_RECEIPT),
    ("never_launched", ErrorCode.RECOVERY_NEVER_LAUNCHED),
])
def test_an_attested_fact_marks_the_expired_attempt_lost_with_its_code(repo, dispatch, cases, worker, fact, code):
    # `never_launched` only for an activated attempt whose start never landed (refused after one)
    flight = launch(repo, dispatch, worker, started=fact != "never_launched")
    assert attest(dispatch, worker, flight, worker, fact).result == "applied"
    assert page_ids(cases) == []  # the lease is live: evidence alone is not enough
    expire_lease(repo, flight.quote.attempt_id)
    assert resolve_one(cases, flight).result == "applied"
    assert_lost(repo, flight, code)
    assert page_ids(cases) == []


def test_retired_evidence_marks_the_attempt_lost(repo, dispatch, cases, worker):
    flight = launch(repo, dispatch, worker)
    set_evidence(repo, flight.quote.attempt_id, "retired")
    expire_lease(repo, flight.quote.attempt_id)
    assert resolve_one(cases, flight).result == "applied"
    assert_lost(repo, flight, ErrorCode.RECOVERY_WORKER_RETIRED)


def test_a_register_on_another_boot_records_rebooted_and_the_attempt_is_lost(repo, dispatch, cases, worker):
    running = launch(repo, dispatch, worker)
    starting = launch(repo, dispatch, worker, started=False)  # no identity: its session's boot counts
    register(dispatch, "w1")  # same boot: nothing is known about the processes
    assert evidence_of(repo, running.quote.attempt_id) is None
    assert evidence_of(repo, starting.quote.attempt_id) is None
    attest(dispatch, register(dispatch, "w1"), running, worker, "launch_unknown")
    register(dispatch, "w1", boot_id="boot-2")
    assert evidence_of(repo, running.quote.attempt_id) == "rebooted"  # launch_unknown is overridden
    assert evidence_of(repo, starting.quote.attempt_id) == "rebooted"
    for flight in (running, starting):
        expire_lease(repo, flight.quote.attempt_id)
    page, _ = cases.page(16)
    assert {c.attempt_id for c in page} == {running.quote.attempt_id, starting.quote.attempt_id}
    for candidate in page:
        assert cases.resolve(candidate).result == "applied"
    assert_lost(repo, running, ErrorCode.RECOVERY_HOST_REBOOTED)
    assert_lost(repo, starting, ErrorCode.RECOVERY_HOST_REBOOTED)


def test_a_trusted_fact_is_not_overridden_by_rebooted(repo, dispatch, worker):
    flight = launch(repo, dispatch, worker)
    attest(dispatch, worker, flight, worker, "stopped")
    register(dispatch, "w1", boot_id="boot-2")
    assert evidence_of(repo, flight.quote.attempt_id) == "stopped"


@pytest.mark.parametrize("fact, words", [
    ("launch_unknown", "waiting for evidence: launch outcome unknown"),
    (None, "waiting for evidence"),
])
def test_no_trusted_evidence_waits_with_its_reason(repo, dispatch, cases, worker, fact, words):
    flight = launch(repo, dispatch, worker)
    if fact is not None:
        attest(dispatch, worker, flight, worker, fact)
    expire_lease(repo, flight.quote.attempt_id)
    expire_session(repo, worker.session_id)  # gone long ago: still no proof for an unknown-safety task
    before = db_state(repo, flight.quote.run_id)
    assert page_ids(cases) == []
    _now, listed = cases.waiting()
    assert [w.attempt_id for w in listed] == [flight.quote.attempt_id]
    why = listed[0].reason
    assert why.startswith("lease of worker w1 expired ") and words in why
    assert "unknown safety: waits for the worker or `qlactors worker retire w1 --confirm-stopped`" in why
    assert listed[0].eligible_at_ms is None and listed[0].evidence == fact
    assert cases.waiting_for(flight.quote.attempt_id) == listed[0]
    assert db_state(repo, flight.quote.run_id) == before


def test_an_idempotent_attempt_waits_for_the_grace_then_is_lost(repo, dispatch, cases, worker):
    flight = launch(repo, dispatch, worker, **IDEMPOTENT)
    expire_lease(repo, flight.quote.attempt_id)
    ended = now_ms(repo) - GRACE_MS + 60_000  # the session's lease expired; a minute of grace is left
    set_session(repo, worker.session_id, lease_expires_at_ms=ended)
    assert page_ids(cases) == []
    waiting = cases.waiting_for(flight.quote.attempt_id)
    assert waiting.eligible_at_ms == ended + GRACE_MS
    assert "idempotent: lost at " in waiting.reason and "once the grace has passed" in waiting.reason
    set_session(repo, worker.session_id, lease_expires_at_ms=now_ms(repo) - GRACE_MS - 1_000)
    assert cases.waiting_for(flight.quote.attempt_id) is None
    assert resolve_one(cases, flight).result == "applied"
    assert_lost(repo, flight, ErrorCode.RECOVERY_SESSION_ENDED)


def test_an_idempotent_attempt_of_a_superseded_session_counts_from_its_end(repo, dispatch, cases, worker):
    flight = launch(repo, dispatch, worker, **IDEMPOTENT)
    expire_lease(repo, flight.quote.attempt_id)
    register(dispatch, "w1")  # the old session ends now (offline, ended_at_ms = now)
    assert page_ids(cases) == []
    set_session(repo, worker.session_id, ended_at_ms=now_ms(repo) - GRACE_MS - 1_000)
    assert resolve_one(cases, flight).result == "applied"
    assert_lost(repo, flight, ErrorCode.RECOVERY_SESSION_ENDED)


def test_a_drained_session_counts_as_ended_only_after_the_drain_grace(repo, dispatch, cases, worker):
    flight = launch(repo, dispatch, worker, **IDEMPOTENT)
    expire_lease(repo, flight.quote.attempt_id)
    assert dispatch.sessions.end("w1", worker.session_id, 1, status="draining").result == "applied"
    assert dispatch.sessions.end("w1", worker.session_id, 1, status="offline").result == "applied"
    register(dispatch, "w1")  # the planned restart: superseded, still drained
    ended = now_ms(repo) - GRACE_MS - 60_000
    set_session(repo, worker.session_id, ended_at_ms=ended)
    assert page_ids(cases) == []  # past the recovery grace, within the drain grace
    waiting = cases.waiting_for(flight.quote.attempt_id)
    assert waiting.eligible_at_ms == ended + DRAIN_MS + GRACE_MS
    assert "worker w1 drained its session (SIGTERM)" in waiting.reason
    set_session(repo, worker.session_id, ended_at_ms=ended - DRAIN_MS)
    assert resolve_one(cases, flight).result == "applied"
    assert_lost(repo, flight, ErrorCode.RECOVERY_SESSION_ENDED)


def test_a_draining_session_whose_lease_expired_counts_from_its_expiry_plus_the_drain_grace(repo, dispatch, cases,
                                                                                           worker):
    flight = launch(repo, dispatch, worker, **IDEMPOTENT)
    expire_lease(repo, flight.quote.attempt_id)
    assert dispatch.sessions.end("w1", worker.session_id, 1, status="draining").result == "applied"
    expired = now_ms(repo) - GRACE_MS - 60_000
    set_session(repo, worker.session_id, lease_expires_at_ms=expired)
    assert page_ids(cases) == []
    set_session(repo, worker.session_id, lease_expires_at_ms=expired - DRAIN_MS)
    assert resolve_one(cases, flight).result == "applied"


def test_a_live_session_is_no_evidence_for_an_idempotent_attempt(repo, dispatch, cases, worker):
    flight = launch(repo, dispatch, worker, **IDEMPOTENT)
    expire_lease(repo, flight.quote.attempt_id)  # its renewals stopped, the worker still heartbeats
    assert page_ids(cases) == []
    waiting = cases.waiting_for(flight.quote.attempt_id)
    assert waiting.eligible_at_ms is None and "once the session of worker w1 has ended" in waiting.reason


def test_twenty_waiting_at_the_head_do_not_hide_the_twenty_first(repo, dispatch, cases):
    session = register(dispatch, "w1", capacity=32)
    waiting = [launch(repo, dispatch, session) for _ in range(20)]
    for flight in waiting:
        expire_lease(repo, flight.quote.attempt_id)  # expired at 1 ms: the oldest
    last = launch(repo, dispatch, session)
    attest(dispatch, session, last, session, "ended")
    expire_lease(repo, last.quote.attempt_id)
    page, more = cases.page(16)
    assert [c.attempt_id for c in page] == [last.quote.attempt_id] and not more
    _now, listed = cases.waiting()
    assert len(listed) == 20 and last.quote.attempt_id not in {w.attempt_id for w in listed}


def test_a_full_page_says_more_remain(repo, dispatch, cases):
    session = register(dispatch, "w1", capacity=8)
    for _ in range(3):
        flight = launch(repo, dispatch, session)
        attest(dispatch, session, flight, session, "stopped")
        expire_lease(repo, flight.quote.attempt_id)
    page, more = cases.page(2)
    assert len(page) == 2 and more
    page, more = cases.page(3)
    assert len(page) == 3 and not more


def test_a_rebind_between_page_and_resolve_is_refused_and_keeps_the_lease(repo, dispatch, cases, worker):
    flight = launch(repo, dispatch, worker)
    attest(dispatch, worker, flight, worker, "ended")
    expire_lease(repo, flight.quote.attempt_id)
    page, _ = cases.page(16)
    restarted = register(dispatch, "w1")
    assert attest(dispatch, restarted, flight, worker, "running").result == "applied"
    before = db_state(repo, flight.quote.run_id)
    outcome = cases.resolve(page[0])
    assert (outcome.result, outcome.detail) == ("refused", "lease_live")
    assert db_state(repo, flight.quote.run_id) == before
    run, attempts, leases, _ = before
    assert run["status"] == "running" and attempts[-1]["evidence"] is None  # the re-bind voided it
    assert [(lease["status"], lease["lease_generation"]) for lease in leases] == [("released", 1), ("leased", 2)]


def test_a_renewal_between_page_and_resolve_is_refused(repo, dispatch, cases, worker):
    flight = launch(repo, dispatch, worker)
    attest(dispatch, worker, flight, worker, "stopped")
    expire_lease(repo, flight.quote.attempt_id)
    page, _ = cases.page(16)
    assert beat(dispatch, worker, 1, flight.quote).renewed
    outcome = cases.resolve(page[0])
    assert (outcome.result, outcome.detail) == ("refused", "lease_live")
    assert db_state(repo, flight.quote.run_id)[0]["status"] == "running"


def test_a_cancel_intent_wins_over_lost(repo, dispatch, cases, worker):
    flight = launch(repo, dispatch, worker)
    attest(dispatch, worker, flight, worker, "stopped")
    assert repo.runs.cancel(flight.quote.run_id).result == "requested"
    expire_lease(repo, flight.quote.attempt_id)
    assert resolve_one(cases, flight).result == "applied"
    run, attempts, leases, _ = db_state(repo, flight.quote.run_id)
    assert (run["status"], attempts[-1]["status"]) == ("cancelled", "cancelled")
    assert (leases[-1]["status"], leases[-1]["release_reason"], leases[-1]["version"]) == ("released", "declined", 2)


def test_resolving_twice_changes_nothing_the_second_time(repo, dispatch, cases, worker):
    flight = launch(repo, dispatch, worker)
    attest(dispatch, worker, flight, worker, "stopped")
    expire_lease(repo, flight.quote.attempt_id)
    page, _ = cases.page(16)
    assert cases.resolve(page[0]).result == "applied"
    after = db_state(repo, flight.quote.run_id)
    assert cases.resolve(page[0]).result == "already_terminal"
    assert db_state(repo, flight.quote.run_id) == after


def test_a_safety_without_retry_on_lost_is_still_trusted_and_the_run_is_not_retried(repo, dispatch, cases,
                                                                                    worker):
    """`--safety idempotent` without `--retry-on-lost`: the run's policy row keeps the safety (never
    retried), so a gone worker's run ends `lost` after the grace instead of waiting for a retire."""
    flight = launch(repo, dispatch, worker, retry=RetryPolicy(safety=RetrySafety.IDEMPOTENT))
    expire_lease(repo, flight.quote.attempt_id)
    set_session(repo, worker.session_id, lease_expires_at_ms=now_ms(repo) - GRACE_MS + 60_000)
    assert page_ids(cases) == []
    assert "idempotent: lost at " in cases.waiting_for(flight.quote.attempt_id).reason
    set_session(repo, worker.session_id, lease_expires_at_ms=now_ms(repo) - GRACE_MS - 1_000)
    resolve_one(cases, flight)
    assert_lost(repo, flight, ErrorCode.RECOVERY_SESSION_ENDED)
    assert LostRetry(repo.store).resolve_lost(flight.quote.run_id).detail == ErrorCode.RUN_LOST_RETRY_DISABLED


def test_a_pending_stop_is_named_and_an_idempotent_run_ends_by_its_intent_after_the_grace(repo, dispatch, cases,
                                                                                          worker):
    flight = launch(repo, dispatch, worker, **IDEMPOTENT)
    assert repo.runs.cancel(flight.quote.run_id).result == "requested"
    pending = repo.runs.get(flight.quote.run_id).stop_pending
    assert pending[0] == "user" and abs(pending[1] - now_ms(repo)) < 60_000
    expire_lease(repo, flight.quote.attempt_id)
    ended = now_ms(repo) - GRACE_MS + 60_000
    set_session(repo, worker.session_id, lease_expires_at_ms=ended)
    why = cases.waiting_for(flight.quote.attempt_id).reason
    assert "; user stop pending: worker w1 has not reported the job stopped (it may still run); " in why
    assert "idempotent: ends cancelled (no exit code) at " in why
    set_session(repo, worker.session_id, lease_expires_at_ms=now_ms(repo) - GRACE_MS - 1_000)
    assert resolve_one(cases, flight).run_state == "cancelled"
    shown = repo.runs.get(flight.quote.run_id)
    assert (shown.state, shown.attempts[-1].exit_code, shown.stop_pending) == ("cancelled", None, None)


def test_a_revoked_worker_s_attempt_is_listed_at_once_with_what_the_operator_can_do(repo, dispatch, cases, worker):
    """issue 28: a run whose worker was revoked is held there (its result cannot reach the control
    side): listed as unresolved at once, its lease still live, saying so and naming the two ways
    out; once the key is allowed again it is the worker's to report, and nothing is listed."""
    from qlactors.store.admin.worker_keys import WorkerKeys

    flight = launch(repo, dispatch, worker)
    keys = WorkerKeys(repo.store)
    keys.allow("w1", "k" * 40)
    _now, listed = cases.waiting()
    assert listed == [] and cases.waiting_for(flight.quote.attempt_id) is None  # a live lease: nothing to say
    keys.revoke("w1")
    _now, listed = cases.waiting()
    assert [w.attempt_id for w in listed] == [flight.quote.attempt_id]
    why = listed[0].reason
    assert why.startswith("lease of worker w1 expires in "), why
    assert ("result held on revoked worker w1: `qlactors worker allow w1 KEYFILE` it again or "
            "`qlactors worker retire w1 --confirm-stopped`") in why
    assert f"unknown safety: waits for an operator (above); this attempt alone: `qlactors confirm-stopped " \
           f"{flight.quote.run_id}`" in why
    assert cases.waiting_for(flight.quote.attempt_id) == listed[0]  # what `show` says
    assert page_ids(cases) == []  # nothing is decided on it
    keys.allow("w1", "k" * 40)
    assert cases.waiting()[1] == [] and cases.waiting_for(flight.quote.attempt_id) is None
