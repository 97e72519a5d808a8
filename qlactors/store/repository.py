"""Store: the repository facade: tasks, runs, and the operations that span both (removing a task)."""

from __future__ import annotations

from dataclasses import dataclass

from ..domain.results import Result
from ..domain.states import CancelReason
from ..errors import BadInput
from . import sqlite
from .engine import Store
from .intent.runs import Runs
from .intent.tasks import Tasks
from .migrations import migrate
from .plans import load_run


@dataclass(frozen=True, slots=True)
class Removal:
    task: str
    cancelled: tuple[str, ...]  # runs that ended `cancelled` at once
    requested: tuple[str, ...]  # runs with a live process: cancel intent recorded


class Repository:
    """The only authority for state: every method is one short transaction on the store."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.tasks = Tasks(store)
        self.runs = Runs(store)

    @classmethod
    def open(cls, url: str, **options) -> "Repository":
        """Open (and create or migrate) the database at `url`; `options` go to `Store` (a replica's
        pool size and PostgreSQL timeouts)."""
        store = Store(url, **options)
        path = sqlite.database_path(store.url)
        try:
            if path is not None:
                sqlite.create_private(path)
            migrate(store)
            if path is not None:
                sqlite.tighten(path)
        except BaseException:
            store.close()
            raise
        return cls(store)

    def remove_task(self, name: str, *, force: bool = False, actor_name: str) -> Removal:
        """Retire a task. With active runs it refuses, unless `force`, which cancels them first.
        `actor_name` (who asks) is written on the cancels' run events and the task's `removed` event."""
        with self.store.write() as conn:
            head = self.tasks.head(conn, name, lock=True)
            active = self.runs.active_ids(conn, head.id)
            if active and not force:
                raise BadInput(f"task {name!r} has {len(active)} active run(s); nothing was removed: "
                               "wait for them, cancel them, or use `task rm --force`")
            cancelled, requested = [], []
            for run_id in active:
                outcome = self.runs.cancel_in(conn, load_run(conn, run_id), CancelReason.USER, actor_type="user",
                                             actor_name=actor_name)
                (cancelled if outcome is Result.CANCELLED else requested).append(run_id)
            self.tasks.mark_removed(conn, name, actor_name=actor_name)
            return Removal(name, tuple(cancelled), tuple(requested))

    def close(self) -> None:
        self.store.close()
