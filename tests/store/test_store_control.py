"""Control contract: timeouts, stops, lost attempts, recovery candidates, re-binding and retry."""

from __future__ import annotations

import secrets
import threading
from typing import NamedTuple

import pytest
from sqlalchemy import func, select

from qlactors.domain.receipt import Receipt, token_hash
from qlactors.domain.retry import RetryPolicy
from qlactors.errors import BadInput
from qlactors.store.dispatch.completion import CompletionService
from qlactors.store.cadence.control import Control
from qlactors.store.cadence.lost_retry import LostRetry
from qlactors.store.dispatch.dispatch import Dispatch
from qlactors.store.records import Fence, Identity
from qlactors.store.schema import run_attempts, run_dispatch_leases, run_events, run_retry_policies, runs
from store_helpers import new_hash, spec

LOST = "RECOVERY_PROCESS_EXITED_WITHOUT_RECEIPT"
IDENTITY = Identity("boot", 100, 100, 5)


class Flight(NamedTuple):
    run_id: str
    attempt_id: str
    fence: Fence
    token: str


@pytest.fixture
def session(dispatch):
    return dispatch.sessions.register("edge", 64)


@pytest.fixture
def control(repo):
    return Control.open(repo.store)


@pytest.fixture
def retries(repo):
    return LostRetry(repo.store)


def launch(repo, dispatch, session, stage="running", *, name=None, **task) -> Flight:
    """A run brought to `stage`: claimed (offered only), starting (activated) or running."""
    name = name or f"t{secrets.token_hex(4)}"
    repo.tasks.add(spec(name, **task), actor_name="tester")
    run_id = repo.runs.request(name).run.id
    return advance(dispatch, session, run_id, stage)


def advance(dispatch, session, run_id, stage="running") -> Flight:
    lease_hash = new_hash()
    offer = dispatch.offers.one(session.worker_id, session.session_id, session.generation,
                           secrets.token_hex(8), lease_hash, log_cap_bytes=0)
    assert offer.run_id == run_id
    fence, token = offer.fence(lease_hash), secrets.token_urlsafe(32)
    if stage in ("starting", "running"):
        assert dispatch.reports.activate(fence, token_hash(token), "log").result == "applied"
    if stage == "running":
        assert dispatch.reports.started(fence, *vars_of(IDENTITY)).result == "applied"
    return Flight(run_id, offer.attempt_id, fence, token)


def vars_of(identity):
    return identity.boot_id, identity.pid, identity.pgid, identity.start_ticks


def attempt_row(repo, attempt_id):
    with repo.store.read() as conn:
        return conn.execute(select(run_attempts).where(run_attempts.c.id == attempt_id)).one()


def lease_rows(repo, attempt_id):
    with repo.store.read() as conn:
        return conn.execute(select(run_dispatch_leases).where(run_dispatch_leases.c.attempt_id == attempt_id)
                            .order_by(run_dispatch_leases.c.lease_generation)).all()


def set_deadline(repo, attempt_id, deadline_ms):
    with repo.store.write() as conn:
        conn.execute(run_attempts.update().where(run_attempts.c.id == attempt_id).values(deadline_at_ms=deadline_ms))


def event_types(repo, run_id):
    return [(e.type, e.actor_type) for e in repo.runs.get(run_id).events]


def n_events(repo, run_id):
    with repo.store.read() as conn:
        return conn.execute(select(func.count()).select_from(run_events)
                            .where(run_events.c.run_id == run_id)).scalar_one()


# -- deadlines and stops -----------------------------------------------------------------------

def test_next_deadline_is_the_earliest_without_an_intent(repo, dispatch, session, control):
    assert control.stops.next_deadline_ms() is None
    a = launch(repo, dispatch, session, timeout_ms=60_000)
    b = launch(repo, dispatch, session, "starting", timeout_ms=60_000)
    launch(repo, dispatch, session)  # no timeout, no deadline
    set_deadline(repo, a.attempt_id, 5_000)
    set_deadline(repo, b.attempt_id, 4_000)
    assert control.stops.next_deadline_ms() == 4_000
    repo.runs.cancel(b.run_id)
    assert control.stops.next_deadline_ms() == 5_000


def test_commit_timeouts_takes_only_past_deadlines_and_keeps_a_user_intent(repo, dispatch, session, control):
    past = launch(repo, dispatch, session, timeout_ms=60_000, stop_grace_ms=2500)
    future = launch(repo, dispatch, session, timeout_ms=60_000)
    user = launch(repo, dispatch, session, timeout_ms=60_000)
    set_deadline(repo, past.attempt_id, 1_000)
    set_deadline(repo, user.attempt_id, 1_000)
    repo.runs.cancel(user.run_id)
    orders = control.stops.commit_timeouts()
    assert [(o.run_id, o.attempt_id, o.reason, o.grace_ms) for o in orders] == [
        (past.run_id, past.attempt_id, "timeout", 2500)]
    assert orders[0].identity == IDENTITY and orders[0].attempt_status == "running"
    assert repo.runs.get(past.run_id).cancel_reason == "timeout"
    assert event_types(repo, past.run_id)[-1] == ("run.cancel_requested", "scheduler")
    assert repo.runs.get(user.run_id).cancel_reason == "user"
    assert repo.runs.get(future.run_id).cancel_reason is None
    assert repo.runs.get(past.run_id).state == "running"  # intent only: the process must be stopped
    assert control.stops.commit_timeouts() == []


def test_pending_stops_lists_intents_with_a_live_process(repo, dispatch, session, control):
    running = launch(repo, dispatch, session, stop_grace_ms=3000)
    starting = launch(repo, dispatch, session, "starting")
    claimed = launch(repo, dispatch, session, "claimed")
    launch(repo, dispatch, session)  # no intent
    for flight in (running, starting, claimed):
        repo.runs.cancel(flight.run_id)
    stops = control.stops.pending()
    assert [(s.run_id, s.reason) for s in stops] == [(running.run_id, "user"), (starting.run_id, "user")]
    assert stops[0].grace_ms == 3000 and stops[0].identity == IDENTITY
    assert stops[1].identity is None and stops[1].attempt_status == "starting"
    assert [s.run_id for s in control.stops.pending(limit=1)] == [running.run_id]


def test_end_by_intent_ends_a_stopped_run_as_its_intent_says(repo, dispatch, session, control):
    flight = launch(repo, dispatch, session, timeout_ms=60_000)
    set_deadline(repo, flight.attempt_id, 1)
    control.stops.commit_timeouts()
    out = control.stops.end_by_intent(flight.run_id, flight.attempt_id)
    assert (out.result, out.run_state) == ("applied", "timed_out")
    attempt = attempt_row(repo, flight.attempt_id)
    assert attempt.status == "timed_out" and attempt.exit_code is None
    assert attempt.error_code == "EXECUTION_TIMED_OUT"
    (lease,) = lease_rows(repo, flight.attempt_id)
    assert (lease.status, lease.release_reason, lease.version) == ("released", "declined", 2)
    assert event_types(repo, flight.run_id)[-2:] == [("attempt.timed_out", "scheduler"),
                                                     ("run.timed_out", "scheduler")]
    assert control.stops.end_by_intent(flight.run_id, flight.attempt_id).result == "already_terminal"


def test_end_by_intent_of_a_shutdown_releases_with_shutdown(repo, dispatch, session, control):
    flight = launch(repo, dispatch, session)
    repo.runs.cancel(flight.run_id, "shutdown")
    assert control.stops.end_by_intent(flight.run_id, flight.attempt_id).run_state == "cancelled"
    assert lease_rows(repo, flight.attempt_id)[0].release_reason == "shutdown"


def test_end_by_intent_needs_an_intent(repo, dispatch, session, control):
    flight = launch(repo, dispatch, session)
    n = n_events(repo, flight.run_id)
    assert control.stops.end_by_intent(flight.run_id, flight.attempt_id).detail == "no_intent"
    assert control.stops.end_by_intent(flight.run_id, "0" * 36).detail == "not_current_attempt"
    assert n_events(repo, flight.run_id) == n


# -- lost --------------------------------------------------------------------------------------

def test_mark_lost_releases_the_lease_in_the_same_transaction(repo, dispatch, session, control):
    flight = launch(repo, dispatch, session)
    out = control.recovery.mark_lost(flight.run_id, flight.attempt_id, LOST)
    assert (out.result, out.run_state) == ("applied", "lost")
    attempt = attempt_row(repo, flight.attempt_id)
    assert attempt.status == "lost" and attempt.error_code == LOST and attempt.lease_version == 2
    assert repo.runs.get(flight.run_id).error_code == LOST
    (lease,) = lease_rows(repo, flight.attempt_id)
    assert (lease.status, lease.release_reason, lease.version) == ("released", "lease_expired", 2)
    assert event_types(repo, flight.run_id)[-2:] == [("attempt.lost", "recovery"), ("run.lost", "recovery")]
    assert control.recovery.mark_lost(flight.run_id, flight.attempt_id, LOST).result == "already_terminal"
    # the old executor's reports are over too: fenced (SEMANTICS.md §9), so it stops its process
    assert Dispatch.open(repo.store).reports.started(flight.fence, "boot", 100, 100, 5).detail == "attempt_lost"


def test_mark_lost_of_an_unstarted_claim(repo, dispatch, session, control):
    flight = launch(repo, dispatch, session, "claimed")
    assert control.recovery.mark_lost(flight.run_id, flight.attempt_id, "RECOVERY_UNSTARTED_CLAIM").run_state == "lost"
    assert lease_rows(repo, flight.attempt_id)[0].status == "released"


def test_release_unactivated_frees_the_claim_for_a_new_offer_and_never_loses_it(repo, dispatch, session, control):
    flight = launch(repo, dispatch, session, "claimed")
    n = n_events(repo, flight.run_id)
    assert not control.status.queued_waiting()  # held by a live lease: nothing to offer
    out = dispatch.reports.release_unactivated(flight.run_id, flight.attempt_id)
    assert (out.result, out.detail, out.run_state) == ("applied", None, "dispatching")
    (lease,) = lease_rows(repo, flight.attempt_id)
    assert (lease.status, lease.release_reason, lease.version) == ("released", "lease_expired", 2)
    attempt = attempt_row(repo, flight.attempt_id)
    assert (attempt.status, attempt.error_code, attempt.lease_version) == ("claimed", None, 2)
    assert n_events(repo, flight.run_id) == n  # no status change, no event
    assert control.status.queued_waiting()
    assert control.recovery.candidates(16) == ([], False)  # backlog now, not a candidate
    # the old executor's Activate is over; the claim is offered again under generation 2
    assert dispatch.reports.activate(flight.fence, new_hash(), "log").result == "fenced"
    again = advance(dispatch, session, flight.run_id, "claimed")
    assert (again.attempt_id, again.fence.lease_generation) == (flight.attempt_id, 2)
    assert dispatch.reports.release_unactivated(flight.run_id, flight.attempt_id).result == "applied"
    assert dispatch.reports.release_unactivated(flight.run_id, flight.attempt_id).detail == "no_live_lease"


def test_release_unactivated_refuses_an_activated_attempt(repo, dispatch, session, control):
    flight = launch(repo, dispatch, session, "starting")
    out = dispatch.reports.release_unactivated(flight.run_id, flight.attempt_id)
    assert (out.result, out.detail) == ("refused", "attempt_starting")
    assert lease_rows(repo, flight.attempt_id)[0].status == "leased"


def test_mark_lost_refuses_with_an_intent_or_for_backlog(repo, dispatch, session, control):
    flight = launch(repo, dispatch, session)
    repo.runs.cancel(flight.run_id)
    n = n_events(repo, flight.run_id)
    assert control.recovery.mark_lost(flight.run_id, flight.attempt_id, LOST).detail == "cancel_intent"
    assert n_events(repo, flight.run_id) == n and lease_rows(repo, flight.attempt_id)[0].status == "leased"
    repo.tasks.add(spec("queued"), actor_name="tester")
    queued = repo.runs.request("queued").run.id
    attempt_id = repo.runs.get(queued).attempts[0].id
    assert control.recovery.mark_lost(queued, attempt_id, LOST).detail == "run_queued"
    with pytest.raises(BadInput):
        control.recovery.mark_lost(flight.run_id, flight.attempt_id, "lower case")


def test_mark_lost_and_a_completion_race_and_exactly_one_wins(repo, dispatch, session, control):
    flight = launch(repo, dispatch, session)
    service = CompletionService(repo.store)
    receipt = Receipt(1, flight.run_id, flight.attempt_id, 1, flight.token, 1, 2, 0)
    barrier, results = threading.Barrier(2), {}

    def lose():
        barrier.wait()
        results["lost"] = control.recovery.mark_lost(flight.run_id, flight.attempt_id, LOST).result

    def complete():
        barrier.wait()
        results["done"] = service.complete(flight.run_id, flight.attempt_id, receipt).result

    threads = [threading.Thread(target=lose), threading.Thread(target=complete)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(results.values()) == ["already_terminal", "applied"]
    state = repo.runs.get(flight.run_id).state
    assert state == ("lost" if results["lost"] == "applied" else "succeeded")


def test_commit_timeout_and_a_user_cancel_race_and_one_intent_sticks(repo, dispatch, session, control):
    flight = launch(repo, dispatch, session, timeout_ms=60_000)
    set_deadline(repo, flight.attempt_id, 1)
    barrier = threading.Barrier(2)

    def timeout():
        barrier.wait()
        control.stops.commit_timeouts()

    def cancel():
        barrier.wait()
        repo.runs.cancel(flight.run_id)

    threads = [threading.Thread(target=timeout), threading.Thread(target=cancel)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    run = repo.runs.get(flight.run_id)
    assert run.cancel_reason in ("user", "timeout")
    assert [e.type for e in run.events].count("run.cancel_requested") == 1


# -- recovery candidates and rebind ------------------------------------------------------------

def test_recovery_candidates_page_with_limit_plus_one_and_skip_backlog(repo, dispatch, session, control):
    flights = [launch(repo, dispatch, session, stage) for stage in
               ("claimed", "starting", "running", "running", "claimed")]
    declined = launch(repo, dispatch, session, "claimed")
    assert dispatch.reports.decline(declined.fence, "declined").result == "applied"  # backlog again
    repo.tasks.add(spec("backlog"), actor_name="tester")
    repo.runs.request("backlog")  # queued: backlog, never a candidate

    seen, after, pages = [], None, []
    while True:
        page, more = control.recovery.candidates(2, after)
        pages.append((len(page), more))
        seen.extend(page)
        if not more:
            break
        after = page[-1].attempt_id
    assert pages == [(2, True), (2, True), (1, False)]
    assert [c.attempt_id for c in seen] == sorted(f.attempt_id for f in flights)
    by_id = {c.attempt_id: c for c in seen}
    running = by_id[flights[2].attempt_id]
    assert (running.attempt_status, running.run_status, running.identity) == ("running", "running", IDENTITY)
    assert running.callback_token_hash is not None and running.worker_id == "edge"
    starting = by_id[flights[1].attempt_id]
    assert starting.identity is None
    assert by_id[flights[0].attempt_id].attempt_status == "claimed"
    repo.runs.cancel(flights[3].run_id)
    assert by_id[flights[3].attempt_id].cancel_reason is None
    assert control.recovery.candidate(flights[3].attempt_id).cancel_reason == "user"
    assert control.recovery.candidates(64, worker_id="nobody") == ([], False)
    with pytest.raises(BadInput):
        control.recovery.candidates(65)


def test_rebind_adopts_a_surviving_starting_attempt_into_the_new_session(repo, dispatch, session, control):
    flight = launch(repo, dispatch, session, "starting")
    new_session = dispatch.sessions.register("edge", 64)  # the runtime restarted
    lease_hash = new_hash()
    out = control.recovery.rebind(flight.run_id, flight.attempt_id, new_session, IDENTITY,
                         offer_id="rebind-1", lease_token_hash=lease_hash)
    assert (out.result, out.run_state) == ("applied", "running")
    assert out.value.session_id == new_session.session_id and out.value.lease_generation == 2
    old, new = lease_rows(repo, flight.attempt_id)
    assert (old.status, old.release_reason, old.version) == ("released", "shutdown", 2)
    assert (new.status, new.version, new.session_generation, new.offer_id) == ("leased", 1, 2, "rebind-1")
    attempt = attempt_row(repo, flight.attempt_id)
    assert attempt.status == "running" and Identity.from_row(attempt) == IDENTITY
    assert (attempt.session_id, attempt.lease_generation, attempt.offer_id) == (new_session.session_id, 2, "rebind-1")
    assert attempt.started_at_ms is not None and repo.runs.get(flight.run_id).started_at_ms is not None
    assert event_types(repo, flight.run_id)[-3:] == [("attempt.adopted", "recovery"), ("attempt.running", "recovery"),
                                                     ("run.running", "recovery")]
    # the new fence works, the old one is dead
    assert dispatch.reports.started(out.value, *vars_of(IDENTITY)).detail == "already_running"
    assert dispatch.reports.started(flight.fence, *vars_of(IDENTITY)).result == "fenced"
    n = n_events(repo, flight.run_id)
    again = control.recovery.rebind(flight.run_id, flight.attempt_id, new_session, IDENTITY,
                           offer_id="rebind-1", lease_token_hash=lease_hash)
    assert (again.result, again.detail, again.value) == ("applied", "already_bound", out.value)
    assert n_events(repo, flight.run_id) == n and len(lease_rows(repo, flight.attempt_id)) == 2


def test_rebind_of_a_running_attempt_keeps_it_running_with_one_adopted_event(repo, dispatch, session, control):
    """issue 28: the re-bind is a fact in the history (SEMANTICS §3: no change without its event)."""
    flight = launch(repo, dispatch, session)
    new_session = dispatch.sessions.register("edge", 64)
    n, version = n_events(repo, flight.run_id), repo.runs.get(flight.run_id).version
    out = control.recovery.rebind(flight.run_id, flight.attempt_id, new_session, IDENTITY,
                         offer_id="rebind-2", lease_token_hash=new_hash())
    assert out.result == "applied" and n_events(repo, flight.run_id) == n + 1
    assert repo.runs.get(flight.run_id).version == version + 1
    assert event_types(repo, flight.run_id)[-1] == ("attempt.adopted", "recovery")
    adopted = repo.runs.get(flight.run_id).events[-1]
    assert adopted.payload == {"lease_generation": 2, "from_generation": 1, "worker_id": new_session.worker_id,
                               "session_id": new_session.session_id}
    assert [lease.status for lease in lease_rows(repo, flight.attempt_id)] == ["released", "leased"]


def test_rebind_refuses_another_identity_and_a_stale_session(repo, dispatch, session, control):
    flight = launch(repo, dispatch, session)
    new_session = dispatch.sessions.register("edge", 64)
    other = Identity("boot", 101, 101, 5)
    out = control.recovery.rebind(flight.run_id, flight.attempt_id, new_session, other,
                         offer_id="rebind-3", lease_token_hash=new_hash())
    assert (out.result, out.detail) == ("refused", "identity_mismatch")
    stale = control.recovery.rebind(flight.run_id, flight.attempt_id, session, IDENTITY,
                           offer_id="rebind-3", lease_token_hash=new_hash())
    assert stale.result == "fenced"
    assert [lease.status for lease in lease_rows(repo, flight.attempt_id)] == ["leased"]


# -- retry -------------------------------------------------------------------------------------

def lost_run(repo, dispatch, session, control, **task) -> Flight:
    flight = launch(repo, dispatch, session, **task)
    assert control.recovery.mark_lost(flight.run_id, flight.attempt_id, LOST).result == "applied"
    return flight


@pytest.mark.parametrize("policy, code", [
    (RetryPolicy(), "RUN_LOST_RETRY_DISABLED"),
    (RetryPolicy(retry_on_lost=True, max_attempts=1), "RUN_LOST_RETRY_UNSAFE"),
    (RetryPolicy(retry_on_lost=True, max_attempts=1, safety="idempotent"), "RUN_LOST_RETRY_EXHAUSTED"),
])
def test_resolve_lost_fails_runs_that_may_not_retry(repo, dispatch, session, control, policy, code, retries):
    flight = lost_run(repo, dispatch, session, control, retry=policy)
    assert retries.lost_runs() == [flight.run_id] and control.status.lost_count() == 1
    out = retries.resolve_lost(flight.run_id)
    assert (out.result, out.detail, out.run_state) == ("applied", code, "failed")
    run = repo.runs.get(flight.run_id)
    assert run.error_code == code and run.attempts[0].error_code == LOST
    assert event_types(repo, flight.run_id)[-1] == ("run.failed", "retry")
    assert retries.lost_runs() == [] and retries.resolve_lost(flight.run_id).result == "already_terminal"


def test_resolve_lost_schedules_a_retry_with_backoff(repo, dispatch, session, control, retries):
    policy = RetryPolicy(retry_on_lost=True, max_attempts=3, safety="idempotent",
                         backoff_base_ms=60_000, backoff_max_ms=90_000)
    flight = lost_run(repo, dispatch, session, control, retry=policy)
    out = retries.resolve_lost(flight.run_id)
    assert (out.result, out.run_state) == ("applied", "retry_wait")
    with repo.store.read() as conn:
        row = conn.execute(select(run_retry_policies).where(run_retry_policies.c.run_id == flight.run_id)).one()
        updated = conn.execute(select(runs.c.updated_at_ms).where(runs.c.id == flight.run_id)).scalar_one()
    assert row.next_attempt_at_ms == int(out.detail) == updated + 60_000 and row.version == 1
    view = repo.runs.get(flight.run_id)
    assert [e.type for e in view.events[-2:]] == ["run.retry_scheduled", "run.retry_wait"]
    assert view.events[-1].payload == {"next_attempt_at_ms": row.next_attempt_at_ms}
    assert retries.due_retries() == []
    assert retries.requeue(flight.run_id).detail == "not_due"


def test_a_due_retry_requeues_with_a_fresh_attempt_that_inherits_nothing(repo, dispatch, session, control, retries):
    policy = RetryPolicy(retry_on_lost=True, max_attempts=2, safety="deduplicated", backoff_base_ms=0)
    flight = lost_run(repo, dispatch, session, control, retry=policy)
    retries.resolve_lost(flight.run_id)
    assert retries.due_retries() == [flight.run_id]
    out = retries.requeue(flight.run_id)
    assert (out.result, out.run_state) == ("applied", "queued")
    view = repo.runs.get(flight.run_id)
    assert [(a.number, a.state) for a in view.attempts] == [(1, "lost"), (2, "claimed")]
    assert view.error_code is None
    fresh = attempt_row(repo, out.detail)
    for column in ("worker_id", "session_id", "session_generation", "boot_id", "pid", "pgid", "start_ticks",
                   "callback_token_hash", "offer_id", "lease_generation", "lease_version",
                   "deadline_at_ms", "started_at_ms", "exit_code", "log_artifact_id"):
        assert getattr(fresh, column) is None, column
    assert fresh.callback_sequence == 0 and fresh.number == 2
    assert [e.type for e in view.events[-2:]] == ["attempt.claimed", "run.queued"]
    assert retries.due_retries() == [] and retries.requeue(flight.run_id).detail == "run_queued"
    # the second attempt is dispatched like any queued run, under its own first lease
    second = advance(dispatch, session, flight.run_id)
    assert second.attempt_id == out.detail and second.fence.lease_generation == 1
    # and when it is lost too, the policy is exhausted
    control.recovery.mark_lost(flight.run_id, second.attempt_id, LOST)
    assert retries.resolve_lost(flight.run_id).detail == "RUN_LOST_RETRY_EXHAUSTED"


def test_a_cancel_intent_wins_over_a_retry(repo, dispatch, session, control, retries):
    policy = RetryPolicy(retry_on_lost=True, max_attempts=3, safety="idempotent")
    flight = lost_run(repo, dispatch, session, control, retry=policy)
    # An intent on a lost run (committed by a path outside this suite, e.g. a cluster race).
    with repo.store.write() as conn:
        conn.execute(runs.update().where(runs.c.id == flight.run_id).values(
            cancel_reason="timeout", cancel_requested_at_ms=1))
    out = retries.resolve_lost(flight.run_id)
    assert (out.result, out.run_state) == ("applied", "timed_out")
    with repo.store.read() as conn:
        assert conn.execute(select(run_retry_policies.c.next_attempt_at_ms).where(
            run_retry_policies.c.run_id == flight.run_id)).scalar_one() is None


def test_status_counts(repo, dispatch, session, control):
    launch(repo, dispatch, session)
    lost_run(repo, dispatch, session, control)
    repo.tasks.add(spec("q"), actor_name="tester")
    repo.runs.request("q")
    counts = control.status.counts()
    assert counts.runs["queued"] == 1 and counts.runs["running"] == 1 and counts.runs["lost"] == 1
    assert counts.runs["succeeded"] == 0 and set(counts.runs) >= {"timed_out", "retry_wait"}
    assert counts.attempts == {"claimed": 1, "starting": 0, "running": 1}
