"""Store: applying a domain Plan inside a transaction: compare-and-set on run and attempt, events appended."""

from __future__ import annotations

import contextlib
import functools
import json
from enum import Enum
from typing import Any, Iterator, Mapping

from sqlalchemy import and_, bindparam, literal_column, select, text
from sqlalchemy.engine import Connection

from ..domain.results import Outcome, Result
from ..domain.states import AttemptStatus, CancelReason, LeaseReleaseReason, LeaseStatus, RunStatus
from ..domain.transitions import AttemptSnapshot, Plan, RunSnapshot
from ..errors import Conflict
from ..ids import new_id
from .run_endings import record_run_end
from .schema import run_attempts, run_dispatch_leases, run_events, runs, task_revisions

MAX_EVENT_PAYLOAD_BYTES = 16 * 1024
SYSTEM = "system"  # the actor of an event the runtime records on its own (`PlannedEvent.by_system`)

# The hot statements are built once, with bound parameters: building a Core statement and its
# cache key costs several times what executing it does (see docs/performance.md). Parameters of
# a guard are named `w_*`, since an UPDATE's SET columns take the plain column names.
_RUN = select(runs).where(runs.c.id == bindparam("run_id"))
_RUN_LOCKED = _RUN.with_for_update()
_ATTEMPT = select(run_attempts).where(run_attempts.c.id == bindparam("attempt_id"))
_ATTEMPTS = select(run_attempts).where(run_attempts.c.id.in_(bindparam("ids", expanding=True)))
_REVISION = select(task_revisions).where(and_(task_revisions.c.task_id == bindparam("task_id"),
                                              task_revisions.c.revision == bindparam("revision")))
_RUN_CAS = runs.update().where(and_(runs.c.id == bindparam("w_id"), runs.c.version == bindparam("w_version"),
                                    runs.c.status == bindparam("w_status")))
_ATTEMPT_CAS = run_attempts.update().where(and_(run_attempts.c.id == bindparam("w_id"),
                                                run_attempts.c.status == bindparam("w_status")))
_ATTEMPT_CAS_SEQ = _ATTEMPT_CAS.where(run_attempts.c.callback_sequence == bindparam("w_sequence"))
_EVENTS_INSERT = run_events.insert()
_KEPT_EVENTS = "qlactors_kept_events"
# Ends the attempt's one live lease (a partial unique index keeps it one) and says which it was.
_LEASE_END = (run_dispatch_leases.update()
              .where(and_(run_dispatch_leases.c.attempt_id == bindparam("w_attempt_id"),
                          run_dispatch_leases.c.status == LeaseStatus.LEASED.value))
              .values(version=run_dispatch_leases.c.version + 1)
              .returning(run_dispatch_leases.c.version, run_dispatch_leases.c.lease_generation))
_LEASE_CAS = run_dispatch_leases.update().where(and_(
    run_dispatch_leases.c.attempt_id == bindparam("w_attempt_id"),
    run_dispatch_leases.c.lease_generation == bindparam("w_generation"),
    run_dispatch_leases.c.status == LeaseStatus.LEASED.value,
    run_dispatch_leases.c.version == bindparam("w_version")))
_LEASE_PROJECTION = run_attempts.update().where(and_(
    run_attempts.c.id == bindparam("w_attempt_id"),
    run_attempts.c.lease_generation == bindparam("w_generation")))


def sql_states(*states: Enum) -> list:
    """Constant states for `in_()`, written into the SQL: a plain list is an "expanding" parameter,
    re-rendered on every execution of a statement that is otherwise built once."""
    return [literal_column(repr(s.value)) for s in states]


def load_run(conn: Connection, run_id: str, *, lock: bool = True):
    """The run row (locked for update on PostgreSQL when `lock`) or None."""
    return conn.execute(_RUN_LOCKED if lock else _RUN, {"run_id": run_id}).first()


def load_attempt(conn: Connection, attempt_id: str):
    """The attempt row, or None."""
    return conn.execute(_ATTEMPT, {"attempt_id": attempt_id}).first()


def load_attempts(conn: Connection, attempt_ids: list[str]) -> dict[str, Any]:
    """The attempt rows of `attempt_ids` that exist, by id (one statement)."""
    if not attempt_ids:
        return {}
    return {row.id: row for row in conn.execute(_ATTEMPTS, {"ids": attempt_ids})}


def load_open_pair(conn: Connection, run_id: str, attempt_id: str) -> tuple[Any, Any, Outcome | None]:
    """The run (locked) and its attempt, and the Outcome that ends the operation before it acts:
    `refused` for an unknown run or an attempt of another run, `already_terminal` when either
    has ended; None when both are open."""
    run = load_run(conn, run_id)
    if run is None:
        return None, None, Outcome(Result.REFUSED, "unknown_run")
    attempt = load_attempt(conn, attempt_id)
    if attempt is None or attempt.run_id != run.id:
        return run, attempt, Outcome(Result.REFUSED, "wrong_attempt", run.status)
    if RunStatus(run.status).terminal or AttemptStatus(attempt.status).terminal:
        return run, attempt, Outcome(Result.ALREADY_TERMINAL, f"attempt_{attempt.status}", run.status)
    return run, attempt, None


def current_attempt(conn: Connection, run_id: str):
    """The run's newest attempt row (the one a transition acts on), or None."""
    query = (select(run_attempts).where(run_attempts.c.run_id == run_id)
             .order_by(run_attempts.c.number.desc()).limit(1))
    return conn.execute(query).first()


def run_snapshot(row) -> RunSnapshot:
    return RunSnapshot(id=row.id, status=RunStatus(row.status), version=row.version,
                       event_sequence=row.event_sequence,
                       cancel_reason=CancelReason(row.cancel_reason) if row.cancel_reason else None)


def attempt_snapshot(row) -> AttemptSnapshot | None:
    if row is None:
        return None
    return AttemptSnapshot(id=row.id, number=row.number, status=AttemptStatus(row.status),
                           callback_sequence=row.callback_sequence)


def encode_payload(payload: Mapping[str, Any]) -> str:
    text = json.dumps(dict(payload), sort_keys=True, separators=(",", ":"))
    if len(text.encode()) > MAX_EVENT_PAYLOAD_BYTES:
        raise ValueError(f"event payload over {MAX_EVENT_PAYLOAD_BYTES} bytes")
    return text


def append_events(conn: Connection, plan: Plan, now_ms: int, actor_type: str, *,
                  actor_name: str | None = None) -> None:
    """The plan's events, by `actor_type`; `actor_name` is the person behind them (an API token's
    name, the CLI's user), None for what the runtime does on its own. An event `by_system` (the
    attempt a new run claims) is the runtime's own step: `system`, nobody's name."""
    if not plan.events:
        return
    rows = [{"id": new_id(), "run_id": plan.run_id, "sequence": e.sequence, "type": e.type,
             "actor_type": SYSTEM if e.by_system else actor_type,
             "actor_name": None if e.by_system else actor_name, "attempt_id": e.attempt_id,
             "payload_json": encode_payload(e.payload), "created_at_ms": now_ms}
            for e in plan.events]
    kept = conn.info.get(_KEPT_EVENTS)
    if kept is not None and kept[0] is conn.get_transaction():
        kept[1].extend(rows)
    else:
        conn.execute(_EVENTS_INSERT, rows)


@contextlib.contextmanager
def events_together(conn: Connection) -> Iterator[None]:
    """Within: the events of every plan applied are kept, and written by one multi-row INSERT
    when the block ends without an error (a batch of reports, `report_batch.py`). Nothing in
    such a block reads the events it appends.

    The info dict is held from the start: after a connection is lost mid-block, `conn.info`
    would raise `PendingRollbackError` and hide the error the store retries."""
    kept: list[dict] = []
    info = conn.info
    info[_KEPT_EVENTS] = (conn.get_transaction(), kept)
    try:
        yield
        if kept:
            conn.execute(_events_insert_of(len(kept)),
                         {f"{key}_{i}": value for i, row in enumerate(kept) for key, value in row.items()})
    finally:
        info.pop(_KEPT_EVENTS, None)


# The keys of every row `append_events` builds, in the multi-row INSERT's column order.
_EVENT_COLUMNS = ("id", "run_id", "sequence", "type", "actor_type", "actor_name", "attempt_id", "payload_json",
                  "created_at_ms")


@functools.lru_cache(maxsize=64)
def _events_insert_of(count: int):
    """One multi-row INSERT of `count` events, as text built once per count: SQLAlchemy caches
    no multi-VALUES insert (each one built with `.values(rows)` is compiled again, ~0.4 ms), and
    a text statement is cached by its string."""
    rows = ", ".join("(" + ", ".join(f":{key}_{i}" for key in _EVENT_COLUMNS) + ")" for i in range(count))
    return text(f"INSERT INTO {run_events.name} ({', '.join(_EVENT_COLUMNS)}) VALUES {rows}")


def apply_plan(
    conn: Connection,
    plan: Plan,
    now_ms: int,
    *,
    actor_type: str,
    actor_name: str | None = None,
    expected_callback_sequence: int | None = None,
    run_values: Mapping[str, Any] | None = None,
    attempt_values: Mapping[str, Any] | None = None,
) -> None:
    """Write a plan for an existing run: guarded updates, then its events. Zero rows -> Conflict.

    The run update is guarded by the expected version and status; the attempt update by its
    expected status and callback sequence. Nothing is retried here: a conflict means someone
    else changed the state first, and the caller decides what that means.
    """
    if plan.run_from is None:
        raise ValueError("apply_plan is for existing runs; admission inserts instead")
    values: dict[str, Any] = {"status": plan.run_to.value, "version": plan.version,
                              "event_sequence": plan.event_sequence, "updated_at_ms": now_ms}
    if plan.cancel_reason is not None:
        values.update(cancel_reason=plan.cancel_reason.value, cancel_requested_at_ms=now_ms)
    if plan.error_code is not None and plan.changes_run:
        values["error_code"] = plan.error_code
    if plan.run_to.terminal:
        values["finished_at_ms"] = now_ms
    values.update(run_values or {})
    values.update(w_id=plan.run_id, w_version=plan.expected_version, w_status=plan.run_from.value)
    if conn.execute(_RUN_CAS, values).rowcount != 1:
        raise Conflict(f"run {plan.run_id} changed meanwhile (expected version {plan.expected_version})")
    if plan.attempt_id is not None and plan.attempt_from is not None and (plan.changes_attempt or attempt_values):
        a_values: dict[str, Any] = {"status": plan.attempt_to.value, "updated_at_ms": now_ms}
        if plan.attempt_to.terminal and plan.changes_attempt:
            a_values["finished_at_ms"] = now_ms
            if plan.error_code is not None:
                a_values["error_code"] = plan.error_code
        a_values.update(attempt_values or {})
        a_values.update(w_id=plan.attempt_id, w_status=plan.attempt_from.value)
        statement = _ATTEMPT_CAS
        if expected_callback_sequence is not None:
            statement = _ATTEMPT_CAS_SEQ
            a_values["w_sequence"] = expected_callback_sequence
        if conn.execute(statement, a_values).rowcount != 1:
            raise Conflict(f"attempt {plan.attempt_id} changed meanwhile (expected {plan.attempt_from.value})")
    if plan.run_to.terminal or plan.run_to is RunStatus.LOST:
        # Its counters and notifications, in this transaction; after the attempt's update, whose
        # exit code and error the outbox rows copy.
        record_run_end(conn, plan.run_id, now_ms)
    append_events(conn, plan, now_ms, actor_type, actor_name=actor_name)


def pinned_revision(conn: Connection, run_row):
    """The task revision a run pinned at admission: its command, timeout, stop grace and limits."""
    return conn.execute(_REVISION, {"task_id": run_row.task_id, "revision": run_row.task_revision}).one()


def end_lease(
    conn: Connection,
    attempt_id: str,
    now_ms: int,
    status: LeaseStatus,
    reason: LeaseReleaseReason | None = None,
) -> int | None:
    """End the attempt's live (`leased`) lease: `released` with a reason, or `completed`; version + 1.

    The attempt's read-only lease projection follows. Returns the lease's new version, or None when
    the attempt holds no live lease: no lease authority, no invented release (SEMANTICS.md §10).
    """
    ended = conn.execute(_LEASE_END, dict(_lease_end(status, reason), updated_at_ms=now_ms,
                                          w_attempt_id=attempt_id)).first()
    if ended is None:
        return None
    conn.execute(_LEASE_PROJECTION, dict(lease_version=ended.version, w_attempt_id=attempt_id,
                                         w_generation=ended.lease_generation))
    return ended.version


def end_held_lease(conn: Connection, lease, now_ms: int, status: LeaseStatus,
                   reason: LeaseReleaseReason | None = None) -> int:
    """`end_lease` for a live lease row the transaction holds locked (`report_locks.hold`): one
    compare-and-set; the new version is returned and the caller's own attempt update writes the
    projection (`lease_version`, when the attempt projects this lease generation)."""
    version = lease.version + 1
    changed = conn.execute(_LEASE_CAS, dict(
        _lease_end(status, reason), version=version, updated_at_ms=now_ms, w_attempt_id=lease.attempt_id,
        w_generation=lease.lease_generation, w_version=lease.version)).rowcount
    if changed != 1:
        raise Conflict(f"lease {lease.lease_generation} of attempt {lease.attempt_id} changed meanwhile")
    return version


def _lease_end(status: LeaseStatus, reason: LeaseReleaseReason | None) -> dict[str, Any]:
    status = LeaseStatus(status)
    if status is LeaseStatus.LEASED or (status is LeaseStatus.RELEASED) != (reason is not None):
        raise ValueError("a lease ends released (with a reason) or completed (without one)")
    return {"status": status.value, "release_reason": LeaseReleaseReason(reason).value if reason else None}
