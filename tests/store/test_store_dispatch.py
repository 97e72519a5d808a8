"""Dispatch contract: sessions, offers and fenced executor reports, on SQLite and PostgreSQL."""

from __future__ import annotations

import dataclasses
import secrets
import threading

import pytest
from sqlalchemy import func, select

from qlactors.domain.model import Command
from qlactors.domain.receipt import token_hash
from qlactors.errors import BadInput
from qlactors.store.records import Fenced
from qlactors.store.schema import run_dispatch_leases, worker_sessions
from store_helpers import db_state, new_hash, spec


@pytest.fixture
def session(dispatch):
    return dispatch.sessions.register("edge", 8)


def pull(dispatch, session, offer_id=None, lease_hash=None, cap=4096):
    """Offer once; returns (OfferView or None, fence or None)."""
    lease_hash = lease_hash or new_hash()
    offer = dispatch.offers.one(session.worker_id, session.session_id, session.generation,
                           offer_id or secrets.token_hex(8), lease_hash, log_cap_bytes=cap)
    return offer, (offer.fence(lease_hash) if offer else None)


def activate(dispatch, fence, token=None):
    return dispatch.reports.activate(fence, token_hash(token or secrets.token_urlsafe(32)), "log-artifact")


def leases_of(repo, run_id):
    return db_state(repo, run_id)[2]


def events(repo, run_id):
    return [(e.type, e.actor_type) for e in repo.runs.get(run_id).events]


def in_threads(n, fn):
    """Run `fn(i)` in n threads released together; return their results."""
    barrier, results, errors = threading.Barrier(n), [None] * n, []

    def body(i):
        barrier.wait()
        try:
            results[i] = fn(i)
        except Exception as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    return results


# -- sessions ----------------------------------------------------------------------------------

def test_register_session_bumps_generation_and_retires_older_sessions(repo, dispatch):
    first = dispatch.sessions.register("w1", 2)
    second = dispatch.sessions.register("w1", 3)
    other = dispatch.sessions.register("w2", 1)
    assert (first.generation, second.generation, other.generation) == (1, 2, 1)
    assert second.capacity == 3 and first.session_id != second.session_id
    with repo.store.read() as conn:
        rows = {r.session_id: r for r in conn.execute(select(worker_sessions))}
    assert (rows[first.session_id].status, rows[first.session_id].version) == ("offline", 2)
    assert rows[second.session_id].status == "online" and rows[second.session_id].lease_expires_at_ms is None
    assert rows[other.session_id].status == "online"
    with pytest.raises(BadInput):
        dispatch.sessions.register("w1", -1)


# -- offer -------------------------------------------------------------------------------------

def test_offer_claims_the_oldest_queued_run_and_writes_its_lease(repo, dispatch, session):
    repo.tasks.add(spec(command=Command.from_words(["echo hi; exit 3"]), cwd="/tmp", env={"A": "1"},
                        timeout_ms=5000, stop_grace_ms=2000), actor_name="tester")
    first = repo.runs.request("job").run.id
    repo.runs.request("job")
    lease_hash = new_hash()
    offer, _ = pull(dispatch, session, "offer-1", lease_hash, cap=1234)
    assert offer.run_id == first and offer.attempt_number == 1 and offer.task == "job"
    assert offer.argv == ("/bin/sh", "-c", "echo hi; exit 3")
    assert (offer.cwd, dict(offer.env), offer.timeout_ms, offer.stop_grace_ms, offer.log_cap_bytes) == (
        "/tmp", {"A": "1"}, 5000, 2000, 1234)
    assert (offer.offer_id, offer.lease_generation, offer.lease_version) == ("offer-1", 1, 1)
    assert (offer.worker_id, offer.session_id, offer.session_generation) == ("edge", session.session_id, 1)
    run, attempts, leases, _ = db_state(repo, first)
    assert run["status"] == "dispatching" and attempts[0]["status"] == "claimed"
    assert events(repo, first)[-1] == ("run.dispatching", "executor")
    (lease,) = leases
    assert (lease["status"], lease["version"], lease["lease_generation"], lease["offer_id"]) == (
        "leased", 1, 1, "offer-1")
    assert lease["token_hash"] == lease_hash and lease["expires_at_ms"] is None
    assert lease["session_id"] == session.session_id and lease["session_generation"] == 1
    projection = {k: attempts[0][k] for k in ("offer_id", "lease_generation", "lease_version", "worker_id",
                                               "session_id", "session_generation")}
    assert projection == {"offer_id": "offer-1", "lease_generation": 1, "lease_version": 1,
                          "worker_id": "edge", "session_id": session.session_id, "session_generation": 1}


def test_offer_argv_task_passes_its_words(repo, dispatch, session):
    repo.tasks.add(spec(), actor_name="tester")
    repo.runs.request("job")
    offer, _ = pull(dispatch, session)
    assert offer.argv == ("echo", "hi") and offer.timeout_ms is None and offer.cwd is None


def test_offer_without_work_is_none(repo, dispatch, session):
    assert pull(dispatch, session)[0] is None
    repo.tasks.add(spec(), actor_name="tester")
    run_id = repo.runs.request("job").run.id
    repo.runs.cancel(run_id)
    assert pull(dispatch, session)[0] is None


def test_offer_respects_max_concurrent_of_the_task(repo, dispatch, session):
    repo.tasks.add(spec(), actor_name="tester")
    first = repo.runs.request("job").run.id
    second = repo.runs.request("job").run.id
    offer, fence = pull(dispatch, session)
    assert offer.run_id == first
    assert pull(dispatch, session)[0] is None  # the task is at its limit of 1
    assert repo.runs.get(second).state == "queued"
    activate(dispatch, fence)
    assert dispatch.reports.start_failed(fence, "no such file").result == "applied"
    offer2, _ = pull(dispatch, session)
    assert offer2.run_id == second


def test_offer_uses_the_limit_of_the_runs_pinned_revision(repo, dispatch, session):
    repo.tasks.add(spec(), actor_name="tester")
    first = repo.runs.request("job").run.id  # pinned max_concurrent 1
    repo.tasks.update("job", max_concurrent=2, actor_name="tester")
    second = repo.runs.request("job").run.id  # pinned max_concurrent 2
    third = repo.runs.request("job").run.id
    assert pull(dispatch, session)[0].run_id == first
    # the first run's revision would refuse a second dispatch; the second run's allows it
    assert pull(dispatch, session)[0].run_id == second
    assert pull(dispatch, session)[0] is None
    assert repo.runs.get(third).state == "queued"


def test_offer_skips_a_task_at_its_limit_for_another_task(repo, dispatch, session):
    repo.tasks.add(spec("a"), actor_name="tester")
    repo.tasks.add(spec("b"), actor_name="tester")
    a1 = repo.runs.request("a").run.id
    repo.runs.request("a")
    b1 = repo.runs.request("b").run.id
    assert [pull(dispatch, session)[0].run_id for _ in range(2)] == [a1, b1]


def test_offer_respects_session_capacity(repo, dispatch):
    small = dispatch.sessions.register("small", 1)
    repo.tasks.add(spec("a"), actor_name="tester")
    repo.tasks.add(spec("b"), actor_name="tester")
    a = repo.runs.request("a").run.id
    b = repo.runs.request("b").run.id
    offer, fence = pull(dispatch, small)
    assert offer.run_id == a
    assert pull(dispatch, small)[0] is None
    assert dispatch.reports.decline(fence, "declined").result == "applied"
    # the slot is free again; the declined run is the oldest and is offered again
    again, _ = pull(dispatch, small)
    assert again.run_id == a and again.lease_generation == 2
    assert repo.runs.get(b).state == "queued"


def test_offer_is_idempotent_per_offer_id(repo, dispatch, session):
    repo.tasks.add(spec(), actor_name="tester")
    repo.tasks.add(spec("other"), actor_name="tester")
    run_id = repo.runs.request("job").run.id
    repo.runs.request("other")
    lease_hash = new_hash()
    first, _ = pull(dispatch, session, "same", lease_hash)
    again, _ = pull(dispatch, session, "same", lease_hash)
    assert again == first
    assert len(leases_of(repo, run_id)) == 1
    assert events(repo, run_id).count(("run.dispatching", "executor")) == 1
    # the same offer id with another token is not this pull: no offer, nothing new
    assert pull(dispatch, session, "same", new_hash())[0] is None
    with repo.store.read() as conn:
        assert conn.execute(select(func.count()).select_from(run_dispatch_leases)).scalar_one() == 1


def test_concurrent_offers_for_one_run_give_it_to_exactly_one(repo, dispatch):
    sessions = [dispatch.sessions.register(f"w{i}", 4) for i in range(2)]
    repo.tasks.add(spec(), actor_name="tester")
    run_id = repo.runs.request("job").run.id
    results = in_threads(2, lambda i: pull(dispatch, sessions[i])[0])
    assert sum(r is not None for r in results) == 1
    assert len(leases_of(repo, run_id)) == 1
    assert events(repo, run_id).count(("run.dispatching", "executor")) == 1


def test_concurrent_offers_never_exceed_max_concurrent(repo, dispatch):
    sessions = [dispatch.sessions.register(f"w{i}", 4) for i in range(4)]
    repo.tasks.add(spec(max_concurrent=2), actor_name="tester")
    ids = [repo.runs.request("job").run.id for _ in range(5)]
    results = in_threads(4, lambda i: pull(dispatch, sessions[i])[0])
    assert sum(r is not None for r in results) == 2
    # concurrent pulls skip each other's locked rows, so which two runs win is not strict FIFO
    assert len({r.run_id for r in results if r}) == 2
    assert [repo.runs.get(i).state for i in ids].count("dispatching") == 2


def test_pull_from_a_dead_session_is_fenced(repo, dispatch, session):
    repo.tasks.add(spec(), actor_name="tester")
    run_id = repo.runs.request("job").run.id
    with pytest.raises(Fenced):
        dispatch.offers.one("edge", "no-such-session", 1, "o1", new_hash(), log_cap_bytes=0)
    with pytest.raises(Fenced):
        dispatch.offers.one("edge", session.session_id, 2, "o1", new_hash(), log_cap_bytes=0)
    with pytest.raises(Fenced):
        dispatch.offers.one("other", session.session_id, 1, "o1", new_hash(), log_cap_bytes=0)
    dispatch.sessions.register("edge", 8)
    with pytest.raises(Fenced):
        pull(dispatch, session)
    assert repo.runs.get(run_id).state == "queued" and leases_of(repo, run_id) == []


def test_offer_refuses_a_raw_token(repo, dispatch, session):
    with pytest.raises(BadInput):
        dispatch.offers.one("edge", session.session_id, 1, "o1", "not-a-hash", log_cap_bytes=0)


# -- fence -------------------------------------------------------------------------------------

FENCE_CHANGES = {
    "session_generation": lambda f: dataclasses.replace(f, session_generation=f.session_generation + 1),
    "lease_token": lambda f: dataclasses.replace(f, lease_token_hash=new_hash()),
    "offer_id": lambda f: dataclasses.replace(f, offer_id="another-offer"),
    "lease_generation": lambda f: dataclasses.replace(f, lease_generation=f.lease_generation + 1),
    "worker": lambda f: dataclasses.replace(f, worker_id="intruder"),
    "run": lambda f: dataclasses.replace(f, run_id="0" * 36),
}


@pytest.mark.parametrize("field", sorted(FENCE_CHANGES))
def test_a_fence_with_any_field_wrong_is_fenced_and_changes_nothing(repo, dispatch, session, field):
    repo.tasks.add(spec(timeout_ms=1000), actor_name="tester")
    repo.runs.request("job")
    offer, fence = pull(dispatch, session)
    before = db_state(repo, offer.run_id)
    bad = FENCE_CHANGES[field](fence)
    assert activate(dispatch, bad).result == "fenced"
    assert db_state(repo, offer.run_id) == before
    assert activate(dispatch, fence).result == "applied"
    before = db_state(repo, offer.run_id)
    assert dispatch.reports.started(bad, "boot", 10, 10, 99).result == "fenced"
    assert dispatch.reports.start_failed(bad, "x").result == "fenced"
    assert dispatch.reports.decline(bad, "declined").result == "fenced"
    assert db_state(repo, offer.run_id) == before


def test_a_newer_session_generation_fences_the_old_one(repo, dispatch, session):
    repo.tasks.add(spec(), actor_name="tester")
    repo.runs.request("job")
    offer, fence = pull(dispatch, session)
    dispatch.sessions.register("edge", 8)
    before = db_state(repo, offer.run_id)
    result = activate(dispatch, fence)
    assert (result.result, result.detail) == ("fenced", "session_offline")
    assert db_state(repo, offer.run_id) == before


def test_an_expired_lease_is_fenced(repo, dispatch, session):
    repo.tasks.add(spec(), actor_name="tester")
    repo.runs.request("job")
    lease_hash = new_hash()
    offer = dispatch.offers.one("edge", session.session_id, 1, "o-ttl", lease_hash, log_cap_bytes=0,
                           lease_ttl_ms=60_000)
    with repo.store.write() as conn:
        conn.execute(run_dispatch_leases.update().values(expires_at_ms=1))
    result = activate(dispatch, offer.fence(lease_hash))
    assert (result.result, result.detail) == ("fenced", "lease_expired")


# -- activate ----------------------------------------------------------------------------------

def test_activate_sets_token_log_and_deadline_from_database_time(repo, dispatch, session):
    repo.tasks.add(spec(timeout_ms=7000), actor_name="tester")
    repo.runs.request("job")
    offer, fence = pull(dispatch, session)
    token = secrets.token_urlsafe(32)
    result = dispatch.reports.activate(fence, token_hash(token), "artifact-1")
    assert (result.result, result.value.lease_version) == ("applied", 1)
    _, (attempt,), _, _ = db_state(repo, offer.run_id)
    assert attempt["status"] == "starting"
    assert attempt["callback_token_hash"] == token_hash(token) and token not in str(attempt)
    assert attempt["log_artifact_id"] == "artifact-1"
    # the deadline is the activation's own database time + the pinned timeout
    assert attempt["deadline_at_ms"] == result.value.deadline_at_ms == attempt["updated_at_ms"] + 7000
    assert events(repo, offer.run_id)[-1] == ("attempt.starting", "executor")


def test_activate_without_timeout_has_no_deadline(repo, dispatch, session):
    repo.tasks.add(spec(), actor_name="tester")
    repo.runs.request("job")
    _, fence = pull(dispatch, session)
    result = activate(dispatch, fence)
    assert result.result == "applied" and result.value.deadline_at_ms is None


def test_activate_again_with_the_same_token_is_idempotent(repo, dispatch, session):
    repo.tasks.add(spec(timeout_ms=5000), actor_name="tester")
    repo.runs.request("job")
    offer, fence = pull(dispatch, session)
    token = secrets.token_urlsafe(32)
    first = activate(dispatch, fence, token)
    n = len(events(repo, offer.run_id))
    again = activate(dispatch, fence, token)
    assert (again.result, again.value.deadline_at_ms) == ("applied", first.value.deadline_at_ms)
    assert len(events(repo, offer.run_id)) == n
    assert activate(dispatch, fence).result == "refused"  # another token: never a second activation


def test_cancelled_run_never_activates(repo, dispatch, session):
    repo.tasks.add(spec(), actor_name="tester")
    run_id = repo.runs.request("job").run.id
    _, fence = pull(dispatch, session)
    assert repo.runs.cancel(run_id).result == "cancelled"
    before = db_state(repo, run_id)
    result = activate(dispatch, fence)
    assert (result.result, result.detail) == ("fenced", "attempt_cancelled")
    assert db_state(repo, run_id) == before
    assert "attempt.starting" not in [t for t, _ in events(repo, run_id)]
    # the cancel already ended its lease: the executor's decline is fenced and changes nothing
    assert dispatch.reports.decline(fence, "declined").result == "fenced"
    assert db_state(repo, run_id) == before
    assert leases_of(repo, run_id)[0]["status"] == "released"


def test_cancel_of_an_offered_attempt_releases_its_lease_as_cancelled_in_the_same_transaction(
        repo, dispatch, session):
    repo.tasks.add(spec(), actor_name="tester")
    run_id = repo.runs.request("job").run.id
    offer, fence = pull(dispatch, session)
    assert leases_of(repo, run_id)[0]["status"] == "leased"
    result = repo.runs.cancel(run_id)
    assert (result.result, result.value.state) == ("cancelled", "cancelled")
    run, attempts, leases, _ = db_state(repo, run_id)
    assert attempts[0]["status"] == "cancelled"
    assert [(lease["status"], lease["release_reason"], lease["version"]) for lease in leases] == [
        ("released", "cancelled", 2)]
    assert attempts[0]["lease_version"] == 2  # the attempt's projection follows
    # the slot is free: another run of another task is offered to the same session
    repo.tasks.add(spec("other"), actor_name="tester")
    repo.runs.request("other")
    assert pull(dispatch, session)[0] is not None
    assert dispatch.reports.decline(fence, "declined").detail == "attempt_cancelled"


def test_cancel_of_a_started_attempt_keeps_its_lease_until_the_process_ends(repo, dispatch, session):
    repo.tasks.add(spec(), actor_name="tester")
    run_id = repo.runs.request("job").run.id
    _, fence = pull(dispatch, session)
    assert activate(dispatch, fence).result == "applied"
    assert repo.runs.cancel(run_id).result == "requested"
    assert [lease["status"] for lease in leases_of(repo, run_id)] == ["leased"]


def test_concurrent_activations_apply_once(repo, dispatch, session):
    repo.tasks.add(spec(), actor_name="tester")
    run_id = repo.runs.request("job").run.id
    _, fence = pull(dispatch, session)
    results = in_threads(2, lambda i: activate(dispatch, fence).result)
    assert sorted(results) == ["applied", "refused"]
    assert [t for t, _ in events(repo, run_id)].count("attempt.starting") == 1


# -- started -----------------------------------------------------------------------------------

def test_started_records_identity_and_is_idempotent(repo, dispatch, session):
    repo.tasks.add(spec(), actor_name="tester")
    run_id = repo.runs.request("job").run.id
    _, fence = pull(dispatch, session)
    assert dispatch.reports.started(fence, "boot", 10, 10, 99).detail == "attempt_claimed"  # not activated
    activate(dispatch, fence)
    result = dispatch.reports.started(fence, "boot", 10, 10, 99)
    assert (result.result, result.run_state) == ("applied", "running")
    run, (attempt,), _, n = db_state(repo, run_id)
    assert run["status"] == "running" and attempt["status"] == "running"
    assert (attempt["boot_id"], attempt["pid"], attempt["pgid"], attempt["start_ticks"]) == ("boot", 10, 10, 99)
    assert attempt["started_at_ms"] == run["started_at_ms"] == attempt["updated_at_ms"]
    assert events(repo, run_id)[-2:] == [("attempt.running", "executor"), ("run.running", "executor")]
    again = dispatch.reports.started(fence, "boot", 10, 10, 99)
    assert (again.result, again.detail) == ("applied", "already_running")
    assert db_state(repo, run_id)[3] == n
    other = dispatch.reports.started(fence, "boot", 11, 11, 99)
    assert (other.result, other.detail) == ("refused", "identity_mismatch")
    assert db_state(repo, run_id)[3] == n


def test_started_with_a_cancel_intent_still_records_the_process(repo, dispatch, session):
    repo.tasks.add(spec(), actor_name="tester")
    run_id = repo.runs.request("job").run.id
    _, fence = pull(dispatch, session)
    activate(dispatch, fence)
    assert repo.runs.cancel(run_id).result == "requested"
    assert dispatch.reports.started(fence, "boot", 10, 10, 99).result == "applied"
    assert repo.runs.get(run_id).state == "running"


# -- start failure and release -----------------------------------------------------------------

def test_start_failed_fails_the_run_and_releases_the_lease(repo, dispatch, session):
    repo.tasks.add(spec(), actor_name="tester")
    run_id = repo.runs.request("job").run.id
    _, fence = pull(dispatch, session)
    activate(dispatch, fence)
    result = dispatch.reports.start_failed(fence, "x" * 2000)
    assert (result.result, result.run_state) == ("applied", "failed")
    run, (attempt,), (lease,), _ = db_state(repo, run_id)
    assert run["error_code"] == attempt["error_code"] == "EXECUTOR_START_FAILED"
    assert len(run["error_summary"]) == 512 and attempt["error_summary"] == "x" * 512
    assert (lease["status"], lease["release_reason"], lease["version"]) == ("released", "start_failed", 2)
    assert attempt["lease_version"] == 2
    assert events(repo, run_id)[-2:] == [("attempt.failed", "executor"), ("run.failed", "executor")]
    # the lease has ended with the attempt: a repeat is fenced (SEMANTICS.md §9) and changes nothing
    before = db_state(repo, run_id)
    assert dispatch.reports.start_failed(fence, "again").detail == "attempt_failed"
    assert dispatch.reports.started(fence, "boot", 10, 10, 99).result == "fenced"
    assert db_state(repo, run_id) == before


def test_start_failed_with_a_cancel_intent_ends_as_the_intent(repo, dispatch, session):
    repo.tasks.add(spec(), actor_name="tester")
    run_id = repo.runs.request("job").run.id
    _, fence = pull(dispatch, session)
    activate(dispatch, fence)
    repo.runs.cancel(run_id)
    assert dispatch.reports.start_failed(fence, "spawn: ENOENT").run_state == "cancelled"
    assert repo.runs.get(run_id).error_code == "EXECUTION_CANCELLED"


def test_released_unstarted_offer_is_offered_again_under_a_new_generation(repo, dispatch, session):
    repo.tasks.add(spec(), actor_name="tester")
    run_id = repo.runs.request("job").run.id
    offer, fence = pull(dispatch, session)
    n = len(events(repo, run_id))
    result = dispatch.reports.decline(fence, "shutdown")
    assert (result.result, result.run_state) == ("applied", "dispatching")
    run, (attempt,), (lease,), _ = db_state(repo, run_id)
    assert attempt["status"] == "claimed" and run["status"] == "dispatching"
    assert (lease["status"], lease["release_reason"], lease["version"]) == ("released", "shutdown", 2)
    assert dispatch.reports.decline(fence, "shutdown").detail == "lease_released"
    assert activate(dispatch, fence).result == "fenced"  # the released lease no longer authorises
    again, fence2 = pull(dispatch, session)
    assert (again.run_id, again.attempt_id, again.lease_generation) == (run_id, offer.attempt_id, 2)
    assert len(events(repo, run_id)) == n  # no status changed, so no event
    assert activate(dispatch, fence2).result == "applied"
    assert dispatch.reports.decline(fence2, "declined").result == "refused"  # activated: too late
    with pytest.raises(BadInput):
        dispatch.reports.decline(fence2, "lease_expired")
