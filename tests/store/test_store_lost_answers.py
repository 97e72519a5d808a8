"""Reports crossing heartbeats (SEMANTICS.md §9 Fence, Renewal): a renewal committed while a
Started is in flight does not fence the Started, and a heartbeat whose answer was lost, followed
by any report, does not stop the job; on SQLite and PostgreSQL."""

from __future__ import annotations

import hashlib
import secrets

from qlactors.domain.receipt import Receipt, token_hash
from qlactors.store.dispatch.completion import CompletionService
from qlactors.store.dispatch.log_chunks import LogChunks
from store_helpers import db_state
from session_steps import IDENTITY, beat, launch, register


def started(dispatch, flight):
    return dispatch.reports.started(flight.fence, IDENTITY.boot_id, IDENTITY.pid, IDENTITY.pgid, IDENTITY.start_ticks)


def completed(repo, flight, worker_id, exit_code, *, token=None, final_log_offset=None):
    receipt = Receipt(schema_version=2, run_id=flight.quote.run_id, attempt_id=flight.quote.attempt_id,
                      callback_sequence=1, token=token or flight.token, started_at_ms=1, finished_at_ms=2,
                      exit_code=exit_code, output_open=0)
    return CompletionService(repo.store).complete(flight.quote.run_id, flight.quote.attempt_id, receipt, 0,
                                                  worker_id=worker_id, final_log_offset=final_log_offset)


def chunk(repo, flight, worker_id, offset, data: bytes):
    return LogChunks(repo.store).append(worker_id, flight.quote.attempt_id, token_hash(flight.token), offset, data,
                                        hashlib.sha256(data).hexdigest())


def the_lease(repo, flight) -> dict:
    (lease,) = db_state(repo, flight.quote.run_id)[2]
    return lease


def test_a_renewal_committed_while_a_started_is_in_flight_does_not_fence_the_started(repo, dispatch):
    """The worker sent Started quoting lease version 1; two heartbeats renewed the lease (versions
    2 and 3) before the Started was handled. The version never fences: the Started applies."""
    session = register(dispatch, "w1")
    flight = launch(repo, dispatch, session, started=False)
    assert flight.fence.lease_version == 1
    for seq in (1, 2):
        answer = beat(dispatch, session, seq, flight.quote)
        assert answer.fenced == () and [r[0] for r in answer.renewed] == [flight.quote.attempt_id]
    assert the_lease(repo, flight)["version"] == 3
    outcome = started(dispatch, flight)
    assert (outcome.result, outcome.run_state) == ("applied", "running")
    run, (attempt,), (lease,), _ = db_state(repo, flight.quote.run_id)
    assert (run["status"], attempt["status"], attempt["pid"]) == ("running", "running", IDENTITY.pid)
    assert (lease["status"], lease["version"]) == ("leased", 3)  # Started changes no lease


def test_a_lost_heartbeat_answer_then_every_report_applies_and_the_run_ends_with_its_exit_code(repo, dispatch):
    """Heartbeat 1 renews the lease; its answer never reaches the worker. Then the worker's
    Started, the same heartbeat again (it heard nothing), a log chunk, a later heartbeat and
    Completed: each is applied, nothing is fenced, and the run ends with the job's exit code."""
    session = register(dispatch, "w1")
    flight = launch(repo, dispatch, session, started=False)
    lost = beat(dispatch, session, 1, flight.quote)  # committed; the answer is lost on the way
    assert lost.fenced == ()
    assert started(dispatch, flight).result == "applied"
    again = beat(dispatch, session, 1, flight.quote)  # repeated: the stored answer, no second renewal
    assert again == lost and the_lease(repo, flight)["version"] == 2
    data = b"half of the output\n"
    appended = chunk(repo, flight, "w1", 0, data)
    assert (appended.result, appended.value) == ("applied", len(data))
    later = beat(dispatch, session, 2, flight.quote)
    assert later.fenced == () and [(r[0], r[2]) for r in later.renewed] == [(flight.quote.attempt_id, 3)]
    assert db_state(repo, flight.quote.run_id)[0]["status"] == "running"  # nothing stopped it
    outcome = completed(repo, flight, "w1", 7, final_log_offset=len(data))
    assert (outcome.result, outcome.run_state) == ("applied", "failed")
    run, (attempt,), (lease,), _ = db_state(repo, flight.quote.run_id)
    assert (run["error_code"], attempt["exit_code"], attempt["log_final_offset"]) == ("EXIT_NONZERO", 7, len(data))
    assert lease["status"] == "completed"
    assert LogChunks(repo.store).read(flight.quote.attempt_id, 0, 1024) == data


def test_a_completed_from_a_later_session_with_a_wrong_token_is_refused_and_changes_nothing(repo, dispatch):
    session = register(dispatch, "w1")
    flight = launch(repo, dispatch, session)
    register(dispatch, "w1")  # the worker restarted: a later session
    before = db_state(repo, flight.quote.run_id)
    outcome = completed(repo, flight, "w1", 0, token=secrets.token_urlsafe(32))
    assert (outcome.result, outcome.detail) == ("refused", "bad_token")
    assert db_state(repo, flight.quote.run_id) == before
    assert completed(repo, flight, "w1", 0).result == "applied"  # the right token still lands
