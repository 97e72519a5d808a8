"""Store: cron admission, the Scheduler's step 3 (SEMANTICS.md §8): one bounded page of due schedules,
each decided by the pure `decide_admission` and committed in one transaction with the cursor
compare-and-set, the run (idempotency key `cron:<trigger>:<revision>:<scheduled_for>`), the
overlap policy's effect and the trigger events.

The cursor is `trigger_schedules.next_fire_at_ms`, the oldest occurrence not yet handled; NULL
means "initialise": from the trigger's `updated_at_ms`, which creating or editing a trigger and
re-enabling its task set (so a re-enabled task starts from then, not from its past).
Two admitters (two processes on one SQLite file, two PostgreSQL transactions, two control
replicas) compare-and-set the same `state_version`: exactly one wins an occurrence, the other
changes nothing. On PostgreSQL each decision's transaction first takes its schedule row with
`FOR UPDATE SKIP LOCKED` at the version the page read: a row another replica is deciding right
now is skipped (`lost_race`) instead of waited for, so replicas never block each other; the
run's unique idempotency key makes a duplicate admission return the existing run regardless.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

from sqlalchemy import and_, bindparam, func, or_, select
from sqlalchemy.engine import Connection

from ...domain.cron import (
    Admit,
    CronError,
    Initialise,
    OverlapAction,
    Skip,
    decide_admission,
    decide_overlap,
)
from ...domain.cron_delay import not_before_ms
from ...domain.results import Result
from ...domain.states import RunStatus, TriggerType
from ...errors import BadInput
from ...ids import new_id
from ..engine import Store
from ..intent.runs import Runs
from ..intent.triggers import DUE_COLUMNS, DUE_FROM, DUE_WHERE, DueSchedule
from ..plans import load_run, sql_states
from ..schema import runs, task_revisions, tasks, trigger_events, trigger_schedules

MAX_PAGE = 256
ACTOR = "scheduler"
INVALID_RETRY_MS = 3_600_000

log = logging.getLogger("qlactors.cron")

_R = RunStatus
# Runs that hold or wait for one of the task's `max_concurrent` places; the running ones.
_HOLDING = sql_states(_R.QUEUED, _R.DISPATCHING, _R.RUNNING)
_RUNNING = sql_states(_R.DISPATCHING, _R.RUNNING)

# Live triggers of enabled, live tasks (the join and filter are the trigger repository's).
_ADMITTING = and_(DUE_WHERE, tasks.c.enabled.is_(True))
_DUE = (select(*DUE_COLUMNS).select_from(DUE_FROM)
        .where(and_(_ADMITTING, or_(trigger_schedules.c.next_fire_at_ms.is_(None),
                                    trigger_schedules.c.next_fire_at_ms <= bindparam("now"))))
        .order_by(trigger_schedules.c.next_fire_at_ms.asc().nulls_first(), trigger_schedules.c.trigger_id)
        .limit(bindparam("limit")))
# The earliest cursor, -1 when one is not initialised yet (it is due at once), NULL without any.
_NEXT_FIRE = select(func.min(func.coalesce(trigger_schedules.c.next_fire_at_ms, -1))).select_from(
    DUE_FROM).where(_ADMITTING)
_CURSOR_CAS = trigger_schedules.update().where(and_(
    trigger_schedules.c.trigger_id == bindparam("w_trigger_id"),
    trigger_schedules.c.trigger_revision == bindparam("w_revision"),
    trigger_schedules.c.state_version == bindparam("w_version")))
# The page's row, taken for this decision; another replica's decision in flight is skipped.
_CLAIM = (select(trigger_schedules.c.trigger_id).where(and_(
    trigger_schedules.c.trigger_id == bindparam("trigger_id"),
    trigger_schedules.c.trigger_revision == bindparam("revision"),
    trigger_schedules.c.state_version == bindparam("version")))
    .with_for_update(skip_locked=True))
_TASK_HEAD = select(tasks).where(tasks.c.id == bindparam("task_id"))
_LIMITS = select(task_revisions.c.max_concurrent, task_revisions.c.max_queued,
                 task_revisions.c.random_delay_ms).where(and_(
    task_revisions.c.task_id == bindparam("task_id"), task_revisions.c.revision == bindparam("revision")))
_HOLDING_COUNT = select(func.count()).select_from(runs).where(and_(
    runs.c.task_id == bindparam("task_id"), runs.c.status.in_(_HOLDING)))
# Cron runs waiting `queued`, the count `max_queued` bounds: manual runs and retries never count.
_QUEUED_CRON_COUNT = select(func.count()).select_from(runs).where(and_(
    runs.c.task_id == bindparam("task_id"), runs.c.status == _R.QUEUED.value,
    runs.c.trigger_type == TriggerType.CRON.value))
_OLDEST_RUNNING = (select(runs.c.id).where(and_(
    runs.c.task_id == bindparam("task_id"), runs.c.status.in_(_RUNNING), runs.c.cancel_reason.is_(None)))
    .order_by(runs.c.created_at_ms, runs.c.id).limit(1))
_EVENT_INSERT = trigger_events.insert()
_NEXT_NOT_BEFORE = select(func.min(runs.c.not_before_ms)).where(and_(
    runs.c.status == _R.QUEUED.value, runs.c.cancel_reason.is_(None), runs.c.not_before_ms > bindparam("now")))


@dataclass(frozen=True, slots=True)
class Fired:
    """What one decision for one schedule committed (`lost_race`: another admitter was first)."""

    trigger_id: str
    outcome: str  # initialised | admitted | skipped | missed_only | lost_race | invalid
    run_id: str | None = None
    scheduled_for_ms: int | None = None
    missed: int = 0
    cancelled_run_id: str | None = None
    next_fire_at_ms: int | None = None


class CronAdmission:
    """The due page and the one-transaction admission of a decision."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.runs = Runs(store)

    def observed_now_ms(self) -> int:
        """The cycle's one observed time (edge: system clock; PostgreSQL: database time)."""
        with self.store.read() as conn:
            return self.store.now_ms(conn)

    def due(self, now_ms: int, limit: int) -> list[DueSchedule]:
        """Schedules due at `now_ms` or not yet initialised, oldest cursor first (NULL first)."""
        if type(limit) is not int or not 1 <= limit <= MAX_PAGE:
            raise BadInput(f"a cron page holds 1 to {MAX_PAGE} schedules")
        with self.store.read() as conn:
            return [DueSchedule.from_row(r) for r in conn.execute(_DUE, {"now": now_ms, "limit": limit})]

    def next_fire_ms(self) -> int | None:
        """When the cadence must wake for cron: the earliest cursor, or now if one is uninitialised."""
        with self.store.read() as conn:
            earliest = conn.execute(_NEXT_FIRE).scalar_one()
            return self.store.now_ms(conn) if earliest == -1 else earliest

    def next_not_before_ms(self) -> int | None:
        """When the cadence must wake for a delayed run: the earliest future not-before time of a
        queued run (one already reached is the offer's business, not a wake-up's)."""
        with self.store.read() as conn:
            return conn.execute(_NEXT_NOT_BEFORE, {"now": self.store.now_ms(conn)}).scalar_one()

    def fire(self, due: DueSchedule, now_ms: int, *, tick_ms: int = 0) -> Fired:
        """Decide and commit one schedule at the cycle's `now_ms`; an initialised cursor that is
        already due (a fire exactly at its start) is decided again at once, in a second commit."""
        try:
            spec = due.spec()
        except CronError as err:
            # Rows are validated when written, so this is a zone database removed since, or a row
            # edited by hand. Logged, and looked at again in an hour, so that it neither blocks
            # the page for valid schedules nor stops silently.
            log.error("event=trigger_invalid trigger=%s task=%s error=%s", due.trigger_id, due.task_name, err)
            retry_at = now_ms + INVALID_RETRY_MS
            with self.store.write() as conn:
                self._move_cursor(conn, due, retry_at, None, now_ms)
            return Fired(due.trigger_id, "invalid", next_fire_at_ms=retry_at)
        decision = decide_admission(spec, due.next_fire_at_ms, now_ms,
                                    initialise_from_ms=due.trigger_updated_at_ms, tick_ms=tick_ms)
        if isinstance(decision, Initialise):
            with self.store.write() as conn:
                if not self._move_cursor(conn, due, decision.cursor_ms, None, now_ms):
                    return Fired(due.trigger_id, "lost_race")
            if decision.cursor_ms > now_ms:
                return Fired(due.trigger_id, "initialised", next_fire_at_ms=decision.cursor_ms)
            due = _with_cursor(due, decision.cursor_ms)
            decision = decide_admission(spec, decision.cursor_ms, now_ms, tick_ms=tick_ms)
        if isinstance(decision, Admit):
            return self._admit(due, decision, now_ms)
        if isinstance(decision, Skip):
            with self.store.write() as conn:
                if not self._move_cursor(conn, due, decision.new_cursor_ms, None, now_ms):
                    return Fired(due.trigger_id, "lost_race")
                self._event(conn, due, "missed", decision.missed_first_ms, decision.missed_count, None, now_ms)
            return Fired(due.trigger_id, "missed_only", missed=decision.missed_count,
                         next_fire_at_ms=decision.new_cursor_ms)
        return Fired(due.trigger_id, "initialised", next_fire_at_ms=decision.next_due_ms)  # Wait

    def _admit(self, due: DueSchedule, decision: Admit, now_ms: int) -> Fired:
        with self.store.write() as conn:
            if not self._move_cursor(conn, due, decision.new_cursor_ms, decision.scheduled_for_ms, now_ms):
                return Fired(due.trigger_id, "lost_race")
            if decision.missed_count:
                self._event(conn, due, "missed", decision.missed_first_ms, decision.missed_count, None, now_ms)
            head = conn.execute(_TASK_HEAD, {"task_id": due.task_id}).first()
            limits = conn.execute(_LIMITS, {"task_id": due.task_id, "revision": head.current_revision}).one()
            holding = conn.execute(_HOLDING_COUNT, {"task_id": due.task_id}).scalar_one()
            oldest = conn.execute(_OLDEST_RUNNING, {"task_id": due.task_id}).scalar()
            queued = conn.execute(_QUEUED_CRON_COUNT, {"task_id": due.task_id}).scalar_one()
            overlap = decide_overlap(due.overlap, limits.max_concurrent, holding, oldest,
                                     queued_runs=queued, max_queued=limits.max_queued)
            if overlap.action is OverlapAction.SKIP:
                self._event(conn, due, "skipped", decision.scheduled_for_ms, 1, None, now_ms)
                return Fired(due.trigger_id, "skipped", scheduled_for_ms=decision.scheduled_for_ms,
                             missed=decision.missed_count, next_fire_at_ms=decision.new_cursor_ms)
            # The random delay is the occurrence's, not part of the idempotency key: every
            # admitter of this occurrence computes the same not-before time.
            not_before = not_before_ms(due.trigger_id, decision.scheduled_for_ms, limits.random_delay_ms)
            admission = self.runs.admit_in(conn, head, head.current_revision, trigger_type=TriggerType.CRON,
                                           idempotency_key=decision.idempotency_key,
                                           scheduled_for_ms=decision.scheduled_for_ms,
                                           trigger_id=due.trigger_id, actor_type=ACTOR,
                                           not_before_ms=not_before)
            cancelled = None
            if overlap.action is OverlapAction.ADMIT_AND_CANCEL and admission.created:
                row = load_run(conn, overlap.cancel_run_id)
                if self.runs.cancel_in(conn, row, overlap.cancel_reason, actor_type=ACTOR) in (
                        Result.CANCELLED, Result.REQUESTED):
                    cancelled = overlap.cancel_run_id
            return Fired(due.trigger_id, "admitted", run_id=admission.run.id,
                         scheduled_for_ms=decision.scheduled_for_ms, missed=decision.missed_count,
                         cancelled_run_id=cancelled, next_fire_at_ms=decision.new_cursor_ms)

    def _move_cursor(self, conn: Connection, due: DueSchedule, cursor_ms: int, scheduled_ms: int | None,
                     now_ms: int) -> bool:
        """Compare-and-set the cursor on (trigger, revision, state_version); False: someone else moved
        it, or is deciding it right now (its row is locked: skipped, never waited for)."""
        claim = {"trigger_id": due.trigger_id, "revision": due.trigger_revision, "version": due.state_version}
        if conn.execute(_CLAIM, claim).first() is None:
            return False
        values = dict(next_fire_at_ms=cursor_ms, state_version=due.state_version + 1, updated_at_ms=now_ms,
                      w_trigger_id=due.trigger_id, w_revision=due.trigger_revision, w_version=due.state_version)
        if scheduled_ms is not None:
            values["last_scheduled_at_ms"] = scheduled_ms
        return conn.execute(_CURSOR_CAS, values).rowcount == 1

    def _event(self, conn: Connection, due: DueSchedule, kind: str, scheduled_ms: int, occurrences: int,
               run_id: str | None, now_ms: int) -> None:
        conn.execute(_EVENT_INSERT, dict(
            id=new_id(), trigger_id=due.trigger_id, trigger_revision=due.trigger_revision, type=kind,
            scheduled_for_ms=scheduled_ms, occurrences=occurrences, run_id=run_id, created_at_ms=now_ms))


def _with_cursor(due: DueSchedule, cursor_ms: int) -> DueSchedule:
    """The row as it is after this cycle's own Initialise commit (its version moved by one)."""
    return dataclasses.replace(due, next_fire_at_ms=cursor_ms, state_version=due.state_version + 1)
