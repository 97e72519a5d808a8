"""`worker retire WORKER --confirm-stopped` in the store (both dialects): the worker's live
sessions end (its reports are fenced, its key stays allowed) and its `starting|running`
attempts get the `retired` evidence recovery trusts (SEMANTICS.md §9 Drain, §10 step 1), in
one transaction; other workers' attempts and proofs already given are left alone."""

from __future__ import annotations

import pytest
from sqlalchemy import select, update

from qlactors.errors import NotFound
from qlactors.store.schema import run_attempts, worker_sessions
from qlactors.store.worker_retirement import WorkerRetirement

from test_store_sessions import beat, launch, register, session_row


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
    assert dispatch.started(starting.fence, "boot-1", 1, 1, 1).result == "fenced"


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
