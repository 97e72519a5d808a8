"""Store: what a run's end writes beside it, in its terminal transition's own transaction
(`apply_plan`): the `/metrics` counters of its task and state (`run_outcome_counts`, so that
retention, deleting runs, never lowers them) and one notification outbox row per rule that asks
about it (`notification_outbox`, delivered by `qlactors web`: web/notifier.py). A rule on `recovered`
asks about a success that follows a failed, timed-out or lost run of the same task.

Two statements, both built once: each reads the run row the transition just wrote (its task,
terminal state and times), so nothing here needs more than the run's id."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.engine import Connection

from ..domain.metrics import DURATION_BUCKETS_S

_DURATION = ("CASE WHEN r.started_at_ms IS NULL OR r.finished_at_ms < r.started_at_ms THEN 0 "
             "ELSE r.finished_at_ms - r.started_at_ms END")
_BUCKETS = [f"le_{b}s" for b in DURATION_BUCKETS_S]
_COUNT = text(
    "INSERT INTO run_outcome_counts (task_id, state, finished, timed, duration_ms_sum, "
    + ", ".join(_BUCKETS) + ") "
    "SELECT r.task_id, r.status, 1, CASE WHEN r.started_at_ms IS NULL THEN 0 ELSE 1 END, " + _DURATION + ", "
    + ", ".join(f"CASE WHEN r.started_at_ms IS NOT NULL AND {_DURATION} <= {b * 1000} THEN 1 ELSE 0 END"
                for b in DURATION_BUCKETS_S)
    + " FROM runs r WHERE r.id = :run_id "
    "ON CONFLICT (task_id, state) DO UPDATE SET finished = run_outcome_counts.finished + excluded.finished, "
    "timed = run_outcome_counts.timed + excluded.timed, "
    "duration_ms_sum = run_outcome_counts.duration_ms_sum + excluded.duration_ms_sum, "
    + ", ".join(f"{c} = run_outcome_counts.{c} + excluded.{c}" for c in _BUCKETS))
_NOTIFY = text(
    "INSERT INTO notification_outbox (run_id, rule_id, task_id, state, status, tries, next_try_at_ms, "
    "created_at_ms) "
    "SELECT r.id, n.id, r.task_id, r.status, 'pending', 0, r.finished_at_ms, r.finished_at_ms "
    "FROM runs r JOIN notification_rules n ON (n.task_id IS NULL OR n.task_id = r.task_id) "
    "WHERE r.id = :run_id AND n.removed_at_ms IS NULL "
    "AND ((',' || n.on_states || ',') LIKE ('%,' || r.status || ',%') "
    # `recovered`: a success whose task's previous finished run had not succeeded
    "OR (r.status = 'succeeded' AND (',' || n.on_states || ',') LIKE '%,recovered,%' AND ("
    "SELECT p.status FROM runs p WHERE p.task_id = r.task_id AND p.id <> r.id AND p.finished_at_ms IS NOT NULL "
    "ORDER BY p.finished_at_ms DESC, p.id DESC LIMIT 1) IN ('failed', 'timed_out', 'lost')))")


def record_run_end(conn: Connection, run_id: str) -> None:
    """Count the run that just ended and queue its notifications (inside the transition)."""
    conn.execute(_COUNT, {"run_id": run_id})
    conn.execute(_NOTIFY, {"run_id": run_id})
