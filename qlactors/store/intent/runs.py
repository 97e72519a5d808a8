"""Store: the run repository: admission, manual retry, cancel, and the reads behind `runs` and `show`.

Every method is one short transaction. Writes follow SEMANTICS.md §3: read the run, ask the
pure state machine for a plan, apply it with compare-and-set, append its events.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Sequence

from sqlalchemy import and_, bindparam, func, or_, select
from sqlalchemy.engine import Connection

from ...domain.audit import check_actor_name
from ...domain.results import Outcome, Result
from ...domain.states import (RUN_TERMINAL, CancelReason, LeaseReleaseReason, LeaseStatus, RetrySafety, RunStatus,
                             TriggerType)
from ...domain.transitions import plan_admission, plan_cancel
from ...errors import BadInput, NotFound, Retired
from ...ids import new_id
from ..engine import Store
from ..plans import append_events, apply_plan, attempt_snapshot, current_attempt, end_lease, load_run, run_snapshot
from ..schema import run_attempts, run_events, run_retry_policies, run_tombstones, runs, task_revisions, tasks
from ..views import AttemptView, EventView, RunPage, RunView

MAX_PAGE = 500
DEFAULT_PAGE = 50
_TERMINAL = [s.value for s in RUN_TERMINAL]
# Built once (see store/plans.py): admission runs for every request and every cron fire.
_LIVE_TASK = select(tasks).where(and_(tasks.c.name == bindparam("name"), tasks.c.deleted_at_ms.is_(None)))
_BY_KEY = select(runs).where(runs.c.idempotency_key == bindparam("key"))
_ATTEMPT_INSERT = run_attempts.insert()
_REVISION_POLICY = select(task_revisions.c.retry_on_lost, task_revisions.c.max_attempts,
                          task_revisions.c.safety, task_revisions.c.backoff_base_ms,
                          task_revisions.c.backoff_max_ms).where(and_(
                              task_revisions.c.task_id == bindparam("task_id"),
                              task_revisions.c.revision == bindparam("revision")))
_TASK_NAME = select(tasks.c.name).where(tasks.c.id == bindparam("task_id"))
_TASK_BY_ID = select(tasks).where(tasks.c.id == bindparam("task_id"))
_TOMBSTONE = select(run_tombstones).where(run_tombstones.c.run_id == bindparam("run_id"))
_ATTEMPTS_OF = select(run_attempts).where(run_attempts.c.run_id == bindparam("run_id")).order_by(
    run_attempts.c.number)
_EVENTS_OF = select(run_events).where(run_events.c.run_id == bindparam("run_id")).order_by(run_events.c.sequence)


@dataclass(frozen=True, slots=True)
class Admission:
    run: RunView
    created: bool  # False: the idempotency key named an existing run, which is returned


class Runs:
    def __init__(self, store: Store) -> None:
        self.store = store

    # -- writes ------------------------------------------------------------------------------

    def request(self, task_name: str, **admission: Any) -> Admission:
        """Admit a run of the task's current revision: run `queued`, attempt 1 `claimed`, events.

        `admission`: the keywords of `admit_in` (trigger, idempotency key, scheduled time, the
        `actor_name` of the person asking...).
        With an idempotency key, a second request returns the first run (the unique key is the
        arbiter: `INSERT ... ON CONFLICT DO NOTHING`, then re-read).
        """
        with self.store.write() as conn:
            head = conn.execute(_LIVE_TASK, {"name": task_name}).first()
            if head is None:
                raise NotFound(f"no task named {task_name!r}: see `qlactors task list`")
            return self.admit_in(conn, head, head.current_revision, **admission)

    def admit_in(
        self,
        conn: Connection,
        head,
        revision: int,
        *,
        trigger_type: TriggerType = TriggerType.MANUAL,
        idempotency_key: str | None = None,
        scheduled_for_ms: int | None = None,
        trigger_id: str | None = None,
        retry_of_run_id: str | None = None,
        actor_type: str = "user",
        not_before_ms: int | None = None,
        actor_name: str | None = None,
    ) -> Admission:
        """Admission inside the caller's write transaction, of revision `revision` of task row `head`.

        `actor_name`: the person asking (an API token's name, the CLI's user), written on the
        admission's events; None when the runtime admits on its own (cron)."""
        if idempotency_key is not None and not 1 <= len(idempotency_key) <= 256:
            raise BadInput("an idempotency key is 1 to 256 characters")
        if actor_name is not None:
            check_actor_name(actor_name)
        if idempotency_key is not None:
            existing = self._by_key(conn, idempotency_key)
            if existing is not None:
                return Admission(self._view(conn, existing), created=False)
        now = self.store.now_ms(conn)
        run_id, attempt_id = new_id(), new_id()
        plan = plan_admission(run_id, attempt_id, {"trigger_type": TriggerType(trigger_type).value})
        inserted = self.store.insert_new(conn, runs, dict(
            id=run_id, task_id=head.id, task_revision=revision,
            trigger_type=TriggerType(trigger_type).value, trigger_id=trigger_id,
            status=plan.run_to.value, version=plan.version, event_sequence=plan.event_sequence,
            scheduled_for_ms=scheduled_for_ms, idempotency_key=idempotency_key,
            retry_of_run_id=retry_of_run_id, created_at_ms=now, queued_at_ms=now, updated_at_ms=now,
            not_before_ms=not_before_ms))
        if not inserted:  # a concurrent request with the same key committed first
            return Admission(self._view(conn, self._by_key(conn, idempotency_key)), created=False)
        conn.execute(_ATTEMPT_INSERT, dict(
            id=attempt_id, run_id=run_id, number=1, status=plan.attempt_to.value,
            executor_type="local_process", callback_sequence=0, created_at_ms=now, updated_at_ms=now))
        self._snapshot_policy(conn, head.id, revision, run_id, now)
        append_events(conn, plan, now, actor_type, actor_name=actor_name)
        return Admission(self._view(conn, load_run(conn, run_id, lock=False)), created=True)

    def retry(self, run_id: str, *, actor_type: str = "user", idempotency_key: str | None = None,
              actor_name: str | None = None) -> Admission:
        """Admit a new run of the revision `run_id` pinned, with `retry_of_run_id` = `run_id`.

        Only from a terminal run (a run still in flight has its own lost-run retry), and only
        while its task exists. It is a fresh manual run of that revision: its own retry-policy
        snapshot (of that revision), no trigger, no scheduled time.
        """
        with self.store.write() as conn:
            row = self._require(conn, run_id)
            if not RunStatus(row.status).terminal:
                raise BadInput(f"run {row.id} is {row.status}, not finished: only a finished run can be "
                               "retried; nothing was written. Wait for it to end, or cancel it first")
            head = conn.execute(_TASK_BY_ID, {"task_id": row.task_id}).one()
            if head.deleted_at_ms is not None:
                raise BadInput(f"run {row.id} belongs to task {head.name!r}, which was removed; nothing was "
                               f"written. Add the task again and use `qlactors run {head.name}`")
            return self.admit_in(conn, head, row.task_revision, trigger_type=TriggerType.MANUAL,
                                 retry_of_run_id=row.id, actor_type=actor_type,
                                 idempotency_key=idempotency_key, actor_name=actor_name)

    def cancel(self, run_id: str, reason: CancelReason = CancelReason.USER, *, actor_type: str = "user",
               actor_name: str | None = None) -> Outcome[RunView]:
        """Commit a cancel intent; a run with no live process ends `cancelled` in the same transaction.

        The Outcome is `cancelled`, `requested` (the runtime stops the job), `already_requested`
        or `already_terminal`; its value is the run as it is now. `actor_name`: the person asking,
        written on the cancel's events (None: the runtime's own cancel, e.g. at shutdown)."""
        if actor_name is not None:
            check_actor_name(actor_name)
        with self.store.write() as conn:
            row = self._require(conn, run_id)
            outcome = self.cancel_in(conn, row, reason, actor_type=actor_type, actor_name=actor_name)
            view = self._view(conn, load_run(conn, run_id, lock=False))
            return Outcome(outcome, run_state=view.state, value=view)

    def cancel_in(self, conn: Connection, row, reason: CancelReason, *, actor_type: str,
                  actor_name: str | None = None) -> Result:
        """Cancel inside the caller's transaction; returns what it did (see `cancel`)."""
        snapshot = run_snapshot(row)
        attempt_row = current_attempt(conn, row.id)
        plan = plan_cancel(snapshot, attempt_snapshot(attempt_row), reason)
        if plan is None:
            return Result.ALREADY_TERMINAL if snapshot.status.terminal else Result.ALREADY_REQUESTED
        now = self.store.now_ms(conn)
        apply_plan(conn, plan, now, actor_type=actor_type, actor_name=actor_name,
                   expected_callback_sequence=attempt_row.callback_sequence if attempt_row else None)
        if plan.run_to.terminal and attempt_row is not None:
            # An attempt offered but never activated holds a live lease: it ends with the run, or
            # it would stay `leased` for ever (SEMANTICS.md §7).
            end_lease(conn, attempt_row.id, now, LeaseStatus.RELEASED, LeaseReleaseReason.CANCELLED)
        return Result.CANCELLED if plan.run_to.terminal else Result.REQUESTED

    def active_ids(self, conn: Connection, task_id: str) -> list[str]:
        return list(conn.execute(select(runs.c.id).where(and_(
            runs.c.task_id == task_id, runs.c.status.not_in(_TERMINAL))).order_by(runs.c.created_at_ms)).scalars())

    # -- reads -------------------------------------------------------------------------------

    def get(self, run_id: str) -> RunView:
        with self.store.read() as conn:
            return self._view(conn, self._require(conn, run_id, lock=False), detail=True)

    def list(self, *, task: str | None = None, state: str | None = None, limit: int = DEFAULT_PAGE,
             cursor: str | None = None, created_since_ms: int | None = None,
             created_before_ms: int | None = None) -> RunPage:
        """Runs newest first, one keyset page; `next_cursor` continues after the last one shown
        (given again with the same filters). `created_since_ms`: only runs created at or after
        it; `created_before_ms`: only runs created strictly before it (epoch ms, >= 0)."""
        if type(limit) is not int or not 1 <= limit <= MAX_PAGE:
            raise BadInput(f"--limit must be between 1 and {MAX_PAGE}")
        for option, bound in (("--since", created_since_ms), ("--until", created_before_ms)):
            if bound is not None and (type(bound) is not int or bound < 0):
                raise BadInput(f"{option} must be a whole number of milliseconds since the epoch, 0 or more, "
                               f"not {bound!r}")
        if state is not None and state not in {s.value for s in RunStatus}:
            raise BadInput(f"unknown state {state!r}: one of {', '.join(s.value for s in RunStatus)}")
        query = select(runs, tasks.c.name.label("task_name")).join(tasks, tasks.c.id == runs.c.task_id)
        if task is not None:
            query = query.where(tasks.c.name == task)
        if state is not None:
            query = query.where(runs.c.status == state)
        if created_since_ms is not None:
            query = query.where(runs.c.created_at_ms >= created_since_ms)
        if created_before_ms is not None:
            query = query.where(runs.c.created_at_ms < created_before_ms)
        if cursor is not None:
            at_ms, run_id = _decode_cursor(cursor)
            query = query.where(or_(runs.c.created_at_ms < at_ms,
                                    and_(runs.c.created_at_ms == at_ms, runs.c.id < run_id)))
        query = query.order_by(runs.c.created_at_ms.desc(), runs.c.id.desc()).limit(limit + 1)
        with self.store.read() as conn:
            if task is not None and conn.execute(select(tasks.c.id).where(tasks.c.name == task)).first() is None:
                raise NotFound(f"no task named {task!r}, now or in the past: see `qlactors task list`")
            rows = conn.execute(query).all()
            last = _last_attempts(conn, [row.id for row in rows[:limit]])
            page = [self._view(conn, row, detail=False, last=last.get(row.id)) for row in rows[:limit]]
        more = len(rows) > limit
        next_cursor = f"{page[-1].created_at_ms}.{page[-1].id}" if more else None
        return RunPage(tuple(page), next_cursor)

    def attempt_state(self, attempt_id: str) -> str | None:
        """The state of the run owning `attempt_id`, or None when no such attempt exists."""
        with self.store.read() as conn:
            return conn.execute(select(runs.c.status).join(run_attempts, run_attempts.c.run_id == runs.c.id)
                                .where(run_attempts.c.id == attempt_id)).scalar()

    def attempt_status(self, attempt_id: str) -> str | None:
        """The state of the attempt itself, or None when no such attempt exists (one indexed read:
        what a log stream asks each time it polls)."""
        with self.store.read() as conn:
            return conn.execute(select(run_attempts.c.status).where(run_attempts.c.id == attempt_id)).scalar()

    # -- inside a transaction ----------------------------------------------------------------

    def _require(self, conn: Connection, run_id: str, *, lock: bool = True):
        """The run row; Retired when retention deleted it (its tombstone says when), else NotFound."""
        valid = isinstance(run_id, str) and len(run_id) <= 36
        row = load_run(conn, run_id, lock=lock) if valid else None
        if row is None:
            stone = conn.execute(_TOMBSTONE, {"run_id": run_id}).first() if valid else None
            if stone is not None:
                raise Retired(stone.run_id, stone.retired_at_ms, stone.reason)
            raise NotFound(f"no run with id {run_id!r}: see `qlactors runs`")
        return row

    def _by_key(self, conn: Connection, key: str):
        return conn.execute(_BY_KEY, {"key": key}).first()

    def _snapshot_policy(self, conn: Connection, task_id: str, revision: int, run_id: str, now: int) -> None:
        """Pin the revision's retry policy at admission; no row means never retried automatically.

        A task that declares a safety without `--retry-on-lost` gets a row too (`retry_on_lost`
        false): the run is never retried, but recovery reads its safety from the row, so a dead
        host's idempotent run still ends `lost` after the grace instead of waiting for a retire.
        """
        rev = conn.execute(_REVISION_POLICY, {"task_id": task_id, "revision": revision}).one()
        if not rev.retry_on_lost and rev.safety == RetrySafety.UNKNOWN.value:
            return
        conn.execute(run_retry_policies.insert().values(
            run_id=run_id, max_attempts=rev.max_attempts, retry_on_lost=bool(rev.retry_on_lost), safety=rev.safety,
            backoff_base_ms=rev.backoff_base_ms, backoff_max_ms=rev.backoff_max_ms,
            version=0, created_at_ms=now, updated_at_ms=now))

    def _view(self, conn: Connection, row, *, detail: bool = True, last=None) -> RunView:
        """The run's read model; `detail` reads its attempts and events, else `last` is its newest
        attempt's row (read for a whole page by `_last_attempts`)."""
        name = getattr(row, "task_name", None) or conn.execute(_TASK_NAME, {"task_id": row.task_id}).scalar_one()
        attempts: Sequence = ()
        events: Sequence = ()
        if detail:
            attempts = tuple(_attempt_view(a) for a in conn.execute(_ATTEMPTS_OF, {"run_id": row.id}))
            events = conn.execute(_EVENTS_OF, {"run_id": row.id}).all()
        newest = attempts[-1] if attempts else None if last is None else _attempt_view(last)
        return RunView(
            id=row.id, task=name, task_revision=row.task_revision, state=row.status, version=row.version,
            trigger_type=row.trigger_type, scheduled_for_ms=row.scheduled_for_ms,
            idempotency_key=row.idempotency_key, cancel_reason=row.cancel_reason,
            error_code=row.error_code, retry_of_run_id=row.retry_of_run_id,
            created_at_ms=row.created_at_ms, started_at_ms=row.started_at_ms,
            finished_at_ms=row.finished_at_ms, not_before_ms=row.not_before_ms,
            attempts=attempts, last_attempt=newest,
            events=tuple(EventView(seq=e.sequence, type=e.type, at_ms=e.created_at_ms,
                                   actor_type=e.actor_type, attempt_id=e.attempt_id,
                                   payload=json.loads(e.payload_json), actor_name=e.actor_name)
                         for e in events),
        )


def _last_attempts(conn: Connection, run_ids: list[str]) -> dict[str, Any]:
    """The newest attempt row of each run, in one read (a page of `runs`)."""
    if not run_ids:
        return {}
    newest = (select(run_attempts.c.run_id, func.max(run_attempts.c.number).label("n"))
              .where(run_attempts.c.run_id.in_(run_ids)).group_by(run_attempts.c.run_id).subquery())
    rows = conn.execute(select(run_attempts).join(newest, and_(newest.c.run_id == run_attempts.c.run_id,
                                                               newest.c.n == run_attempts.c.number))).all()
    return {r.run_id: r for r in rows}


def _attempt_view(a) -> AttemptView:
    return AttemptView(
        id=a.id, number=a.number, state=a.status, exit_code=a.exit_code, signal=a.signal,
        error_code=a.error_code, log_dropped_bytes=a.log_dropped_bytes, deadline_at_ms=a.deadline_at_ms,
        created_at_ms=a.created_at_ms, started_at_ms=a.started_at_ms, finished_at_ms=a.finished_at_ms,
        worker_id=a.worker_id, session_generation=a.session_generation, pid=a.pid, boot_id=a.boot_id)


def _decode_cursor(cursor: str) -> tuple[int, str]:
    at, sep, run_id = cursor.partition(".")
    if not sep or not at.isdigit() or not run_id:
        raise BadInput(f"bad page cursor {cursor!r}: use the `next_cursor` a previous page printed")
    return int(at), run_id
