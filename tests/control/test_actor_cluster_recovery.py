"""ClusterRecovery on the cadence (SEMANTICS.md §10): the Scheduler's cycle marks an attempt with
evidence lost and the Retry step requeues it; a full page runs another cycle at once."""

from __future__ import annotations

import secrets

import pytest
from sqlalchemy import update

from qlactors.control.cluster_recovery import ClusterRecovery
from qlactors.control.retry import Retry
from qlactors.control.scheduler import Scheduler
from qlactors.runtime.signals import CycleDone, Tick
from qlactors.domain.retry import RetryPolicy
from qlactors.domain.transitions import ErrorCode
from qlactors.store.records import LeaseQuote
from qlactors.store.schema import run_dispatch_leases
from actor_harness import ActorHarness
from store_helpers import new_hash, spec

BOOT = "boot-a"


@pytest.fixture
def cadence(tmp_path):
    h = ActorHarness(tmp_path, recovery_page=2)
    try:
        h.ctx.control_side.recovery_grace_ms, h.ctx.control_side.drain_grace_ms = 120_000, 900_000
        h.start_bridge()
        h.ctx.admitting.set()
        h.stub("supervisor")
        h.start("recovery", ClusterRecovery)
        h.start("retry", Retry)
        h.scheduler = h.start("scheduler", Scheduler)
        yield h
    finally:
        h.close()


def stopped_and_expired(h, session, task: str) -> tuple[str, str]:
    """A started attempt on `session` that its worker attested it stopped, its lease expired."""
    d = h.ctx.control_side.dispatch
    run_id = h.repo.runs.request(task).run.id
    lease_hash = new_hash()
    view = d.offers.one(session.worker_id, session.session_id, session.generation, secrets.token_hex(8),
                   lease_hash, log_cap_bytes=0, lease_ttl_ms=30_000)
    fence = view.fence(lease_hash)
    assert d.reports.activate(fence, new_hash(), "ab/x.log").result == "applied"
    assert d.reports.started(fence, BOOT, 4242, 4242, 7).result == "applied"
    quote = LeaseQuote(run_id, view.attempt_id, view.offer_id, view.lease_generation, lease_hash)
    assert d.attestations.apply(session.worker_id, session.session_id, session.generation, quote, session.session_id,
                    session.generation, "stopped", run_lease_ms=30_000).result == "applied"
    with h.repo.store.write() as conn:
        conn.execute(update(run_dispatch_leases).where(run_dispatch_leases.c.attempt_id == view.attempt_id)
                     .values(expires_at_ms=1))
    return run_id, view.attempt_id


def worker_session(h):
    return h.ctx.control_side.dispatch.sessions.register("w1", 16, boot_id=BOOT, session_lease_ms=60_000)


def test_a_cycle_marks_an_evidenced_attempt_lost_and_retry_requeues_it(cadence):
    cadence.repo.tasks.add(spec("again", retry=RetryPolicy(max_attempts=2, retry_on_lost=True, safety="idempotent",
                                                           backoff_base_ms=0, backoff_max_ms=0)), actor_name="tester")
    run_id, attempt_id = stopped_and_expired(cadence, worker_session(cadence), "again")
    cadence.scheduler.tell(Tick("test"))
    [done] = cadence.inbox.wait("supervisor", CycleDone)
    assert done.ok
    run = cadence.repo.runs.get(run_id)
    assert run.state == "queued"
    assert [(a.number, a.state, a.error_code) for a in run.attempts] == [
        (1, "lost", ErrorCode.RECOVERY_PROCESS_STOPPED), (2, "claimed", None)]
    types = [e.type for e in run.events]
    assert types.index("attempt.lost") < types.index("run.retry_scheduled") < len(types) - 1


def test_a_full_recovery_page_runs_another_cycle_at_once(cadence):
    session = worker_session(cadence)
    runs = []
    for n in range(3):  # a page of 2: two pages
        cadence.repo.tasks.add(spec(f"plain{n}"), actor_name="tester")
        runs.append(stopped_and_expired(cadence, session, f"plain{n}")[0])
    cadence.scheduler.tell(Tick("test"))
    done = cadence.inbox.wait("supervisor", CycleDone, count=2)  # no second tick was sent
    assert all(d.ok for d in done)
    states = {cadence.repo.runs.get(r).attempts[0].state for r in runs}
    assert states == {"lost"}
