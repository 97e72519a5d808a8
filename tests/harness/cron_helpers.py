"""Cron triggers in the store: a fixed clock, a trigger added, its runs and its cursor; shared by
the store's cron tests."""

from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import select

from qlactors.domain.model import Command
from qlactors.store.schema import runs, tasks, trigger_schedules
from qlactors.store.intent.triggers import TriggerOptions, set_trigger, settle

from store_helpers import spec


MINUTE = 60_000


def ms(text: str) -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=timezone.utc).timestamp() * 1000)


T0 = ms("2026-03-02T10:00:00")  # a Monday, in UTC


def add_trigger(repo, task: str, cron: str = "*/5 * * * *", *, tz: str = "UTC", misfire: str = "fire_once",
                grace_ms: int = 30_000, overlap: str = "queue", since_ms: int = T0,
                max_concurrent: int = 1, command=("true",), **task_fields) -> str:
    """A task with one live trigger, written at `since_ms`: its cursor counts from then."""
    repo.tasks.add(spec(task, command=Command.from_words(list(command)), max_concurrent=max_concurrent, **task_fields),
                   actor_name="tester")
    settings = settle(TriggerOptions(cron=cron, tz=tz, misfire=misfire, grace_ms=grace_ms, overlap=overlap), None)
    with repo.store.write() as conn:
        task_id = conn.execute(select(tasks.c.id).where(tasks.c.name == task)).scalar_one()
        return set_trigger(conn, task_id, settings, since_ms).trigger_id


def cron_runs(repo, trigger_id: str) -> list:
    with repo.store.read() as conn:
        return conn.execute(select(runs).where(runs.c.trigger_id == trigger_id)
                            .order_by(runs.c.scheduled_for_ms)).all()


def cursor(repo, trigger_id: str) -> int | None:
    with repo.store.read() as conn:
        return conn.execute(select(trigger_schedules.c.next_fire_at_ms).where(
            trigger_schedules.c.trigger_id == trigger_id)).scalar_one()
