"""`worker retire WORKER --confirm-stopped` in the store (both dialects): the worker's live
sessions end (its reports are fenced, its key stays allowed) and its `starting|running`
attempts get the `retired` evidence recovery trusts (SEMANTICS.md §9 Drain, §10 step 1), in
one transaction; other workers' attempts and proofs already given are left alone. Revoked and
retired (§9): `worker revoke` and `worker retire` end drained sessions too, none is resumed, and
a resume checks the allow-list."""

from __future__ import annotations

import pytest
from sqlalchemy import delete, select, update

from qlactors.errors import NotFound
from qlactors.store.cadence.cluster_recovery import ClusterRecoveryCases
from qlactors.store.records import Fenced
from qlactors.store.schema import run_attempts, worker_keys, worker_sessions
from qlactors.store.admin.worker_keys import WorkerKeys
from qlactors.store.admin.worker_retirement import WorkerRetirement
from store_helpers import new_hash

from cluster_recovery_steps import DRAIN_MS, GRACE_MS, IDEMPOTENT, page_ids
from session_steps import beat, expire_lease, launch, register, session_row


def _evidence(repo, attempt_id):
    with repo.store.read() as conn:
        return conn.execute(select(run_attempts.c.evidence, run_attempts.c.evidence_at_ms)
                            .where(run_attempts.c.id == attempt_id)).one()


def test_retire_ends_the_sessions_and_marks_the_running_attempts_retired(repo, dispatch):
    w1 = register(dispatch, "w1")
    running = launch(repo, dispatch, w1)
    starting = launch(repo, dispatch, w1, started=False)
    offered = launch(repo, dispatch, w1, activated=False, started=False)  # claimed: recovery re-offers it
    other = launch(repo, dispatch, register(dispatch, "w2"))
    before = session_row(repo, w1.session_id)

    done = WorkerRetirement(repo.store).retire("w1")

    assert (done.worker_id, done.sessions_ended) == ("w1", 1)
    assert set(done.attempts) == {running.quote.attempt_id, starting.quote.attempt_id}
    after = session_row(repo, w1.session_id)
    assert (after.status, after.version) == ("offline", before.version + 1) and after.ended_at_ms is not None
    for flight in (running, starting):
        evidence, at_ms = _evidence(repo, flight.quote.attempt_id)
        assert evidence == "retired" and at_ms is not None
    assert _evidence(repo, offered.quote.attempt_id).evidence is None
    assert _evidence(repo, other.quote.attempt_id).evidence is None
    # Every report of the ended session is fenced from now on; nothing else changed.
    assert beat(dispatch, w1, 1, running.quote).session_ended
    assert dispatch.reports.started(starting.fence, "boot-1", 1, 1, 1).result == "fenced"


def test_retire_keeps_a_proof_already_given_and_replaces_an_unknown_launch(repo, dispatch):
    w1 = register(dispatch, "w1")
    stopped, unknown = launch(repo, dispatch, w1), launch(repo, dispatch, w1)
    with repo.store.write() as conn:
        for flight, fact in ((stopped, "stopped"), (unknown, "launch_unknown")):
            conn.execute(update(run_attempts).where(run_attempts.c.id == flight.quote.attempt_id)
                         .values(evidence=fact, evidence_at_ms=5,
                                 evidence_lease_generation=run_attempts.c.lease_generation))
    done = WorkerRetirement(repo.store).retire("w1")
    assert done.attempts == (unknown.quote.attempt_id,)
    assert _evidence(repo, stopped.quote.attempt_id) == ("stopped", 5)
    assert _evidence(repo, unknown.quote.attempt_id).evidence == "retired"


def test_retire_twice_is_harmless_and_an_unknown_worker_is_refused(repo, dispatch):
    w1 = register(dispatch, "w1")
    flight = launch(repo, dispatch, w1)
    first = WorkerRetirement(repo.store).retire("w1")
    again = WorkerRetirement(repo.store).retire("w1")
    assert (first.sessions_ended, again.sessions_ended) == (1, 0)
    assert again.attempts == () and _evidence(repo, flight.quote.attempt_id).evidence == "retired"
    with pytest.raises(NotFound, match="no worker ghost"):
        WorkerRetirement(repo.store).retire("ghost")
    with repo.store.read() as conn:
        assert conn.execute(select(worker_sessions.c.status)).scalars().all() == ["offline"]


# -- Revoked and retired (SEMANTICS.md §9): every session ends, drained ones included -----------

def _drain(dispatch, session, *, offline):
    assert dispatch.sessions.end("w1", session.session_id, session.generation, status="draining").result == "applied"
    if offline:
        assert dispatch.sessions.end("w1", session.session_id, session.generation).result == "applied"


def _resume(dispatch, session, secret, **kw):
    return dispatch.sessions.resume("w1", session.session_id, session.generation, secret, new_hash(), "boot-1",
                                   capacity=4, labels=(), session_lease_ms=60_000, **kw)


def _end(repo, how):
    if how == "revoked":
        keys = WorkerKeys(repo.store)
        keys.allow("w1", "k" * 40)
        done = keys.revoke("w1")
        keys.allow("w1", "k" * 40)  # allowed again: the old session still never comes back
        return done.sessions_ended
    return WorkerRetirement(repo.store).retire("w1").sessions_ended


@pytest.mark.parametrize("how", ["revoked", "retired"])
@pytest.mark.parametrize("offline", [True, False], ids=["offline_after_drain", "draining"])
def test_revoke_and_retire_end_a_drained_session_which_is_never_resumed(repo, dispatch, how, offline):
    secret = new_hash()
    session = register(dispatch, "w1", secret)
    flight = launch(repo, dispatch, session, **IDEMPOTENT)  # kept running across the planned restart
    _drain(dispatch, session, offline=offline)
    drained = session_row(repo, session.session_id)

    assert _end(repo, how) == 1

    row = session_row(repo, session.session_id)
    assert (row.status, row.ended_by, row.version) == ("offline", how, drained.version + 1)
    # Recovery's clock for the idempotent rule is not moved: the drain's end (or, for a session
    # still draining, the operator's end of it) plus the drain grace.
    assert row.drained_at_ms == drained.drained_at_ms
    if offline:
        assert row.ended_at_ms == drained.ended_at_ms
    else:
        assert row.ended_at_ms is not None
    expire_lease(repo, flight.quote.attempt_id)
    cases = ClusterRecoveryCases(repo.store, recovery_grace_ms=GRACE_MS, drain_grace_ms=DRAIN_MS)
    if how == "revoked":  # no word on its processes: its idempotent attempt waits out the drain grace
        assert page_ids(cases) == []
        waiting = cases.waiting_for(flight.quote.attempt_id)
        assert waiting.eligible_at_ms == row.ended_at_ms + DRAIN_MS + GRACE_MS
    else:  # the operator's word that nothing runs: trusted at once
        assert page_ids(cases) == [flight.quote.attempt_id]
    before = session_row(repo, session.session_id)
    with pytest.raises(Fenced, match=f"^{how}"):
        _resume(dispatch, session, secret)
    assert session_row(repo, session.session_id) == before
    assert beat(dispatch, session, 9).session_ended
    assert _end(repo, how) == 0  # ended once; a second revoke or retire finds nothing to end


def test_a_resume_of_a_worker_off_the_allow_list_is_refused_and_changes_nothing(repo, dispatch):
    secret = new_hash()
    session = register(dispatch, "w1", secret)
    with repo.store.write() as conn:  # the key is gone, as a replica with a stale cache would not see
        conn.execute(delete(worker_keys).where(worker_keys.c.worker_id == "w1"))
    before = session_row(repo, session.session_id)
    with pytest.raises(Fenced, match="^revoked: .*not on the allow-list"):
        _resume(dispatch, session, secret, require_key=True)
    assert session_row(repo, session.session_id) == before
    WorkerKeys(repo.store).allow("w1", "k" * 40)
    assert _resume(dispatch, session, secret, require_key=True).session_id == session.session_id


def test_a_resume_after_revoke_is_refused(repo, dispatch):
    keys = WorkerKeys(repo.store)
    keys.allow("w1", "k" * 40)
    secret = new_hash()
    session = register(dispatch, "w1", secret)
    keys.revoke("w1")
    with pytest.raises(Fenced, match="^revoked"):
        _resume(dispatch, session, secret, require_key=True)
    assert session_row(repo, session.session_id).ended_by == "revoked"
