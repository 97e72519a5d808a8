"""The Scheduler actor alone, with stub recovery, retry and supervisor actors: the cycle's steps in
order, deadlines, failures and coalesced ticks (SEMANTICS.md §8, §10).

The harness (tests/harness/actor_harness.py) builds the EdgeContext on a SQLite file in a temp
home and starts one actor; the other names in the Directory are recording stubs. The rigs are
tests/harness/actor_rigs.py's.
"""

from __future__ import annotations

import time
from typing import Any

from qlactors.control import scheduler as scheduler_module
from qlactors.control.scheduler import Scheduler
from qlactors.domain.receipt import token_hash
from qlactors.runtime.signals import ActorFailed, CycleDone, StepDone, StepRequest, Tick

from actor_harness import QUIET_S
from actor_rigs import BOOT_ID, spec, new_token, sched, step_stub  # noqa: F401 - fixtures


def test_scheduler_a_tick_runs_recovery_then_retry_then_reports_the_cycle(sched):
    step_stub(sched, "recovery")
    step_stub(sched, "retry")
    sched.stub("supervisor")
    ref = sched.start("scheduler", Scheduler)
    ref.tell(Tick("test"))
    [done] = sched.inbox.wait("supervisor", CycleDone)
    # Nothing in flight and no step reported work: the idle tick may apply.
    assert done == CycleDone(ok=True, next_due_ms=None, stops=(), work_waiting=False, idle=True)
    assert sched.inbox.log() == [("recovery", StepRequest(1)), ("retry", StepRequest(1)), ("supervisor", done)]


def test_scheduler_a_cycle_commits_timeouts_and_reports_stops_and_waiting_work(sched):
    step_stub(sched, "recovery")
    step_stub(sched, "retry")
    sched.stub("supervisor")
    repo, d, s = sched.repo, sched.ctx.control_side.dispatch, sched.ctx.executor_side.session
    repo.tasks.add(spec("slow", timeout_ms=1, stop_grace_ms=700), actor_name="tester")
    run_id = repo.runs.request("slow").run.id
    lease_hash = token_hash(new_token())
    view = d.offers.one(s.worker_id, s.session_id, s.generation, "o1", lease_hash, log_cap_bytes=0)
    fence = view.fence(lease_hash)
    assert d.reports.activate(fence, token_hash(new_token()), "ab/x.log").result == "applied"
    assert d.reports.started(fence, BOOT_ID, 4242, 4242, 1).result == "applied"
    repo.tasks.add(spec("waiting"), actor_name="tester")
    repo.runs.request("waiting")
    time.sleep(0.005)  # past the 1 ms deadline
    ref = sched.start("scheduler", Scheduler)
    ref.tell(Tick("test"))
    [done] = sched.inbox.wait("supervisor", CycleDone)
    assert done.ok and done.work_waiting
    [stop] = set(done.stops)
    assert (stop.run_id, stop.attempt_id, stop.reason, stop.grace_ms, stop.pid) == (
        run_id, view.attempt_id, "timeout", 700, 4242)
    assert repo.runs.get(run_id).cancel_reason == "timeout"


def test_scheduler_a_cycle_lists_each_stop_order_once(sched):
    step_stub(sched, "recovery")
    step_stub(sched, "retry")
    sched.stub("supervisor")
    repo, d, s = sched.repo, sched.ctx.control_side.dispatch, sched.ctx.executor_side.session
    repo.tasks.add(spec("slow", timeout_ms=1), actor_name="tester")
    repo.runs.request("slow")
    lease_hash = token_hash(new_token())
    fence = d.offers.one(s.worker_id, s.session_id, s.generation, "o1", lease_hash, log_cap_bytes=0).fence(lease_hash)
    d.reports.activate(fence, token_hash(new_token()), "ab/x.log")
    time.sleep(0.005)
    sched.start("scheduler", Scheduler).tell(Tick("test"))
    [done] = sched.inbox.wait("supervisor", CycleDone)
    assert len(done.stops) == len(set(done.stops)) == 1


def test_scheduler_a_silent_step_ends_the_cycle_at_its_deadline_and_is_reported(sched, monkeypatch):
    monkeypatch.setattr(scheduler_module, "STEP_DEADLINE_S", 0.2)
    step_stub(sched, "recovery", silent=True)
    step_stub(sched, "retry")
    sched.stub("supervisor")
    ref = sched.start("scheduler", Scheduler)
    t0 = time.monotonic()
    ref.tell(Tick("test"))
    [done] = sched.inbox.wait("supervisor", CycleDone)
    assert time.monotonic() - t0 >= 0.2
    assert not done.ok and done.stops == () and not done.work_waiting
    [failed] = sched.inbox.wait("supervisor", ActorFailed)
    assert failed.name == "recovery"
    assert sched.inbox.items("retry") == []  # nothing after a step whose authority is unknown


def test_scheduler_a_failing_step_stops_the_cycle_before_retry(sched):
    step_stub(sched, "recovery", ok=False)
    step_stub(sched, "retry")
    sched.stub("supervisor")
    ref = sched.start("scheduler", Scheduler)
    ref.tell(Tick("test"))
    [done] = sched.inbox.wait("supervisor", CycleDone)
    assert not done.ok
    time.sleep(QUIET_S)
    assert sched.inbox.items("retry") == []
    assert sched.inbox.items("supervisor", ActorFailed) == []  # it answered: no restart needed


def test_scheduler_a_failed_cycle_withholds_authority_until_a_cycle_gets_through(sched):
    answers = {"ok": False}

    def recovery(message: Any) -> None:
        if isinstance(message, StepRequest):
            sched.directory.tell("scheduler", StepDone(message.cycle, "recovery", answers["ok"], detail="db down"))

    sched.stub("recovery", recovery)
    step_stub(sched, "retry")
    sched.stub("supervisor")
    assert sched.ctx.control_side.authority.is_set()  # nothing has failed yet
    ref = sched.start("scheduler", Scheduler)
    ref.tell(Tick("test"))
    [done] = sched.inbox.wait("supervisor", CycleDone)
    assert not done.ok and not sched.ctx.control_side.authority.is_set()
    answers["ok"] = True
    ref.tell(Tick("test"))
    done = sched.inbox.wait("supervisor", CycleDone, count=2)
    assert done[-1].ok and sched.ctx.control_side.authority.is_set()


def test_scheduler_a_step_actor_that_is_not_running_fails_the_cycle(sched):
    step_stub(sched, "recovery")
    sched.stub("supervisor")  # no "retry" in the directory
    ref = sched.start("scheduler", Scheduler)
    ref.tell(Tick("test"))
    [done] = sched.inbox.wait("supervisor", CycleDone)
    assert not done.ok


def test_scheduler_ticks_during_a_cycle_are_coalesced_into_one_more_cycle(sched):
    step_stub(sched, "recovery", silent=True)  # the test answers for it, when it chooses
    step_stub(sched, "retry")
    sched.stub("supervisor")
    ref = sched.start("scheduler", Scheduler)
    for _ in range(4):
        ref.tell(Tick("test"))
    sched.inbox.wait("recovery", StepRequest)
    ref.tell(StepDone(0, "recovery", True))  # a late answer of another cycle changes nothing
    ref.tell(StepDone(1, "recovery", True))
    sched.inbox.wait("recovery", StepRequest, count=2)
    ref.tell(StepDone(2, "recovery", True))
    done = sched.inbox.wait("supervisor", CycleDone, count=2)
    assert all(d.ok for d in done)
    time.sleep(QUIET_S)
    assert sched.inbox.items("recovery") == [StepRequest(1), StepRequest(2)]
    assert sched.inbox.items("retry") == [StepRequest(1), StepRequest(2)]
    assert len(sched.inbox.items("supervisor", CycleDone)) == 2


def test_scheduler_a_due_schedule_is_admitted_in_the_cycle_and_the_next_fire_is_reported(sched):
    from qlactors.store.intent.triggers import TriggerOptions

    step_stub(sched, "recovery")
    step_stub(sched, "retry")
    sched.stub("supervisor")
    # max_queued 4: a slow first cycle may admit the fire it initialised on, which (queued, no
    # executor here) must not make the next fire a `skipped` one.
    sched.repo.tasks.add(spec("every-second", max_queued=4), trigger=TriggerOptions(cron="* * * * * *",
                                                                                  tz="UTC"), actor_name="tester")
    ref = sched.start("scheduler", Scheduler)
    ref.tell(Tick("test"))
    [done] = sched.inbox.wait("supervisor", CycleDone)
    # First sight initialises the cursor (and admits a fire that falls exactly on it).
    assert done.ok and done.next_due_ms is not None and not done.idle
    time.sleep(max(0.0, done.next_due_ms / 1000 - time.time()) + 0.01)
    ref.tell(Tick("due"))
    [_, second] = sched.inbox.wait("supervisor", CycleDone, count=2)
    runs = [r for r in sched.repo.runs.list().runs if r.trigger_type == "cron"]
    assert second.ok and second.work_waiting and runs
    assert done.next_due_ms in {r.scheduled_for_ms for r in runs}
    assert second.next_due_ms > done.next_due_ms  # the cursor moved past the admitted fire


def test_scheduler_a_failing_cron_step_ends_the_cycle_before_stops_and_admission(sched, monkeypatch):
    step_stub(sched, "recovery")
    step_stub(sched, "retry")
    sched.stub("supervisor")
    sched.repo.tasks.add(spec("waiting"), actor_name="tester")
    sched.repo.runs.request("waiting")

    def broken(*_a, **_k):
        raise RuntimeError("database is locked")
    monkeypatch.setattr(sched.ctx.control_side.cron, "due", broken)
    sched.start("scheduler", Scheduler).tell(Tick("test"))
    [done] = sched.inbox.wait("supervisor", CycleDone)
    assert not done.ok and not done.work_waiting and done.stops == ()
