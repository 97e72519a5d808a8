"""Restarts and database outages together: a restarted actor's resume meets the outage and is
retried, a step silent during an outage is not counted towards escalation, one message failing
for longer than `store_outage_stop_ms` fails its actor, `edge --cancel-running` shuts down even
when the database fails, and the outage status file never shows an outage that ended.

Failures are real where the store can make them (another connection holds SQLite's write lock);
a read failure, which SQLite in WAL mode does not give, is injected as the `StoreUnavailable`
the store raises.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from dataclasses import replace

import pykka

from qlactors.control import scheduler as scheduler_module
from qlactors.control.recovery import Recovery
from qlactors.control.retry import Retry
from qlactors.control.scheduler import Scheduler
from qlactors.runtime.signals import Tick
from qlactors.runtime.supervisor import MAX_RESTARTS
from qlactors.config import DEFAULTS, Config
from qlactors.profiles.edge import EdgeRuntime
from qlactors.runtime.home import STORE_OUTAGE_FILE, _write_json, read_store_outage
from qlactors.errors import StoreUnavailable
from qlactors.store.repository import Repository

from actor_harness import WAIT_S, ActorHarness, Stub, attempt_row, wait_until
from restart_rig import breakable, make_rig  # noqa: F401 - fixtures
from actor_rigs import spec
from outage_rig import short_busy_timeout, write_locked  # noqa: F401 - fixture


def _restarts(caplog, name: str) -> int:
    return len([r for r in caplog.records if "event=actor_restarted" in r.getMessage()
                and f"actor={name} " in r.getMessage()])


def test_a_recovery_restarted_during_an_outage_retries_its_resume_instead_of_failing_again(
        make_rig, monkeypatch, caplog):
    rig = make_rig("recovery")
    h = rig.h
    h.stub("scheduler")
    h.start("recovery", Recovery)
    h.inbox.wait("scheduler", Tick, where=lambda t: t.reason == "recovery_resumed")
    real = h.ctx.control_side.control.recovery.candidates
    failures = [0]

    def unavailable(*args, **kwargs):
        if failures[0] < MAX_RESTARTS + 2:  # more than the restarts that would escalate
            failures[0] += 1
            raise StoreUnavailable("the database is unavailable (database is locked); nothing was changed")
        return real(*args, **kwargs)

    monkeypatch.setattr(h.ctx.control_side.control.recovery, "candidates", unavailable)
    caplog.set_level(logging.WARNING)
    rig.fail("recovery")
    h.inbox.wait("scheduler", Tick, count=2, where=lambda t: t.reason == "recovery_resumed")
    assert failures[0] == MAX_RESTARTS + 2
    assert not h.ctx.fatal.event.is_set(), h.ctx.fatal.reason
    assert _restarts(caplog, "recovery") == 1  # only the real failure: the outage was retried
    assert len([r for r in caplog.records if "event=store_retry actor=recovery message=Resume"
                in r.getMessage()]) == MAX_RESTARTS + 2


def test_a_step_silent_during_a_database_outage_is_restarted_but_not_counted(make_rig, monkeypatch, caplog):
    monkeypatch.setattr(scheduler_module, "STEP_DEADLINE_S", 0.05)
    rig = make_rig("recovery", cadence_tick_ms=100)
    h = rig.h
    h.ctx.admitting.clear()  # no cron page: nothing but the silent step in a cycle
    made = [0]

    def silent_recovery():
        made[0] += 1
        return Stub.start("recovery", h.inbox)

    rig.factories["recovery"] = silent_recovery
    h.stub("recovery")
    h.start("scheduler", Scheduler)
    caplog.set_level(logging.WARNING, logger="qlactors.supervisor")
    health = h.repo.store.health
    health.failed("database is locked")  # what the store records when a write meets the lock
    h.directory.tell("scheduler", Tick("test"))  # then the Supervisor's cadence goes on cycling
    wait_until(lambda: made[0] >= MAX_RESTARTS + 3, what="silent steps restarted")
    assert not h.ctx.fatal.event.is_set(), h.ctx.fatal.reason
    assert "counted=False" in [r for r in caplog.records if "event=actor_restarted" in r.getMessage()][0].getMessage()
    # Once the database answers again, a silent step is a broken actor: it is counted and escalates.
    health.succeeded()
    wait_until(h.ctx.fatal.event.is_set, what="the escalation")
    assert h.ctx.fatal.reason == (f"actor recovery failed {MAX_RESTARTS + 1} times, "
                                  "last: silent past its step deadline")


class Jam:
    """A test-only message whose handling meets an unavailable database every time."""


def test_one_message_failing_longer_than_store_outage_stop_ms_fails_its_actor(make_rig, monkeypatch, caplog):
    def jammed(_msg, _peer):
        raise StoreUnavailable("the database is unavailable (disk I/O error); nothing was changed")

    original = Retry.handlers
    monkeypatch.setattr(Retry, "handlers", lambda self: {**original(self), Jam: jammed})
    rig = make_rig("retry", store_outage_stop_ms=1_000)
    h = rig.h
    first = h.start("retry", Retry)
    caplog.set_level(logging.WARNING)
    first.tell(Jam())
    replacement = wait_until(lambda: (ref := h.directory.get("retry")) is not first and ref, timeout=WAIT_S,
                             what="the actor failed and restarted")
    assert not first.is_alive()
    messages = [r.getMessage() for r in caplog.records]
    assert len([t for t in messages if "event=store_retry actor=retry message=Jam" in t]) >= 3
    assert any("event=store_retries_exhausted actor=retry message=Jam" in t for t in messages)
    assert _restarts(caplog, "retry") == 1
    assert replacement.is_alive() and not h.ctx.fatal.event.is_set()


def test_cancel_running_shutdown_with_the_database_locked_stops_every_actor_and_returns(
        tmp_path, short_busy_timeout, caplog):  # noqa: F811
    caplog.set_level(logging.ERROR, logger="qlactors.edge")
    home = tmp_path / "home"
    config = Config(home=home, profile="edge", database_url=f"sqlite:///{home / 'qlactors.db'}",
                    runtime=replace(DEFAULTS["edge"], shutdown_drain_ms=2_000))
    runtime = EdgeRuntime(config, cancel_running=True)
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["status"] = runtime.run()
        except BaseException as err:  # before the fix: the error escaped, actors left running
            outcome["error"] = err

    thread = threading.Thread(target=run, name="test-edge", daemon=True)
    repo = None
    pgid = None
    try:
        thread.start()
        assert runtime.started.wait(60)
        repo = Repository.open(config.database_url)
        repo.tasks.add(spec("job", ["sleep", "60"]), actor_name="tester")
        run_id = repo.runs.request("job").run.id
        runtime.ctx.directory.tell("supervisor", "nudge")
        wait_until(lambda: repo.runs.get(run_id).state == "running", timeout=30, what="the job running")
        pgid = attempt_row(repo, repo.runs.get(run_id).attempts[0].id).pgid
        with write_locked(home / "qlactors.db"):
            runtime.stop()
            thread.join(60)
            assert not thread.is_alive(), "the shutdown hung"
        assert "error" not in outcome, outcome
        assert outcome["status"] == 0
        assert pykka.ActorRegistry.get_all() == []
        assert any("event=cancel_running_failed" in r.getMessage() and "database is locked" in r.getMessage()
                   for r in caplog.records)
        assert repo.runs.get(run_id).state == "running"  # not cancelled: left for the next start
    finally:
        if thread.is_alive() or "error" in outcome:
            pykka.ActorRegistry.stop_all(timeout=WAIT_S)
        if pgid is not None:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                os.waitpid(pgid, 0)  # the launcher (group leader) was our child
            except ChildProcessError:
                pass
        if repo is not None:
            repo.close()


def test_a_late_outage_change_never_publishes_an_outage_that_ended(tmp_path):
    h = ActorHarness(tmp_path)
    try:
        health = h.repo.store.health
        health.failed("database is locked")
        stale = health.outage()
        assert read_store_outage(h.config.home)["failures"] == 1
        health.succeeded()
        assert read_store_outage(h.config.home) is None
        # The failing thread's own change handling comes last (it runs outside the health lock).
        health._on_change(stale)
        assert read_store_outage(h.config.home) is None
    finally:
        h.close()


def test_concurrent_writers_of_one_status_file_never_share_a_temp_file(tmp_path):
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def write(n: int) -> None:
        start.wait()
        try:
            for i in range(300):
                _write_json(tmp_path, STORE_OUTAGE_FILE, {"writer": n, "i": i, "pad": "x" * (n * 1000)})
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S * 6)
    assert errors == []
    data = read_store_outage(tmp_path)
    assert data is not None and data["i"] == 299 and len(data["pad"]) == data["writer"] * 1000
    assert sorted(p.name for p in tmp_path.iterdir()) == [STORE_OUTAGE_FILE]  # no temp file left
