"""`status` says when the cadence fails (issue 17 point 9): the step a cycle failed at (it raised
or stayed silent, so nothing is offered), its error and since when, cleared by the next cycle
that gets through. The Scheduler with stub steps; a replica's row on SQLite and PostgreSQL and
the real cluster `status`; a real `qlactors edge` whose retry step breaks on a planted run and
the real `status`."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import sys
import time

import pytest

from qlactors.control.cycle_health import CycleFailure
from qlactors.control.scheduler import Scheduler
from qlactors.runtime.signals import CycleDone, StepDone, StepRequest, Tick
from qlactors.store.cadence.cluster_status import read_cluster_status
from qlactors.store.health import ErrorTally
from qlactors.store.admin.replicas import Replicas

from edge_harness import Home, wait_until
from actor_rigs import sched, step_stub  # noqa: F401 - the fixture


def _cycle(h, ref, n: int) -> CycleDone:
    """Cycle `n` (1, 2, ...): one tick, then its CycleDone."""
    ref.tell(Tick("test"))
    return h.inbox.wait("supervisor", CycleDone, count=n)[-1]


def test_the_scheduler_records_the_failing_step_its_error_and_since_when(sched):  # noqa: F811
    broken = {"retry": True}

    def retry(message) -> None:
        if isinstance(message, StepRequest):
            ok = not broken["retry"]
            sched.directory.tell("scheduler", StepDone(message.cycle, "retry", ok, "" if ok else "ValueError('bad row')"))

    step_stub(sched, "recovery")
    sched.stub("retry", retry)
    sched.stub("supervisor")
    ref = sched.start("scheduler", Scheduler)
    health = sched.ctx.control_side.cycle_health
    assert health.current is None
    before = int(time.time() * 1000)
    assert not _cycle(sched, ref, 1).ok
    first = health.current
    assert (first.step, first.error) == ("retry", "ValueError('bad row')")
    assert before <= first.since_ms <= int(time.time() * 1000)
    assert not _cycle(sched, ref, 2).ok
    assert health.current == first  # the same failure: since its first cycle
    broken["retry"] = False
    assert _cycle(sched, ref, 3).ok
    assert health.current is None


def test_a_silent_step_is_recorded_as_failing(sched, monkeypatch):  # noqa: F811
    from qlactors.control import scheduler

    monkeypatch.setattr(scheduler, "STEP_DEADLINE_S", 0.2)
    step_stub(sched, "recovery", silent=True)
    sched.stub("supervisor")
    ref = sched.start("scheduler", Scheduler)
    assert not _cycle(sched, ref, 1).ok
    failure = sched.ctx.control_side.cycle_health.current
    assert (failure.step, failure.error) == ("recovery", "did not answer within 0.2 s")


def test_a_replicas_row_carries_its_cycle_failure_until_a_cycle_gets_through(repo):
    replicas = Replicas(repo.store)
    replica_id = replicas.register("host-a", 4242, "tcp://127.0.0.1:1")
    failure = CycleFailure("recovery", "RuntimeError('head candidate')", 1_700_000_000_000)
    replicas.heartbeat(replica_id, ErrorTally(0, None, None), failure)
    [view] = read_cluster_status(repo.store, 1000, recovery_grace_ms=0, drain_grace_ms=0).replicas
    assert view.cycle_failure == {"step": "recovery", "error": "RuntimeError('head candidate')",
                                  "since_ms": 1_700_000_000_000}
    assert view.to_json()["cycle_failure"] == view.cycle_failure
    replicas.heartbeat(replica_id, ErrorTally(0, None, None), None)
    [view] = read_cluster_status(repo.store, 1000, recovery_grace_ms=0, drain_grace_ms=0).replicas
    assert view.cycle_failure is None and view.to_json()["cycle_failure"] is None


# -- a real edge runtime ----------------------------------------------------------------------------

CONFIG = """\
[runtime]
cadence_tick_ms = 200
"""


def _plant_a_run_retry_cannot_read(home: Home, run_id: str) -> None:
    """The run `lost` with a policy snapshot no RetryPolicy accepts: the retry step raises on it
    at every cycle (a head candidate that breaks the step), as a corrupt row would."""
    with contextlib.closing(sqlite3.connect(home.db_path, timeout=10)) as conn:
        conn.execute("PRAGMA ignore_check_constraints = ON")
        conn.execute("UPDATE runs SET status = 'lost' WHERE id = ?", (run_id,))
        conn.execute("UPDATE run_attempts SET status = 'lost' WHERE run_id = ?", (run_id,))
        conn.execute("INSERT OR REPLACE INTO run_retry_policies (run_id, max_attempts, retry_on_lost, safety, "
                     "backoff_base_ms, backoff_max_ms, version, created_at_ms, updated_at_ms) "
                     "VALUES (?, 1, 0, 'bogus', 0, 0, 0, 0, 0)", (run_id,))
        conn.commit()


def _status(home: Home) -> dict:
    done = home.ql("status", "--json")
    assert done.returncode == 0, (done.stdout, done.stderr, home.edge_logs())
    return json.loads(done.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux")
def test_edge_status_shows_the_failing_step_and_its_error_and_clears_after(tmp_path):
    from qlactors.runtime.home import read_cycle_failure

    home = Home(tmp_path, CONFIG)
    home.add_tasks(("job", "--", "/bin/true"))
    run_id = home.run("job")
    _plant_a_run_retry_cannot_read(home, run_id)
    edge = home.start_edge()
    try:
        wait_until(lambda: read_cycle_failure(home.path), 15, lambda: home.edge_logs())  # then the real command
        failure = _status(home)["cycle_failure"]
        assert failure["step"] == "retry" and "bogus" in failure["error"], failure
        assert failure["since_ms"] <= int(time.time() * 1000)
        text = home.ok("status").stdout
        assert "cadence: failing since " in text and "at step retry: " in text and "bogus" in text, text
        assert "nothing is offered until a cycle gets through" in text
        home.ok("cancel", run_id)  # a lost run is cancelled at once: the step has nothing to break on
        wait_until(lambda: read_cycle_failure(home.path) is None, 15, lambda: home.edge_logs())
        assert _status(home)["cycle_failure"] is None
        assert "cadence:" not in home.ok("status").stdout
        ok_run = home.run("job")  # offers again
        assert home.wait_terminal(ok_run) == "succeeded"
    finally:
        edge.terminate()
