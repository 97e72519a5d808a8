"""Store: the batched offer's candidate queries (SEMANTICS.md §9 Offers): the oldest dispatchable runs
whose task has room and whose pinned revision's required labels the session has.

Built per shape and cached: the shapes are few (kind x label filter x locked or not), and the
values (tasks, skipped runs, labels, limit, now) are bound parameters. The label filter is the
one dialect-specific piece: PostgreSQL compares `jsonb` (`<@`), SQLite walks `json_each`.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Sequence

from sqlalchemy import and_, bindparam, exists, func, or_, select, text, union_all
from sqlalchemy.engine import Connection

from ...domain.states import AttemptStatus, LeaseStatus, RunStatus
from ..schema import run_attempts, run_dispatch_leases, runs, task_revisions
from .dispatch_queries import DISPATCHED

_A, _R, _L = AttemptStatus, RunStatus, LeaseStatus
KINDS = (_R.DISPATCHING.value, _R.QUEUED.value)  # a declined claim first: it was the oldest

# The revision's required labels are a subset of the session's (`:labels`, a JSON array).
_LABELS_SUBSET = {
    "postgresql": text("CAST(task_revisions.labels_json AS jsonb) <@ CAST(:labels AS jsonb)"),
    "sqlite": text("NOT EXISTS (SELECT 1 FROM json_each(task_revisions.labels_json) AS rl "
                   "WHERE rl.value NOT IN (SELECT sl.value FROM json_each(:labels) AS sl))"),
}
NO_LABELS = "[]"


def labels_param(labels_json: str | None) -> str:
    """The session's labels as the canonical JSON array the filter binds (sorted, distinct)."""
    labels = json.loads(labels_json or NO_LABELS)
    return json.dumps(sorted({str(label) for label in labels}))


@lru_cache(maxsize=64)
def candidates(dialect: str, kind: str, *, labelled: bool, locked: bool, skipping: bool,
               restricted: bool = False):
    """Runs of one kind, oldest first, at most `:limit`; of the tasks in `:tasks` when `restricted`.

    `queued`, or `dispatching` with no live lease (a declined claim, offered again); no cancel
    intent; the not-before time reached at `:now`; the task below its pinned `max_concurrent`
    (as committed: the caller re-counts under the task's advisory lock); the labels fit. Locked
    (PostgreSQL): `FOR UPDATE OF runs SKIP LOCKED` with the statement's own LIMIT, so concurrent
    pulls never wait on each other's rows; SQLite serialises writers already.
    """
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
    label_ok = (_LABELS_SUBSET[dialect] if labelled
                else task_revisions.c.labels_json == NO_LABELS)
    fits = exists().where(and_(task_revisions.c.task_id == runs.c.task_id,
                               task_revisions.c.revision == runs.c.task_revision, label_ok))
    columns = (runs, claimed.label("attempt_id"), limit.label("max_concurrent")) if locked else (
        runs.c.task_id,)
    query = (
        select(*columns)
        .where(and_(runs.c.status == kind, runs.c.cancel_reason.is_(None), claimed.is_not(None),
                    busy < limit, fits,
                    or_(runs.c.not_before_ms.is_(None), runs.c.not_before_ms <= bindparam("now"))))
        .order_by(runs.c.queued_at_ms, runs.c.id)
        .limit(bindparam("limit"))
    )
    if kind == _R.DISPATCHING.value:
        query = query.where(~exists().where(and_(run_dispatch_leases.c.attempt_id == claimed,
                                                 run_dispatch_leases.c.status == _L.LEASED.value)))
    if restricted:
        query = query.where(runs.c.task_id.in_(bindparam("tasks", expanding=True)))
    if locked:
        query = query.with_for_update(skip_locked=True, of=runs)
    if skipping:
        query = query.where(and_(runs.c.id.not_in(bindparam("skip_runs", expanding=True)),
                                 runs.c.task_id.not_in(bindparam("skip_tasks", expanding=True))))
    return query


def candidate_tasks(conn: Connection, dialect: str, labels: str, now: int, limit: int) -> list[str]:
    """The tasks of the oldest `limit` candidates of each kind, read without a lock, in task-id order:
    the tasks whose advisory locks a batch takes before any row lock (the global order of §9)."""
    query = _candidate_tasks(dialect, labels != NO_LABELS)
    return sorted({r.task_id for r in conn.execute(query, {"now": now, "limit": limit, "labels": labels})})


@lru_cache(maxsize=8)
def _candidate_tasks(dialect: str, labelled: bool):
    """The unlocked candidates' task ids of every kind, in one statement."""
    kinds = [candidates(dialect, kind, labelled=labelled, locked=False, skipping=False).subquery()
             for kind in KINDS]
    return union_all(*(select(kind.c.task_id) for kind in kinds))


def claim_candidates(conn: Connection, dialect: str, kind: str, *, labels: str, now: int, limit: int,
                     tasks: Sequence[str] | None, skip_runs: Sequence[str], skip_tasks: Sequence[str]) -> list:
    """Up to `limit` candidate runs of `kind` (among `tasks` unless None), locked (PostgreSQL:
    SKIP LOCKED)."""
    skipping = bool(skip_runs or skip_tasks)
    query = candidates(dialect, kind, labelled=labels != NO_LABELS, locked=True, skipping=skipping,
                       restricted=tasks is not None)
    params = {"now": now, "limit": limit, "labels": labels}
    if tasks is not None:
        params["tasks"] = list(tasks)
    if skipping:
        # NOT IN over an empty expanding list renders as always-true on both dialects.
        params.update(skip_runs=list(skip_runs), skip_tasks=list(skip_tasks))
    return conn.execute(query, params).all()
