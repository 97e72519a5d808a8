"""Store: the trigger repository: a task's one live cron trigger, its schedule cursor, and its recent events.

Every function works inside the caller's transaction (`conn`), so that `Tasks.add/update` write a
task and its trigger in one transaction. The caller holds the task head's lock (or has just
inserted the head): that lock is what keeps "one live trigger per task" true, since the schema has
no unique index for it. Lock order is task head → trigger → schedule.

Rows and their meaning (SEMANTICS.md §8):

- `triggers`: one row per trigger, edited in place. Every change of a setting bumps `revision`
  (the idempotency key of a cron run names the revision, so an edited schedule never collides
  with the old one). `updated_at_ms` is the time the schedule counts from while its cursor is
  NULL: creation, the last new revision, or the last re-enable of the task. Removal sets
  `deleted_at_ms`; the row stays, because runs and trigger events refer to it.
- `trigger_schedules`: one row per live trigger. `next_fire_at_ms` NULL means "not initialised":
  the scheduler's admission step computes it. Every reset here bumps `state_version`, so an
  admission that read the old cursor fails its compare-and-set. A removed trigger's schedule row
  is deleted, so a due-page query never sees it.
- `trigger_events`: written by admission; read here, newest first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy import and_, bindparam, select
from sqlalchemy.engine import Connection

from ...domain.cron import (
    DEFAULT_GRACE_MS,
    CronError,
    Misfire,
    Overlap,
    TriggerSpec,
    check_grace_ms,
    check_misfire,
    check_overlap,
    first_fire_at_or_after_ms,
    parse_cron,
)
from ...errors import Conflict
from ...ids import new_id
from ...scheduling.zones import resolve_zone
from ..schema import tasks, trigger_events, trigger_schedules, triggers
from ..views import TriggerEventView, TriggerView

RECENT_EVENTS = 10  # trigger events shown by `task show`
MAX_RECENT_EVENTS = 100

_LIVE = triggers.c.deleted_at_ms.is_(None)


# --- settings ----------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class TriggerOptions:
    """Trigger settings as a user gives them. None means "not given": the default for a new
    trigger (misfire fire_once, grace 30 s, overlap queue, the system zone), the stored value
    when editing one."""

    cron: str | None = None
    tz: str | None = None
    misfire: str | None = None
    grace_ms: int | None = None
    overlap: str | None = None


@dataclass(frozen=True, slots=True)
class TriggerSettings:
    """One trigger revision's settings, validated; `cron` normalised, `tz` an explicit IANA name."""

    cron: str
    tz: str
    misfire: Misfire
    grace_ms: int
    overlap: Overlap


def settle(options: TriggerOptions, current: TriggerSettings | None) -> TriggerSettings:
    """The settings `options` ask for, over `current` (the live trigger's, None when there is none).

    Raises CronError (a BadInput: exit 2) before anything is written. A zone not given keeps the
    stored one, or for a new trigger is the system zone, resolved now and stored by name: a later
    change of the host's zone never moves the schedule silently.
    """
    if current is None and options.cron is None:
        raise CronError("cron", "--tz, --misfire, --grace and --overlap refine a schedule and the "
                                "task has none: give --cron EXPR too")
    cron = current.cron if options.cron is None else parse_cron(options.cron).text
    if options.tz is not None:
        tz = resolve_zone(options.tz)
    else:
        tz = current.tz if current is not None else resolve_zone(None)
    misfire = check_misfire(options.misfire) if options.misfire is not None else (
        current.misfire if current is not None else Misfire.FIRE_ONCE)
    grace_ms = check_grace_ms(options.grace_ms) if options.grace_ms is not None else (
        current.grace_ms if current is not None else DEFAULT_GRACE_MS)
    overlap = check_overlap(options.overlap) if options.overlap is not None else (
        current.overlap if current is not None else Overlap.QUEUE)
    return TriggerSettings(cron, tz, misfire, grace_ms, overlap)


def _settings_of(row: Any) -> TriggerSettings:
    return TriggerSettings(row.cron, row.tz, Misfire(row.misfire), row.grace_ms, Overlap(row.overlap))


def _setting_values(settings: TriggerSettings) -> dict[str, Any]:
    return {"cron": settings.cron, "tz": settings.tz, "misfire": settings.misfire.value,
            "grace_ms": settings.grace_ms, "overlap": settings.overlap.value}


# --- writes (inside the caller's transaction) ---------------------------------------------------

@dataclass(frozen=True, slots=True)
class TriggerWrite:
    """What `set_trigger` did: `created` (revision 1), `revised` (a new revision), or `unchanged`."""

    trigger_id: str
    revision: int
    outcome: Literal["created", "revised", "unchanged"]


_LIVE_OF_TASK = select(triggers).where(and_(triggers.c.task_id == bindparam("task_id"), _LIVE))


def _live_row(conn: Connection, task_id: str) -> Any:
    return conn.execute(_LIVE_OF_TASK, {"task_id": task_id}).first()


def current_settings(conn: Connection, task_id: str) -> TriggerSettings | None:
    """The settings of the task's live trigger, or None when it has no schedule."""
    row = _live_row(conn, task_id)
    return None if row is None else _settings_of(row)


def set_trigger(conn: Connection, task_id: str, settings: TriggerSettings, now_ms: int) -> TriggerWrite:
    """Give the task this schedule: create its trigger (revision 1, cursor not initialised), or,
    when any setting differs, bump the revision and reset the cursor. Same settings: no write."""
    row = _live_row(conn, task_id)
    if row is None:
        trigger_id = new_id()
        conn.execute(triggers.insert().values(
            id=trigger_id, task_id=task_id, revision=1, created_at_ms=now_ms, updated_at_ms=now_ms,
            **_setting_values(settings)))
        conn.execute(trigger_schedules.insert().values(
            trigger_id=trigger_id, trigger_revision=1, next_fire_at_ms=None, last_scheduled_at_ms=None,
            state_version=0, claim_version=0, updated_at_ms=now_ms))
        return TriggerWrite(trigger_id, 1, "created")
    if _settings_of(row) == settings:
        return TriggerWrite(row.id, row.revision, "unchanged")
    revision = row.revision + 1
    updated = conn.execute(triggers.update().where(and_(
        triggers.c.id == row.id, triggers.c.revision == row.revision, _LIVE)).values(
            revision=revision, updated_at_ms=now_ms, **_setting_values(settings)))
    if updated.rowcount != 1:
        raise Conflict("the task's schedule changed meanwhile; nothing was written, try again")
    _reset_schedule(conn, row.id, revision, now_ms)
    return TriggerWrite(row.id, revision, "revised")


def remove_trigger(conn: Connection, task_id: str, now_ms: int) -> bool:
    """Retire the task's live trigger (`deleted_at_ms`) and delete its schedule row; False when
    there was none. The trigger row stays: its runs and events still name it."""
    row = _live_row(conn, task_id)
    if row is None:
        return False
    conn.execute(trigger_schedules.delete().where(trigger_schedules.c.trigger_id == row.id))
    updated = conn.execute(triggers.update().where(and_(triggers.c.id == row.id, _LIVE)).values(
        deleted_at_ms=now_ms, updated_at_ms=now_ms))
    if updated.rowcount != 1:
        raise Conflict("the task's schedule changed meanwhile; nothing was written, try again")
    return True


def reset_cursor(conn: Connection, task_id: str, now_ms: int) -> bool:
    """Make the task's schedule count from `now_ms` (a re-enabled task: SEMANTICS.md §8, "re-enabling
    initialises the cursor from now"): NULL cursor, same revision. False when it has no trigger.

    Occurrences that fell while the task was disabled are therefore neither run nor reported.
    """
    row = _live_row(conn, task_id)
    if row is None:
        return False
    conn.execute(triggers.update().where(triggers.c.id == row.id).values(updated_at_ms=now_ms))
    _reset_schedule(conn, row.id, row.revision, now_ms)
    return True


def _reset_schedule(conn: Connection, trigger_id: str, revision: int, now_ms: int) -> None:
    """NULL cursor at `revision`, `state_version` + 1. Deliberately unguarded: whatever an
    admission did meanwhile, the reset wins, and the bump makes that admission's CAS fail.
    `last_scheduled_at_ms` is history and stays; the cluster claim columns are admission's."""
    reset = conn.execute(trigger_schedules.update().where(
        trigger_schedules.c.trigger_id == trigger_id).values(
            trigger_revision=revision, next_fire_at_ms=None,
            state_version=trigger_schedules.c.state_version + 1, updated_at_ms=now_ms))
    if reset.rowcount == 0:  # a row lost by hand: recreate it rather than leave the trigger dead
        conn.execute(trigger_schedules.insert().values(
            trigger_id=trigger_id, trigger_revision=revision, next_fire_at_ms=None,
            last_scheduled_at_ms=None, state_version=1, claim_version=0, updated_at_ms=now_ms))


# --- reads -------------------------------------------------------------------------------------

_VIEW_COLUMNS = (
    triggers.c.id, triggers.c.task_id, triggers.c.revision, triggers.c.cron, triggers.c.tz,
    triggers.c.misfire, triggers.c.grace_ms, triggers.c.overlap, triggers.c.updated_at_ms,
    trigger_schedules.c.next_fire_at_ms, trigger_schedules.c.last_scheduled_at_ms,
    tasks.c.enabled.label("task_enabled"),
)
_VIEW_FROM = triggers.join(tasks, tasks.c.id == triggers.c.task_id).outerjoin(
    trigger_schedules, trigger_schedules.c.trigger_id == triggers.c.id)
_VIEW_OF_TASK = select(*_VIEW_COLUMNS).select_from(_VIEW_FROM).where(and_(
    triggers.c.task_id == bindparam("task_id"), _LIVE))
_VIEW_OF_LIVE_TASKS = select(*_VIEW_COLUMNS).select_from(_VIEW_FROM).where(and_(
    _LIVE, tasks.c.deleted_at_ms.is_(None)))
_EVENTS_OF = (select(trigger_events).where(trigger_events.c.trigger_id == bindparam("trigger_id"))
              .order_by(trigger_events.c.created_at_ms.desc(), trigger_events.c.scheduled_for_ms.desc(),
                        trigger_events.c.id.desc())
              .limit(bindparam("limit")))


def _next_fire_for_display(row: Any, now_ms: int) -> int | None:
    if not row.task_enabled:
        return None  # re-enabling resets the cursor: the stored one says nothing about the future
    if row.next_fire_at_ms is not None:
        return row.next_fire_at_ms
    try:
        return first_fire_at_or_after_ms(row.cron, row.tz, now_ms)
    except CronError:  # e.g. the zone database went away since; `show` still works
        return None


def _view(row: Any, now_ms: int, events: tuple[TriggerEventView, ...] | None) -> TriggerView:
    return TriggerView(
        id=row.id, revision=row.revision, cron=row.cron, tz=row.tz, misfire=row.misfire,
        grace_ms=row.grace_ms, overlap=row.overlap, next_fire_at_ms=_next_fire_for_display(row, now_ms),
        last_scheduled_at_ms=row.last_scheduled_at_ms, updated_at_ms=row.updated_at_ms, events=events)


def read_trigger(conn: Connection, task_id: str, now_ms: int, *,
                 events: int = RECENT_EVENTS) -> TriggerView | None:
    """The task's live trigger with its schedule and its `events` most recent trigger events
    (newest first); None when the task has no schedule. `now_ms` only serves the display of a
    cursor that is not initialised yet."""
    row = conn.execute(_VIEW_OF_TASK, {"task_id": task_id}).first()
    if row is None:
        return None
    return _view(row, now_ms, recent_events(conn, row.id, events))


def read_live_triggers(conn: Connection, now_ms: int) -> dict[str, TriggerView]:
    """Every live task's trigger by task id, without events: one query for `task list`."""
    return {row.task_id: _view(row, now_ms, None) for row in conn.execute(_VIEW_OF_LIVE_TASKS)}


def recent_events(conn: Connection, trigger_id: str, limit: int = RECENT_EVENTS) -> tuple[TriggerEventView, ...]:
    """The trigger's newest `limit` events (all revisions), newest first."""
    limit = max(0, min(limit, MAX_RECENT_EVENTS))
    if limit == 0:
        return ()
    return tuple(TriggerEventView(type=r.type, scheduled_for_ms=r.scheduled_for_ms, count=r.occurrences,
                                  trigger_revision=r.trigger_revision, run_id=r.run_id, at_ms=r.created_at_ms)
                 for r in conn.execute(_EVENTS_OF, {"trigger_id": trigger_id, "limit": limit}))


# --- what the scheduler's admission step reads ---------------------------------------------------

@dataclass(frozen=True, slots=True)
class DueSchedule:
    """One live trigger as the admission step sees it: a row of `DUE_COLUMNS` from `DUE_FROM`.

    - `trigger_revision`: `triggers.revision`; the schedule row's `trigger_revision` always equals
      it, both being written in one transaction here.
    - `next_fire_at_ms`: the stored cursor, the oldest occurrence not yet handled; None = not
      initialised (new trigger, new revision, or re-enabled task): initialise it from
      `trigger_updated_at_ms`, the time the schedule counts from.
    - `state_version`: the schedule's compare-and-set fence; every write here bumps it.
    - `task_enabled`: a disabled task admits nothing from its triggers.
    """

    trigger_id: str
    trigger_revision: int
    task_id: str
    task_name: str
    task_enabled: bool
    cron: str
    tz: str
    misfire: Misfire
    grace_ms: int
    overlap: Overlap
    next_fire_at_ms: int | None
    last_scheduled_at_ms: int | None
    state_version: int
    trigger_updated_at_ms: int

    @classmethod
    def from_row(cls, row: Any) -> "DueSchedule":
        """Build from a row selected with `DUE_COLUMNS` (the labels are the field names)."""
        return cls(
            trigger_id=row.trigger_id, trigger_revision=row.trigger_revision, task_id=row.task_id,
            task_name=row.task_name, task_enabled=bool(row.task_enabled), cron=row.cron, tz=row.tz,
            misfire=Misfire(row.misfire), grace_ms=row.grace_ms, overlap=Overlap(row.overlap),
            next_fire_at_ms=row.next_fire_at_ms, last_scheduled_at_ms=row.last_scheduled_at_ms,
            state_version=row.state_version, trigger_updated_at_ms=row.trigger_updated_at_ms)

    def spec(self) -> TriggerSpec:
        """The pure domain's view of this trigger revision, for `decide_admission`."""
        return TriggerSpec(self.trigger_id, self.trigger_revision, self.cron, self.tz,
                           self.misfire, self.grace_ms)


# Columns labelled as DueSchedule's fields, and the join they come from: live triggers of live
# tasks that have a schedule row. Add the due condition, order and page size to taste.
DUE_COLUMNS = (
    triggers.c.id.label("trigger_id"), triggers.c.revision.label("trigger_revision"),
    tasks.c.id.label("task_id"), tasks.c.name.label("task_name"), tasks.c.enabled.label("task_enabled"),
    triggers.c.cron, triggers.c.tz, triggers.c.misfire, triggers.c.grace_ms, triggers.c.overlap,
    trigger_schedules.c.next_fire_at_ms, trigger_schedules.c.last_scheduled_at_ms,
    trigger_schedules.c.state_version, triggers.c.updated_at_ms.label("trigger_updated_at_ms"),
)
DUE_FROM = trigger_schedules.join(triggers, triggers.c.id == trigger_schedules.c.trigger_id).join(
    tasks, tasks.c.id == triggers.c.task_id)
DUE_WHERE = and_(_LIVE, tasks.c.deleted_at_ms.is_(None))
