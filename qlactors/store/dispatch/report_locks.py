"""Store: the locks and rows of one transaction of executor reports — one report or a batch of them — taken
in the global order of SEMANTICS.md §9, with a fixed number of statements whatever the batch size.

The order: the advisory locks `attempt:<id>` of every report (in key order), then `task:<id>`
of the fenced reports' runs (in task-id order), then their session rows (shared, in id order),
then the run rows (for update, in id order), the attempt rows and the quoted lease rows (for
update, in attempt-id order). Database time is read once, by the first lock statement.

A report then decides from `HeldRows` alone. Rows are read once per transaction, so a batch
holds at most one report that changes the rows of an attempt (see `ReportBatch` in
`report_batch.py`); log chunks change none of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import and_, bindparam, func, or_, select, tuple_
from sqlalchemy.engine import Connection

from ...domain.states import LeaseStatus
from ..engine import Store
from ..plans import load_attempts
from ..records import Fence
from ..schema import log_chunks, run_dispatch_leases, runs, task_revisions, worker_sessions

_SESSIONS = (select(worker_sessions).where(worker_sessions.c.session_id.in_(bindparam("ids", expanding=True)))
             .order_by(worker_sessions.c.session_id).with_for_update(read=True))
_RUNS = (select(runs).where(runs.c.id.in_(bindparam("ids", expanding=True)))
         .order_by(runs.c.id).with_for_update())
_L = run_dispatch_leases.c
# The quoted leases of fenced reports and the live leases of completions, in one statement.
_LEASES = (select(run_dispatch_leases)
           .where(or_(tuple_(_L.attempt_id, _L.lease_generation).in_(bindparam("pairs", expanding=True)),
                      and_(_L.attempt_id.in_(bindparam("live", expanding=True)),
                           _L.status == LeaseStatus.LEASED.value)))
           .order_by(_L.attempt_id, _L.lease_generation)
           .with_for_update())
_LOG_ENDS = (select(log_chunks.c.attempt_id, func.max(log_chunks.c.start_offset + log_chunks.c.length))
             .where(log_chunks.c.attempt_id.in_(bindparam("ids", expanding=True)))
             .group_by(log_chunks.c.attempt_id))
_REVISIONS = select(task_revisions).where(
    tuple_(task_revisions.c.task_id, task_revisions.c.revision).in_(bindparam("pairs", expanding=True)))


@dataclass(frozen=True, slots=True)
class LockRequest:
    """What one report needs held: its attempt; its run (all but a log chunk); its fence (a
    fenced report: the task lock, the session row and the quoted lease row too); the run's
    pinned revision (`revision`: an Activate); the attempt's live lease (`live_lease`: a
    completion ends it); where its stored log ends (`log_end`: a log chunk)."""

    attempt_id: str
    run_id: str | None = None
    fence: Fence | None = None
    revision: bool = False
    live_lease: bool = False
    log_end: bool = False


@dataclass(slots=True)
class HeldRows:
    """The rows one transaction locked or read for its reports, by id, and its database time."""

    now: int
    runs: dict[str, Any] = field(default_factory=dict)
    attempts: dict[str, Any] = field(default_factory=dict)
    sessions: dict[str, Any] = field(default_factory=dict)
    leases: dict[tuple[str, int], Any] = field(default_factory=dict)
    live_leases: dict[str, Any] = field(default_factory=dict)  # by attempt id
    revisions: dict[tuple[str, int], Any] = field(default_factory=dict)  # by task id and revision
    log_ends: dict[str, int] = field(default_factory=dict)  # by attempt id; the appends move them


def hold(store: Store, conn: Connection, requests: list[LockRequest]) -> HeldRows:
    """Take every lock `requests` need in the global order and read their rows (see the module doc)."""
    fences = [r.fence for r in requests if r.fence is not None]
    store.advisory_locks_then_tasks(conn, sorted({f"attempt:{r.attempt_id}" for r in requests}),
                                    sorted({f.run_id for f in fences}))
    held = HeldRows(now=store.now_ms(conn))
    if fences:
        held.sessions = _by(conn, _SESSIONS, "session_id", ids=sorted({f.session_id for f in fences}))
    lock_rows(conn, held, run_ids=sorted({r.run_id for r in requests if r.run_id is not None}),
              attempt_ids=sorted({r.attempt_id for r in requests}),
              pairs=sorted({(f.attempt_id, f.lease_generation) for f in fences}),
              live=sorted({r.attempt_id for r in requests if r.live_lease}))
    logs = sorted({r.attempt_id for r in requests if r.log_end})
    if logs:
        held.log_ends = dict.fromkeys(logs, 0) | {a: end for a, end in conn.execute(_LOG_ENDS, {"ids": logs})}
    wanted = sorted({(run.task_id, run.task_revision) for r in requests if r.revision
                     and (run := held.runs.get(r.run_id)) is not None})
    if wanted:
        held.revisions = {(row.task_id, row.revision): row for row in conn.execute(_REVISIONS, {"pairs": wanted})}
    return held


def lock_rows(conn: Connection, held: HeldRows, *, run_ids: list[str], attempt_ids: list[str],
              pairs: list[tuple[str, int]] = (), live: list[str] = ()) -> None:
    """Into `held`: the run rows (for update), the attempt rows, then the lease rows `pairs`
    quote and the live leases of `live` (for update), each in id order, one statement per table
    (the row tier of the global order; a heartbeat takes it right after its session row)."""
    if run_ids:
        held.runs = _by(conn, _RUNS, "id", ids=run_ids)
    held.attempts = load_attempts(conn, attempt_ids)
    if pairs or live:
        for row in conn.execute(_LEASES, {"pairs": list(pairs), "live": list(live)}):
            held.leases[(row.attempt_id, row.lease_generation)] = row
            if row.status == LeaseStatus.LEASED.value:
                held.live_leases[row.attempt_id] = row


def _by(conn: Connection, query, key: str, **params) -> dict[str, Any]:
    return {getattr(row, key): row for row in conn.execute(query, params)}
