"""Run, Attempt and run-lease states and their allowed transitions, as data (SEMANTICS.md §2)."""

from __future__ import annotations

from enum import Enum


class RunStatus(str, Enum):
    QUEUED = "queued"
    DISPATCHING = "dispatching"
    RUNNING = "running"
    RETRY_WAIT = "retry_wait"
    LOST = "lost"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"

    @property
    def terminal(self) -> bool:
        return self in RUN_TERMINAL


class AttemptStatus(str, Enum):
    CLAIMED = "claimed"
    STARTING = "starting"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"
    LOST = "lost"

    @property
    def terminal(self) -> bool:
        return self in ATTEMPT_TERMINAL


class LeaseStatus(str, Enum):
    LEASED = "leased"
    RELEASED = "released"
    COMPLETED = "completed"


class CancelReason(str, Enum):
    USER = "user"
    POLICY = "policy"
    TIMEOUT = "timeout"
    SHUTDOWN = "shutdown"


class TriggerType(str, Enum):
    MANUAL = "manual"
    CRON = "cron"
    RETRY = "retry"


class TaskEventType(str, Enum):
    """What a task-change history row records (schema 16: `task_events`)."""

    ADDED = "added"
    UPDATED = "updated"
    ENABLED = "enabled"
    DISABLED = "disabled"
    REMOVED = "removed"


class RetrySafety(str, Enum):
    UNKNOWN = "unknown"
    IDEMPOTENT = "idempotent"
    DEDUPLICATED = "deduplicated"


class LeaseReleaseReason(str, Enum):
    DECLINED = "declined"
    SHUTDOWN = "shutdown"
    START_FAILED = "start_failed"
    LEASE_EXPIRED = "lease_expired"
    CANCELLED = "cancelled"


R, A, L = RunStatus, AttemptStatus, LeaseStatus

RUN_TERMINAL = frozenset({R.SUCCEEDED, R.FAILED, R.CANCELLED, R.TIMED_OUT})
ATTEMPT_TERMINAL = frozenset({A.SUCCEEDED, A.FAILED, A.CANCELLED, A.TIMED_OUT, A.LOST})
# Attempts that hold (or may hold) a live process or an unfinished claim.
ATTEMPT_ACTIVE = frozenset({A.CLAIMED, A.STARTING, A.RUNNING})

RUN_TRANSITIONS: dict[RunStatus, frozenset[RunStatus]] = {
    R.QUEUED: frozenset({R.DISPATCHING, R.CANCELLED}),
    R.DISPATCHING: frozenset({R.RUNNING, R.SUCCEEDED, R.FAILED, R.CANCELLED, R.TIMED_OUT, R.LOST}),
    R.RUNNING: frozenset({R.SUCCEEDED, R.FAILED, R.CANCELLED, R.TIMED_OUT, R.LOST}),
    R.LOST: frozenset({R.RETRY_WAIT, R.FAILED, R.CANCELLED, R.TIMED_OUT}),
    R.RETRY_WAIT: frozenset({R.QUEUED, R.CANCELLED}),
    R.SUCCEEDED: frozenset(),
    R.FAILED: frozenset(),
    R.CANCELLED: frozenset(),
    R.TIMED_OUT: frozenset(),
}

ATTEMPT_TRANSITIONS: dict[AttemptStatus, frozenset[AttemptStatus]] = {
    # `failed` from `claimed`: an offer the control side cannot build or encode (OFFER_UNENCODABLE).
    A.CLAIMED: frozenset({A.STARTING, A.FAILED, A.CANCELLED, A.LOST}),
    # A completion may arrive before the running report, so `starting` may end directly.
    A.STARTING: frozenset({A.RUNNING, A.SUCCEEDED, A.FAILED, A.CANCELLED, A.TIMED_OUT, A.LOST}),
    A.RUNNING: frozenset({A.SUCCEEDED, A.FAILED, A.CANCELLED, A.TIMED_OUT, A.LOST}),
    A.SUCCEEDED: frozenset(),
    A.FAILED: frozenset(),
    A.CANCELLED: frozenset(),
    A.TIMED_OUT: frozenset(),
    A.LOST: frozenset(),
}

# A renew keeps the lease `leased` (version + 1, new expiry); release and completion end it.
LEASE_TRANSITIONS: dict[LeaseStatus, frozenset[LeaseStatus]] = {
    L.LEASED: frozenset({L.LEASED, L.RELEASED, L.COMPLETED}),
    L.RELEASED: frozenset(),
    L.COMPLETED: frozenset(),
}

# Where a run's current attempt may be when the run is in a given status.
RUN_STATUS_ATTEMPT: dict[RunStatus, frozenset[AttemptStatus]] = {
    R.QUEUED: frozenset({A.CLAIMED}),
    R.DISPATCHING: frozenset({A.CLAIMED, A.STARTING}),
    R.RUNNING: frozenset({A.RUNNING}),
    R.RETRY_WAIT: frozenset({A.LOST}),
    R.LOST: frozenset({A.LOST}),
    R.SUCCEEDED: frozenset({A.SUCCEEDED}),
    R.FAILED: frozenset({A.FAILED, A.LOST}),
    R.CANCELLED: frozenset({A.CANCELLED, A.LOST}),
    R.TIMED_OUT: frozenset({A.TIMED_OUT, A.LOST}),
}


def run_event(status: RunStatus) -> str:
    """The event type recorded when a run enters `status`."""
    return f"run.{RunStatus(status).value}"


def attempt_event(status: AttemptStatus) -> str:
    """The event type recorded when an attempt enters `status`."""
    return f"attempt.{AttemptStatus(status).value}"


RUN_CREATED = "run.created"
RUN_CANCEL_REQUESTED = "run.cancel_requested"
RUN_RETRY_SCHEDULED = "run.retry_scheduled"
# The job's receipt came while something outside its process group still held its output open.
ATTEMPT_OUTPUT_LEFT_OPEN = "attempt.output_left_open"
# A renewal of the lease generation a not-running fact spoke of (an operator's `confirm-stopped`,
# a worker's attestation) proved it wrong: the fact is cleared (issue 26).
ATTEMPT_EVIDENCE_WITHDRAWN = "attempt.evidence_withdrawn"
# A process that outlived its session (a restart of the runtime, a new worker session) was re-bound
# to the current one: a new lease generation (issue 28).
ATTEMPT_ADOPTED = "attempt.adopted"

EVENT_TYPES = frozenset(
    {RUN_CREATED, RUN_CANCEL_REQUESTED, RUN_RETRY_SCHEDULED, ATTEMPT_OUTPUT_LEFT_OPEN, ATTEMPT_EVIDENCE_WITHDRAWN,
     ATTEMPT_ADOPTED}
    | {run_event(s) for s in RunStatus}
    | {attempt_event(s) for s in AttemptStatus}
)
