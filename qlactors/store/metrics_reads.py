"""Store: the figures `/metrics` shows beside what `status` reports, each one bounded read: the
kept counters of finished runs (per task and state; `run_outcome_counts`), the oldest queued run,
the cron schedules' lateness, worker sessions by state, and the notification outbox. (The runs not
finished, by state, are the status report's `active_runs`.)"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import and_, func, select

from ..domain.metrics import DURATION_BUCKETS_S
from .engine import Store
from .schema import notification_outbox, run_outcome_counts, runs, tasks, trigger_schedules, triggers, worker_sessions

@dataclass(frozen=True, slots=True)
class Finished:
    task: str
    state: str
    count: int
    timed: int
    duration_ms_sum: int
    buckets: tuple[int, ...]  # cumulative, one per DURATION_BUCKETS_S


@dataclass(frozen=True, slots=True)
class Figures:
    now_ms: int
    finished: list[Finished] = field(default_factory=list)
    oldest_queued_at_ms: int | None = None
    cron_late_ms: int = 0  # the most an enabled schedule's next fire is overdue (0: none)
    sessions: dict[str, int] = field(default_factory=dict)  # worker session status -> count
    task_names: list[str] = field(default_factory=list)  # the tasks there are (their counters start at 0)
    notifications: dict[str, int] = field(default_factory=dict)  # outbox status -> rows


def read_figures(store: Store) -> Figures:
    """Every figure in one read transaction (a consistent picture)."""
    bucket_columns = [run_outcome_counts.c[f"le_{b}s"] for b in DURATION_BUCKETS_S]
    with store.read() as conn:
        now = store.now_ms(conn)
        # By name: a name used again after `task rm` continues its counters (one series per name).
        summed = [func.sum(c) for c in (run_outcome_counts.c.finished, run_outcome_counts.c.timed,
                                        run_outcome_counts.c.duration_ms_sum, *bucket_columns)]
        finished = [Finished(row[0], row[1], row[2], row[3], row[4], tuple(row[5:]))
                    for row in conn.execute(
                        select(tasks.c.name, run_outcome_counts.c.state, *summed)
                        .join(tasks, tasks.c.id == run_outcome_counts.c.task_id)
                        .group_by(tasks.c.name, run_outcome_counts.c.state)
                        .order_by(tasks.c.name, run_outcome_counts.c.state))]
        names = list(conn.execute(select(tasks.c.name).where(tasks.c.deleted_at_ms.is_(None))
                                  .order_by(tasks.c.name)).scalars())
        oldest = conn.execute(select(func.min(runs.c.queued_at_ms)).where(runs.c.status == "queued")).scalar()
        overdue = conn.execute(
            select(func.min(trigger_schedules.c.next_fire_at_ms))
            .join(triggers, triggers.c.id == trigger_schedules.c.trigger_id)
            .join(tasks, tasks.c.id == triggers.c.task_id)
            .where(and_(triggers.c.deleted_at_ms.is_(None), tasks.c.deleted_at_ms.is_(None), tasks.c.enabled,
                        trigger_schedules.c.next_fire_at_ms.is_not(None)))).scalar()
        sessions = dict(conn.execute(select(worker_sessions.c.status, func.count())
                                     .group_by(worker_sessions.c.status)).all())
        outbox = dict(conn.execute(select(notification_outbox.c.status, func.count())
                                   .group_by(notification_outbox.c.status)).all())
    return Figures(now_ms=now, finished=finished, oldest_queued_at_ms=oldest,
                   cron_late_ms=max(0, now - overdue) if overdue is not None else 0,
                   sessions=sessions, notifications=outbox, task_names=names)
