"""Store: the runs not yet terminal, as `status` lists them: each with its newest attempt's worker and the
labels its pinned revision requires (why a queued one may wait), oldest first and bounded."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, bindparam, func, select, union_all

from ...domain.states import RunStatus
from ..engine import Store
from ..schema import run_attempts, runs, task_revisions, tasks

ACTIVE_SHOWN = 20  # `status` lists at most this many active runs (oldest first); it counts them all
_ACTIVE = [s.value for s in RunStatus if not s.terminal]
_OTHER = run_attempts.alias("newer")
# The run's newest attempt number (the (run_id, number) unique index answers it per run).
_NEWEST = select(func.max(_OTHER.c.number)).where(_OTHER.c.run_id == runs.c.id).scalar_subquery()
_LABELS_OF_RUN = (select(task_revisions.c.labels_json)
                  .join(runs, and_(runs.c.task_id == task_revisions.c.task_id,
                                   runs.c.task_revision == task_revisions.c.revision))
                  .where(runs.c.id == bindparam("run_id")))


@dataclass(frozen=True, slots=True)
class ActiveRun:
    run_id: str
    task: str
    state: str
    created_at_ms: int
    labels: tuple[str, ...]  # what its pinned revision requires of a worker
    attempt_number: int | None
    worker_id: str | None  # its newest attempt's worker (`local` on edge); None before an offer
    session_generation: int | None
    pid: int | None  # the job's launcher, once started

    def to_json(self, waiting: str | None) -> dict[str, Any]:
        return {"run_id": self.run_id, "task": self.task, "state": self.state,
                "created_at_ms": self.created_at_ms, "attempt_number": self.attempt_number,
                "worker_id": self.worker_id, "session_generation": self.session_generation,
                "pid": self.pid, "labels": list(self.labels), "waiting": waiting}


def _oldest_active(limit: int):
    """The ids of the oldest `limit` runs not terminal: the oldest `limit` of each such state,
    each a walk of the start of the `(status, created_at_ms, id)` index, so that the work does not
    grow with the number of active runs (an `IN` over the states sorted every one of them)."""
    per_state = [select(runs.c.id, runs.c.created_at_ms).where(runs.c.status == state)
                 .order_by(runs.c.created_at_ms, runs.c.id).limit(limit).subquery() for state in _ACTIVE]
    oldest = union_all(*[select(part.c.id, part.c.created_at_ms) for part in per_state]).subquery()
    return select(oldest.c.id).order_by(oldest.c.created_at_ms, oldest.c.id).limit(limit)


def active_runs(store: Store, limit: int = ACTIVE_SHOWN) -> list[ActiveRun]:
    """The oldest `limit` runs that are not terminal, in one read."""
    query = (select(runs.c.id, runs.c.status, runs.c.created_at_ms, tasks.c.name, task_revisions.c.labels_json,
                    run_attempts.c.number, run_attempts.c.worker_id, run_attempts.c.session_generation,
                    run_attempts.c.pid)
             .join(tasks, tasks.c.id == runs.c.task_id)
             .join(task_revisions, and_(task_revisions.c.task_id == runs.c.task_id,
                                        task_revisions.c.revision == runs.c.task_revision))
             .outerjoin(run_attempts, and_(run_attempts.c.run_id == runs.c.id, run_attempts.c.number == _NEWEST))
             .where(runs.c.id.in_(_oldest_active(limit)))
             .order_by(runs.c.created_at_ms, runs.c.id).limit(limit))
    with store.read() as conn:
        rows = conn.execute(query).all()
    return [ActiveRun(r.id, r.name, r.status, r.created_at_ms, tuple(json.loads(r.labels_json)), r.number,
                      r.worker_id, r.session_generation, r.pid) for r in rows]


def required_labels(store: Store, run_id: str) -> tuple[str, ...]:
    """The labels the run's pinned revision requires (none for an unknown run)."""
    with store.read() as conn:
        found = conn.execute(_LABELS_OF_RUN, {"run_id": run_id}).scalar()
    return () if found is None else tuple(json.loads(found))
