"""`show`'s exit code line and the EXIT/WORKER cells, from what the database holds (pure rendering)."""

from __future__ import annotations

import pytest

from qlactors.cli.render import exit_of, exit_text, worker_of
from qlactors.store.views import AttemptView, RunView


def _run(exit_code, signal, cancel_reason, **where) -> RunView:
    attempt = AttemptView(id="a1", number=1, state="timed_out", exit_code=exit_code, signal=signal,
                          error_code=None, log_dropped_bytes=0, deadline_at_ms=None, created_at_ms=1,
                          started_at_ms=2, finished_at_ms=3, **where)
    return RunView(id="r1", task="t", task_revision=1, state="timed_out", version=9, trigger_type="manual",
                   scheduled_for_ms=None, idempotency_key=None, cancel_reason=cancel_reason, error_code=None,
                   retry_of_run_id=None, created_at_ms=1, started_at_ms=2, finished_at_ms=3,
                   attempts=(attempt,), last_attempt=attempt)


@pytest.mark.parametrize("exit_code, signal, reason, line, cell", [
    (143, 15, "timeout", "143, killed by SIGTERM (stop: timeout)", "143 (SIGTERM)"),
    (137, 9, "user", "137, killed by SIGKILL (stop: user)", "137 (SIGKILL)"),
    (143, None, "user", "143 = 128 + SIGTERM (stop: user)", "143"),  # no kill by the stop recorded
    (143, None, None, "143", "143"),  # no stop was asked for: the job's own exit status
    (3, None, None, "3", "3"),
    (None, None, "user", "-", "-"),
])
def test_the_exit_line_names_the_signal_and_the_stop_reason_the_database_holds(exit_code, signal, reason,
                                                                                line, cell):
    run = _run(exit_code, signal, reason)
    assert (exit_of(run), exit_text(run.last_attempt)) == (line, cell)


def test_the_worker_cell_names_the_worker_its_generation_and_the_launchers_pid():
    assert worker_of(_run(0, None, None, worker_id="w1", session_generation=2, pid=4242).last_attempt) == \
        "w1 (gen 2, pid 4242)"
    assert worker_of(_run(0, None, None, worker_id="local", session_generation=1).last_attempt) == "local (gen 1)"
    assert worker_of(_run(0, None, None).last_attempt) == "-"
    assert worker_of(None) == "-"
