"""Restarts and database outages together: a restarted actor's resume meets the outage and is
retried, a step silent during an outage is not counted towards escalation, one message failing
for longer than `store_outage_stop_ms` fails its actor.

Failures are real where the store can make them (another connection holds SQLite's write lock);
a read failure, which SQLite in WAL mode does not give, is injected as the `StoreUnavailable`
the store raises.
"""

from __future__ import annotations

import logging


from qlactors.actors import scheduler as scheduler_module
from qlactors.actors.recovery import Recovery
from qlactors.actors.retry import Retry
from qlactors.actors.scheduler import Scheduler
from qlactors.actors.signals import Tick
from qlactors.actors.supervisor import MAX_RESTARTS
from qlactors.store.engine import StoreUnavailable

from actor_harness import WAIT_S, Stub, wait_until
from test_actor_restarts import breakable, make_rig  # noqa: F401 - fixtures


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
    real = h.ctx.control.recovery_candidates
    failures = [0]

    def unavailable(*args, **kwargs):
        if failures[0] < MAX_RESTARTS + 2:  # more than the restarts that would escalate
            failures[0] += 1
            raise StoreUnavailable("the database is unavailable (database is locked); nothing was changed")
        return real(*args, **kwargs)

    monkeypatch.setattr(h.ctx.control, "recovery_candidates", unavailable)
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
