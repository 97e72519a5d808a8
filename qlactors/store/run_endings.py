"""Store: what a run's transition into a terminal state or `lost` writes beside it, in that
transition's own transaction (`apply_plan`): the `/metrics` counters of its task and state
(`run_outcome_counts`, so that retention, deleting runs, never lowers them) and one notification
outbox row per rule that asks about it (`notification_outbox`, delivered by `qlactors web`:
web/notifier.py). A rule on `recovered` asks about a success that follows a failed or timed-out run
of the same task.

The outbox rows are new rows (their id names the run, the rule and the run's version after the
transition), inserted at once, with the run's facts as the transition leaves them (state, its
latest attempt's number and exit code, error code, times): what a notification tells is never read
from the run later, which retention may have deleted and a retry moved on. The counters are rows many transactions update: they are written
last in the transaction (`engine.last_step`), in (task, state) order, so that the row locks they
take on PostgreSQL cannot close a deadlock with the locks taken before them, and are held only
until the commit that follows."""

from __future__ import annotations

from sqlalchemy import bindparam, select, text
from sqlalchemy.engine import Connection

from ..domain.metrics import DURATION_BUCKETS_S
from .engine import last_step
from .schema import runs

_ENDED_RUNS = "qlactors_ended_runs"
_DURATION = ("CASE WHEN r.started_at_ms IS NULL OR r.finished_at_ms IS NULL OR r.finished_at_ms < r.started_at_ms "
             "THEN 0 ELSE r.finished_at_ms - r.started_at_ms END")
_TIMED = "CASE WHEN r.started_at_ms IS NULL OR r.finished_at_ms IS NULL THEN 0 ELSE 1 END"
_BUCKETS = [f"le_{b}s" for b in DURATION_BUCKETS_S]
_COUNT = text(
    "INSERT INTO run_outcome_counts (task_id, state, finished, timed, duration_ms_sum, "
    + ", ".join(_BUCKETS) + ") "
    f"SELECT r.task_id, r.status, 1, {_TIMED}, {_DURATION}, "
    + ", ".join(f"CASE WHEN {_TIMED} = 1 AND {_DURATION} <= {b * 1000} THEN 1 ELSE 0 END" for b in DURATION_BUCKETS_S)
    + " FROM runs r WHERE r.id = :run_id "
    "ON CONFLICT (task_id, state) DO UPDATE SET finished = run_outcome_counts.finished + excluded.finished, "
    "timed = run_outcome_counts.timed + excluded.timed, "
    "duration_ms_sum = run_outcome_counts.duration_ms_sum + excluded.duration_ms_sum, "
    + ", ".join(f"{c} = run_outcome_counts.{c} + excluded.{c}" for c in _BUCKETS))
# The run's facts are copied by the same INSERT (no statement more on a run's end): its latest
# attempt (the one that ended, or became lost) found through the (run_id, number) unique index,
# read only for the rows a rule asks for.
_NOTIFY = text(
    "INSERT INTO notification_outbox (id, run_id, rule_id, task_id, state, status, tries, next_try_at_ms, "
    "created_at_ms, exit_code, error_code, attempt_number, run_created_at_ms, started_at_ms, finished_at_ms) "
    "SELECT r.id || ':' || n.id || ':' || CAST(r.version AS VARCHAR(12)), r.id, n.id, r.task_id, r.status, "
    "'pending', 0, :now, :now, a.exit_code, r.error_code, a.number, r.created_at_ms, r.started_at_ms, "
    "r.finished_at_ms "
    "FROM runs r JOIN notification_rules n ON (n.task_id IS NULL OR n.task_id = r.task_id) "
    "LEFT JOIN run_attempts a ON a.run_id = r.id "
    "AND a.number = (SELECT max(b.number) FROM run_attempts b WHERE b.run_id = r.id) "
    "WHERE r.id = :run_id AND n.removed_at_ms IS NULL "
    "AND ((',' || n.on_states || ',') LIKE ('%,' || r.status || ',%') "
    "OR (r.status = 'succeeded' AND (',' || n.on_states || ',') LIKE '%,recovered,%' AND ("
    "SELECT p.status FROM runs p WHERE p.task_id = r.task_id AND p.id <> r.id AND p.finished_at_ms IS NOT NULL "
    "ORDER BY p.finished_at_ms DESC, p.id DESC LIMIT 1) IN ('failed', 'timed_out')))")
_KEYS = select(runs.c.id, runs.c.task_id, runs.c.status).where(runs.c.id.in_(bindparam("ids", expanding=True)))


def record_run_end(conn: Connection, run_id: str, now_ms: int) -> None:
    """Queue the run's notifications now, and its count for the end of the transaction."""
    conn.execute(_NOTIFY, {"run_id": run_id, "now": now_ms})
    _ended(conn).append(run_id)
    last_step(conn, _count_ended_runs)


def _ended(conn: Connection) -> list[str]:
    """This transaction's ended runs (a list left by a transaction that failed is not this one's)."""
    transaction = conn.get_transaction()
    found = conn.info.get(_ENDED_RUNS)
    if found is None or found[0] is not transaction:
        found = conn.info[_ENDED_RUNS] = (transaction, [])
    return found[1]


def _count_ended_runs(conn: Connection) -> None:
    """The counters of every run this transaction ended, in (task, state) order."""
    ended = _ended(conn)
    conn.info.pop(_ENDED_RUNS, None)
    rows = sorted(conn.execute(_KEYS, {"ids": ended}), key=lambda r: (r.task_id, r.status, r.id))
    for row in rows:
        conn.execute(_COUNT, {"run_id": row.id})
