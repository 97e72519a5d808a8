"""Cluster recovery's evidence vocabulary (SEMANTICS.md §10 step 1): the code of each kind of proof
and the reason an attempt waits. Pure."""

from __future__ import annotations

import pytest

from qlactors.domain.recovery_evidence import (
    EVIDENCE_KINDS,
    TRUSTED_FACTS,
    WaitingFacts,
    error_code,
    waiting,
)
from qlactors.domain.transitions import ErrorCode

NOW = 1_800_000_000_000
GRACE = 120_000


def test_every_kind_has_its_own_code():
    codes = {kind: error_code(kind) for kind in EVIDENCE_KINDS}
    assert codes == {
        "stopped": ErrorCode.RECOVERY_PROCESS_STOPPED,
        "ended": ErrorCode.RECOVERY_PROCESS_EXITED_WITHOUT_RECEIPT,
        "ended_with_receipt": ErrorCode.RECOVERY_PROCESS_ENDED_WITH_RECEIPT,
        "never_launched": ErrorCode.RECOVERY_NEVER_LAUNCHED,
        "rebooted": ErrorCode.RECOVERY_HOST_REBOOTED,
        "retired": ErrorCode.RECOVERY_WORKER_RETIRED,
        "confirmed_stopped": ErrorCode.RECOVERY_CONFIRMED_STOPPED,
        "session_ended": ErrorCode.RECOVERY_SESSION_ENDED,
    }
    assert len(set(codes.values())) == len(codes)


@pytest.mark.parametrize("kind", ["launch_unknown", "running", "", "unreadable"])
def test_anything_else_is_not_evidence(kind):
    assert kind not in TRUSTED_FACTS
    with pytest.raises(ValueError):
        error_code(kind)


def facts(**kw):
    base = dict(worker_id="w1", lease_expires_at_ms=NOW - 12_000, evidence=None, safety="unknown",
                session_ended_at_ms=None)
    base.update(kw)
    return WaitingFacts(**base)


def test_unknown_safety_waits_for_the_worker_or_retire():
    why = waiting(facts(evidence="launch_unknown", session_ended_at_ms=NOW - 600_000), NOW, GRACE)
    assert why.reason == ("lease of worker w1 expired 12 s ago; waiting for evidence: launch outcome unknown; "
                          "unknown safety: waits for the worker or `qlactors worker retire w1 --confirm-stopped`")
    assert why.eligible_at_ms is None


def test_idempotent_says_when_it_will_be_lost():
    why = waiting(facts(safety="idempotent", session_ended_at_ms=NOW - 20_000), NOW, GRACE)
    assert why.eligible_at_ms == NOW - 20_000 + GRACE
    assert why.reason.endswith("idempotent: lost at 2027-01-15 08:01:40Z once the grace has passed")


def test_idempotent_with_a_live_session_waits_for_its_end():
    why = waiting(facts(safety="deduplicated", lease_expires_at_ms=None), NOW, GRACE)
    assert why.reason.startswith("no live lease (worker w1); waiting for evidence; deduplicated: lost once ")
    assert "recovery grace (2 min)" in why.reason and why.eligible_at_ms is None


def test_a_drained_session_says_so_and_that_the_drain_grace_counts():
    why = waiting(facts(safety="idempotent", session_ended_at_ms=NOW + 900_000, session_drained=True), NOW, GRACE)
    assert "worker w1 drained its session (SIGTERM): its restart re-attests it" in why.reason
    assert why.eligible_at_ms == NOW + 900_000 + GRACE
    assert why.reason.endswith("once the drain grace and the recovery grace have passed")
    unknown = waiting(facts(session_drained=True), NOW, GRACE)
    assert "drained its session" in unknown.reason and unknown.eligible_at_ms is None
    assert "drained" not in waiting(facts(safety="idempotent"), NOW, GRACE).reason


def test_a_fact_about_another_lease_generation_waits_and_says_so():
    why = waiting(facts(evidence="stopped", evidence_lease_generation=1, lease_generation=2), NOW, GRACE)
    assert "waiting for evidence: the recorded `stopped` is about lease generation 1, not the current 2" in why.reason
    old = waiting(facts(evidence="never_launched", lease_generation=3), NOW, GRACE)
    assert "the recorded `never_launched` names no lease generation, not the current 3" in old.reason
    assert "lease generation" not in waiting(facts(evidence="launch_unknown", evidence_lease_generation=2,
                                                   lease_generation=2), NOW, GRACE).reason


def test_unknown_safety_names_the_one_attempt_confirm_for_its_run():
    why = waiting(facts(run_id="r-1"), NOW, GRACE)
    assert why.reason.endswith("unknown safety: waits for the worker or `qlactors worker retire w1 "
                               "--confirm-stopped`; this attempt alone: `qlactors confirm-stopped r-1`")
    assert "confirm-stopped r-1" not in waiting(facts(run_id="r-1", safety="idempotent"), NOW, GRACE).reason


def test_a_pending_stop_is_named_and_the_idempotent_end_is_its_intent_s_outcome():
    why = waiting(facts(safety="idempotent", session_ended_at_ms=NOW - 20_000, cancel_reason="timeout"), NOW, GRACE)
    assert "; timeout stop pending: worker w1 has not reported the job stopped (it may still run); " in why.reason
    assert why.reason.endswith("idempotent: ends timed_out (no exit code) at 2027-01-15 08:01:40Z once the grace "
                               "has passed")
    user = waiting(facts(safety="deduplicated", cancel_reason="user"), NOW, GRACE)
    assert "user stop pending" in user.reason and "deduplicated: ends cancelled (no exit code) once " in user.reason
    unknown = waiting(facts(cancel_reason="timeout"), NOW, GRACE)
    assert "timeout stop pending" in unknown.reason and unknown.reason.endswith(
        "unknown safety: waits for the worker or `qlactors worker retire w1 --confirm-stopped`")
    assert "stop pending" not in waiting(facts(), NOW, GRACE).reason
