"""Store: recovery's operations (SEMANTICS.md §10): marking an attempt lost, the candidates recovery
judges (the database's facts; edge's Recovery adds its journal's), and re-binding a process that survived a
restart to the current session.

Each write is one short transaction under the attempt's advisory lock.
"""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy import and_, func, or_, select

from ...domain.results import Outcome, Result
from ...domain.states import AttemptStatus, LeaseReleaseReason, LeaseStatus, RunStatus
from ...domain.transitions import adoption_payload, plan_adopted, plan_lost
from ...errors import BadInput, Conflict
from ..engine import Store
from ..plans import (apply_plan, attempt_snapshot, current_attempt, end_lease, load_open_pair, load_run,
                    run_snapshot)
from ..records import Fence, Identity, Session, check_hash, check_id, same_hash
from ..schema import run_attempts, run_dispatch_leases, runs, worker_sessions
from .control_rows import (ACTIVE, DEFAULT_PAGE, DISPATCHED, LIVE, Candidate,
                           candidate_from_row, candidate_select, live_lease, page_size)

_A, _R, _L = AttemptStatus, RunStatus, LeaseStatus
_ERROR_CODE = re.compile(r"[A-Z][A-Z0-9_]{0,63}")


class RecoveryCases:
    """Lost attempts, recovery candidates and re-binding survivors."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def mark_lost(self, run_id: str, attempt_id: str, error_code: str, *,
                  actor_type: str = "recovery") -> Outcome:
        """Attempt and run `lost`, and the live lease `released` (`lease_expired`), in one transaction.

        `refused` when the run has a cancel intent (recovery then calls `end_by_intent`), when
        the run is not `dispatching|running` (a `claimed` attempt of a `queued` run is backlog),
        or when the attempt is not the run's current one.
        """
        if type(error_code) is not str or _ERROR_CODE.fullmatch(error_code) is None:
            raise BadInput("an error code is 1 to 64 characters of A-Z, 0-9 and _")
        with self.store.write() as conn:
            self.store.advisory_lock(conn, f"attempt:{attempt_id}")
            run, attempt, ended = load_open_pair(conn, run_id, attempt_id)
            if ended is not None:
                return ended
            return lost_in(conn, run, attempt, error_code, self.store.now_ms(conn), actor_type=actor_type)

    def candidates(self, limit: int = DEFAULT_PAGE, after_attempt_id: str | None = None, *,
                   worker_id: str | None = None) -> tuple[list[Candidate], bool]:
        """One page of attempts to judge, ascending attempt id, and whether more remain (`limit + 1`).

        Attempts `claimed|starting|running` of runs `dispatching|running`. A `claimed` attempt
        counts only while it holds a live lease (offered, never activated): a `queued` run, or a
        declined offer waiting to be offered again, is backlog, never a candidate. `worker_id`
        narrows the page to attempts last leased by that worker.
        """
        page_size(limit)
        query = candidate_select().where(and_(
            runs.c.status.in_(DISPATCHED), run_attempts.c.status.in_(ACTIVE),
            or_(run_attempts.c.status != _A.CLAIMED.value, live_lease())))
        if after_attempt_id is not None:
            query = query.where(run_attempts.c.id > after_attempt_id)
        if worker_id is not None:
            query = query.where(run_attempts.c.worker_id == worker_id)
        query = query.order_by(run_attempts.c.id).limit(limit + 1)
        with self.store.read() as conn:
            rows = conn.execute(query).all()
        return [candidate_from_row(r) for r in rows[:limit]], len(rows) > limit

    def candidates_for(self, attempt_ids: list[str]) -> list[Candidate]:
        """The candidates among `attempt_ids` (ids no longer in flight are simply absent)."""
        found = (self.candidate(attempt_id) for attempt_id in attempt_ids)
        return [c for c in found if c is not None]

    def candidate(self, attempt_id: str) -> Candidate | None:
        """The same facts for one attempt, whatever its state (for the continuous pass)."""
        with self.store.read() as conn:
            row = conn.execute(candidate_select().where(run_attempts.c.id == attempt_id)).first()
        return candidate_from_row(row) if row is not None else None

    def rebind(self, run_id: str, attempt_id: str, session: Session, identity: Any, *,
               offer_id: str, lease_token_hash: str, actor_type: str = "recovery") -> Outcome[Fence]:
        """Re-bind a process that survived a restart to the current local session.

        The old live lease ends `released` (`shutdown`); a new lease (next generation, the given
        offer id and token hash, version 1) is written for `session`, with the attempt's lease
        projection; `starting` is promoted to `running` (identity written, `started_at_ms` if
        unset). A recorded identity that differs is `refused`. Capacity is not checked: a survivor
        is adopted whatever the slots say. Repeating the call with the same offer id and token
        hash answers `applied` again. The Outcome's value is the fence the new session's reports quote.
        """
        ident = Identity.of(identity)
        check_id("offer id", offer_id)
        check_hash("lease token hash", lease_token_hash)
        with self.store.write() as conn:
            self.store.advisory_lock(conn, f"attempt:{attempt_id}")
            srow = conn.execute(select(worker_sessions).where(
                worker_sessions.c.session_id == session.session_id).with_for_update()).first()
            if (srow is None or srow.worker_id != session.worker_id
                    or srow.generation != session.generation or srow.status != "online"):
                return Outcome(Result.FENCED, "session")
            run = load_run(conn, run_id)
            if run is None:
                return Outcome(Result.REFUSED, "unknown_run")
            attempt = current_attempt(conn, run_id)
            if attempt is None or attempt.id != attempt_id:
                return Outcome(Result.REFUSED, "not_current_attempt", run.status)
            if RunStatus(run.status).terminal or AttemptStatus(attempt.status).terminal:
                return Outcome(Result.ALREADY_TERMINAL, f"attempt_{attempt.status}", run.status)
            if attempt.status not in LIVE or run.status not in DISPATCHED:
                return Outcome(Result.REFUSED, f"attempt_{attempt.status}", run.status)
            stored = Identity.from_row(attempt)
            if stored is not None and stored != ident:
                return Outcome(Result.REFUSED, "identity_mismatch", run.status)
            live = conn.execute(select(run_dispatch_leases).where(and_(
                run_dispatch_leases.c.attempt_id == attempt_id,
                run_dispatch_leases.c.status == _L.LEASED.value)).with_for_update()).first()
            if (live is not None and live.offer_id == offer_id and live.session_id == session.session_id
                    and same_hash(live.token_hash, lease_token_hash) and attempt.status == _A.RUNNING.value):
                return Outcome(Result.APPLIED, "already_bound", run.status, _fence(session, run_id, live))
            if conn.execute(select(run_dispatch_leases.c.attempt_id).where(
                    run_dispatch_leases.c.offer_id == offer_id)).first() is not None:
                return Outcome(Result.REFUSED, "offer_id_taken", run.status)
            return self._bind(conn, run, attempt, live, session, ident, offer_id, lease_token_hash, actor_type)


    def _bind(self, conn, run, attempt, live, session: Session, ident: Identity, offer_id: str,
              lease_token_hash: str, actor_type: str) -> Outcome[Fence]:
        """`rebind`'s writes, in its transaction once every check passed: the old lease ends, the new
        one is written, the attempt projects it (and `starting` becomes `running`)."""
        run_id, attempt_id = run.id, attempt.id
        now = self.store.now_ms(conn)
        if live is not None:
            end_lease(conn, attempt_id, now, _L.RELEASED, LeaseReleaseReason.SHUTDOWN)
        generation = conn.execute(select(func.coalesce(func.max(run_dispatch_leases.c.lease_generation), 0))
                                  .where(run_dispatch_leases.c.attempt_id == attempt_id)).scalar_one() + 1
        lease = dict(attempt_id=attempt_id, lease_generation=generation, run_id=run_id,
                     status=_L.LEASED.value, version=1, worker_id=session.worker_id,
                     session_id=session.session_id, session_generation=session.generation,
                     token_hash=lease_token_hash, offer_id=offer_id, expires_at_ms=None,
                     release_reason=None, created_at_ms=now, updated_at_ms=now)
        if not self.store.insert_new(conn, run_dispatch_leases, lease):
            raise Conflict(f"attempt {attempt_id} was leased again meanwhile")
        values: dict[str, Any] = dict(
            offer_id=offer_id, lease_generation=generation, lease_version=1, lease_expires_at_ms=None,
            worker_id=session.worker_id, session_id=session.session_id,
            session_generation=session.generation, boot_id=ident.boot_id, pid=ident.pid,
            pgid=ident.pgid, start_ticks=ident.start_ticks)
        if attempt.started_at_ms is None:
            values["started_at_ms"] = now
        plan = plan_adopted(run_snapshot(run), attempt_snapshot(attempt), adoption_payload(
            generation, None if live is None else live.lease_generation, session.worker_id, session.session_id))
        # `starting` becomes `running` with the identity (as a Started would); a `running` one
        # takes the new lease's projection. Either way the run's version and `attempt.adopted`.
        apply_plan(conn, plan, now, actor_type=actor_type, expected_callback_sequence=attempt.callback_sequence,
                   attempt_values=values,
                   run_values={"started_at_ms": now} if plan.changes_run and run.started_at_ms is None else None)
        fence = Fence(session.worker_id, session.session_id, session.generation, run_id, attempt_id,
                      offer_id, generation, lease_token_hash, 1)
        return Outcome(Result.APPLIED, None, _R.RUNNING.value, fence)


def lost_in(conn, run, attempt, error_code: str, now: int, *, actor_type: str) -> Outcome:
    """`mark_lost`'s body, shared with cluster recovery: in the caller's transaction, which holds
    the attempt's advisory lock and the run row (`load_open_pair`, both open), the attempt and run
    `lost` and the live lease `released` (`lease_expired`, version + 1; none live: none invented)."""
    if run.cancel_reason is not None:
        return Outcome(Result.REFUSED, "cancel_intent", run.status)
    if run.status not in DISPATCHED:
        return Outcome(Result.REFUSED, f"run_{run.status}", run.status)
    current = current_attempt(conn, run.id)
    if current.id != attempt.id:
        return Outcome(Result.REFUSED, "not_current_attempt", run.status)
    plan = plan_lost(run_snapshot(run), attempt_snapshot(attempt), error_code)
    apply_plan(conn, plan, now, actor_type=actor_type, expected_callback_sequence=attempt.callback_sequence)
    end_lease(conn, attempt.id, now, _L.RELEASED, LeaseReleaseReason.LEASE_EXPIRED)
    return Outcome(Result.APPLIED, None, plan.run_to.value)


def _fence(session: Session, run_id: str, lease) -> Fence:
    return Fence(session.worker_id, session.session_id, session.generation, run_id, lease.attempt_id,
                 lease.offer_id, lease.lease_generation, lease.token_hash, lease.version)
