"""CompletionService contract (SEMANTICS.md §5), on SQLite and PostgreSQL."""

from __future__ import annotations

import dataclasses
import secrets
import threading
import time
from typing import NamedTuple

import pytest
from sqlalchemy import func, select

from qlactors.domain.receipt import Receipt, token_hash
from qlactors.errors import BadInput
from qlactors.store.dispatch.completion import CompletionService
from qlactors.store.cadence.control import Control
from qlactors.store.records import Fence
from qlactors.store.schema import run_attempts, run_dispatch_leases, run_events, runs
from store_helpers import spec


class Flight(NamedTuple):
    run_id: str
    attempt_id: str
    fence: Fence
    token: str


@pytest.fixture
def session(dispatch):
    return dispatch.sessions.register("edge", 8)


@pytest.fixture
def service(repo):
    return CompletionService(repo.store)


def launch(repo, dispatch, session, *, started=True, **task) -> Flight:
    """Admit, offer, activate (and report Started) one run of a fresh task."""
    name = f"t{secrets.token_hex(4)}"
    repo.tasks.add(spec(name, **task), actor_name="tester")
    run_id = repo.runs.request(name).run.id
    lease_hash = token_hash(secrets.token_urlsafe(32))
    offer = dispatch.offers.one(session.worker_id, session.session_id, session.generation,
                           secrets.token_hex(8), lease_hash, log_cap_bytes=0)
    assert offer.run_id == run_id
    fence = offer.fence(lease_hash)
    token = secrets.token_urlsafe(32)
    assert dispatch.reports.activate(fence, token_hash(token), "log").result == "applied"
    if started:
        assert dispatch.reports.started(fence, "boot", 100, 100, 5).result == "applied"
    return Flight(run_id, offer.attempt_id, fence, token)


def receipt(flight: Flight, exit_code=0, *, started_at_ms=1, finished_at_ms=2, sequence=1, token=None,
            schema_version=1, output_open=0):
    return Receipt(schema_version=schema_version, run_id=flight.run_id, attempt_id=flight.attempt_id,
                   callback_sequence=sequence, token=token or flight.token, started_at_ms=started_at_ms,
                   finished_at_ms=finished_at_ms, exit_code=exit_code, output_open=output_open)


def later_ms() -> int:
    """A launcher finish time after anything committed so far (the service caps it at now)."""
    return int(time.time() * 1000) + 60_000


def rows(repo, flight):
    with repo.store.read() as conn:
        run = dict(conn.execute(select(runs).where(runs.c.id == flight.run_id)).one()._mapping)
        attempt = dict(conn.execute(select(run_attempts).where(
            run_attempts.c.id == flight.attempt_id)).one()._mapping)
        leases = [dict(r._mapping) for r in conn.execute(select(run_dispatch_leases).where(
            run_dispatch_leases.c.attempt_id == flight.attempt_id))]
        n = conn.execute(select(func.count()).select_from(run_events).where(
            run_events.c.run_id == flight.run_id)).scalar_one()
    return run, attempt, leases, n


def set_deadline(repo, flight, deadline_ms):
    with repo.store.write() as conn:
        conn.execute(run_attempts.update().where(run_attempts.c.id == flight.attempt_id)
                     .values(deadline_at_ms=deadline_ms))


def test_exit_zero_succeeds_and_completes_the_lease(repo, dispatch, session, service):
    flight = launch(repo, dispatch, session)
    out = service.complete(flight.run_id, flight.attempt_id, receipt(flight, 0), 17)
    assert (out.result, out.detail, out.run_state) == ("applied", None, "succeeded")
    run, attempt, (lease,), _ = rows(repo, flight)
    assert run["status"] == attempt["status"] == "succeeded" and run["error_code"] is None
    assert (attempt["exit_code"], attempt["callback_sequence"], attempt["log_dropped_bytes"]) == (0, 1, 17)
    assert attempt["signal"] is None
    assert (lease["status"], lease["version"], lease["release_reason"]) == ("completed", 2, None)
    assert attempt["lease_version"] == 2
    view = repo.runs.get(flight.run_id)
    assert [(e.type, e.actor_type) for e in view.events[-2:]] == [
        ("attempt.succeeded", "completion"), ("run.succeeded", "completion")]
    assert view.events[-1].payload == {"exit_code": 0}


def test_nonzero_exit_fails_with_exit_nonzero(repo, dispatch, session, service):
    flight = launch(repo, dispatch, session)
    out = service.complete(flight.run_id, flight.attempt_id, receipt(flight, 3), None)
    assert (out.result, out.run_state) == ("applied", "failed")
    run, attempt, _, _ = rows(repo, flight)
    assert run["error_code"] == attempt["error_code"] == "EXIT_NONZERO"
    assert attempt["exit_code"] == 3 and attempt["log_dropped_bytes"] is None


def test_times_are_clamped_to_committed_ones(repo, dispatch, session, service):
    flight = launch(repo, dispatch, session)
    _, before, _, _ = rows(repo, flight)
    # a launcher clock far behind: finished before the committed start is raised to it
    service.complete(flight.run_id, flight.attempt_id, receipt(flight, 0, started_at_ms=1, finished_at_ms=2))
    run, attempt, _, _ = rows(repo, flight)
    assert attempt["started_at_ms"] == before["started_at_ms"]
    assert attempt["finished_at_ms"] == before["started_at_ms"] == run["finished_at_ms"]

    ahead = launch(repo, dispatch, session)
    service.complete(ahead.run_id, ahead.attempt_id, receipt(ahead, 0, finished_at_ms=2**52))
    _, attempt, _, _ = rows(repo, ahead)
    assert attempt["finished_at_ms"] <= attempt["updated_at_ms"]  # never after the commit's now


def test_receipt_before_started_completes_and_started_is_then_fenced(repo, dispatch, session, service):
    flight = launch(repo, dispatch, session, started=False)
    out = service.complete(flight.run_id, flight.attempt_id, receipt(flight, 0, started_at_ms=0, finished_at_ms=0))
    assert (out.result, out.run_state) == ("applied", "succeeded")
    run, attempt, _, _ = rows(repo, flight)
    assert attempt["started_at_ms"] == attempt["created_at_ms"] == run["started_at_ms"]
    # the lease completed with the attempt: the late Started is fenced (SEMANTICS.md §9), no change
    before = rows(repo, flight)
    assert dispatch.reports.started(flight.fence, "boot", 100, 100, 5).detail == "attempt_succeeded"
    assert rows(repo, flight) == before


def test_wrong_token_is_refused_and_changes_nothing(repo, dispatch, session, service):
    flight = launch(repo, dispatch, session)
    before = rows(repo, flight)
    out = service.complete(flight.run_id, flight.attempt_id,
                           receipt(flight, 0, token=secrets.token_urlsafe(32)), 5)
    assert (out.result, out.detail) == ("refused", "bad_token")
    assert rows(repo, flight) == before


def test_wrong_sequence_is_refused(repo, dispatch, session, service):
    flight = launch(repo, dispatch, session)
    before = rows(repo, flight)
    out = service.complete(flight.run_id, flight.attempt_id, receipt(flight, 0, sequence=2))
    assert (out.result, out.detail) == ("refused", "wrong_sequence")
    assert rows(repo, flight) == before


def test_receipts_that_do_not_belong_are_refused(repo, dispatch, session, service):
    flight = launch(repo, dispatch, session)
    other = launch(repo, dispatch, session)
    before = rows(repo, flight)
    good = receipt(flight)
    assert service.complete("0" * 36, flight.attempt_id, good).detail == "unknown_run"
    assert service.complete(flight.run_id, "0" * 36, good).detail == "unknown_attempt"
    assert service.complete(other.run_id, flight.attempt_id, good).detail == "wrong_run"
    assert service.complete(flight.run_id, flight.attempt_id,
                            dataclasses.replace(good, run_id=other.run_id)).detail == "receipt_mismatch"
    assert rows(repo, flight) == before
    with repo.store.write() as conn:
        conn.execute(run_attempts.update().where(run_attempts.c.id == flight.attempt_id)
                     .values(executor_type="remote"))
    assert service.complete(flight.run_id, flight.attempt_id, good).detail == "wrong_executor"
    with pytest.raises(BadInput):
        service.complete(flight.run_id, flight.attempt_id, good, -1)


def test_receipt_for_a_claimed_attempt_has_no_token_to_match(repo, dispatch, session, service):
    repo.tasks.add(spec(), actor_name="tester")
    run_id = repo.runs.request("job").run.id
    with repo.store.read() as conn:
        attempt_id = conn.execute(select(run_attempts.c.id).where(run_attempts.c.run_id == run_id)).scalar_one()
    flight = Flight(run_id, attempt_id, None, secrets.token_urlsafe(32))
    assert service.complete(run_id, attempt_id, receipt(flight)).detail == "no_token"


def test_replay_after_applied_is_already_terminal_without_an_event(repo, dispatch, session, service):
    flight = launch(repo, dispatch, session)
    assert service.complete(flight.run_id, flight.attempt_id, receipt(flight, 0)).result == "applied"
    before = rows(repo, flight)
    again = service.complete(flight.run_id, flight.attempt_id, receipt(flight, 0))
    assert (again.result, again.run_state) == ("already_terminal", "succeeded")
    assert rows(repo, flight) == before
    # a forged replay is still refused: the token is checked before anything else is said
    forged = service.complete(flight.run_id, flight.attempt_id, receipt(flight, 0, token=secrets.token_urlsafe(32)))
    assert forged.result == "refused"


def test_receipt_for_a_lost_attempt_is_already_terminal(repo, dispatch, session, service):
    flight = launch(repo, dispatch, session)
    assert Control.open(repo.store).recovery.mark_lost(flight.run_id, flight.attempt_id,
                                         "RECOVERY_PROCESS_EXITED_WITHOUT_RECEIPT").result == "applied"
    before = rows(repo, flight)
    out = service.complete(flight.run_id, flight.attempt_id, receipt(flight, 0))
    assert (out.result, out.run_state) == ("already_terminal", "lost")
    assert rows(repo, flight) == before


def test_user_cancel_intent_wins_over_exit_zero(repo, dispatch, session, service):
    flight = launch(repo, dispatch, session)
    assert repo.runs.cancel(flight.run_id).result == "requested"
    out = service.complete(flight.run_id, flight.attempt_id, receipt(flight, 0, finished_at_ms=later_ms()))
    assert out.run_state == "cancelled"
    run, attempt, (lease,), _ = rows(repo, flight)
    assert run["error_code"] == "EXECUTION_CANCELLED" and attempt["exit_code"] == 0
    assert lease["status"] == "completed"


def test_a_job_that_ended_before_the_cancel_keeps_its_own_outcome(repo, dispatch, session, service):
    # The receipt came late (its reader drained) but the job had exited 4 before the cancel:
    # the stop found it ended and signalled nothing (`exit`), so its exit decides (SEMANTICS.md §7).
    # (A job the executor did signal was alive after the commit: see the signalled case below.)
    flight = launch(repo, dispatch, session)
    ended_ms = rows(repo, flight)[1]["started_at_ms"]  # at once, before the cancel below
    assert repo.runs.cancel(flight.run_id).result == "requested"
    out = service.complete(flight.run_id, flight.attempt_id, receipt(flight, 4, finished_at_ms=ended_ms),
                           stopped_by="exit")
    assert out.run_state == "failed"
    run, attempt, _, _ = rows(repo, flight)
    assert (run["error_code"], attempt["exit_code"], attempt["signal"]) == ("EXIT_NONZERO", 4, None)
    assert run["finished_at_ms"] == attempt["finished_at_ms"] == ended_ms


def test_a_job_the_stop_signalled_is_cancelled_whatever_its_finish_time_says(repo, dispatch, session, service):
    # Signals are sent only after the intent is committed, so a signalled job was alive then;
    # its launcher-clock finish time may still read a tick earlier than the commit's.
    flight = launch(repo, dispatch, session)
    ended_ms = rows(repo, flight)[1]["started_at_ms"]
    assert repo.runs.cancel(flight.run_id).result == "requested"
    out = service.complete(flight.run_id, flight.attempt_id, receipt(flight, 143, finished_at_ms=ended_ms),
                           stopped_by="term")
    assert out.run_state == "cancelled"
    _, attempt, _, _ = rows(repo, flight)
    assert (attempt["exit_code"], attempt["signal"]) == (143, 15)


@pytest.mark.parametrize(("stopped_by", "exit_code", "expected"), [
    ("term", 143, 15), ("kill", 137, 9), ("kill", 143, None), ("term", 0, None), ("exit", 143, None)])
def test_signal_is_the_stop_signal_that_ended_the_job(repo, dispatch, session, service,
                                                    stopped_by, exit_code, expected):
    flight = launch(repo, dispatch, session)
    assert repo.runs.cancel(flight.run_id).result == "requested"
    out = service.complete(flight.run_id, flight.attempt_id,
                           receipt(flight, exit_code, finished_at_ms=later_ms()), stopped_by=stopped_by)
    assert out.run_state == "cancelled"
    _, attempt, _, _ = rows(repo, flight)
    assert (attempt["exit_code"], attempt["signal"]) == (exit_code, expected)


def test_signal_stays_null_when_no_stop_decided_the_outcome(repo, dispatch, session, service):
    flight = launch(repo, dispatch, session)
    out = service.complete(flight.run_id, flight.attempt_id, receipt(flight, 143), stopped_by="term")
    assert out.run_state == "failed"
    _, attempt, _, _ = rows(repo, flight)
    assert (attempt["exit_code"], attempt["signal"]) == (143, None)


def test_a_receipt_with_its_output_left_open_says_so_and_records_no_dropped_count(repo, dispatch, session,
                                                                                   service):
    flight = launch(repo, dispatch, session)
    out = service.complete(flight.run_id, flight.attempt_id,
                           receipt(flight, 4, schema_version=2, output_open=1), log_dropped_bytes=7)
    assert out.run_state == "failed"
    _, attempt, _, _ = rows(repo, flight)
    assert (attempt["exit_code"], attempt["log_dropped_bytes"]) == (4, None)
    events = [e for e in repo.runs.get(flight.run_id).events if e.attempt_id == flight.attempt_id]
    types = [e.type for e in events]
    assert types[-3:] == ["attempt.output_left_open", "attempt.failed", "run.failed"]


def test_a_schema_2_receipt_with_its_output_closed_records_the_dropped_count(repo, dispatch, session, service):
    flight = launch(repo, dispatch, session)
    out = service.complete(flight.run_id, flight.attempt_id,
                           receipt(flight, 0, schema_version=2, output_open=0), log_dropped_bytes=7)
    assert out.run_state == "succeeded"
    _, attempt, _, _ = rows(repo, flight)
    assert attempt["log_dropped_bytes"] == 7
    assert "attempt.output_left_open" not in [e.type for e in repo.runs.get(flight.run_id).events]


def test_timeout_intent_with_a_receipt_finished_in_time_completes_normally(repo, dispatch, session, service):
    flight = launch(repo, dispatch, session, timeout_ms=60_000)
    set_deadline(repo, flight, 1_000)
    assert [o.run_id for o in Control.open(repo.store).stops.commit_timeouts()] == [flight.run_id]
    out = service.complete(flight.run_id, flight.attempt_id, receipt(flight, 0, finished_at_ms=1_000))
    assert out.run_state == "succeeded"
    assert repo.runs.get(flight.run_id).cancel_reason == "timeout"


def test_timeout_intent_with_a_receipt_finished_late_times_out(repo, dispatch, session, service):
    flight = launch(repo, dispatch, session, timeout_ms=60_000)
    set_deadline(repo, flight, 1_000)
    Control.open(repo.store).stops.commit_timeouts()
    out = service.complete(flight.run_id, flight.attempt_id, receipt(flight, 0, finished_at_ms=1_001))
    assert out.run_state == "timed_out"
    run, attempt, _, _ = rows(repo, flight)
    assert run["error_code"] == attempt["error_code"] == "EXECUTION_TIMED_OUT"


def test_receipt_lands_after_the_executor_session_was_replaced(repo, dispatch, session, service):
    flight = launch(repo, dispatch, session)
    dispatch.sessions.register("edge", 8)  # a restart: the old fence is dead, the receipt is not
    assert service.complete(flight.run_id, flight.attempt_id, receipt(flight, 0)).result == "applied"


def test_concurrent_completions_of_one_receipt_apply_once(repo, dispatch, session, service):
    flight = launch(repo, dispatch, session)
    barrier, results = threading.Barrier(2), []

    def complete():
        barrier.wait()
        results.append(service.complete(flight.run_id, flight.attempt_id, receipt(flight, 0)).result)

    threads = [threading.Thread(target=complete) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(results) == ["already_terminal", "applied"]
    types = [e.type for e in repo.runs.get(flight.run_id).events]
    assert types.count("run.succeeded") == 1 and types.count("attempt.succeeded") == 1


# -- completion from a later session (SEMANTICS.md §9 Completion) ------------------------------

def test_completed_lands_from_a_later_session_of_the_same_worker(repo, dispatch, session, service):
    flight = launch(repo, dispatch, session)
    dispatch.sessions.register("edge", 8)  # the worker restarted: its old session is superseded
    out = service.complete(flight.run_id, flight.attempt_id, receipt(flight, 0), 0,
                           worker_id="edge", final_log_offset=1234)
    assert (out.result, out.run_state) == ("applied", "succeeded")
    _, attempt, (lease,), _ = rows(repo, flight)
    assert attempt["log_final_offset"] == 1234
    assert (lease["status"], lease["version"]) == ("completed", 2)


def test_completed_for_another_workers_attempt_is_refused_and_changes_nothing(repo, dispatch, session, service):
    flight = launch(repo, dispatch, session)
    before = rows(repo, flight)
    out = service.complete(flight.run_id, flight.attempt_id, receipt(flight, 0), worker_id="intruder",
                           final_log_offset=5)
    assert (out.result, out.detail) == ("refused", "wrong_worker")
    wrong = service.complete(flight.run_id, flight.attempt_id, receipt(flight, 0, token=secrets.token_urlsafe(32)),
                             worker_id="edge", final_log_offset=5)
    assert (wrong.result, wrong.detail) == ("refused", "bad_token")
    assert rows(repo, flight) == before


def test_completed_of_a_superseded_attempt_is_already_terminal(repo, dispatch, session, service):
    from qlactors.domain.retry import RetryPolicy
    from qlactors.store.cadence.lost_retry import LostRetry

    policy = RetryPolicy(retry_on_lost=True, max_attempts=2, safety="idempotent", backoff_base_ms=0)
    flight = launch(repo, dispatch, session, retry=policy)
    assert Control.open(repo.store).recovery.mark_lost(flight.run_id, flight.attempt_id, "RECOVERY_PROCESS_EXITED_WITHOUT_RECEIPT").result == "applied"
    retries = LostRetry(repo.store)
    retries.resolve_lost(flight.run_id)
    assert retries.requeue(flight.run_id).result == "applied"  # attempt 2 is the run's now
    before = rows(repo, flight)
    out = service.complete(flight.run_id, flight.attempt_id, receipt(flight, 0), worker_id="edge",
                           final_log_offset=9)
    assert (out.result, out.run_state) == ("already_terminal", "queued")
    assert rows(repo, flight) == before


def test_final_log_offset_must_be_a_count(repo, dispatch, session, service):
    flight = launch(repo, dispatch, session)
    with pytest.raises(BadInput):
        service.complete(flight.run_id, flight.attempt_id, receipt(flight, 0), final_log_offset=-1)
