"""The Retry actor alone, on the real store: a lost run is resolved by its retry policy
(SEMANTICS.md §1, §10).

The harness (tests/harness/actor_harness.py) builds the EdgeContext on a SQLite file in a temp
home and starts one actor; the other names in the Directory are recording stubs. The rigs are
tests/harness/actor_rigs.py's.
"""

from __future__ import annotations

from qlactors.control.retry import Retry
from qlactors.domain.receipt import token_hash
from qlactors.domain.retry import RetryPolicy
from qlactors.domain.transitions import ErrorCode
from qlactors.runtime.signals import StepDone, StepRequest

from actor_rigs import spec, new_token, Flights, rec  # noqa: F401 - fixtures


def test_retry_resolves_a_lost_run_without_policy_as_failed(rec):
    flights = Flights(rec, rec.ctx.executor_side.session)
    run_id, attempt_id = flights.make("claimed")
    assert rec.ctx.control_side.control.recovery.mark_lost(run_id, attempt_id, ErrorCode.RECOVERY_UNSTARTED_CLAIM).result == "applied"
    ref = rec.start("retry", Retry)
    ref.tell(StepRequest(5))
    [done] = rec.inbox.wait("scheduler", StepDone)
    assert done == StepDone(5, "retry", True, pending=True)  # it resolved a lost run
    run = rec.repo.runs.get(run_id)
    assert (run.state, run.error_code) == ("failed", ErrorCode.RUN_LOST_RETRY_DISABLED)


def test_retry_requeues_a_lost_run_whose_policy_allows_it(rec):
    rec.repo.tasks.add(spec("again", retry=RetryPolicy(max_attempts=2, retry_on_lost=True, safety="idempotent",
                                                       backoff_base_ms=0, backoff_max_ms=0)), actor_name="tester")
    run_id = rec.repo.runs.request("again").run.id
    s, lease_hash = rec.ctx.executor_side.session, token_hash(new_token())
    view = rec.ctx.control_side.dispatch.offers.one(s.worker_id, s.session_id, s.generation, "o1", lease_hash, log_cap_bytes=0)
    rec.ctx.control_side.control.recovery.mark_lost(run_id, view.attempt_id, ErrorCode.RECOVERY_UNSTARTED_CLAIM)
    ref = rec.start("retry", Retry)
    ref.tell(StepRequest(1))
    assert rec.inbox.wait("scheduler", StepDone)[0].ok
    run = rec.repo.runs.get(run_id)
    assert run.state == "queued"
    assert [(a.number, a.state) for a in run.attempts] == [(1, "lost"), (2, "claimed")]
