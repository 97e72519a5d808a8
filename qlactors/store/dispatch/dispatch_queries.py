"""Store: the dispatch path's queries, built once with bound parameters (see plans.py): the offer and
report paths run per job. The session, lease and count reads and updates the offers and the
fenced reports share; the batch's candidate queries are in offer_queries.py.
"""

from __future__ import annotations

from sqlalchemy import and_, bindparam, func, select
from sqlalchemy.engine import Connection

from ...domain.states import AttemptStatus, LeaseStatus, RunStatus
from ..plans import sql_states
from ..schema import run_attempts, run_dispatch_leases, runs, task_revisions, tasks, worker_sessions

_A, _R, _L = AttemptStatus, RunStatus, LeaseStatus

ACTIVE = sql_states(_A.CLAIMED, _A.STARTING, _A.RUNNING)
DISPATCHED = sql_states(_R.DISPATCHING, _R.RUNNING)



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
