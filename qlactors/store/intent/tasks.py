"""Store: the task repository: a mutable head plus immutable revisions; every edit is a new revision."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any, Callable, Mapping

from sqlalchemy import and_, bindparam, func, select
from sqlalchemy.engine import Connection

from ...domain.audit import changed_fields, check_actor_name
from ...domain.model import TaskSpec, validate_name
from ...domain.retention import TaskRetention
from ...domain.states import RUN_TERMINAL, TaskEventType
from ...errors import AlreadyExists, BadInput, Conflict, NotFound
from ...ids import new_id
from ..engine import Store
from ..plans import encode_payload
from ..schema import runs, task_events, task_revisions, tasks
from ..views import TaskEventView, TaskView, TriggerView, revision_values, spec_from_revision
from . import triggers as trigger_store
from .triggers import TriggerOptions

_LIVE = tasks.c.deleted_at_ms.is_(None)
_TERMINAL = [s.value for s in RUN_TERMINAL]
MAX_HISTORY = 500
_HISTORY = (select(task_events).where(task_events.c.task_id == bindparam("task_id"))
            .order_by(task_events.c.created_at_ms.desc(), task_events.c.id.desc()).limit(bindparam("limit")))


class Tasks:
    """Create, edit, enable, list and remove tasks and their cron schedules; removal keeps history readable.

    A task's schedule (its trigger) is written in the same transaction as the task. It has its own
    revision: editing the schedule does not add a task revision, and editing the task does not
    touch the schedule.

    A task's own retention bounds (`TaskRetention`) live on its head, not in its revisions: a
    revision is what a run pins and executes, while retention is decided when a finished run is
    retired, by the bounds in force then. Changing them is a head change, not a new revision.

    Every change records who made it (`actor_name`: an API token's name, the CLI's user) as one
    `task_events` row in the change's own transaction; a change that changes nothing writes none.
    """

    def __init__(self, store: Store) -> None:
        self.store = store

    def add(self, spec: TaskSpec, *, enabled: bool = True, trigger: TriggerOptions | None = None,
            retention: TaskRetention = TaskRetention(),
            check: Callable[[TaskSpec], None] | None = None, actor_name: str) -> TaskView:
        """A new task at revision 1, with a cron schedule when `trigger` is given and its own
        retention bounds when `retention` has any. `check` may refuse the validated spec (the
        CLI's: every offer of it must fit one wire frame) before anything is written. Recorded
        as `added` by `actor_name`."""
        check_actor_name(actor_name)
        spec = spec.validated()
        if check is not None:
            check(spec)
        settings = None if trigger is None else trigger_store.settle(trigger, None)
        task_id = new_id()
        with self.store.write() as conn:
            now = self.store.now_ms(conn)
            inserted = self.store.insert_new(conn, tasks, dict(
                id=task_id, name=spec.name, current_revision=1, version=1, enabled=enabled,
                created_at_ms=now, updated_at_ms=now, **_retention_values(retention)))
            if not inserted:
                raise AlreadyExists(f"a task named {spec.name!r} already exists: pick another name, "
                                    f"or change it with `qlactors task update {spec.name}`")
            conn.execute(task_revisions.insert().values(
                task_id=task_id, revision=1, created_at_ms=now, **revision_values(spec)))
            if settings is not None:
                trigger_store.set_trigger(conn, task_id, settings, now)
            _record(conn, task_id, TaskEventType.ADDED, 1, actor_name, now)
            return self._detail(conn, self.head(conn, spec.name), now_ms=now)

    def update(self, name: str, *, trigger: TriggerOptions | None = None, remove_trigger: bool = False,
               retention: Mapping[str, int | None] | None = None,
               check: Callable[[TaskSpec], None] | None = None, actor_name: str, **changes: Any) -> TaskView:
        """A new revision with `changes` applied to the current one; runs keep the revision they pinned.

        `trigger` sets the schedule (given fields only; see TriggerOptions), `remove_trigger`
        removes it. `retention` sets the given TaskRetention fields (None: back to the global
        bound) on the head, no new revision. Each part writes only when something differs; all of
        it in one transaction. `check` may refuse a new revision, as for `add`. A change is
        recorded as `updated` by `actor_name`, naming the fields that changed (the TaskSpec's,
        `schedule`, `retention`).
        """
        check_actor_name(actor_name)
        if trigger is not None and remove_trigger:
            raise BadInput("a schedule cannot be set and removed at once: drop --no-cron or the --cron options")
        unknown = set(retention or {}) - set(TaskRetention.__dataclass_fields__)
        if unknown:
            raise BadInput(f"unknown retention field(s) {sorted(unknown)}")
        with self.store.write() as conn:
            head = self.head(conn, name, lock=True)
            current = self._spec(conn, head)
            spec = current.with_changes(**changes)
            if check is not None and spec != current:
                check(spec)
            settings = None  # validated before anything is written
            if trigger is not None:
                settings = trigger_store.settle(trigger, trigger_store.current_settings(conn, head.id))
            kept = _retention_of(head)
            new_retention = replace(kept, **(retention or {}))  # validated before anything is written
            now = self.store.now_ms(conn)
            head_values: dict[str, Any] = {}
            changed = changed_fields(current, spec)
            if spec != current:
                revision = head.current_revision + 1
                conn.execute(task_revisions.insert().values(
                    task_id=head.id, revision=revision, created_at_ms=now, **revision_values(spec)))
                head_values["current_revision"] = revision
            if new_retention != kept:
                head_values.update(_retention_values(new_retention))
                changed.append("retention")
            if head_values:
                self._cas_head(conn, head, updated_at_ms=now, **head_values)
                head = self.head(conn, name)
            if settings is not None:
                if trigger_store.set_trigger(conn, head.id, settings, now).outcome != "unchanged":
                    changed.append("schedule")
            elif remove_trigger:
                if trigger_store.remove_trigger(conn, head.id, now):
                    changed.append("schedule")
            if changed:
                _record(conn, head.id, TaskEventType.UPDATED, head.current_revision, actor_name, now,
                        {"changed": sorted(changed)})
            return self._detail(conn, head, now_ms=now)

    def set_enabled(self, name: str, enabled: bool, *, actor_name: str) -> TaskView:
        """Enable or disable cron admission. Re-enabling (only a real change) makes the schedule
        count from now: occurrences that fell while disabled are neither run nor reported. A real
        change is recorded as `enabled` or `disabled` by `actor_name`."""
        check_actor_name(actor_name)
        with self.store.write() as conn:
            head = self.head(conn, name, lock=True)
            now = self.store.now_ms(conn)
            if bool(head.enabled) != enabled:
                self._cas_head(conn, head, enabled=enabled, updated_at_ms=now)
                if enabled:
                    trigger_store.reset_cursor(conn, head.id, now)
                _record(conn, head.id, TaskEventType.ENABLED if enabled else TaskEventType.DISABLED,
                        head.current_revision, actor_name, now)
            return self._detail(conn, self.head(conn, name), now_ms=now)

    def get(self, name: str) -> TaskView:
        """One task in detail: with its schedule and the schedule's recent trigger events."""
        with self.store.read() as conn:
            return self._detail(conn, self.head(conn, name))

    def history(self, name: str, *, limit: int = 50) -> tuple[TaskEventView, ...]:
        """The live task's changes, newest first, at most `limit` (1 to MAX_HISTORY)."""
        if type(limit) is not int or not 1 <= limit <= MAX_HISTORY:
            raise BadInput(f"a history limit is between 1 and {MAX_HISTORY}, not {limit!r}")
        with self.store.read() as conn:
            head = self.head(conn, name)
            return tuple(TaskEventView(type=r.type, revision=r.revision, actor_name=r.actor_name,
                                       at_ms=r.created_at_ms,
                                       changed=tuple(json.loads(r.payload_json).get("changed", ())))
                         for r in conn.execute(_HISTORY, {"task_id": head.id, "limit": limit}))

    def list(self) -> list[TaskView]:
        """Every live task by name, with its schedule but without trigger events (kept cheap)."""
        with self.store.read() as conn:
            heads = conn.execute(select(tasks).where(_LIVE).order_by(tasks.c.name)).all()
            if not heads:
                return []
            schedules = trigger_store.read_live_triggers(conn, self.store.now_ms(conn))
            return [self._view(conn, head, schedules.get(head.id)) for head in heads]

    def mark_removed(self, conn: Connection, name: str, *, actor_name: str) -> str:
        """Inside a caller's transaction: retire the head (its name becomes free) and its schedule,
        recorded as `removed` by `actor_name`; returns its id."""
        check_actor_name(actor_name)
        head = self.head(conn, name, lock=True)
        now = self.store.now_ms(conn)
        self._cas_head(conn, head, deleted_at_ms=now, enabled=False)
        trigger_store.remove_trigger(conn, head.id, now)
        _record(conn, head.id, TaskEventType.REMOVED, head.current_revision, actor_name, now)
        return head.id

    # -- inside a transaction ----------------------------------------------------------------

    def head(self, conn: Connection, name: str, *, lock: bool = False):
        validate_name(name)
        query = select(tasks).where(and_(tasks.c.name == name, _LIVE))
        if lock:
            query = query.with_for_update()
        head = conn.execute(query).first()
        if head is None:
            raise NotFound(f"no task named {name!r}: see `qlactors task list`")
        return head

    def _spec(self, conn: Connection, head) -> TaskSpec:
        row = conn.execute(select(task_revisions).where(and_(
            task_revisions.c.task_id == head.id,
            task_revisions.c.revision == head.current_revision))).one()
        return spec_from_revision(head.name, row)

    def revision(self, conn: Connection, task_id: str, name: str, revision: int) -> TaskSpec:
        row = conn.execute(select(task_revisions).where(and_(
            task_revisions.c.task_id == task_id, task_revisions.c.revision == revision))).one()
        return spec_from_revision(name, row)

    def _cas_head(self, conn: Connection, head, **values: Any) -> None:
        guard = and_(tasks.c.id == head.id, tasks.c.version == head.version, _LIVE)
        values["version"] = head.version + 1
        if conn.execute(tasks.update().where(guard).values(**values)).rowcount != 1:
            raise Conflict(f"task {head.name!r} changed meanwhile; nothing was written, try again")

    def _detail(self, conn: Connection, head, *, now_ms: int | None = None) -> TaskView:
        """The task with its schedule read in detail (recent trigger events included)."""
        now = self.store.now_ms(conn) if now_ms is None else now_ms
        return self._view(conn, head, trigger_store.read_trigger(conn, head.id, now))

    def _view(self, conn: Connection, head, trigger: TriggerView | None) -> TaskView:
        active = conn.execute(select(func.count()).select_from(runs).where(and_(
            runs.c.task_id == head.id, runs.c.status.not_in(_TERMINAL)))).scalar_one()
        return TaskView(id=head.id, revision=head.current_revision, enabled=bool(head.enabled),
                        spec=self._spec(conn, head), created_at_ms=head.created_at_ms,
                        updated_at_ms=head.updated_at_ms, active_runs=active, trigger=trigger,
                        retention=_retention_of(head))


def _record(conn: Connection, task_id: str, type_: TaskEventType, revision: int, actor_name: str, now_ms: int,
            payload: Mapping[str, Any] | None = None) -> None:
    """One `task_events` row: the change, the task's revision after it, and who made it."""
    conn.execute(task_events.insert().values(
        id=new_id(), task_id=task_id, type=type_.value, revision=revision, actor_name=actor_name,
        payload_json=encode_payload(payload or {}), created_at_ms=now_ms))


def _retention_values(retention: TaskRetention) -> dict[str, int | None]:
    """The head columns of a task's own retention bounds."""
    return {"retention_max_age_ms": retention.max_age_ms, "retention_max_runs": retention.max_runs}


def _retention_of(head) -> TaskRetention:
    return TaskRetention(max_age_ms=head.retention_max_age_ms, max_runs=head.retention_max_runs)
