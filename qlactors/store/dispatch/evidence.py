"""Store: an attempt's not-running evidence (SEMANTICS.md §10 step 1): the columns every new lease and
every activation clears, and `qlactors confirm-stopped RUN`, the operator's statement that the
run's current attempt runs nowhere.

Evidence is bound to a lease generation: `run_attempts.evidence_lease_generation` names the lease
the fact speaks of, and recovery trusts a fact only while that is the attempt's current lease
generation (the `lease_generation` projection). `confirm-stopped` is accepted for exactly the
attempts recovery could act on but for evidence — the run's current attempt, `starting|running`,
of a run `dispatching|running`, whose lease is missing or expired (database time) — and records
`confirmed_stopped` for that attempt's current lease generation, with the operator's name. A
live lease is refused: its worker still renews it, so it believes the job runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import and_, bindparam, select

from ...domain.recovery_evidence import CONFIRMED_STOPPED, TRUSTED_FACTS
from ...domain.results import Outcome, Result
from ...domain.states import AttemptStatus, LeaseStatus, RunStatus
from ...errors import BadInput, Conflict, NotFound
from ..engine import Store
from ..plans import current_attempt, load_attempt, load_run
from ..schema import run_attempts, run_dispatch_leases

# Written with every new lease (offer, re-offer, re-bind) and every activation: whatever was
# known about an earlier lease says nothing about this one.
NO_EVIDENCE = dict(evidence=None, evidence_at_ms=None, evidence_lease_generation=None, evidence_by=None)
MAX_BY = 128

_A, _L = run_attempts, run_dispatch_leases
_LIVE = (AttemptStatus.STARTING.value, AttemptStatus.RUNNING.value)
_DISPATCHED = (RunStatus.DISPATCHING.value, RunStatus.RUNNING.value)
_CURRENT_ID = (select(_A.c.id).where(_A.c.run_id == bindparam("run_id"))
               .order_by(_A.c.number.desc()).limit(1))
_LIVE_LEASE = select(_L).where(and_(_L.c.attempt_id == bindparam("attempt_id"),
                                     _L.c.status == LeaseStatus.LEASED.value)).with_for_update()
_CONFIRM = _A.update().where(and_(_A.c.id == bindparam("w_id"), _A.c.status == bindparam("w_status"),
                                  _A.c.lease_generation == bindparam("w_generation")))


@dataclass(frozen=True, slots=True)
class Found:
    """What `confirm-stopped` found (the value of its Outcome, whose `run_state` is the run's
    status): the Outcome is `applied` (recorded, or a trusted fact about the current lease
    generation was there already: `detail` is `already_<fact>`) or `refused` (nothing written;
    `detail` a short machine word, these fields say what was found)."""

    run_id: str
    attempt_id: str | None = None
    attempt_number: int | None = None
    attempt_status: str | None = None
    worker_id: str | None = None
    lease_generation: int | None = None
    lease_expires_at_ms: int | None = None
    """The live lease's expiry when `lease_live` (None: it never expires, as on edge)."""
    by: str | None = None
    """Who said it (the first operator's name when it was recorded already)."""
    now_ms: int | None = None


def check_operator(by: str) -> str:
    if type(by) is not str or not by.strip() or len(by) > MAX_BY or not by.isprintable():
        raise BadInput(f"the operator's name is 1 to {MAX_BY} printable characters")
    return by.strip()


class ConfirmStopped:
    """`confirm_stopped(run_id, by)`: the operator's statement for one attempt."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def confirm_stopped(self, run_id: str, by: str) -> Outcome[Found]:
        """Record that the run's current attempt runs nowhere (see the module's doc); NotFound for
        an unknown run. One transaction: the attempt's advisory lock, the run row, the attempt,
        its live lease, then database time once."""
        by = check_operator(by)
        with self.store.read() as conn:
            attempt_id = conn.execute(_CURRENT_ID, {"run_id": run_id}).scalar()
        with self.store.write() as conn:
            if attempt_id is not None:
                self.store.advisory_lock(conn, f"attempt:{attempt_id}")
            run = load_run(conn, run_id)
            if run is None:
                raise NotFound(f"no run {run_id}")
            if RunStatus(run.status).terminal:
                return _answer(Result.REFUSED, f"run_{run.status}", run)
            current = current_attempt(conn, run.id)
            if current is None or current.id != attempt_id:  # a retry admitted meanwhile: look again
                return _answer(Result.REFUSED, "attempt_changed", run)
            attempt = load_attempt(conn, attempt_id)
            found = dict(attempt_id=attempt.id, attempt_number=attempt.number, attempt_status=attempt.status,
                         worker_id=attempt.worker_id, lease_generation=attempt.lease_generation)
            if attempt.status not in _LIVE:
                return _answer(Result.REFUSED, f"attempt_{attempt.status}", run, **found)
            if run.status not in _DISPATCHED:
                return _answer(Result.REFUSED, f"run_{run.status}", run, **found)
            lease = conn.execute(_LIVE_LEASE, {"attempt_id": attempt.id}).first()
            now = self.store.now_ms(conn)
            if lease is not None and (lease.expires_at_ms is None or lease.expires_at_ms > now):
                return _answer(Result.REFUSED, "lease_live", run, **dict(
                    found, lease_expires_at_ms=lease.expires_at_ms), now_ms=now)
            if attempt.lease_generation is None:
                return _answer(Result.REFUSED, "no_lease", run, **found)
            if attempt.evidence in TRUSTED_FACTS and attempt.evidence_lease_generation == attempt.lease_generation:
                return _answer(Result.APPLIED, f"already_{attempt.evidence}", run, **found,
                               by=attempt.evidence_by, now_ms=now)
            changed = conn.execute(_CONFIRM, dict(
                evidence=CONFIRMED_STOPPED, evidence_at_ms=now, evidence_lease_generation=attempt.lease_generation,
                evidence_by=by, updated_at_ms=now, w_id=attempt.id, w_status=attempt.status,
                w_generation=attempt.lease_generation)).rowcount
            if changed != 1:
                raise Conflict(f"attempt {attempt.id} changed meanwhile")
            return _answer(Result.APPLIED, None, run, **found, by=by, now_ms=now)


def _answer(result: Result, detail: str | None, run, **found) -> Outcome[Found]:
    return Outcome(result, detail, run.status, Found(run.id, **found))
