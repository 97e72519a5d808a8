"""Store: each task's newest run, in one read (the task list of the web page: "last result")."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select

from ..engine import Store
from ..schema import runs


def last_runs(store: Store, task_id: str | None = None) -> dict[str, dict[str, Any]]:
    """task id -> its newest run's `{id, state, created_at_ms, finished_at_ms}`, for every task or
    for `task_id` only; a task that never ran is absent. One statement: the newest row per task by
    (created_at_ms, id)."""
    rank = func.row_number().over(partition_by=runs.c.task_id,
                                  order_by=(runs.c.created_at_ms.desc(), runs.c.id.desc())).label("rank")
    ranked = select(runs.c.task_id, runs.c.id, runs.c.status, runs.c.created_at_ms, runs.c.finished_at_ms, rank)
    if task_id is not None:
        ranked = ranked.where(runs.c.task_id == task_id)
    ranked = ranked.subquery()
    query = select(ranked).where(ranked.c.rank == 1)
    with store.read() as conn:
        return {row.task_id: {"id": row.id, "state": row.status, "created_at_ms": row.created_at_ms,
                              "finished_at_ms": row.finished_at_ms} for row in conn.execute(query)}
