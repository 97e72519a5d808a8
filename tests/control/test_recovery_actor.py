"""The Recovery actor alone, on the real store: the startup pass and the continuous pass judge attempts
in flight (SEMANTICS.md §5, §10).

The harness (tests/harness/actor_harness.py) builds the EdgeContext on a SQLite file in a temp
home and starts one actor; the other names in the Directory are recording stubs. The rigs are
tests/harness/actor_rigs.py's.
"""

from __future__ import annotations

import time

from qlactors.control.recovery import Recovery
from qlactors.domain.receipt import token_hash
from qlactors.domain.transitions import ErrorCode
from qlactors.runtime.signals import AttemptEnded, StartupPass, StepDone, StepRequest
from qlactors.store import sqlite as sqlite_store
from qlactors.store.repository import Repository

from actor_harness import WAIT_S, attempt_row, leases
from actor_rigs import new_token, Flights, plant_receipt, rec  # noqa: F401 - fixtures


def test_recovery_startup_pass_judges_every_kind_of_in_flight_attempt(rec):
    old = rec.ctx.executor_side.session  # the session of the runtime that "crashed"
    flights = Flights(rec, old)
    proc, live = rec.spawn_sleep(30)
    dead = rec.dead_identity()
    token = new_token()
    claimed = flights.make("claimed")
    surviving = flights.make("running", live)
    gone = flights.make("running", dead)
    receipted = flights.make("running", dead, token)
    receipt = plant_receipt(rec, *receipted, token, exit_code=5)
    cancelled = flights.make("running", dead)
    rec.repo.runs.cancel(cancelled[0])
    backlog = flights.make("queued")
    rec.ctx.control_side.local.session = rec.ctx.control_side.dispatch.sessions.register("local", 8)  # this start's session

    ref = rec.start("recovery", Recovery)
    totals = ref.ask(StartupPass(), timeout=WAIT_S)
    assert totals == {"lost": 1, "released": 1, "running": 1, "completed": 1, "ended_by_intent": 1}

    # Offered, never activated: its lease is released and it is offered again, never lost.
    run = rec.repo.runs.get(claimed[0])
    assert (run.state, run.attempts[0].state, run.attempts[0].error_code) == ("dispatching", "claimed", None)
    assert [(lease["status"], lease["release_reason"]) for lease in leases(rec.repo, claimed[0])] == [
        ("released", "lease_expired")]
    assert rec.ctx.control_side.control.status.queued_waiting()  # the Scheduler nudges executors for it

    run = rec.repo.runs.get(gone[0])
    assert (run.state, run.attempts[0].state, run.attempts[0].error_code) == (
        "lost", "lost", ErrorCode.RECOVERY_PROCESS_EXITED_WITHOUT_RECEIPT)

    run = rec.repo.runs.get(receipted[0])
    assert (run.state, run.attempts[0].exit_code) == ("failed", 5)
    assert not receipt.exists()

    assert rec.repo.runs.get(cancelled[0]).state == "cancelled"
    assert rec.repo.runs.get(backlog[0]).state == "queued"

    # The survivor keeps running, re-bound to the new session with a fresh lease.
    assert proc.poll() is None
    run = rec.repo.runs.get(surviving[0])
    assert (run.state, run.attempts[0].state) == ("running", "running")
    row = attempt_row(rec.repo, surviving[1])
    new = rec.ctx.control_side.local.session
    assert (row.session_id, row.session_generation, row.pid, row.start_ticks) == (
        new.session_id, new.generation, live.pid, live.start_ticks)
    assert [(lease["session_id"], lease["status"]) for lease in leases(rec.repo, surviving[0])] == [
        (old.session_id, "released"), (new.session_id, "leased")]
    assert rec.ctx.control_side.control.recovery.candidates(64)[0] == [rec.ctx.control_side.control.recovery.candidate(surviving[1])]
    assert ref.is_alive()
    # The released claim is offered again, to the new session, under the next lease generation.
    again = rec.ctx.control_side.dispatch.offers.one(new.worker_id, new.session_id, new.generation, "offer-again",
                                   token_hash(new_token()), log_cap_bytes=0)
    assert (again.run_id, again.attempt_id, again.lease_generation) == (claimed[0], claimed[1], 2)


def test_recovery_startup_pass_recovers_200_in_flight_attempts_in_one_call(rec, monkeypatch):
    dead = rec.dead_identity()
    kinds = {"claimed": 80, "dead": 80, "receipt": 40}
    # Setting up 200 attempts takes ~700 transactions: do them without fsync, on a second store
    # over the same file. The pass itself runs on the harness's store (synchronous=FULL).
    with monkeypatch.context() as patch:
        patch.setattr(sqlite_store, "PRAGMAS", tuple(
            "PRAGMA synchronous=OFF" if p.startswith("PRAGMA synchronous") else p for p in sqlite_store.PRAGMAS))
        setup = Repository.open(rec.config.database_url)
    try:
        flights = Flights(rec, rec.ctx.executor_side.session, setup)
        for _ in range(kinds["claimed"]):
            flights.make("claimed")
        for _ in range(kinds["dead"]):
            flights.make("running", dead)
        for _ in range(kinds["receipt"]):
            token = new_token()
            plant_receipt(rec, *flights.make("running", dead, token), token, exit_code=0)
    finally:
        setup.close()
    assert rec.ctx.control_side.control.recovery.candidates(64)[1]  # more than one page
    local, reads = rec.ctx.control_side.local, []
    monkeypatch.setattr(local, "journal_entries", lambda ids, read=local.journal_entries: reads.append(len(ids))
                        or read(ids))
    ref = rec.start("recovery", Recovery)
    t0 = time.monotonic()
    totals = ref.ask(StartupPass(), timeout=60)
    elapsed = time.monotonic() - t0
    print(f"\nstartup recovery of 200 in-flight attempts took {elapsed:.3f} s: {totals}")
    assert totals == {"released": 80, "lost": 80, "completed": 40}
    assert reads == [64, 64, 64, 8]  # the journal is read once a page, not once a candidate
    assert rec.ctx.control_side.control.recovery.candidates(64) == ([], False)


def test_recovery_continuous_pass_judges_what_the_executor_attests(rec):
    flights = Flights(rec, rec.ctx.executor_side.session)
    _, live = rec.spawn_sleep(30)
    dead = rec.dead_identity()
    ended = flights.make("running", dead)
    unreported = flights.make("running", dead)  # not attested: the live Executor still owns it
    healthy = flights.make("running", live)
    ref = rec.start("recovery", Recovery)
    ref.tell(AttemptEnded(*ended))
    ref.tell(StepRequest(3))
    [done] = rec.inbox.wait("scheduler", StepDone)
    assert done == StepDone(3, "recovery", True, pending=True)  # it had an attested attempt to judge
    run = rec.repo.runs.get(ended[0])
    assert (run.state, run.attempts[0].error_code) == ("lost", ErrorCode.RECOVERY_PROCESS_EXITED_WITHOUT_RECEIPT)
    assert rec.repo.runs.get(unreported[0]).state == "running"
    assert rec.repo.runs.get(healthy[0]).state == "running"


def test_a_receipt_found_after_an_attested_stop_completes_with_the_signal_the_executor_sent(rec):
    """A launcher slow to publish: the Executor attested the end (`stopped`, after its TERM) before
    the receipt was there; Recovery, finding it next, completes with that stop, not as an `exit`."""
    flights = Flights(rec, rec.ctx.executor_side.session)
    dead = rec.dead_identity()
    runs = {}
    for stopped_by in ("term", "kill", None):
        token = new_token()
        run_id, attempt_id = flights.make("running", dead, token)
        assert rec.repo.runs.cancel(run_id).result == "requested"
        plant_receipt(rec, run_id, attempt_id, token, exit_code=143 if stopped_by != "kill" else 137)
        runs[stopped_by] = run_id, attempt_id
    ref = rec.start("recovery", Recovery)
    for stopped_by, (run_id, attempt_id) in runs.items():
        ref.tell(AttemptEnded(run_id, attempt_id, stopped_by))
    ref.tell(StepRequest(4))
    [done] = rec.inbox.wait("scheduler", StepDone)
    assert done.ok
    facts = {by: (rec.repo.runs.get(run_id).state, rec.repo.runs.get(run_id).attempts[0].exit_code,
                  rec.repo.runs.get(run_id).attempts[0].signal) for by, (run_id, _a) in runs.items()}
    # what this process sent the group decides the signal; with no attested stop, none is invented
    assert facts == {"term": ("cancelled", 143, 15), "kill": ("cancelled", 137, 9), None: ("cancelled", 143, None)}


def test_recovery_takes_the_identity_from_the_journal_when_started_never_committed(rec):
    flights = Flights(rec, rec.ctx.executor_side.session)
    proc, live = rec.spawn_sleep(30)
    token = new_token()
    run_id, attempt_id = flights.make("starting", token=token)
    j = rec.ctx.executor_side.journal
    j.accept(attempt_id, run_id, str(rec.ctx.executor_side.logs.path_for(run_id, attempt_id)),
             str(rec.ctx.executor_side.receipts.final_path(attempt_id)), token_hash(token))
    j.set_state(attempt_id, "started", identity=live)
    rec.ctx.control_side.local.session = rec.ctx.control_side.dispatch.sessions.register("local", 8)
    ref = rec.start("recovery", Recovery)
    assert ref.ask(StartupPass(), timeout=WAIT_S) == {"running": 1}
    run = rec.repo.runs.get(run_id)
    assert (run.state, run.attempts[0].state) == ("running", "running")
    assert proc.poll() is None
