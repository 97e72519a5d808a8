"""Cluster recovery's evidence (SEMANTICS.md §10 step 1): which facts prove that a `starting|running`
attempt whose lease is missing or expired no longer runs, the error code each kind of proof gives
the lost attempt, and the reason `status` and `show` give for an attempt still waiting.

Pure: the store's candidate query computes the evidence kind from the rows (the same names), and
passes database time in.
"""

from __future__ import annotations

from dataclasses import dataclass

from .states import CancelReason, RetrySafety
from .times import utc_second
from .transitions import ErrorCode, outcome_of_cancel

# The facts recorded in `run_attempts.evidence` that are trusted not-running evidence: what the
# worker attested (it stopped the process; the process ended, with or without a receipt; it was
# never launched), what Register derived (the host rebooted since the attempt's identity or its
# session's boot), what `worker retire --confirm-stopped` wrote and what `confirm-stopped RUN`
# wrote (the operator's word for one attempt). `launch_unknown` is recorded but never trusted:
# the launch may have happened. Every fact is recorded with the lease generation it speaks of,
# and trusted only while that generation is the attempt's current one (a fact about generation
# N never decides generation N + 1).
ATTESTED_TRUSTED = ("stopped", "ended", "ended_with_receipt", "never_launched")
NEVER_LAUNCHED = "never_launched"
REBOOTED, RETIRED, LAUNCH_UNKNOWN = "rebooted", "retired", "launch_unknown"
CONFIRMED_STOPPED = "confirmed_stopped"
TRUSTED_FACTS = (*ATTESTED_TRUSTED, REBOOTED, RETIRED, CONFIRMED_STOPPED)
# Not a recorded fact: the lease's session ended longer ago than the recovery grace, and the task
# declared a duplicate harmless.
SESSION_ENDED = "session_ended"
EVIDENCE_KINDS = (*TRUSTED_FACTS, SESSION_ENDED)
# The safeties for which the session's end past the grace is evidence enough.
GRACE_SAFETIES = (RetrySafety.IDEMPOTENT.value, RetrySafety.DEDUPLICATED.value)

_CODES = {
    "stopped": ErrorCode.RECOVERY_PROCESS_STOPPED,
    "ended": ErrorCode.RECOVERY_PROCESS_EXITED_WITHOUT_RECEIPT,
    "ended_with_receipt": ErrorCode.RECOVERY_PROCESS_ENDED_WITH_RECEIPT,
    "never_launched": ErrorCode.RECOVERY_NEVER_LAUNCHED,
    REBOOTED: ErrorCode.RECOVERY_HOST_REBOOTED,
    RETIRED: ErrorCode.RECOVERY_WORKER_RETIRED,
    CONFIRMED_STOPPED: ErrorCode.RECOVERY_CONFIRMED_STOPPED,
    SESSION_ENDED: ErrorCode.RECOVERY_SESSION_ENDED,
}


def error_code(kind: str) -> str:
    """The error code a lost attempt records for its evidence kind (ValueError for any other)."""
    try:
        return _CODES[kind]
    except KeyError:
        raise ValueError(f"{kind!r} is not trusted not-running evidence") from None


@dataclass(frozen=True, slots=True)
class WaitingFacts:
    """What is known about an attempt whose lease is missing or expired but that has no evidence."""

    worker_id: str | None
    lease_expires_at_ms: int | None
    """The live lease's expiry; None when the attempt holds no live lease."""
    evidence: str | None
    """The recorded fact, if any (an untrusted one: `launch_unknown`)."""
    safety: str | None
    """The run's retry safety; None without a retry policy (unknown)."""
    session_ended_at_ms: int | None
    """When the lease's session ended for the idempotent rule (drain grace included); None while
    it has not."""
    session_drained: bool = False
    """The lease's session was drained (its worker's SIGTERM, SEMANTICS.md §9 Drain): a planned
    restart is expected to re-attest the attempt."""
    evidence_lease_generation: int | None = None
    """The lease generation the recorded fact speaks of."""
    lease_generation: int | None = None
    """The attempt's current lease generation: a fact about another one is void."""
    run_id: str | None = None
    """The attempt's run, for the one-attempt `qlactors confirm-stopped RUN`."""
    cancel_reason: str | None = None
    """The run's committed cancel intent (`timeout`, ...): its stop waits for the worker, and
    evidence ends the run as the intent says instead of `lost`."""
    worker_revoked: bool = False
    """`worker revoke` ended the lease's session and the key has not been allowed again: what the
    worker holds (the job's result) cannot reach the control side until an operator acts."""


@dataclass(frozen=True, slots=True)
class Waiting:
    reason: str
    eligible_at_ms: int | None
    """Idempotent runs: when recovery will mark the attempt lost; None when only the worker or
    an operator can settle it."""


def waiting(facts: WaitingFacts, now_ms: int, recovery_grace_ms: int) -> Waiting:
    """Why recovery does not mark the attempt lost yet, in words for `status` and `show`."""
    worker = facts.worker_id or "?"
    if facts.lease_expires_at_ms is None:
        head = f"no live lease (worker {worker})"
    elif facts.lease_expires_at_ms > now_ms:  # listed before its expiry: a revoked worker's
        head = f"lease of worker {worker} expires in {_ago(facts.lease_expires_at_ms - now_ms)}"
    else:
        head = f"lease of worker {worker} expired {_ago(now_ms - facts.lease_expires_at_ms)} ago"
    parts = [head]
    if facts.cancel_reason is not None:
        parts.append(f"{facts.cancel_reason} stop pending: worker {worker} has not reported the job "
                     "stopped (it may still run)")
    if facts.worker_revoked:
        parts.append(f"result held on revoked worker {worker}: `qlactors worker allow {worker} KEYFILE` it "
                     f"again or `qlactors worker retire {worker} --confirm-stopped`")
    if facts.session_drained:
        parts.append(f"worker {worker} drained its session (SIGTERM): its restart re-attests it")
    if facts.evidence is not None and facts.evidence_lease_generation != facts.lease_generation:
        about = ("names no lease generation" if facts.evidence_lease_generation is None
                 else f"is about lease generation {facts.evidence_lease_generation}")
        parts.append(f"waiting for evidence: the recorded `{facts.evidence}` {about}, "
                     f"not the current {facts.lease_generation}")
    elif facts.evidence == LAUNCH_UNKNOWN:
        parts.append("waiting for evidence: launch outcome unknown")
    else:
        parts.append("waiting for evidence")
    eligible = None
    if facts.safety in GRACE_SAFETIES:
        ends = ("lost" if facts.cancel_reason is None
                else f"ends {outcome_of_cancel(CancelReason(facts.cancel_reason))[0].value} (no exit code)")
        if facts.session_ended_at_ms is None:
            parts.append(f"{facts.safety}: {ends} once the session of worker {worker} has ended and "
                         f"the recovery grace ({_ago(recovery_grace_ms)}) has passed")
        else:
            eligible = facts.session_ended_at_ms + recovery_grace_ms
            grace = "the drain grace and the recovery grace have" if facts.session_drained else "the grace has"
            parts.append(f"{facts.safety}: {ends} at {utc_second(eligible)} once {grace} passed")
    else:
        alone = f"; this attempt alone: `qlactors confirm-stopped {facts.run_id}`" if facts.run_id else ""
        parts.append("unknown safety: waits for an operator (above)" + alone if facts.worker_revoked else
                     f"unknown safety: waits for the worker or `qlactors worker retire {worker} --confirm-stopped`"
                     + alone)
    return Waiting("; ".join(parts), eligible)


def _ago(ms: int) -> str:
    seconds = max(0, ms) // 1000
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h"


