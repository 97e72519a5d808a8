"""Store: deadlines and stops (SEMANTICS.md §6, §7): when the cadence must wake next, committing timeouts,
the stops still to enforce, and ending a run by its cancel intent when its process is gone.

Every write is one short transaction per run; a page of work is a read that lists ids, then one
transaction per id that re-checks everything under its locks (so a page never holds locks for long
and one broken run cannot roll back the others' commits).
"""

from __future__ import annotations

from sqlalchemy import and_, func, select

from ...domain.results import Outcome, Result
from ...domain.states import CancelReason, LeaseReleaseReason, LeaseStatus, RunStatus
from ...domain.transitions import InvalidTransition, plan_cancel, plan_end_by_intent
from ..engine import Store
from ..plans import (
    apply_plan,
    attempt_snapshot,
    current_attempt,
    end_lease,
    load_run,
    pinned_revision,
    run_snapshot,
)
from ..schema import run_attempts, run_retry_policies, runs, task_revisions
from .control_rows import DEFAULT_PAGE, DISPATCHED, LIVE, MAX_STOP_PAGE, StopOrder, page_size, stop_order

_R, _L = RunStatus, LeaseStatus


class Stops:
    """Deadlines, timeouts, pending stops and the end of a run by its intent."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def next_deadline_ms(self) -> int | None:
        """The earliest deadline of a `starting|running` attempt whose run has no cancel intent."""
        with self.store.read() as conn:
            return conn.execute(select(func.min(run_attempts.c.deadline_at_ms)).select_from(
                run_attempts.join(runs, runs.c.id == run_attempts.c.run_id)).where(and_(
                    run_attempts.c.status.in_(LIVE), run_attempts.c.deadline_at_ms.is_not(None),
                    runs.c.cancel_reason.is_(None)))).scalar_one()

    def next_due_ms(self) -> int | None:
        """When the cadence must wake next: the earliest attempt deadline or retry backoff end."""
        with self.store.read() as conn:
            retry = conn.execute(select(func.min(run_retry_policies.c.next_attempt_at_ms)).select_from(
                run_retry_policies.join(runs, runs.c.id == run_retry_policies.c.run_id)).where(
                    runs.c.status == _R.RETRY_WAIT.value)).scalar_one()
        due = [t for t in (self.next_deadline_ms(), retry) if t is not None]
        return min(due) if due else None

    def commit_timeouts(self, limit: int = DEFAULT_PAGE) -> list[StopOrder]:
        """Commit `cancel_reason=timeout` for attempts past their deadline; the stops to send.

        One transaction per run, each re-checking deadline (database time) and intent under the
        run lock, so a user's intent committed meanwhile is never overwritten. Only the runs this
        call gave an intent are returned; `pending` lists every intent still to enforce.
        """
        page_size(limit, MAX_STOP_PAGE)
        with self.store.read() as conn:
            now = self.store.now_ms(conn)
            due = conn.execute(
                select(run_attempts.c.run_id, run_attempts.c.id)
                .join(runs, runs.c.id == run_attempts.c.run_id)
                .where(and_(run_attempts.c.status.in_(LIVE), run_attempts.c.deadline_at_ms <= now,
                            runs.c.cancel_reason.is_(None), runs.c.status.in_(DISPATCHED)))
                .order_by(run_attempts.c.deadline_at_ms, run_attempts.c.id).limit(limit)).all()
        orders = []
        for run_id, attempt_id in due:
            order = self._commit_timeout(run_id, attempt_id)
            if order is not None:
                orders.append(order)
        return orders

    def _commit_timeout(self, run_id: str, attempt_id: str) -> StopOrder | None:
        with self.store.write() as conn:
            self.store.advisory_lock(conn, f"attempt:{attempt_id}")
            run = load_run(conn, run_id)
            attempt = current_attempt(conn, run_id)
            if (run is None or attempt is None or attempt.id != attempt_id
                    or attempt.status not in LIVE or run.cancel_reason is not None):
                return None
            now = self.store.now_ms(conn)
            if attempt.deadline_at_ms is None or attempt.deadline_at_ms > now:
                return None
            plan = plan_cancel(run_snapshot(run), attempt_snapshot(attempt), CancelReason.TIMEOUT)
            if plan is None:
                return None
            apply_plan(conn, plan, now, actor_type="scheduler",
                       expected_callback_sequence=attempt.callback_sequence)
            return stop_order(run.id, attempt, CancelReason.TIMEOUT.value,
                               pinned_revision(conn, run).stop_grace_ms)

    def pending(self, limit: int = DEFAULT_PAGE, *, worker_id: str | None = None) -> list[StopOrder]:
        """Runs with a committed cancel intent whose attempt is `starting|running`, oldest intent first.

        Re-sending StopRequested for them is idempotent, so this is also how stops survive a restart
        and how a stop committed by one replica reaches a worker talking to another (every
        heartbeat answer carries that worker's: `worker_id`).
        """
        page_size(limit, MAX_STOP_PAGE)
        where = and_(runs.c.cancel_reason.is_not(None), runs.c.status.in_(DISPATCHED),
                     run_attempts.c.status.in_(LIVE))
        if worker_id is not None:
            where = and_(where, run_attempts.c.worker_id == worker_id)
        query = (
            select(run_attempts, runs.c.cancel_reason, task_revisions.c.stop_grace_ms)
            .join(runs, runs.c.id == run_attempts.c.run_id)
            .join(task_revisions, and_(task_revisions.c.task_id == runs.c.task_id,
                                       task_revisions.c.revision == runs.c.task_revision))
            .where(where)
            .order_by(runs.c.cancel_requested_at_ms, runs.c.id).limit(limit))
        with self.store.read() as conn:
            return [stop_order(r.run_id, r, r.cancel_reason, r.stop_grace_ms) for r in conn.execute(query)]

    def end_by_intent(self, run_id: str, attempt_id: str, *, actor_type: str = "scheduler") -> Outcome:
        """End a run whose process is conclusively gone with no receipt, as its cancel intent says.

        `exit_code` stays NULL. The live lease ends `released`: reason `shutdown` for a shutdown
        intent, else `declined` (the control side withdrew the attempt's authority; the lease
        vocabulary has no better word, and `completed` is kept for receipts).
        """
        with self.store.write() as conn:
            self.store.advisory_lock(conn, f"attempt:{attempt_id}")
            run = load_run(conn, run_id)
            if run is None:
                return Outcome(Result.REFUSED, "unknown_run")
            if RunStatus(run.status).terminal:
                return Outcome(Result.ALREADY_TERMINAL, None, run.status)
            attempt = current_attempt(conn, run_id)
            if attempt is None or attempt.id != attempt_id:
                return Outcome(Result.REFUSED, "not_current_attempt", run.status)
            return end_by_intent_in(conn, run, attempt, self.store.now_ms(conn), actor_type=actor_type)


def end_by_intent_in(conn, run, attempt, now: int, *, actor_type: str) -> Outcome:
    """`end_by_intent`'s body, shared with cluster recovery: in the caller's transaction, which
    holds the attempt's advisory lock and the run row, `attempt` being the run's current one."""
    if run.cancel_reason is None:
        return Outcome(Result.REFUSED, "no_intent", run.status)
    try:
        plan = plan_end_by_intent(run_snapshot(run), attempt_snapshot(attempt))
    except InvalidTransition:
        return Outcome(Result.REFUSED, f"run_{run.status}", run.status)
    apply_plan(conn, plan, now, actor_type=actor_type, expected_callback_sequence=attempt.callback_sequence)
    reason = (LeaseReleaseReason.SHUTDOWN if run.cancel_reason == CancelReason.SHUTDOWN.value
              else LeaseReleaseReason.DECLINED)
    end_lease(conn, attempt.id, now, _L.RELEASED, reason)
    return Outcome(Result.APPLIED, None, plan.run_to.value)
