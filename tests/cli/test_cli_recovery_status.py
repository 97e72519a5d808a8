"""`status` and `show` on a cluster name the attempts recovery waits on and why (SEMANTICS.md §10
step 1): the real command against a migrated PostgreSQL database."""

from __future__ import annotations

import json

import pytest

from qlactors.domain.retry import RetryPolicy
from qlactors.domain.states import RetrySafety
from qlactors.store.dispatch.dispatch import Dispatch
from cli_cluster_harness import cluster  # noqa: F401 (the fixture)
from session_steps import attest, expire_lease, expire_session, launch, register

pytestmark = pytest.mark.postgres


def test_status_and_show_give_each_waiting_attempts_reason(cluster):  # noqa: F811
    dispatch = Dispatch.open(cluster.repo.store)
    session = register(dispatch, "w1")
    unknown = launch(cluster.repo, dispatch, session)
    attest(dispatch, session, unknown, session, "launch_unknown")
    idempotent = launch(cluster.repo, dispatch, session,
                        retry=RetryPolicy(max_attempts=2, retry_on_lost=True, safety=RetrySafety.IDEMPOTENT))
    evidenced = launch(cluster.repo, dispatch, session)
    attest(dispatch, session, evidenced, session, "stopped")  # recovery's to mark lost: not waiting
    healthy = launch(cluster.repo, dispatch, session)
    for flight in (unknown, idempotent, evidenced):
        expire_lease(cluster.repo, flight.quote.attempt_id)
    expire_session(cluster.repo, session.session_id)  # ended at 1 ms: the idempotent grace is over long ago

    report = json.loads(cluster.ql("status", "--json").stdout)
    waiting = {w["attempt_id"]: w for w in report["unresolved_recoveries"]}
    assert set(waiting) == {unknown.quote.attempt_id}  # the idempotent one is due: recovery's too
    entry = waiting[unknown.quote.attempt_id]
    assert (entry["run_id"], entry["attempt_status"], entry["worker_id"], entry["evidence"]) == (
        unknown.quote.run_id, "running", "w1", "launch_unknown")
    assert entry["why"].startswith("lease of worker w1 expired ")
    assert "waiting for evidence: launch outcome unknown" in entry["why"]
    assert "`qlactors worker retire w1 --confirm-stopped`" in entry["why"]
    text = cluster.ql("status").stdout
    assert "unresolved recoveries: 1" in text
    assert f"run {unknown.quote.run_id} attempt {unknown.quote.attempt_id} (running): lease of worker w1" in text

    shown = json.loads(cluster.ok("show", unknown.quote.run_id, "--json").stdout)
    assert shown["attempts"][-1]["recovery"]["waiting"] == entry["why"]
    assert "recovery: attempt 1 waits: lease of worker w1 expired" in cluster.ok("show", unknown.quote.run_id).stdout
    for flight in (healthy, evidenced, idempotent):  # live lease, or evidence: nothing to wait for
        shown = json.loads(cluster.ok("show", flight.quote.run_id, "--json").stdout)
        assert "recovery" not in shown["attempts"][-1]
        assert "recovery:" not in cluster.ok("show", flight.quote.run_id).stdout


def test_status_says_when_an_idempotent_attempt_will_be_lost(cluster):  # noqa: F811
    dispatch = Dispatch.open(cluster.repo.store)
    session = register(dispatch, "w1")
    flight = launch(cluster.repo, dispatch, session,
                    retry=RetryPolicy(max_attempts=2, retry_on_lost=True, safety=RetrySafety.IDEMPOTENT))
    expire_lease(cluster.repo, flight.quote.attempt_id)
    register(dispatch, "w1")  # superseded now: lost once the recovery grace (2 min by default) is over
    [entry] = json.loads(cluster.ql("status", "--json").stdout)["unresolved_recoveries"]
    assert "idempotent: lost at " in entry["why"] and entry["eligible_at_ms"] is not None
