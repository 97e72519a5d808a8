"""The fence of SEMANTICS.md §9 on Activate, Started, start failure and decline: every stale or
forged quote is `fenced` and changes no row; the lease version never fences; expiry fences only
Activate. On SQLite and PostgreSQL, plus offers racing reports on the real PostgreSQL."""

from __future__ import annotations

import dataclasses
import secrets
import threading

import pytest
from sqlalchemy import select

from qlactors.domain.receipt import token_hash
from qlactors.store.dispatch.dispatch import Dispatch
from qlactors.store.engine import Store
from qlactors.store.schema import run_dispatch_leases, worker_sessions
from store_helpers import db_state, new_hash, spec

WORKER = "w1"


def offer_one(dispatch, session):
    lease_hash = new_hash()
    offer = dispatch.offers.one(session.worker_id, session.session_id, session.generation,
                           secrets.token_hex(8), lease_hash, log_cap_bytes=0, lease_ttl_ms=60_000)
    assert offer is not None
    return offer.fence(lease_hash)


def activate(dispatch, fence):
    return dispatch.reports.activate(fence, token_hash(secrets.token_urlsafe(32)), "log")


# Each report, the state it applies in, and how it is sent.
REPORTS = {
    "activate": (False, lambda d, f: activate(d, f).result),
    "started": (True, lambda d, f: d.reports.started(f, "boot", 10, 10, 99).result),
    "start_failed": (True, lambda d, f: d.reports.start_failed(f, "spawn failed").result),
    "decline": (False, lambda d, f: d.reports.decline(f).result),
}


def set_lease(repo, fence, **values):
    with repo.store.write() as conn:
        conn.execute(run_dispatch_leases.update().where(
            run_dispatch_leases.c.attempt_id == fence.attempt_id).values(**values))


def superseded(repo, dispatch, fence):
    dispatch.sessions.register(WORKER, 4)
    return fence


def released(repo, dispatch, fence):
    set_lease(repo, fence, status="released", release_reason="lease_expired", version=2)
    return fence


def completed(repo, dispatch, fence):
    set_lease(repo, fence, status="completed", version=2)
    return fence


def wrong_token(repo, dispatch, fence):
    return dataclasses.replace(fence, lease_token_hash=new_hash())


def wrong_offer(repo, dispatch, fence):
    return dataclasses.replace(fence, offer_id="another-offer")


CASES = {"superseded_session": superseded, "released_lease": released, "completed_lease": completed,
         "wrong_token": wrong_token, "wrong_offer_id": wrong_offer}


@pytest.fixture
def session(dispatch):
    return dispatch.sessions.register(WORKER, 4)


def prepared(repo, dispatch, session, activated):
    repo.tasks.add(spec(timeout_ms=60_000), actor_name="tester")
    repo.runs.request("job")
    fence = offer_one(dispatch, session)
    if activated:
        assert activate(dispatch, fence).result == "applied"
    return fence


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("report", sorted(REPORTS))
def test_a_stale_or_forged_fence_is_fenced_and_changes_no_row(repo, dispatch, session, report, case):
    activated, send = REPORTS[report]
    fence = CASES[case](repo, dispatch, prepared(repo, dispatch, session, activated))
    before = db_state(repo, fence.run_id)
    assert send(dispatch, fence) == "fenced"
    assert db_state(repo, fence.run_id) == before


@pytest.mark.parametrize("report", sorted(REPORTS))
def test_an_old_lease_generation_is_fenced(repo, dispatch, session, report):
    activated, send = REPORTS[report]
    repo.tasks.add(spec(), actor_name="tester")
    repo.runs.request("job")
    old = offer_one(dispatch, session)
    assert dispatch.reports.decline(old).result == "applied"
    new = offer_one(dispatch, session)  # the same attempt under lease generation 2
    assert (new.attempt_id, new.lease_generation) == (old.attempt_id, 2)
    if activated:
        assert activate(dispatch, new).result == "applied"
    # the old generation quoted with the current lease's offer id and token: still not this lease
    forged = dataclasses.replace(new, lease_generation=1)
    for stale in (old, forged):
        before = db_state(repo, new.run_id)
        assert send(dispatch, stale) == "fenced"
        assert db_state(repo, new.run_id) == before


@pytest.mark.parametrize("report", sorted(REPORTS))
def test_a_report_quoting_an_old_lease_version_is_not_fenced(repo, dispatch, session, report):
    activated, send = REPORTS[report]
    fence = prepared(repo, dispatch, session, activated)
    set_lease(repo, fence, version=7)  # renewed meanwhile (the report was in flight)
    assert send(dispatch, dataclasses.replace(fence, lease_version=1)) == "applied"


@pytest.mark.parametrize("report", sorted(REPORTS))
def test_an_expired_lease_fences_activate_only(repo, dispatch, session, report):
    activated, send = REPORTS[report]
    fence = prepared(repo, dispatch, session, activated)
    set_lease(repo, fence, expires_at_ms=1)
    before = db_state(repo, fence.run_id)
    if report == "activate":
        result = dispatch.reports.activate(fence, new_hash(), "log")
        assert (result.result, result.detail) == ("fenced", "lease_expired")
        assert db_state(repo, fence.run_id) == before
    else:
        assert send(dispatch, fence) == "applied"


def test_decline_releases_the_lease_and_the_attempt_is_offered_again(repo, dispatch, session):
    repo.tasks.add(spec(), actor_name="tester")
    run_id = repo.runs.request("job").run.id
    fence = offer_one(dispatch, session)
    events = db_state(repo, run_id)[3]
    out = dispatch.reports.decline(fence)
    assert (out.result, out.run_state) == ("applied", "dispatching")
    run, (attempt,), (lease,), n = db_state(repo, run_id)
    assert (attempt["status"], run["status"], n) == ("claimed", "dispatching", events)
    assert (lease["status"], lease["release_reason"], lease["version"]) == ("released", "declined", 2)
    again = offer_one(dispatch, session)
    assert (again.attempt_id, again.lease_generation) == (fence.attempt_id, 2)
    assert activate(dispatch, again).result == "applied"
    assert dispatch.reports.decline(again).result == "refused"  # activated: too late to give back


def test_a_draining_session_still_reports_and_an_ended_one_does_not(repo, dispatch, session):
    fence = prepared(repo, dispatch, session, activated=True)
    with repo.store.write() as conn:
        conn.execute(worker_sessions.update().values(status="draining"))
    assert dispatch.reports.started(fence, "boot", 10, 10, 99).result == "applied"
    with repo.store.write() as conn:
        conn.execute(worker_sessions.update().values(ended_at_ms=1))
    before = db_state(repo, fence.run_id)
    assert dispatch.reports.start_failed(fence, "x").result == "fenced"
    assert db_state(repo, fence.run_id) == before


@pytest.mark.postgres
def test_pulls_racing_activations_and_declines_never_deadlock(pg_schema_url):
    """One worker's Pulls (task locks, then its session row) against its own reports (attempt,
    task, then the session row) from another connection pool: the lock order is one, so both
    sides finish, and no attempt is ever leased twice at once."""
    from qlactors.store.repository import Repository

    repo = Repository.open(pg_schema_url)
    other = Store(pg_schema_url)
    try:
        for name in ("a", "b"):
            repo.tasks.add(spec(name, max_concurrent=3), actor_name="tester")
        for name in ("a", "b"):
            for _ in range(15):
                repo.runs.request(name)
        puller, reporter = Dispatch.open(repo.store), Dispatch.open(other)
        session = puller.sessions.register(WORKER, 6)
        offered, errors, done = [], [], threading.Event()
        lock = threading.Lock()

        def pulls():
            try:
                for _ in range(40):
                    the_pairs = [(secrets.token_hex(8), new_hash()) for _ in range(3)]
                    got = puller.offers.batch(WORKER, session.session_id, session.generation, the_pairs,
                                             log_cap_bytes=0)
                    hashes = dict(the_pairs)
                    with lock:
                        offered.extend(o.fence(hashes[o.offer_id]) for o in got)
            except Exception as err:  # reported below
                errors.append(err)
            finally:
                done.set()

        def reports():
            try:
                while not done.is_set() or offered:
                    with lock:
                        fence = offered.pop(0) if offered else None
                    if fence is None:
                        continue
                    if int(fence.offer_id, 16) % 2:
                        assert reporter.reports.decline(fence).result == "applied"
                    else:
                        assert activate(reporter, fence).result == "applied"
                        assert reporter.reports.start_failed(fence, "x").result == "applied"
            except Exception as err:  # reported below
                errors.append(err)

        threads = [threading.Thread(target=pulls), threading.Thread(target=reports)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(180)
        assert not errors, errors
        with repo.store.read() as conn:
            live = conn.execute(select(run_dispatch_leases.c.attempt_id).where(
                run_dispatch_leases.c.status == "leased")).scalars().all()
        assert len(live) == len(set(live))
    finally:
        other.close()
        repo.close()


@pytest.mark.parametrize("report", sorted(REPORTS))
def test_only_a_start_failure_or_a_decline_may_come_from_a_later_session_of_the_leases_worker(
        repo, dispatch, session, report):
    """Issue 26 item 5: re-made from the next session after the lease's own ended before it landed,
    a start failure or a decline quoting the same lease (offer id, generation, token) applies;
    Activate and Started do not; an earlier session, or another worker, is never the lease's."""
    activated, send = REPORTS[report]
    fence = prepared(repo, dispatch, session, activated)
    later = dispatch.sessions.register(WORKER, 4)
    remade = dataclasses.replace(fence, session_id=later.session_id, session_generation=later.generation)
    before = db_state(repo, fence.run_id)
    assert send(dispatch, fence) == "fenced"  # its own session has ended
    other = dispatch.sessions.register("w2", 4)
    forged = dataclasses.replace(fence, worker_id="w2", session_id=other.session_id,
                                 session_generation=other.generation)
    assert send(dispatch, forged) == "fenced"
    assert db_state(repo, fence.run_id) == before
    expected = "applied" if report in ("start_failed", "decline") else "fenced"
    assert send(dispatch, remade) == expected
    if expected == "fenced":
        assert db_state(repo, fence.run_id) == before
