"""The trigger repository (store/intent/triggers.py) through Tasks: the same tests on SQLite and PostgreSQL."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import func, select

from qlactors.domain.cron import CronError, Misfire, Overlap, TriggerSpec, first_fire_at_or_after_ms
from qlactors.errors import BadInput
from qlactors.ids import new_id
from qlactors.scheduling import zones
from qlactors.scheduling.zones import resolve_zone
from qlactors.store.schema import task_revisions, tasks, trigger_events, trigger_schedules, triggers
from qlactors.store.intent.triggers import (
    DUE_COLUMNS,
    DUE_FROM,
    DUE_WHERE,
    RECENT_EVENTS,
    DueSchedule,
    TriggerOptions,
)
from store_helpers import spec

EVERY_5_MIN = TriggerOptions(cron="*/5 * * * *", tz="Europe/Berlin")


def trigger_rows(repo) -> list[dict]:
    with repo.store.read() as conn:
        return [dict(r._mapping) for r in conn.execute(select(triggers).order_by(triggers.c.created_at_ms))]


def schedule_of(repo, trigger_id: str) -> dict | None:
    with repo.store.read() as conn:
        row = conn.execute(select(trigger_schedules).where(trigger_schedules.c.trigger_id == trigger_id)).first()
    return None if row is None else dict(row._mapping)


def set_cursor(repo, trigger_id: str, next_fire_at_ms: int, *, last_scheduled_at_ms: int | None = None) -> None:
    """What an admission would leave behind (test scaffolding): a cursor and a bumped state_version."""
    with repo.store.write() as conn:
        conn.execute(trigger_schedules.update().where(trigger_schedules.c.trigger_id == trigger_id).values(
            next_fire_at_ms=next_fire_at_ms, last_scheduled_at_ms=last_scheduled_at_ms,
            state_version=trigger_schedules.c.state_version + 1))


def counts(repo) -> tuple[int, int, int, int]:
    with repo.store.read() as conn:
        return tuple(conn.execute(select(func.count()).select_from(t)).scalar_one()
                     for t in (tasks, task_revisions, triggers, trigger_schedules))


# -- create -------------------------------------------------------------------------------------

def test_a_task_added_with_a_schedule_gets_trigger_revision_1_and_an_uninitialised_cursor(repo):
    view = repo.tasks.add(spec(), trigger=TriggerOptions(cron="*/5  *  * * *", tz="Europe/Berlin",
                                                         misfire="skip", grace_ms=10_000, overlap="replace"),
                          actor_name="tester")
    [row] = trigger_rows(repo)
    assert row["task_id"] == view.id and row["revision"] == 1 and row["deleted_at_ms"] is None
    assert (row["cron"], row["tz"], row["misfire"], row["grace_ms"], row["overlap"]) == (
        "*/5 * * * *", "Europe/Berlin", "skip", 10_000, "replace")  # the expression normalised
    schedule = schedule_of(repo, row["id"])
    assert schedule["trigger_revision"] == 1 and schedule["next_fire_at_ms"] is None
    assert schedule["last_scheduled_at_ms"] is None and schedule["state_version"] == 0
    t = view.trigger
    assert (t.id, t.revision, t.cron, t.tz, t.misfire, t.grace_ms, t.overlap) == (
        row["id"], 1, "*/5 * * * *", "Europe/Berlin", "skip", 10_000, "replace")
    assert view.revision == 1  # the schedule is not a task revision


def test_defaults_are_fire_once_30s_grace_queue_and_a_task_without_cron_has_no_trigger(repo):
    repo.tasks.add(spec("plain"), actor_name="tester")
    view = repo.tasks.add(spec("cron"), trigger=TriggerOptions(cron="0 3 * * *", tz="UTC"), actor_name="tester")
    assert (view.trigger.misfire, view.trigger.grace_ms, view.trigger.overlap) == ("fire_once", 30_000, "queue")
    assert repo.tasks.get("plain").trigger is None
    assert len(trigger_rows(repo)) == 1


def test_the_zone_defaults_to_the_system_zone_and_is_stored_by_name_so_it_never_moves(repo, monkeypatch):
    view = repo.tasks.add(spec("a"), trigger=TriggerOptions(cron="0 3 * * *"), actor_name="tester")
    assert view.trigger.tz == resolve_zone(None) and trigger_rows(repo)[0]["tz"] == view.trigger.tz

    monkeypatch.setattr(zones, "system_zone", lambda: "Asia/Tokyo")  # the host's zone changes
    added = repo.tasks.add(spec("b"), trigger=TriggerOptions(cron="0 3 * * *"), actor_name="tester")
    assert added.trigger.tz == "Asia/Tokyo"
    edited = repo.tasks.update("a", trigger=TriggerOptions(cron="0 4 * * *"), actor_name="tester")
    assert edited.trigger.tz == view.trigger.tz  # the stored zone, not the host's new one
    assert edited.trigger.revision == 2


# -- update -------------------------------------------------------------------------------------

def test_an_update_with_the_same_settings_keeps_the_revision_and_the_cursor(repo):
    view = repo.tasks.add(spec(), trigger=EVERY_5_MIN, actor_name="tester")
    set_cursor(repo, view.trigger.id, 1_800_000_000_000, last_scheduled_at_ms=1_799_999_700_000)
    before = schedule_of(repo, view.trigger.id)

    same = repo.tasks.update("job", trigger=TriggerOptions(cron=" */5 * *  * * ", tz="Europe/Berlin",
                                                           misfire="fire_once", grace_ms=30_000, overlap="queue"),
                           actor_name="tester")
    assert same.trigger.revision == 1 and same.revision == 1
    assert schedule_of(repo, view.trigger.id) == before
    assert same.trigger.next_fire_at_ms == 1_800_000_000_000  # the stored cursor is shown as is
    assert trigger_rows(repo)[0]["updated_at_ms"] == view.trigger.updated_at_ms


@pytest.mark.parametrize("change", [
    TriggerOptions(cron="*/10 * * * *"), TriggerOptions(tz="America/New_York"), TriggerOptions(misfire="skip"),
    TriggerOptions(grace_ms=5_000), TriggerOptions(overlap="skip"),
], ids=["cron", "tz", "misfire", "grace", "overlap"])
def test_changing_any_setting_bumps_the_revision_and_resets_the_cursor(repo, change):
    view = repo.tasks.add(spec(), trigger=EVERY_5_MIN, actor_name="tester")
    set_cursor(repo, view.trigger.id, 1_800_000_000_000, last_scheduled_at_ms=1_799_999_700_000)
    before = schedule_of(repo, view.trigger.id)

    edited = repo.tasks.update("job", trigger=change, actor_name="tester")
    assert edited.trigger.id == view.trigger.id and edited.trigger.revision == 2
    assert edited.revision == 1  # the task itself has no new revision
    after = schedule_of(repo, view.trigger.id)
    assert after["trigger_revision"] == 2 and after["next_fire_at_ms"] is None
    assert after["state_version"] == before["state_version"] + 1  # an admission's CAS now fails
    assert after["last_scheduled_at_ms"] == 1_799_999_700_000  # history is kept
    [row] = trigger_rows(repo)
    assert row["revision"] == 2 and row["updated_at_ms"] >= view.trigger.updated_at_ms
    for field, old in (("cron", "*/5 * * * *"), ("tz", "Europe/Berlin"), ("misfire", "fire_once"),
                       ("grace_ms", 30_000), ("overlap", "queue")):
        assert row[field] == (old if getattr(change, field) is None else getattr(change, field))


def test_task_and_schedule_changes_are_written_together(repo):
    repo.tasks.add(spec(), trigger=EVERY_5_MIN, actor_name="tester")
    edited = repo.tasks.update("job", max_concurrent=3, trigger=TriggerOptions(overlap="skip"), actor_name="tester")
    assert edited.revision == 2 and edited.spec.max_concurrent == 3
    assert edited.trigger.revision == 2 and edited.trigger.overlap == "skip"
    again = repo.tasks.update("job", max_concurrent=4, actor_name="tester")  # a task edit leaves the schedule alone
    assert again.revision == 3 and again.trigger.revision == 2


def test_a_schedule_can_be_added_to_an_existing_task_by_update(repo):
    repo.tasks.add(spec(), actor_name="tester")
    view = repo.tasks.update("job", trigger=TriggerOptions(cron="0 */5 * * * *", tz="UTC"), actor_name="tester")
    assert view.trigger.revision == 1 and view.trigger.cron == "0 */5 * * * *" and view.revision == 1


# -- remove -------------------------------------------------------------------------------------

def test_removing_the_schedule_retires_the_trigger_and_deletes_its_schedule_row(repo):
    view = repo.tasks.add(spec(), trigger=EVERY_5_MIN, actor_name="tester")
    set_cursor(repo, view.trigger.id, 1_800_000_000_000)
    removed = repo.tasks.update("job", remove_trigger=True, actor_name="tester")
    assert removed.trigger is None and removed.revision == 1
    [row] = trigger_rows(repo)
    assert row["deleted_at_ms"] is not None  # kept: runs and trigger events refer to it
    assert schedule_of(repo, view.trigger.id) is None
    assert repo.tasks.get("job").trigger is None

    # nothing to remove: no-op
    assert repo.tasks.update("job", remove_trigger=True, actor_name="tester").trigger is None
    again = repo.tasks.update("job", trigger=EVERY_5_MIN, actor_name="tester")
    assert again.trigger.id != view.trigger.id and again.trigger.revision == 1  # a fresh trigger
    assert [r["deleted_at_ms"] is None for r in trigger_rows(repo)] == [False, True]


def test_removing_a_task_retires_its_trigger(repo):
    view = repo.tasks.add(spec(), trigger=EVERY_5_MIN, actor_name="tester")
    repo.remove_task("job", actor_name="tester")
    assert trigger_rows(repo)[0]["deleted_at_ms"] is not None
    assert schedule_of(repo, view.trigger.id) is None
    # the name is free again
    assert repo.tasks.add(spec(), trigger=EVERY_5_MIN, actor_name="tester").trigger.revision == 1


# -- enable -------------------------------------------------------------------------------------

def test_re_enabling_a_task_resets_the_cursor_to_count_from_now_and_keeps_the_revision(repo):
    view = repo.tasks.add(spec(), trigger=EVERY_5_MIN, actor_name="tester")
    set_cursor(repo, view.trigger.id, 1_800_000_000_000)

    disabled = repo.tasks.set_enabled("job", False, actor_name="tester")
    assert schedule_of(repo, view.trigger.id)["next_fire_at_ms"] == 1_800_000_000_000  # untouched
    assert disabled.trigger.next_fire_at_ms is None  # nothing fires while disabled
    assert repo.tasks.list()[0].trigger.next_fire_at_ms is None
    before = schedule_of(repo, view.trigger.id)

    started = int(time.time() * 1000) - 1_000
    enabled = repo.tasks.set_enabled("job", True, actor_name="tester")
    after = schedule_of(repo, view.trigger.id)
    assert after["next_fire_at_ms"] is None and after["trigger_revision"] == 1
    assert after["state_version"] == before["state_version"] + 1
    assert enabled.trigger.revision == 1
    row = trigger_rows(repo)[0]
    assert row["updated_at_ms"] >= started  # the schedule now counts from the re-enable

    set_cursor(repo, view.trigger.id, 1_800_000_000_000)
    repo.tasks.set_enabled("job", True, actor_name="tester")  # already enabled: nothing is reset
    assert schedule_of(repo, view.trigger.id)["next_fire_at_ms"] == 1_800_000_000_000


def test_enabling_a_task_without_a_schedule_still_works(repo):
    repo.tasks.add(spec(), actor_name="tester")
    repo.tasks.set_enabled("job", False, actor_name="tester")
    assert repo.tasks.set_enabled("job", True, actor_name="tester").enabled is True


# -- bad input ----------------------------------------------------------------------------------

BAD = [
    (TriggerOptions(cron="* * *"), "cron", "3 fields"),
    (TriggerOptions(cron="61 * * * *"), "cron", "not valid"),
    (TriggerOptions(cron="0 0 31 2 *"), "cron", "never fires"),
    (TriggerOptions(cron="* * * * *", tz="Mars/Olympus_Mons"), "zone", "unknown time zone"),
    (TriggerOptions(cron="* * * * *", tz="../etc/passwd"), "zone", "not a time zone"),
    (TriggerOptions(cron="* * * * *", misfire="twice"), "misfire", "fire_once|skip"),
    (TriggerOptions(cron="* * * * *", grace_ms=-1), "grace", "grace"),
    (TriggerOptions(cron="* * * * *", grace_ms=True), "grace", "grace"),
    (TriggerOptions(cron="* * * * *", overlap="parallel"), "overlap", "queue|skip|replace"),
]


@pytest.mark.parametrize("options,field,fragment", BAD, ids=[f"{b[1]}-{i}" for i, b in enumerate(BAD)])
def test_a_bad_setting_on_add_is_refused_and_nothing_is_written(repo, options, field, fragment):
    with pytest.raises(CronError) as caught:
        repo.tasks.add(spec(), trigger=options, actor_name="tester")
    assert isinstance(caught.value, BadInput) and caught.value.field == field
    assert fragment in str(caught.value)
    assert counts(repo) == (0, 0, 0, 0)


@pytest.mark.parametrize("options,field,fragment", BAD, ids=[f"{b[1]}-{i}" for i, b in enumerate(BAD)])
def test_a_bad_setting_on_update_is_refused_and_nothing_is_written(repo, options, field, fragment):
    view = repo.tasks.add(spec(), trigger=EVERY_5_MIN, actor_name="tester")
    set_cursor(repo, view.trigger.id, 1_800_000_000_000)
    before = (counts(repo), trigger_rows(repo), schedule_of(repo, view.trigger.id))
    with pytest.raises(CronError):
        repo.tasks.update("job", max_concurrent=5, trigger=options, actor_name="tester")  # the task edit is refused too
    assert (counts(repo), trigger_rows(repo), schedule_of(repo, view.trigger.id)) == before
    assert repo.tasks.get("job").spec.max_concurrent == 1


def test_refining_a_schedule_that_does_not_exist_or_setting_and_removing_at_once_is_refused(repo):
    with pytest.raises(CronError, match="give --cron"):
        repo.tasks.add(spec(), trigger=TriggerOptions(tz="UTC"), actor_name="tester")
    repo.tasks.add(spec(), actor_name="tester")
    with pytest.raises(CronError, match="give --cron"):
        repo.tasks.update("job", trigger=TriggerOptions(overlap="skip"), actor_name="tester")
    with pytest.raises(BadInput, match="set and removed"):
        repo.tasks.update("job", trigger=EVERY_5_MIN, remove_trigger=True, actor_name="tester")
    assert counts(repo) == (1, 1, 0, 0)


# -- views --------------------------------------------------------------------------------------

def add_events(repo, trigger_id: str, n: int) -> None:
    with repo.store.write() as conn:
        for i in range(n):
            conn.execute(trigger_events.insert().values(
                id=new_id(), trigger_id=trigger_id, trigger_revision=1, type="missed" if i % 2 else "skipped",
                scheduled_for_ms=1_700_000_000_000 + i * 300_000, occurrences=i + 1, run_id=None,
                created_at_ms=1_700_000_000_000 + i * 1_000))


def test_show_has_the_recent_trigger_events_newest_first_and_bounded_and_list_has_none(repo):
    view = repo.tasks.add(spec(), trigger=EVERY_5_MIN, actor_name="tester")
    repo.tasks.add(spec("other"), actor_name="tester")
    add_events(repo, view.trigger.id, RECENT_EVENTS + 2)

    shown = repo.tasks.get("job").trigger
    assert len(shown.events) == RECENT_EVENTS
    assert [e.count for e in shown.events] == list(range(RECENT_EVENTS + 2, 2, -1))  # newest first
    newest = shown.events[0]
    assert (newest.type, newest.scheduled_for_ms, newest.trigger_revision) == (
        "missed", 1_700_000_000_000 + (RECENT_EVENTS + 1) * 300_000, 1)
    assert shown.to_json()["events"][0] == {
        "type": "missed", "scheduled_for_ms": newest.scheduled_for_ms, "count": RECENT_EVENTS + 2,
        "trigger_revision": 1, "run_id": None, "at_ms": newest.at_ms}

    listed = {v.name: v for v in repo.tasks.list()}
    assert listed["job"].trigger.events is None and "events" not in listed["job"].to_json()["trigger"]
    assert listed["job"].trigger.cron == "*/5 * * * *" and listed["other"].trigger is None
    assert listed["other"].to_json()["trigger"] is None


def test_the_next_fire_time_is_the_cursor_else_computed_from_now_for_display_only(repo):
    started = int(time.time() * 1000) - 1_000
    view = repo.tasks.add(spec(), trigger=EVERY_5_MIN, actor_name="tester")
    ended = int(time.time() * 1000) + 1_000
    possible = {first_fire_at_or_after_ms("*/5 * * * *", "Europe/Berlin", t) for t in (started, ended)}
    assert view.trigger.next_fire_at_ms in possible
    assert repo.tasks.list()[0].trigger.next_fire_at_ms in possible
    assert schedule_of(repo, view.trigger.id)["next_fire_at_ms"] is None  # never written by a read

    set_cursor(repo, view.trigger.id, 1_800_000_000_000, last_scheduled_at_ms=1_799_999_700_000)
    shown = repo.tasks.get("job").trigger
    assert shown.next_fire_at_ms == 1_800_000_000_000 and shown.last_scheduled_at_ms == 1_799_999_700_000
    assert repo.tasks.get("job").to_json()["trigger"]["next_fire_at_ms"] == 1_800_000_000_000


# -- what admission reads -----------------------------------------------------------------------

def test_due_columns_give_the_scheduler_a_due_schedule_of_live_triggers_of_live_tasks(repo):
    view = repo.tasks.add(spec(), trigger=TriggerOptions(cron="*/5 * * * * *", tz="UTC", misfire="skip",
                                                         grace_ms=2_000, overlap="replace"), actor_name="tester")
    gone = repo.tasks.add(spec("gone"), trigger=EVERY_5_MIN, actor_name="tester")
    repo.remove_task("gone", actor_name="tester")
    set_cursor(repo, view.trigger.id, 1_800_000_000_000, last_scheduled_at_ms=1_799_999_995_000)
    with repo.store.read() as conn:
        rows = conn.execute(select(*DUE_COLUMNS).select_from(DUE_FROM).where(DUE_WHERE)).all()
    [due] = [DueSchedule.from_row(r) for r in rows]
    assert due.trigger_id != gone.trigger.id
    assert due == DueSchedule(
        trigger_id=view.trigger.id, trigger_revision=1, task_id=view.id, task_name="job", task_enabled=True,
        cron="*/5 * * * * *", tz="UTC", misfire=Misfire.SKIP, grace_ms=2_000, overlap=Overlap.REPLACE,
        next_fire_at_ms=1_800_000_000_000, last_scheduled_at_ms=1_799_999_995_000, state_version=1,
        trigger_updated_at_ms=view.trigger.updated_at_ms)
    assert due.spec() == TriggerSpec(view.trigger.id, 1, "*/5 * * * * *", "UTC", Misfire.SKIP, 2_000)
