"""The task repository: a mutable head plus immutable revisions; every edit is a new revision."""

from __future__ import annotations

from typing import Any

from sqlalchemy import and_, func, select
from sqlalchemy.engine import Connection

from ..domain.model import TaskSpec, validate_name
from ..domain.states import RUN_TERMINAL
from ..errors import AlreadyExists, Conflict, NotFound
from ..ids import new_id
from .engine import Store
from .schema import runs, task_revisions, tasks
from .views import TaskView, revision_values, spec_from_revision

_LIVE = tasks.c.deleted_at_ms.is_(None)
_TERMINAL = [s.value for s in RUN_TERMINAL]


class Tasks:
    """Create, edit, enable, list and remove tasks; removal keeps history readable."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def add(self, spec: TaskSpec, *, enabled: bool = True) -> TaskView:
        spec = spec.validated()
        task_id = new_id()
        with self.store.write() as conn:
            now = self.store.now_ms(conn)
            inserted = self.store.insert_new(conn, tasks, dict(
                id=task_id, name=spec.name, current_revision=1, version=1, enabled=enabled,
                created_at_ms=now, updated_at_ms=now))
            if not inserted:
                raise AlreadyExists(f"a task named {spec.name!r} already exists: pick another name, "
                                    f"or change it with `qlactors task update {spec.name}`")
            conn.execute(task_revisions.insert().values(
                task_id=task_id, revision=1, created_at_ms=now, **revision_values(spec)))
            return self._view(conn, self.head(conn, spec.name))

    def update(self, name: str, **changes: Any) -> TaskView:
        """A new revision with `changes` applied to the current one; runs keep the revision they pinned."""
        with self.store.write() as conn:
            head = self.head(conn, name, lock=True)
            current = self._spec(conn, head)
            spec = current.with_changes(**changes)
            if spec == current:
                return self._view(conn, head)
            now = self.store.now_ms(conn)
            revision = head.current_revision + 1
            conn.execute(task_revisions.insert().values(
                task_id=head.id, revision=revision, created_at_ms=now, **revision_values(spec)))
            self._cas_head(conn, head, current_revision=revision, updated_at_ms=now)
            return self._view(conn, self.head(conn, name))

    def set_enabled(self, name: str, enabled: bool) -> TaskView:
        with self.store.write() as conn:
            head = self.head(conn, name, lock=True)
            if bool(head.enabled) != enabled:
                self._cas_head(conn, head, enabled=enabled, updated_at_ms=self.store.now_ms(conn))
            return self._view(conn, self.head(conn, name))

    def get(self, name: str) -> TaskView:
        with self.store.read() as conn:
            return self._view(conn, self.head(conn, name))

    def list(self) -> list[TaskView]:
        with self.store.read() as conn:
            heads = conn.execute(select(tasks).where(_LIVE).order_by(tasks.c.name)).all()
            return [self._view(conn, head) for head in heads]

    def mark_removed(self, conn: Connection, name: str) -> str:
        """Inside a caller's transaction: retire the head (its name becomes free); returns its id."""
        head = self.head(conn, name, lock=True)
        self._cas_head(conn, head, deleted_at_ms=self.store.now_ms(conn), enabled=False)
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

    def _view(self, conn: Connection, head) -> TaskView:
        active = conn.execute(select(func.count()).select_from(runs).where(and_(
            runs.c.task_id == head.id, runs.c.status.not_in(_TERMINAL)))).scalar_one()
        return TaskView(id=head.id, revision=head.current_revision, enabled=bool(head.enabled),
                        spec=self._spec(conn, head), created_at_ms=head.created_at_ms,
                        updated_at_ms=head.updated_at_ms, active_runs=active)
