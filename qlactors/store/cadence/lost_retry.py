"""Store: the Retry step's store operations: lost runs resolved by their admission-time policy, and runs
whose backoff is over queued again with a fresh attempt (SEMANTICS.md §10 step 2).

Like the rest of the cadence's writes, each run is one short transaction under the run's advisory
lock; a page is a read that lists ids.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import and_, select
from sqlalchemy.engine import Connection

from ...domain.results import Outcome, Result
from ...domain.retry import RetryPolicy, decide_lost
from ...domain.states import AttemptStatus, RunStatus
from ...domain.transitions import plan_end_by_intent, plan_lost_failed, plan_requeue, plan_retry_wait
from ...errors import Conflict
from ...ids import new_id
from ..engine import Store
from ..plans import apply_plan, attempt_snapshot, current_attempt, load_run, run_snapshot
from ..schema import run_attempts, run_retry_policies, runs
from .control_rows import DEFAULT_PAGE, page_size

_A, _R = AttemptStatus, RunStatus


class LostRetry:
    """Lost runs and due retries, read and changed one run per transaction."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def _locked_run_in(self, conn: Connection, run_id: str, status: RunStatus) -> tuple[Any, Outcome | None]:
        """The run under its advisory lock (runs are the unit here: a lost attempt has no
        authority left to serialise on), or the Outcome when it is not in `status`."""
        self.store.advisory_lock(conn, f"run:{run_id}")
        run = load_run(conn, run_id)
        if run is None:
            return None, Outcome(Result.REFUSED, "unknown_run")
        if RunStatus(run.status).terminal:
            return run, Outcome(Result.ALREADY_TERMINAL, None, run.status)
        if run.status != status.value:
            return run, Outcome(Result.REFUSED, f"run_{run.status}", run.status)
        return run, None

    def lost_runs(self, limit: int = DEFAULT_PAGE) -> list[str]:
        """Ids of `lost` runs, longest lost first."""
        page_size(limit)
        with self.store.read() as conn:
            return list(conn.execute(select(runs.c.id).where(runs.c.status == _R.LOST.value)
                                     .order_by(runs.c.updated_at_ms, runs.c.id).limit(limit)).scalars())

    def resolve_lost(self, run_id: str) -> Outcome:
        """The retry step for one lost run (SEMANTICS.md §10 step 2).

        A cancel intent wins (the run ends as it says); otherwise the run's policy snapshot decides
        with attempts used = the lost attempt's number: `failed` with RUN_LOST_RETRY_DISABLED,
        _UNSAFE or _EXHAUSTED, or `retry_wait` with the policy row's `next_attempt_at_ms` set to
        now + backoff (policy version + 1). `detail` carries the error code or the due time.
        """
        with self.store.write() as conn:
            run, refusal = self._locked_run_in(conn, run_id, _R.LOST)
            if refusal is not None:
                return refusal
            attempt = current_attempt(conn, run_id)
            run_s, attempt_s = run_snapshot(run), attempt_snapshot(attempt)
            now = self.store.now_ms(conn)
            if run.cancel_reason is not None:
                plan = plan_end_by_intent(run_s, attempt_s)
                apply_plan(conn, plan, now, actor_type="retry")
                return Outcome(Result.APPLIED, plan.error_code, plan.run_to.value)
            policy_row = conn.execute(select(run_retry_policies).where(
                run_retry_policies.c.run_id == run_id).with_for_update()).first()
            decision = decide_lost(_policy(policy_row), attempt.number, now)
            if not decision.retry:
                plan = plan_lost_failed(run_s, attempt_s, decision.error_code)
                apply_plan(conn, plan, now, actor_type="retry")
                return Outcome(Result.APPLIED, decision.error_code, plan.run_to.value)
            plan = plan_retry_wait(run_s, attempt_s, decision.next_attempt_at_ms)
            apply_plan(conn, plan, now, actor_type="retry")
            _cas_policy(conn, policy_row, now, next_attempt_at_ms=decision.next_attempt_at_ms)
            return Outcome(Result.APPLIED, str(decision.next_attempt_at_ms), plan.run_to.value)

    def due_retries(self, limit: int = DEFAULT_PAGE) -> list[str]:
        """Ids of `retry_wait` runs whose backoff ended (policy `next_attempt_at_ms` <= now)."""
        page_size(limit)
        with self.store.read() as conn:
            now = self.store.now_ms(conn)
            return list(conn.execute(
                select(runs.c.id).join(run_retry_policies, run_retry_policies.c.run_id == runs.c.id)
                .where(and_(runs.c.status == _R.RETRY_WAIT.value,
                            run_retry_policies.c.next_attempt_at_ms <= now))
                .order_by(run_retry_policies.c.next_attempt_at_ms, runs.c.id).limit(limit)).scalars())

    def requeue(self, run_id: str) -> Outcome:
        """Backoff over: run `queued` with a fresh Attempt N+1 `claimed` that inherits nothing.

        No worker, session, lease, offer, token, identity or start fact is copied. The run's
        `queued_at_ms` becomes now (it joins the back of the queue) and its error code, which
        described the lost attempt, is cleared; the policy's `next_attempt_at_ms` is cleared.
        `detail` is the new attempt's id.
        """
        with self.store.write() as conn:
            run, refusal = self._locked_run_in(conn, run_id, _R.RETRY_WAIT)
            if refusal is not None:
                return refusal
            policy_row = conn.execute(select(run_retry_policies).where(
                run_retry_policies.c.run_id == run_id).with_for_update()).first()
            now = self.store.now_ms(conn)
            if policy_row is None or policy_row.next_attempt_at_ms is None:
                return Outcome(Result.REFUSED, "no_policy", run.status)
            if policy_row.next_attempt_at_ms > now:
                return Outcome(Result.REFUSED, "not_due", run.status)
            previous = current_attempt(conn, run_id)
            number = previous.number + 1
            attempt_id = new_id()
            conn.execute(run_attempts.insert().values(
                id=attempt_id, run_id=run_id, number=number, status=_A.CLAIMED.value,
                executor_type=previous.executor_type, callback_sequence=0,
                created_at_ms=now, updated_at_ms=now))
            plan = plan_requeue(run_snapshot(run), attempt_id, number)
            apply_plan(conn, plan, now, actor_type="retry",
                       run_values=dict(queued_at_ms=now, error_code=None, error_summary=None))
            _cas_policy(conn, policy_row, now, next_attempt_at_ms=None)
            return Outcome(Result.APPLIED, attempt_id, plan.run_to.value)


def _policy(row) -> RetryPolicy | None:
    if row is None:
        return None
    return RetryPolicy(max_attempts=row.max_attempts, retry_on_lost=bool(row.retry_on_lost),
                       safety=row.safety, backoff_base_ms=row.backoff_base_ms,
                       backoff_max_ms=row.backoff_max_ms)


def _cas_policy(conn: Connection, row, now: int, **values: Any) -> None:
    guard = and_(run_retry_policies.c.run_id == row.run_id, run_retry_policies.c.version == row.version)
    if conn.execute(run_retry_policies.update().where(guard).values(
            version=row.version + 1, updated_at_ms=now, **values)).rowcount != 1:
        raise Conflict(f"retry policy of run {row.run_id} changed meanwhile")
