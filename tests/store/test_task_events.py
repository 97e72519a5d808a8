"""A task's change history (schema 16 `task_events`): each change writes exactly one row, in its own
transaction, naming its type, the revision after it, who made it and, for an update, which fields
changed (never a command's words, an environment value or output); a change of nothing writes none.
On a SQLite file and on PostgreSQL (see conftest)."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import select

from qlactors.domain.model import Command
from qlactors.domain.retention import TaskRetention
from qlactors.errors import BadInput
from qlactors.store.intent.tasks import MAX_HISTORY
from qlactors.store.intent.triggers import TriggerOptions
from qlactors.store.schema import task_events, tasks
from store_helpers import spec

SECRET_WORD = "hunter2-word"
SECRET_VALUE = "s3cret-value"


def rows(repo, name: str = "job") -> list[dict]:
    """The task's `task_events` rows, oldest first, as stored (every task of that name, removed too)."""
    with repo.store.read() as conn:
        ids = list(conn.execute(select(tasks.c.id).where(tasks.c.name == name)).scalars())
        return [dict(r._mapping) for r in conn.execute(
            select(task_events).where(task_events.c.task_id.in_(ids))
            .order_by(task_events.c.created_at_ms, task_events.c.id))]


def summary(row: dict) -> tuple:
    return row["type"], row["revision"], row["actor_name"], json.loads(row["payload_json"])


def test_adding_records_one_added_event_at_revision_1(repo):
    repo.tasks.add(spec(command=Command.from_words(["echo", SECRET_WORD]), env={"TOKEN": SECRET_VALUE}),
                   actor_name="alice")
    [row] = rows(repo)
    assert summary(row) == ("added", 1, "alice", {})
    assert type(row["created_at_ms"]) is int and row["created_at_ms"] > 0


def test_an_update_records_the_changed_field_names_never_their_values(repo):
    repo.tasks.add(spec(command=Command.from_words(["echo", "old"])), actor_name="alice")
    repo.tasks.update("job", command=Command.from_words(["echo", SECRET_WORD]), timeout_ms=5_000,
                      env={"TOKEN": SECRET_VALUE}, actor_name="bob")
    [_, row] = rows(repo)
    assert summary(row) == ("updated", 2, "bob", {"changed": ["command", "env", "timeout_ms"]})
    assert SECRET_WORD not in row["payload_json"] and SECRET_VALUE not in row["payload_json"]
    assert "TOKEN" not in row["payload_json"]  # not even an environment name


def test_an_update_that_changes_nothing_writes_no_event(repo):
    repo.tasks.add(spec(timeout_ms=5_000), trigger=TriggerOptions(cron="*/5 * * * *", tz="UTC"),
                   retention=TaskRetention(max_runs=3), actor_name="alice")
    view = repo.tasks.update("job", timeout_ms=5_000, trigger=TriggerOptions(cron="*/5 * * * *"),
                             retention={"max_runs": 3}, actor_name="bob")
    repo.tasks.update("job", actor_name="bob")
    assert view.revision == 1
    assert [summary(r)[0] for r in rows(repo)] == ["added"]


def test_schedule_and_retention_changes_are_updates_at_the_same_revision(repo):
    repo.tasks.add(spec(), actor_name="alice")
    repo.tasks.update("job", trigger=TriggerOptions(cron="*/5 * * * *", tz="UTC"), actor_name="bob")
    repo.tasks.update("job", retention={"max_age_ms": 86_400_000}, actor_name="carol")
    repo.tasks.update("job", remove_trigger=True, labels=("gpu",), actor_name="dave")
    repo.tasks.update("job", remove_trigger=True, actor_name="erin")  # no schedule left: nothing
    assert [summary(r) for r in rows(repo)][1:] == [
        ("updated", 1, "bob", {"changed": ["schedule"]}),
        ("updated", 1, "carol", {"changed": ["retention"]}),
        ("updated", 2, "dave", {"changed": ["labels", "schedule"]}),
    ]


def test_enable_and_disable_record_only_a_real_change(repo):
    repo.tasks.add(spec(), actor_name="alice")
    repo.tasks.set_enabled("job", True, actor_name="bob")  # already enabled
    repo.tasks.set_enabled("job", False, actor_name="bob")
    repo.tasks.set_enabled("job", False, actor_name="carol")  # already disabled
    repo.tasks.update("job", max_concurrent=2, actor_name="carol")
    repo.tasks.set_enabled("job", True, actor_name="dave")
    assert [summary(r)[:3] for r in rows(repo)] == [
        ("added", 1, "alice"), ("disabled", 1, "bob"), ("updated", 2, "carol"), ("enabled", 2, "dave")]


def test_removal_records_removed_at_the_last_revision_and_the_history_stays(repo):
    repo.tasks.add(spec(), actor_name="alice")
    repo.tasks.update("job", timeout_ms=1_000, actor_name="alice")
    repo.remove_task("job", actor_name="bob")
    assert [summary(r)[:3] for r in rows(repo)] == [("added", 1, "alice"), ("updated", 2, "alice"),
                                                    ("removed", 2, "bob")]
    repo.tasks.add(spec(), actor_name="carol")  # the name is free again: a new task, its own history
    assert [(e.type, e.actor_name) for e in repo.tasks.history("job")] == [("added", "carol")]


def test_history_is_newest_first_and_limited(repo):
    repo.tasks.add(spec(), actor_name="alice")
    for n in range(2, 6):
        repo.tasks.update("job", max_concurrent=n, actor_name=f"user{n}")
    history = repo.tasks.history("job")
    assert [(e.type, e.revision, e.actor_name) for e in history] == [
        ("updated", 5, "user5"), ("updated", 4, "user4"), ("updated", 3, "user3"), ("updated", 2, "user2"),
        ("added", 1, "alice")]
    assert history[0].changed == ("max_concurrent",) and history[-1].changed == ()
    assert all(a.at_ms >= b.at_ms for a, b in zip(history, history[1:]))
    assert [e.revision for e in repo.tasks.history("job", limit=2)] == [5, 4]
    assert history[0].to_json() == {"type": "updated", "revision": 5, "actor_name": "user5",
                                    "at_ms": history[0].at_ms, "changed": ["max_concurrent"]}


@pytest.mark.parametrize("limit", [0, MAX_HISTORY + 1, True, "5"])
def test_a_bad_history_limit_is_refused(repo, limit):
    repo.tasks.add(spec(), actor_name="alice")
    with pytest.raises(BadInput, match="history limit"):
        repo.tasks.history("job", limit=limit)


def test_every_change_needs_a_name_and_a_bad_one_writes_nothing(repo):
    with pytest.raises(TypeError):
        repo.tasks.add(spec())  # the keyword is required: no caller forgets who it is
    for bad in ("", "x" * 129, "bad\x1bname"):
        with pytest.raises(BadInput, match="printable characters"):
            repo.tasks.add(spec(), actor_name=bad)
    repo.tasks.add(spec(), actor_name="alice")
    for change in (lambda bad: repo.tasks.update("job", timeout_ms=9_000, actor_name=bad),
                   lambda bad: repo.tasks.set_enabled("job", False, actor_name=bad),
                   lambda bad: repo.remove_task("job", actor_name=bad)):
        with pytest.raises(BadInput, match="printable characters"):
            change("")
    view = repo.tasks.get("job")
    assert (view.revision, view.enabled, view.spec.timeout_ms) == (1, True, None)
    assert [summary(r)[0] for r in rows(repo)] == ["added"]
