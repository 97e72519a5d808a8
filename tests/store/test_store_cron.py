"""Cron admission in the store (SEMANTICS.md §8): the due page, one transaction per decision,
overlap, trigger events and exactly one run per occurrence under concurrent admitters; on
SQLite and PostgreSQL. Triggers are written by the trigger repository at a simulated time."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import pytest
from sqlalchemy import func, select

from qlactors.store.cadence.cron_admission import CronAdmission
from qlactors.store.repository import Repository
from qlactors.store.schema import runs, tasks, trigger_events, triggers
from qlactors.ids import new_id
from store_helpers import new_hash, spec
from cron_helpers import MINUTE, T0, add_trigger, cron_runs, cursor

DAY = 86_400_000


def cycle(cron: CronAdmission, now_ms: int, page: int = 16, tick_ms: int = 1000) -> list:
    """One Scheduler cron step at one observed time."""
    return [cron.fire(d, now_ms, tick_ms=tick_ms) for d in cron.due(now_ms, page)]


def events(repo, trigger_id: str) -> list:
    with repo.store.read() as conn:
        return conn.execute(select(trigger_events).where(trigger_events.c.trigger_id == trigger_id)
                            .order_by(trigger_events.c.created_at_ms, trigger_events.c.scheduled_for_ms)).all()


@pytest.fixture
def cron(repo):
    return CronAdmission(repo.store)


def test_first_sight_initialises_then_each_fire_admits_one_run_with_its_key(repo, cron):
    tid = add_trigger(repo, "every5", since_ms=T0 + 1)
    assert cron.next_fire_ms() is not None  # an uninitialised schedule is due at once
    [fired] = cycle(cron, T0 + 1000)
    assert (fired.outcome, fired.next_fire_at_ms) == ("initialised", T0 + 5 * MINUTE)
    assert cron.due(T0 + 5 * MINUTE - 1, 16) == [] and cron_runs(repo, tid) == []
    assert cron.next_fire_ms() == T0 + 5 * MINUTE

    [fired] = cycle(cron, T0 + 5 * MINUTE + 40)
    assert (fired.outcome, fired.scheduled_for_ms, fired.missed) == ("admitted", T0 + 5 * MINUTE, 0)
    [run] = cron_runs(repo, tid)
    assert (run.status, run.trigger_type, run.scheduled_for_ms) == ("queued", "cron", T0 + 5 * MINUTE)
    assert run.idempotency_key == f"cron:{tid}:1:{T0 + 5 * MINUTE}"
    assert repo.runs.get(run.id).scheduled_for_ms == T0 + 5 * MINUTE
    assert cursor(repo, tid) == T0 + 10 * MINUTE
    assert cycle(cron, T0 + 5 * MINUTE + 50) == []  # the same occurrence is never admitted twice


def test_a_fire_exactly_at_the_start_is_admitted_in_the_same_cycle(repo, cron):
    tid = add_trigger(repo, "at-start", since_ms=T0)
    [fired] = cycle(cron, T0)
    assert (fired.outcome, fired.scheduled_for_ms) == ("admitted", T0)
    assert len(cron_runs(repo, tid)) == 1


def test_a_week_powered_off_admits_one_catch_up_run_and_one_missed_event(repo, cron):
    tid = add_trigger(repo, "hourly", "0 * * * *", since_ms=T0 - 1)
    cycle(cron, T0 - 1)  # initialised: next fire T0
    [fired] = cycle(cron, T0 + 7 * DAY + 17 * MINUTE)
    assert fired.outcome == "admitted"
    [run] = cron_runs(repo, tid)
    assert run.scheduled_for_ms == T0  # fire_once: the oldest missed occurrence runs once
    [missed] = events(repo, tid)
    assert (missed.type, missed.occurrences, missed.scheduled_for_ms) == ("missed", 7 * 24, T0 + 60 * MINUTE)
    assert cursor(repo, tid) == T0 + 7 * DAY + 60 * MINUTE  # the next one after now: no backlog
    assert cycle(cron, T0 + 7 * DAY + 18 * MINUTE) == []


def test_skip_past_the_grace_admits_nothing_and_records_the_missed_count(repo, cron):
    tid = add_trigger(repo, "hourly-skip", "0 * * * *", misfire="skip", grace_ms=30_000, since_ms=T0 - 1)
    cycle(cron, T0 - 1)
    [fired] = cycle(cron, T0 + 3 * 60 * MINUTE + 5 * MINUTE)  # 5 minutes late for 13:00
    assert (fired.outcome, fired.missed) == ("missed_only", 4)
    assert cron_runs(repo, tid) == []
    [missed] = events(repo, tid)
    assert (missed.type, missed.occurrences) == ("missed", 4)
    [fired] = cycle(cron, T0 + 4 * 60 * MINUTE + 20_000)  # 20 s late: within the grace
    assert (fired.outcome, fired.scheduled_for_ms) == ("admitted", T0 + 4 * 60 * MINUTE)


def test_a_disabled_task_or_a_deleted_trigger_admits_nothing(repo, cron):
    off = add_trigger(repo, "off", since_ms=T0)
    gone = add_trigger(repo, "gone", since_ms=T0)
    repo.tasks.set_enabled("off", False, actor_name="tester")
    with repo.store.write() as conn:
        conn.execute(triggers.update().where(triggers.c.id == gone).values(deleted_at_ms=T0))
    assert cycle(cron, T0 + DAY) == []
    assert cron_runs(repo, off) == [] and cron_runs(repo, gone) == []
    assert cron.next_fire_ms() is None


def start(repo, run_id: str) -> None:
    """Put a queued run into `running`, as dispatch would (overlap counts it)."""
    with repo.store.write() as conn:
        conn.execute(runs.update().where(runs.c.id == run_id).values(status="running"))


@pytest.mark.parametrize("overlap", ["queue", "skip", "replace"])
def test_overlap_when_the_previous_run_outlives_its_period(repo, cron, overlap):
    tid = add_trigger(repo, f"long-{overlap}", "* * * * *", overlap=overlap, since_ms=T0)
    [first] = cycle(cron, T0)
    start(repo, first.run_id)
    [second] = cycle(cron, T0 + MINUTE)
    if overlap == "queue":
        assert second.outcome == "admitted" and second.cancelled_run_id is None
        assert [r.status for r in cron_runs(repo, tid)] == ["running", "queued"]
        assert events(repo, tid) == []
    elif overlap == "skip":
        assert second.outcome == "skipped" and second.run_id is None
        assert [r.status for r in cron_runs(repo, tid)] == ["running"]
        [skipped] = events(repo, tid)
        assert (skipped.type, skipped.scheduled_for_ms, skipped.occurrences) == ("skipped", T0 + MINUTE, 1)
    else:
        assert (second.outcome, second.cancelled_run_id) == ("admitted", first.run_id)
        old, new = cron_runs(repo, tid)
        assert (old.cancel_reason, new.status) == ("policy", "queued")
    assert cursor(repo, tid) == T0 + 2 * MINUTE


@pytest.mark.parametrize("max_queued", [1, 3])
def test_queue_admits_while_fewer_than_max_queued_cron_runs_wait_then_records_skipped(repo, cron, max_queued):
    tid = add_trigger(repo, f"bounded{max_queued}", "* * * * *", since_ms=T0, max_queued=max_queued)
    [first] = cycle(cron, T0)
    start(repo, first.run_id)
    outcomes = [cycle(cron, T0 + m * MINUTE)[0].outcome for m in range(1, max_queued + 3)]
    assert outcomes == ["admitted"] * max_queued + ["skipped", "skipped"]
    assert [r.status for r in cron_runs(repo, tid)] == ["running"] + ["queued"] * max_queued
    assert [(e.type, e.scheduled_for_ms, e.occurrences) for e in events(repo, tid)] == [
        ("skipped", T0 + m * MINUTE, 1) for m in (max_queued + 1, max_queued + 2)]
    assert cursor(repo, tid) == T0 + (max_queued + 3) * MINUTE


def test_manual_runs_and_retries_are_never_counted_against_max_queued_nor_refused(repo, cron):
    tid = add_trigger(repo, "mixed", "* * * * *", since_ms=T0)
    [first] = cycle(cron, T0)
    start(repo, first.run_id)
    manual = [repo.runs.request("mixed").run.id for _ in range(2)]  # two manual runs wait `queued`
    [second] = cycle(cron, T0 + MINUTE)
    assert second.outcome == "admitted"  # no cron run waits: the manual ones do not count
    [third] = cycle(cron, T0 + 2 * MINUTE)
    assert third.outcome == "skipped"  # one cron run waits now: max_queued 1 reached
    # a manual run and a retry are admitted whatever waits
    assert repo.runs.request("mixed").created
    assert repo.runs.cancel(manual[0]).result == "cancelled"  # a finished run, to retry
    assert repo.runs.retry(manual[0]).created
    [fourth] = cycle(cron, T0 + 3 * MINUTE)
    assert fourth.outcome == "skipped"  # and they did not change the count either way
    with repo.store.read() as conn:
        waiting = conn.execute(select(runs.c.trigger_type).where(runs.c.status == "queued")
                               .order_by(runs.c.created_at_ms)).scalars().all()
    assert sorted(waiting) == ["cron", "manual", "manual", "manual"]
    assert [r.status for r in cron_runs(repo, tid)] == ["running", "queued"]


def test_each_fire_of_a_long_job_under_skip_is_recorded_once(repo, cron):
    tid = add_trigger(repo, "skipper", "* * * * *", overlap="skip", since_ms=T0)
    [first] = cycle(cron, T0)
    start(repo, first.run_id)
    for minute in range(1, 4):
        cycle(cron, T0 + minute * MINUTE + 100)
    assert len(cron_runs(repo, tid)) == 1
    assert [(e.type, e.scheduled_for_ms) for e in events(repo, tid)] == [
        ("skipped", T0 + m * MINUTE) for m in range(1, 4)]


def test_the_page_is_bounded_and_the_rest_waits_for_the_next_cycle(repo, cron):
    ids = [add_trigger(repo, f"t{i}", since_ms=T0) for i in range(5)]
    assert len(cycle(cron, T0, page=2)) == 2
    assert len(cycle(cron, T0, page=2)) == 2
    assert len(cycle(cron, T0, page=2)) == 1
    assert cycle(cron, T0, page=2) == []
    assert sum(len(cron_runs(repo, i)) for i in ids) == 5


def test_two_admitters_in_threads_admit_exactly_one_run_per_occurrence(repo, store_url):
    # room for every occurrence (max_concurrent 3): overlap and max_queued are not what this tests
    ids = [add_trigger(repo, f"race{i}", "* * * * *", since_ms=T0, max_concurrent=3) for i in range(6)]
    others = [Repository.open(store_url) for _ in range(2)]
    try:
        barrier = threading.Barrier(2)
        errors: list[BaseException] = []

        def admitter(r) -> None:
            cron = CronAdmission(r.store)
            try:
                for minute in range(3):
                    now = T0 + minute * MINUTE + 10
                    barrier.wait(timeout=10)
                    for due in cron.due(now, 16):
                        cron.fire(due, now, tick_ms=1000)
            except BaseException as err:  # noqa: BLE001 - reported below
                errors.append(err)

        threads = [threading.Thread(target=admitter, args=(r,)) for r in others]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not errors, errors
    finally:
        for r in others:
            r.close()
    for tid in ids:
        assert [r.scheduled_for_ms for r in cron_runs(repo, tid)] == [T0, T0 + MINUTE, T0 + 2 * MINUTE]


ADMITTER = textwrap.dedent("""
    import sys, time
    from qlactors.store.cadence.cron_admission import CronAdmission
    from qlactors.store.repository import Repository
    url, go, t0 = sys.argv[1], sys.argv[2], int(sys.argv[3])
    repo = Repository.open(url)
    cron = CronAdmission(repo.store)
    deadline = time.monotonic() + 20
    import os
    while not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.001)
    for minute in range(3):
        now = t0 + minute * 60_000 + 10
        for _ in range(3):  # the other process may hold the write lock: look again
            for due in cron.due(now, 16):
                cron.fire(due, now, tick_ms=1000)
    repo.close()
""")


def test_two_processes_on_one_sqlite_file_admit_exactly_one_run_per_occurrence(tmp_path):
    url = f"sqlite:///{tmp_path / 'q.db'}"
    repo = Repository.open(url)
    try:
        ids = [add_trigger(repo, f"proc{i}", "* * * * *", since_ms=T0, max_concurrent=3) for i in range(8)]
        go = tmp_path / "go"
        procs = [subprocess.Popen([sys.executable, "-c", ADMITTER, url, str(go), str(T0)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
        go.touch()
        for p in procs:
            out, err = p.communicate(timeout=60)
            assert p.returncode == 0, err.decode()
        for tid in ids:
            assert [r.scheduled_for_ms for r in cron_runs(repo, tid)] == [T0, T0 + MINUTE, T0 + 2 * MINUTE]
        with repo.store.read() as conn:
            assert conn.execute(select(func.count()).select_from(runs)).scalar_one() == 3 * len(ids)
    finally:
        repo.close()


def test_a_re_enabled_task_starts_from_the_re_enable_time_without_catching_up(repo, cron):
    import time

    tid = add_trigger(repo, "paused", since_ms=T0)
    [first] = cycle(cron, T0)
    assert first.outcome == "admitted"
    repo.tasks.set_enabled("paused", False, actor_name="tester")
    repo.tasks.set_enabled("paused", True, actor_name="tester")  # months later, in real time
    now = time.time_ns() // 1_000_000
    [fired] = cycle(cron, now)
    assert fired.outcome in ("initialised", "admitted")
    if fired.outcome == "admitted":  # only an occurrence at the re-enable instant itself
        assert fired.scheduled_for_ms >= now - 60_000 and fired.missed == 0
    assert [e.type for e in events(repo, tid)] == []  # the paused months are not "missed"
    assert len(cron_runs(repo, tid)) <= 2


def test_an_unreadable_schedule_is_set_aside_for_an_hour_and_does_not_block_the_others(repo, cron):
    bad = add_trigger(repo, "bad-zone", since_ms=T0)
    good = add_trigger(repo, "good", since_ms=T0)
    with repo.store.write() as conn:  # a zone the database no longer knows
        conn.execute(triggers.update().where(triggers.c.id == bad).values(tz="Mars/Olympus_Mons"))
    fired = {f.trigger_id: f for f in cycle(cron, T0, page=1) + cycle(cron, T0, page=1)}
    assert fired[bad].outcome == "invalid" and fired[bad].next_fire_at_ms == T0 + 3_600_000
    assert fired[good].outcome == "admitted"
    assert cron_runs(repo, bad) == [] and cursor(repo, bad) == T0 + 3_600_000


# --- the random delay (SEMANTICS §8): a not-before time per occurrence -----------------------

def test_a_random_delay_sets_the_runs_not_before_from_the_trigger_and_occurrence_only(repo, cron):
    from qlactors.domain.cron_delay import random_delay_ms

    tid = add_trigger(repo, "spread", "* * * * *", since_ms=T0, random_delay_ms=600_000, max_concurrent=3)
    plain = add_trigger(repo, "plain", "* * * * *", since_ms=T0, max_concurrent=3)
    for minute in range(3):
        cycle(cron, T0 + minute * MINUTE)
    spread = cron_runs(repo, tid)
    assert [r.scheduled_for_ms for r in spread] == [T0 + m * MINUTE for m in range(3)]
    for r in spread:
        assert r.not_before_ms == r.scheduled_for_ms + random_delay_ms(tid, r.scheduled_for_ms, 600_000)
        assert r.idempotency_key == f"cron:{tid}:1:{r.scheduled_for_ms}"  # the delay is not in the key
    assert len({r.not_before_ms - r.scheduled_for_ms for r in spread}) == 3  # one draw per occurrence
    assert [r.not_before_ms for r in cron_runs(repo, plain)] == [None] * 3
    # the same occurrence admitted again (a replay) returns the same run, same not-before
    again = repo.runs.admit_in  # through the store's own path: the idempotency key finds it
    with repo.store.write() as conn:
        head = conn.execute(select(tasks).where(tasks.c.name == "spread")).one()
        replay = again(conn, head, head.current_revision, idempotency_key=spread[0].idempotency_key)
    assert not replay.created and replay.run.id == spread[0].id and replay.run.not_before_ms == spread[0].not_before_ms
    assert repo.runs.get(spread[0].id).to_json()["not_before_ms"] == spread[0].not_before_ms


def test_a_queued_run_is_not_offered_before_its_not_before_and_the_cadence_wakes_for_it(repo, cron):
    from qlactors.store.cadence.control import Control
    from qlactors.store.dispatch.dispatch import Dispatch

    dispatch, control = Dispatch.open(repo.store), Control.open(repo.store)
    session = dispatch.sessions.register("edge", 8)
    repo.tasks.add(spec("later"), actor_name="tester")
    run_id = repo.runs.request("later").run.id
    with repo.store.read() as conn:
        now = repo.store.now_ms(conn)
    with repo.store.write() as conn:
        conn.execute(runs.update().where(runs.c.id == run_id).values(not_before_ms=now + 3_600_000))

    def offer():
        return dispatch.offers.one(session.worker_id, session.session_id, session.generation, new_id(), new_hash(),
                              log_cap_bytes=4096)

    assert offer() is None
    assert not control.status.queued_waiting()  # nothing to nudge executors for yet
    assert cron.next_not_before_ms() == now + 3_600_000  # the Scheduler's wake-up
    with repo.store.write() as conn:
        conn.execute(runs.update().where(runs.c.id == run_id).values(not_before_ms=now - 1))
    assert cron.next_not_before_ms() is None  # reached: the offer's business, not a wake-up's
    assert control.status.queued_waiting()
    offered = offer()
    assert offered is not None and offered.run_id == run_id
