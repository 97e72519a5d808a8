"""Cron with several control replicas on the real PostgreSQL (SEMANTICS.md §8, §10): each
decision takes its schedule row `FOR UPDATE SKIP LOCKED`, so two replicas never admit an
occurrence twice, never wait on each other, and every occurrence is either a run or counted once
in a `missed` event."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import select

from qlactors.store.cadence.cron_admission import CronAdmission
from qlactors.store.repository import Repository
from qlactors.store.schema import trigger_events, trigger_schedules
from cron_helpers import MINUTE, T0, add_trigger, cron_runs, cursor

pytestmark = pytest.mark.postgres

# Observed minutes of the replicas' cycles: the jumps are downtime (fire_once: one run, the rest missed).
STEPS = [1, 2, 3, 10, 11, 12, 30, 31]


@pytest.fixture
def replicas(pg_schema_url):
    repos = [Repository.open(pg_schema_url) for _ in range(3)]  # the test's own, and two replicas
    yield repos
    for r in repos:
        r.close()


def missed_minutes(repo, trigger_id) -> list[int]:
    with repo.store.read() as conn:
        rows = conn.execute(select(trigger_events).where(trigger_events.c.trigger_id == trigger_id)).all()
    assert {r.type for r in rows} <= {"missed"}
    return [r.scheduled_for_ms + i * MINUTE for r in rows for i in range(r.occurrences)]


def test_two_replicas_admit_each_occurrence_once_and_count_every_miss_once(replicas):
    repo, *others = replicas
    ids = [add_trigger(repo, f"rep{i}", "* * * * *", since_ms=T0, max_concurrent=50, max_queued=50)
           for i in range(8)]
    barrier, errors = threading.Barrier(2), []
    fired = [[], []]

    def replica(i):
        cron = CronAdmission(others[i].store)
        try:
            for minute in STEPS:
                now = T0 + minute * MINUTE + 10
                barrier.wait(timeout=30)
                for due in cron.due(now, 16):
                    fired[i].append(cron.fire(due, now, tick_ms=1000).outcome)
        except BaseException as err:  # reported below
            errors.append(err)

    threads = [threading.Thread(target=replica, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    for tid in ids:
        admitted = [r.scheduled_for_ms for r in cron_runs(repo, tid)]
        missed = missed_minutes(repo, tid)
        assert len(admitted) == len(set(admitted)) == len(STEPS)  # one run per observed cycle
        assert not set(admitted) & set(missed) and len(missed) == len(set(missed))
        handled = sorted(admitted + missed)
        assert handled == list(range(T0, cursor(repo, tid), MINUTE))  # every occurrence, once


def test_a_replica_skips_a_schedule_another_replica_is_deciding_instead_of_waiting(replicas):
    repo, first, second = replicas
    tid = add_trigger(repo, "held", "* * * * *", since_ms=T0)
    cron = CronAdmission(second.store)
    now = T0 + MINUTE + 10
    [due] = cron.due(now, 16)
    answer = []
    with first.store.engine.connect() as conn:
        with conn.begin():
            # the other replica's decision in flight: it holds the schedule row
            conn.execute(select(trigger_schedules).where(trigger_schedules.c.trigger_id == tid)
                         .with_for_update()).one()
            worker = threading.Thread(target=lambda: answer.append(cron.fire(due, now, tick_ms=1000)))
            worker.start()
            worker.join(60)
            finished_while_held = not worker.is_alive()
        worker.join(60)
    assert finished_while_held  # it never waited for the lock
    assert [f.outcome for f in answer] == ["lost_race"] and cron_runs(repo, tid) == []
    # once the row is free, the next cycle decides it
    [again] = cron.due(now, 16)
    assert cron.fire(again, now, tick_ms=1000).outcome in ("initialised", "admitted")
