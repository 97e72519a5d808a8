"""The dispatch path's queries, built once with bound parameters (see plans.py): the offer and
report paths run per job. The candidate query picks the oldest dispatchable run; the rest are
the session, lease and count reads and updates the offer and the fenced reports share.
"""

from __future__ import annotations

from sqlalchemy import and_, bindparam, exists, func, or_, select
from sqlalchemy.engine import Connection

from ..domain.states import AttemptStatus, LeaseStatus, RunStatus
from .plans import sql_states
from .schema import run_attempts, run_dispatch_leases, runs, task_revisions, tasks, worker_sessions

_A, _R, _L = AttemptStatus, RunStatus, LeaseStatus

ACTIVE = sql_states(_A.CLAIMED, _A.STARTING, _A.RUNNING)
DISPATCHED = sql_states(_R.DISPATCHING, _R.RUNNING)



def candidate_query(kind: str, skip_runs: list[str], skip_tasks: list[str]):
    """The oldest dispatchable run of one kind, locked; rows another offer holds are skipped (PostgreSQL).

    `queued`, or `dispatching` with no live lease (a declined claim, offered again). The attempt
    and the limit are correlated subqueries, not joins, so that both databases walk the runs in
    queue order on `(status, queued_at_ms, id)` and stop at the first that fits, instead of
    sorting every claimed attempt.
    """
    # Ordered by number (a run has one active attempt, its newest), so SQLite looks it up by run
    # id on (run_id, number) instead of walking every claimed attempt on (status, ...).
    claimed = (select(run_attempts.c.id).where(and_(run_attempts.c.run_id == runs.c.id,
                                                    run_attempts.c.status == _A.CLAIMED.value))
               .order_by(run_attempts.c.number.desc()).limit(1).scalar_subquery())
    limit = (select(task_revisions.c.max_concurrent).where(and_(
        task_revisions.c.task_id == runs.c.task_id, task_revisions.c.revision == runs.c.task_revision))
        .scalar_subquery())
    other = runs.alias("other")
    busy = (select(func.count()).select_from(other).where(and_(
        other.c.task_id == runs.c.task_id, other.c.status.in_(DISPATCHED), other.c.id != runs.c.id))
        .scalar_subquery())
    query = (
        select(runs, claimed.label("attempt_id"), limit.label("max_concurrent"))
        .where(and_(runs.c.status == kind, runs.c.cancel_reason.is_(None), claimed.is_not(None),
                    busy < limit,
                    # a cron run's random delay: not offered before its not-before time, judged on
                    # the transaction's observed time (edge: system clock; cluster: database time)
                    or_(runs.c.not_before_ms.is_(None), runs.c.not_before_ms <= bindparam("now"))))
        .order_by(runs.c.queued_at_ms, runs.c.id)
        .limit(1)
        # SQLAlchemy drops FOR UPDATE on SQLite, where BEGIN IMMEDIATE already serialises writers.
        .with_for_update(skip_locked=True, of=runs)
    )
    if kind == _R.DISPATCHING.value:
        query = query.where(~exists().where(and_(run_dispatch_leases.c.attempt_id == claimed,
                                                 run_dispatch_leases.c.status == _L.LEASED.value)))
    if skip_runs:
        query = query.where(runs.c.id.not_in(skip_runs))
    if skip_tasks:
        query = query.where(runs.c.task_id.not_in(skip_tasks))
    return query


def dispatchable(conn: Connection, run, attempt) -> bool:
    """Re-check a locked candidate with fresh reads (the query's snapshot may predate a commit)."""
    if run is None or attempt is None or run.cancel_reason is not None:
        return False
    if attempt.status != _A.CLAIMED.value or attempt.run_id != run.id:
        return False
    if run.status == _R.QUEUED.value:
        return True
    if run.status != _R.DISPATCHING.value:
        return False
    return conn.execute(LIVE_LEASES, {"attempt_id": attempt.id}).scalar_one() == 0


def busy(conn: Connection, task_id: str, run_id: str) -> int:
    """Runs of the task already dispatched (`dispatching|running`), other than `run_id` itself."""
    return conn.execute(BUSY, {"task_id": task_id, "run_id": run_id}).scalar_one()


# Built once with bound parameters (see plans.py): the offer and report paths run per job.
CANDIDATES = {kind: candidate_query(kind, [], []) for kind in (_R.DISPATCHING.value, _R.QUEUED.value)}
SESSION = select(worker_sessions).where(worker_sessions.c.session_id == bindparam("session_id"))
SESSION_LOCKED = SESSION.with_for_update()
SESSION_SHARED = SESSION.with_for_update(read=True)
LEASE_BY_OFFER = select(run_dispatch_leases).where(run_dispatch_leases.c.offer_id == bindparam("offer_id"))
LEASE_LOCKED = select(run_dispatch_leases).where(and_(
    run_dispatch_leases.c.attempt_id == bindparam("attempt_id"),
    run_dispatch_leases.c.lease_generation == bindparam("generation"))).with_for_update()
LEASED_COUNT = select(func.count()).select_from(
    run_dispatch_leases.join(run_attempts, run_attempts.c.id == run_dispatch_leases.c.attempt_id)).where(and_(
        run_dispatch_leases.c.session_id == bindparam("session_id"),
        run_dispatch_leases.c.status == _L.LEASED.value, run_attempts.c.status.in_(ACTIVE)))
LIVE_LEASES = select(func.count()).select_from(run_dispatch_leases).where(and_(
    run_dispatch_leases.c.attempt_id == bindparam("attempt_id"), run_dispatch_leases.c.status == _L.LEASED.value))
MAX_GENERATION = select(func.coalesce(func.max(run_dispatch_leases.c.lease_generation), 0)).where(
    run_dispatch_leases.c.attempt_id == bindparam("attempt_id"))
CLAIMED_ATTEMPT_UPDATE = run_attempts.update().where(and_(
    run_attempts.c.id == bindparam("w_id"), run_attempts.c.status == _A.CLAIMED.value))
OFFER_REVISION = (select(task_revisions, tasks.c.name.label("task_name"))
                   .join(tasks, tasks.c.id == task_revisions.c.task_id)
                   .where(and_(task_revisions.c.task_id == bindparam("task_id"),
                               task_revisions.c.revision == bindparam("revision"))))
BUSY = select(func.count()).select_from(runs).where(and_(
    runs.c.task_id == bindparam("task_id"), runs.c.status.in_(DISPATCHED), runs.c.id != bindparam("run_id")))
