"""Worker sessions, heartbeats with lease renewals, and attestations (SEMANTICS.md §9), on SQLite
and PostgreSQL."""

from __future__ import annotations

import dataclasses
import threading
from types import SimpleNamespace

import pytest
from sqlalchemy import select, update

from qlactors.errors import BadInput
from qlactors.store.admin.workers import Workers
from qlactors.store.cadence.control import Control
from qlactors.store.records import Fenced, Identity, LeaseQuote
from qlactors.store.schema import run_attempts, run_dispatch_leases, worker_sessions
from qlactors.store.dispatch.session_rules import renewal_fence
from store_helpers import db_state, new_hash
from session_steps import (
    LEASE_MS, BOOT, IDENTITY, register, launch, beat, session_row, expire_lease, expire_session, complete,
    attest,
)


@pytest.fixture
def worker(dispatch):
    return register(dispatch, "w1")


def live_lease(repo, run_id):
    return [lease for lease in db_state(repo, run_id)[2] if lease["status"] == "leased"]


# -- register and resume -----------------------------------------------------------------------

def test_register_increments_the_generation_and_ends_the_older_session(repo, dispatch):
    first = register(dispatch, "w1")
    second = register(dispatch, "w1")
    assert (first.generation, second.generation) == (1, 2)
    assert second.labels == ("eu", "gpu") and second.boot_id == BOOT
    old, new = session_row(repo, first.session_id), session_row(repo, second.session_id)
    assert old.status == "offline" and old.ended_at_ms is not None
    assert new.status == "online" and new.ended_at_ms is None and new.labels_json == '["eu","gpu"]'
    assert new.lease_expires_at_ms == second.lease_expires_at_ms
    assert new.lease_expires_at_ms - new.created_at_ms == LEASE_MS
    # an expired session that is superseded ended when its lease expired
    expire_session(repo, second.session_id)
    register(dispatch, "w1")
    assert session_row(repo, second.session_id).ended_at_ms == 1


def test_a_worker_off_the_allow_list_cannot_register_and_nothing_changes(repo, dispatch):
    from qlactors.store.admin.worker_keys import WorkerKeys

    old = register(dispatch, "w1")
    keys = WorkerKeys(repo.store)
    keys.allow("w1", "k" * 40)
    keys.revoke("w1")  # a replica whose allow-list cache still has the key lets its Register in
    with pytest.raises(Fenced, match="not on the allow-list"):
        dispatch.sessions.register("w1", 2, session_lease_ms=LEASE_MS, require_key=True)
    with repo.store.read() as conn:
        rows = conn.execute(select(worker_sessions.c.generation, worker_sessions.c.status)
                            .where(worker_sessions.c.worker_id == "w1")).all()
    assert [tuple(r) for r in rows] == [(old.generation, "offline")]  # ended by `revoke`; no new one
    keys.allow("w1", "k" * 40)
    assert dispatch.sessions.register("w1", 2, session_lease_ms=LEASE_MS, require_key=True).generation == 2


def test_register_checks_its_arguments(dispatch):
    with pytest.raises(BadInput):
        dispatch.sessions.register("w1", 1, labels="gpu")
    with pytest.raises(BadInput):
        dispatch.sessions.register("w1", 1, labels=("bad label",))
    with pytest.raises(BadInput):
        dispatch.sessions.register("w1", 1, session_lease_ms=0)
    with pytest.raises(BadInput):
        dispatch.sessions.register("w1", 1, resume_secret_hash="raw-secret")


def test_resume_within_the_lease_on_the_same_boot_rotates_the_secret(repo, dispatch):
    secret, rotated = new_hash(), new_hash()
    session = register(dispatch, "w1", secret)
    assert beat(dispatch, session, 3).renewed == ()
    with repo.store.write() as conn:  # its last heartbeat long before the restart
        conn.execute(update(worker_sessions).where(worker_sessions.c.session_id == session.session_id)
                     .values(heartbeat_at_ms=worker_sessions.c.heartbeat_at_ms - 600_000))
    before = session_row(repo, session.session_id)
    resumed = dispatch.sessions.resume("w1", session.session_id, 1, secret, rotated, BOOT,
                                      capacity=2, labels=["cpu"], session_lease_ms=LEASE_MS)
    # `workers` counts the heartbeat's age from the resume, not from before the stop (issue 28)
    [shown] = Workers(repo.store).list().workers
    assert shown.heartbeat_age_ms is not None and shown.heartbeat_age_ms < 600_000 / 2
    assert (resumed.session_id, resumed.generation, resumed.capacity) == (session.session_id, 1, 2)
    assert resumed.labels == ("cpu",) and resumed.heartbeat_seq == 3
    row = session_row(repo, session.session_id)
    assert row.resume_secret_hash == rotated and row.free_slots == 2 and row.status == "online"
    assert row.lease_expires_at_ms >= before.lease_expires_at_ms and row.version == before.version + 1
    with pytest.raises(Fenced, match="^wrong_secret"):  # the old secret is refused afterwards
        dispatch.sessions.resume("w1", session.session_id, 1, secret, new_hash(), BOOT,
                                capacity=2, labels=(), session_lease_ms=LEASE_MS)


@pytest.mark.parametrize("case", ["expired", "rebooted", "wrong_secret", "superseded", "offline",
                                  "unknown_session"])
def test_resume_is_refused_and_changes_nothing(repo, dispatch, case):
    secret = new_hash()
    session = register(dispatch, "w1", secret)
    boot, session_id, generation, quoted = BOOT, session.session_id, 1, secret
    if case == "expired":
        expire_session(repo, session.session_id)
    elif case == "rebooted":
        boot = "boot-2"
    elif case == "wrong_secret":
        quoted = new_hash()
    elif case == "superseded":
        register(dispatch, "w1")
    elif case == "offline":  # ended otherwise than by its own drain (as an older release's revoke left it)
        with repo.store.write() as conn:
            conn.execute(update(worker_sessions).where(worker_sessions.c.session_id == session_id)
                         .values(status="offline", ended_at_ms=2))
    else:
        generation = 2
    before = session_row(repo, session_id)
    with pytest.raises(Fenced, match=f"^{case}"):
        dispatch.sessions.resume("w1", session_id, generation, quoted, new_hash(), boot,
                                capacity=4, labels=(), session_lease_ms=LEASE_MS)
    assert session_row(repo, session_id) == before


def test_end_session_drains_then_goes_offline(repo, dispatch, worker):
    assert dispatch.sessions.end("w1", worker.session_id, 1, status="draining").result == "applied"
    row = session_row(repo, worker.session_id)
    assert (row.status, row.ended_at_ms) == ("draining", None) and row.drained_at_ms is not None
    drained_at = row.drained_at_ms
    # a draining session still heartbeats (it keeps its running jobs renewed)
    assert not beat(dispatch, worker, 1).session_ended
    outcome = dispatch.sessions.end("w1", worker.session_id, 1)
    row = session_row(repo, worker.session_id)
    assert (outcome.result, outcome.detail, row.status) == ("applied", None, "offline")
    assert row.ended_at_ms is not None and row.drained_at_ms == drained_at  # drained since the first
    assert beat(dispatch, worker, 2).session_ended  # an offline session's heartbeat: register anew


def test_end_session_repeated_is_idempotent_and_changes_nothing(repo, dispatch, worker):
    assert dispatch.sessions.end("w1", worker.session_id, 1, status="draining").result == "applied"
    draining = session_row(repo, worker.session_id)
    again = dispatch.sessions.end("w1", worker.session_id, 1, status="draining")
    assert (again.result, again.detail) == ("applied", "already_draining")
    assert session_row(repo, worker.session_id) == draining
    assert dispatch.sessions.end("w1", worker.session_id, 1).result == "applied"
    offline = session_row(repo, worker.session_id)
    for status in ("offline", "draining"):  # a late repeat of either, after a failover
        outcome = dispatch.sessions.end("w1", worker.session_id, 1, status=status)
        assert (outcome.result, outcome.detail) == ("applied", "already_offline")
    assert session_row(repo, worker.session_id) == offline


def test_end_session_offline_without_draining_first_is_a_drain_too(repo, dispatch, worker):
    assert dispatch.sessions.end("w1", worker.session_id, 1).result == "applied"
    row = session_row(repo, worker.session_id)
    assert row.status == "offline" and row.drained_at_ms is not None and row.ended_at_ms is not None


@pytest.mark.parametrize("status", ["draining", "offline"])
def test_end_session_from_a_superseded_or_foreign_session_is_fenced_and_changes_nothing(
        repo, dispatch, worker, status):
    newer = register(dispatch, "w1")  # generation 2 supersedes the fixture's session
    old, current = session_row(repo, worker.session_id), session_row(repo, newer.session_id)
    superseded = dispatch.sessions.end("w1", worker.session_id, 1, status=status)
    assert (superseded.result, superseded.detail) == ("fenced", "superseded")
    assert dispatch.sessions.end("w2", newer.session_id, 2, status=status).detail == "session_worker"
    assert dispatch.sessions.end("w1", newer.session_id, 1, status=status).detail == "session_generation"
    assert dispatch.sessions.end("w1", "0" * 26, 2, status=status).detail == "unknown_session"
    assert session_row(repo, worker.session_id) == old and session_row(repo, newer.session_id) == current
    assert old.drained_at_ms is None  # superseded, not drained: no drain grace for it


def test_end_session_of_a_revoked_session_is_fenced(repo, dispatch, worker):
    from qlactors.store.admin.worker_keys import WorkerKeys

    keys = WorkerKeys(repo.store)
    keys.allow("w1", "k" * 40)
    assert keys.revoke("w1").sessions_ended == 1  # offline, not drained, ended by `revoked`
    before = session_row(repo, worker.session_id)
    assert (before.status, before.ended_by, before.drained_at_ms) == ("offline", "revoked", None)
    outcome = dispatch.sessions.end("w1", worker.session_id, 1, status="offline")
    assert (outcome.result, outcome.detail) == ("fenced", "session_offline")
    assert session_row(repo, worker.session_id) == before


def test_draining_a_session_whose_lease_expired_is_refused_but_it_may_go_offline(repo, dispatch, worker):
    expire_session(repo, worker.session_id)
    refused = dispatch.sessions.end("w1", worker.session_id, 1, status="draining")
    assert (refused.result, refused.detail) == ("refused", "session_expired")
    assert dispatch.sessions.end("w1", worker.session_id, 1).result == "applied"
    row = session_row(repo, worker.session_id)
    assert (row.status, row.ended_at_ms) == ("offline", 1)  # it ended when its lease expired


def test_a_drained_session_is_resumed_within_its_lease_and_is_online_again(repo, dispatch):
    secret, rotated = new_hash(), new_hash()
    session = register(dispatch, "w1", secret)
    assert dispatch.sessions.end("w1", session.session_id, 1, status="draining").result == "applied"
    assert dispatch.sessions.end("w1", session.session_id, 1).result == "applied"
    resumed = dispatch.sessions.resume("w1", session.session_id, 1, secret, rotated, BOOT,
                                      capacity=4, labels=(), session_lease_ms=LEASE_MS)
    assert (resumed.session_id, resumed.generation) == (session.session_id, 1)
    row = session_row(repo, session.session_id)
    assert (row.status, row.ended_at_ms, row.drained_at_ms) == ("online", None, None)
    assert not beat(dispatch, session, 5).session_ended


# -- heartbeats and renewals -------------------------------------------------------------------

def test_heartbeat_renews_the_session_and_its_leases(repo, dispatch, worker):
    flight = launch(repo, dispatch, worker)
    answer = beat(dispatch, worker, 1, flight.quote, free_slots=99, clock=5_000)
    ((attempt_id, generation, version, expires),) = answer.renewed
    assert (attempt_id, generation, version, answer.fenced) == (flight.quote.attempt_id, 1, 2, ())
    assert not answer.session_ended and not answer.stale
    (lease,) = live_lease(repo, flight.quote.run_id)
    assert (lease["version"], lease["expires_at_ms"]) == (2, expires)
    attempt = db_state(repo, flight.quote.run_id)[1][0]
    assert (attempt["lease_version"], attempt["lease_expires_at_ms"]) == (2, expires)
    row = session_row(repo, worker.session_id)
    assert row.free_slots == 4 and row.heartbeat_seq == 1  # clamped to the capacity
    assert row.clock_skew_ms == row.heartbeat_at_ms - 5_000
    assert row.lease_expires_at_ms == answer.session_expires_at_ms == row.heartbeat_at_ms + LEASE_MS


def test_a_repeated_heartbeat_gets_the_stored_answer_and_renews_nothing(repo, dispatch, worker):
    flight = launch(repo, dispatch, worker)
    first = beat(dispatch, worker, 1, flight.quote)
    before = db_state(repo, flight.quote.run_id), session_row(repo, worker.session_id)
    assert beat(dispatch, worker, 1, flight.quote) == first
    assert (db_state(repo, flight.quote.run_id), session_row(repo, worker.session_id)) == before
    assert live_lease(repo, flight.quote.run_id)[0]["version"] == 2


def test_a_lower_heartbeat_number_is_stale_and_changes_nothing(repo, dispatch, worker):
    flight = launch(repo, dispatch, worker)
    beat(dispatch, worker, 5, flight.quote)
    before = db_state(repo, flight.quote.run_id), session_row(repo, worker.session_id)
    answer = beat(dispatch, worker, 4, flight.quote)
    assert answer.stale and answer.renewed == () and not answer.session_ended
    assert (db_state(repo, flight.quote.run_id), session_row(repo, worker.session_id)) == before


def test_an_expired_but_leased_lease_of_a_running_attempt_is_renewed(repo, dispatch, worker):
    flight = launch(repo, dispatch, worker)
    expire_lease(repo, flight.quote.attempt_id)
    answer = beat(dispatch, worker, 1, flight.quote)
    assert [r[:3] for r in answer.renewed] == [(flight.quote.attempt_id, 1, 2)]
    assert live_lease(repo, flight.quote.run_id)[0]["expires_at_ms"] > 1


@pytest.mark.parametrize("session_case", ["superseded", "expired", "offline"])
def test_a_heartbeat_of_an_ended_session_renews_nothing(repo, dispatch, worker, session_case):
    flight = launch(repo, dispatch, worker)
    if session_case == "superseded":
        register(dispatch, "w1")
    elif session_case == "expired":
        expire_session(repo, worker.session_id)
    else:
        dispatch.sessions.end("w1", worker.session_id, 1)
    before = db_state(repo, flight.quote.run_id), session_row(repo, worker.session_id)
    answer = beat(dispatch, worker, 1, flight.quote)
    assert answer.session_ended and answer.renewed == () and answer.reason.startswith("session_")
    assert (db_state(repo, flight.quote.run_id), session_row(repo, worker.session_id)) == before


@pytest.mark.parametrize("case", ["lease_released", "lease_completed", "lease_token", "offer_id",
                                  "lease_generation", "lease_session", "unknown_attempt", "mark_lost"])
def test_each_fenced_renewal_changes_nothing(repo, dispatch, worker, case):
    flight = launch(repo, dispatch, worker, activated=case != "lease_released", started=False)
    quote = flight.quote
    if case == "lease_released":
        assert dispatch.reports.decline(flight.fence, "declined").result == "applied"
    elif case == "lease_completed":
        complete(repo, flight)
    elif case == "lease_token":
        quote = dataclasses.replace(quote, lease_token_hash=new_hash())
    elif case == "offer_id":
        quote = dataclasses.replace(quote, offer_id="other-offer")
    elif case == "lease_generation":
        quote = dataclasses.replace(quote, lease_generation=2)
    elif case == "unknown_attempt":
        quote = dataclasses.replace(quote, attempt_id="no-such-attempt")
    elif case == "mark_lost":
        assert Control.open(repo.store).recovery.mark_lost(quote.run_id, quote.attempt_id, "WORKER_LOST").result == "applied"
    session = worker
    if case == "lease_session":  # another worker's session quoting this worker's lease
        session = register(dispatch, "w2")
    before = db_state(repo, quote.run_id)
    answer = beat(dispatch, session, 1, quote)
    expected = "lease_released" if case == "mark_lost" else case
    assert answer.renewed == () and answer.fenced == ((quote.attempt_id, quote.lease_generation, expected),)
    assert db_state(repo, quote.run_id) == before
    assert session_row(repo, session.session_id).heartbeat_seq == 1  # the heartbeat itself counted


def test_renewal_fence_of_a_live_lease_whose_attempt_ended():
    quote = LeaseQuote("r", "a", "o", 1, "f" * 64)
    lease = SimpleNamespace(run_id="r", offer_id="o", worker_id="w", session_id="s", session_generation=1,
                            token_hash="f" * 64, status="leased")

    def fence(status):
        return renewal_fence(quote, lease, SimpleNamespace(run_id="r", status=status), "w", "s", 1)

    assert (fence("lost"), fence("succeeded"), fence("running"), fence("claimed")) == (
        "attempt_lost", "attempt_terminal", None, None)


def test_one_heartbeat_renews_some_and_fences_others(repo, dispatch, worker):
    kept, released = launch(repo, dispatch, worker), launch(repo, dispatch, worker, activated=False, started=False)
    assert dispatch.reports.decline(released.fence, "declined").result == "applied"
    answer = beat(dispatch, worker, 1, released.quote, kept.quote, kept.quote)
    assert [r[0] for r in answer.renewed] == [kept.quote.attempt_id]
    assert answer.fenced == ((released.quote.attempt_id, 1, "lease_released"),)
    assert beat(dispatch, worker, 1) == answer  # the stored answer, whatever the repeat quotes


# -- attestations ------------------------------------------------------------------------------


def test_attest_running_from_the_current_session_rebinds_an_old_sessions_lease(repo, dispatch, worker):
    flight = launch(repo, dispatch, worker)
    restarted = register(dispatch, "w1")
    new_token = new_hash()
    result = attest(dispatch, restarted, flight, worker, new_lease_token_hash=new_token, new_offer_id="offer-2")
    assert (result.result, result.value.lease_generation, result.value.lease_version) == ("applied", 2, 1)
    old, new = db_state(repo, flight.quote.run_id)[2]
    assert (old["status"], old["release_reason"]) == ("released", "lease_expired")
    assert (new["status"], new["session_id"], new["session_generation"], new["offer_id"]) == (
        "leased", restarted.session_id, 2, "offer-2")
    assert new["token_hash"] == new_token and new["expires_at_ms"] == result.value.expires_at_ms
    attempt = db_state(repo, flight.quote.run_id)[1][0]
    assert (attempt["lease_generation"], attempt["session_id"], attempt["offer_id"], attempt["status"]) == (
        2, restarted.session_id, "offer-2", "running")
    # the old lease no longer renews (from no session); the new lease does
    assert beat(dispatch, restarted, 1, flight.quote).fenced == ((flight.quote.attempt_id, 1, "lease_session"),)
    # the re-bind is a fact of the run's history (issue 28), by the worker's executor
    adopted = repo.runs.get(flight.quote.run_id).events[-1]
    assert (adopted.type, adopted.actor_type, adopted.payload["lease_generation"], adopted.payload["from_generation"]) \
        == ("attempt.adopted", "executor", 2, 1)
    new_quote = LeaseQuote(flight.quote.run_id, flight.quote.attempt_id, "offer-2", 2, new_token)
    assert [r[:3] for r in beat(dispatch, restarted, 2, new_quote).renewed] == [(flight.quote.attempt_id, 2, 2)]


def test_a_repeated_running_attestation_answers_the_same_lease(repo, dispatch, worker):
    flight = launch(repo, dispatch, worker)
    restarted = register(dispatch, "w1")
    token = new_hash()
    first = attest(dispatch, restarted, flight, worker, new_lease_token_hash=token, new_offer_id="offer-2")
    before = db_state(repo, flight.quote.run_id)
    again = attest(dispatch, restarted, flight, worker, new_lease_token_hash=token, new_offer_id="offer-2")
    assert again == first and db_state(repo, flight.quote.run_id) == before
    other = attest(dispatch, restarted, flight, worker, new_lease_token_hash=new_hash(), new_offer_id="offer-2")
    assert (other.result, other.detail) == ("fenced", "offer_id_used")


def test_attest_running_of_an_attempt_whose_started_never_landed_records_it_running(repo, dispatch, worker):
    flight = launch(repo, dispatch, worker, started=False)
    restarted = register(dispatch, "w1")
    result = attest(dispatch, restarted, flight, worker)
    assert (result.result, result.value.lease_generation) == ("applied", 2)
    run, (attempt,), leases, _ = db_state(repo, flight.quote.run_id)
    assert (run["status"], attempt["status"], attempt["session_id"]) == ("running", "running", restarted.session_id)
    assert Identity.from_row(SimpleNamespace(**attempt)) == IDENTITY and attempt["started_at_ms"] is not None
    assert [lease["status"] for lease in leases] == ["released", "leased"]
    assert [e.type for e in repo.runs.get(flight.quote.run_id).events][-3:] == [
        "attempt.adopted", "attempt.running", "run.running"]
    assert [e.type for e in repo.runs.get(flight.quote.run_id).events][-1] == "run.running"


def test_attest_about_another_workers_lease_is_refused(repo, dispatch, worker):
    flight = launch(repo, dispatch, worker)
    intruder = register(dispatch, "w2")
    before = db_state(repo, flight.quote.run_id)
    for fact in ("running", "stopped"):
        result = attest(dispatch, intruder, flight, worker, fact)
        assert (result.result, result.detail) == ("refused", "lease_worker")
    assert db_state(repo, flight.quote.run_id) == before


def test_attest_from_a_superseded_session_is_fenced(repo, dispatch, worker):
    flight = launch(repo, dispatch, worker)
    register(dispatch, "w1")
    before = db_state(repo, flight.quote.run_id)
    result = attest(dispatch, worker, flight, worker, "stopped")
    assert (result.result, result.detail) == ("fenced", "session_offline")
    assert db_state(repo, flight.quote.run_id) == before


def test_attest_running_with_another_identity_is_refused(repo, dispatch, worker):
    flight = launch(repo, dispatch, worker)
    before = db_state(repo, flight.quote.run_id)
    result = attest(dispatch, worker, flight, worker, identity=Identity(BOOT, 4242, 4242, 78))
    assert (result.result, result.detail) == ("refused", "identity_mismatch")
    assert db_state(repo, flight.quote.run_id) == before


def test_attest_about_an_ended_attempt_is_superseded_and_changes_nothing(repo, dispatch, worker):
    flight = launch(repo, dispatch, worker)
    complete(repo, flight)
    restarted = register(dispatch, "w1")
    before = db_state(repo, flight.quote.run_id)
    for fact in ("running", "ended_with_receipt"):
        result = attest(dispatch, restarted, flight, worker, fact)
        assert (result.result, result.detail) == ("superseded", "attempt_succeeded")
    assert db_state(repo, flight.quote.run_id) == before


def test_attest_evidence_is_recorded_on_the_attempt_only(repo, dispatch, worker):
    flight = launch(repo, dispatch, worker)
    restarted = register(dispatch, "w1")
    run_before, attempts_before, leases_before, events_before = db_state(repo, flight.quote.run_id)
    result = attest(dispatch, restarted, flight, worker, "stopped")
    assert (result.result, result.value.lease_generation, result.value.lease_version) == ("applied", 1, 1)
    run, (attempt,), leases, events = db_state(repo, flight.quote.run_id)
    assert attempt["evidence"] == "stopped" and attempt["evidence_at_ms"] is not None
    assert (run, leases, events) == (run_before, leases_before, events_before)
    changed = {k for k in attempt if attempt[k] != attempts_before[0][k]}
    assert changed == {"evidence", "evidence_at_ms", "evidence_lease_generation", "updated_at_ms"}
    assert attempt["evidence_lease_generation"] == 1  # the generation of the lease it quoted
    # the same fact again keeps its first time; a released lease fences further attestations
    attest(dispatch, restarted, flight, worker, "stopped")
    assert db_state(repo, flight.quote.run_id)[1][0]["evidence_at_ms"] == attempt["evidence_at_ms"]
    with repo.store.write() as conn:
        conn.execute(update(run_dispatch_leases).where(run_dispatch_leases.c.attempt_id == flight.quote.attempt_id)
                     .values(status="released", release_reason="lease_expired"))
    assert attest(dispatch, restarted, flight, worker, "ended").detail == "lease_released"
    with repo.store.read() as conn:
        assert conn.execute(select(run_attempts.c.evidence).where(
            run_attempts.c.id == flight.quote.attempt_id)).scalar_one() == "stopped"


def test_attest_checks_its_arguments(repo, dispatch, worker):
    flight = launch(repo, dispatch, worker)
    with pytest.raises(BadInput):
        attest(dispatch, worker, flight, worker, "maybe")
    with pytest.raises(BadInput):
        attest(dispatch, worker, flight, worker, identity=None)


def test_a_heartbeat_racing_completions_of_its_leases_neither_deadlocks_nor_loses_either(repo, dispatch):
    session = register(dispatch, "w1", capacity=8)
    flights = [launch(repo, dispatch, session) for _ in range(6)]
    barrier, errors, answers = threading.Barrier(2, timeout=30), [], []

    def heartbeat():
        barrier.wait()
        answers.append(beat(dispatch, session, 1, *(f.quote for f in flights)))

    def completions():
        barrier.wait()
        for flight in reversed(flights):  # the other end of the heartbeat's order
            complete(repo, flight)

    threads = [threading.Thread(target=lambda fn=fn: _record(errors, fn)) for fn in (heartbeat, completions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    (answer,) = answers
    outcome = {r[0]: "renewed" for r in answer.renewed} | {f[0]: f[2] for f in answer.fenced}
    assert set(outcome.values()) <= {"renewed", "lease_completed"} and len(outcome) == len(flights)
    for flight in flights:  # every completion landed, whatever the heartbeat did first
        assert [lease["status"] for lease in db_state(repo, flight.quote.run_id)[2]] == ["completed"]


def _record(errors, fn):
    try:
        fn()
    except Exception as err:  # reported by the test
        errors.append(err)


def test_unactivated_leases_lists_the_sessions_offers_never_activated(repo):
    """What Welcome lists after a resume: live leases whose attempt is still `claimed`."""
    from qlactors.store.dispatch.dispatch import Dispatch
    from store_helpers import new_hash, spec

    dispatch = Dispatch.open(repo.store)
    repo.tasks.add(spec("u", max_concurrent=2), actor_name="tester")
    first, second = (repo.runs.request("u").run.id for _ in range(2))
    session = dispatch.sessions.register("w-u", 2, session_lease_ms=60_000)
    offers = dispatch.offers.batch("w-u", session.session_id, session.generation,
                                  [("o-u1", new_hash()), ("o-u2", new_hash())], log_cap_bytes=1024,
                                  lease_ttl_ms=60_000)
    assert {o.run_id for o in offers} == {first, second}
    activated = offers[0]
    dispatch.reports.activate(activated.fence(_token_hash_of(dispatch, activated)), new_hash(), "ab/x.log")
    listed = dispatch.sessions.unactivated_leases(session.session_id)
    assert [(u.attempt_id, u.offer_id) for u in listed] == [(offers[1].attempt_id, offers[1].offer_id)]
    assert dispatch.sessions.unactivated_leases("no-such-session") == []


def _token_hash_of(dispatch, view) -> str:
    from qlactors.store.schema import run_dispatch_leases
    from sqlalchemy import select

    with dispatch.store.read() as conn:
        return conn.execute(select(run_dispatch_leases.c.token_hash).where(
            run_dispatch_leases.c.offer_id == view.offer_id)).scalar_one()
