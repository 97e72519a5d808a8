"""Pure transition builders: given a run (and its current attempt) they return the planned change.

A plan names the new statuses, the events to append (one version and one event-sequence step
each) and the error code; the store applies it with compare-and-set. Nothing here reads a clock
or touches I/O: times and ids are passed in.
Size: one planner per transition of a run, beside the one builder they share, read as a table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from ..errors import PeerFault
from .states import (
    ATTEMPT_ADOPTED,
    ATTEMPT_EVIDENCE_WITHDRAWN,
    ATTEMPT_OUTPUT_LEFT_OPEN,
    ATTEMPT_TRANSITIONS,
    RUN_CANCEL_REQUESTED,
    RUN_CREATED,
    RUN_RETRY_SCHEDULED,
    RUN_TRANSITIONS,
    AttemptStatus,
    CancelReason,
    RunStatus,
    attempt_event,
    run_event,
)

R, A = RunStatus, AttemptStatus


class InvalidTransition(PeerFault):
    """A change the state machine does not allow (the caller's data or request is stale or wrong).

    A peer's stale report meets it (refused); a command never should, the store decides first:
    one that does is a bug, so it has no exit status of its own.
    """

    exit_status = None


class ErrorCode:
    """Stable error codes recorded on runs and attempts."""

    EXIT_NONZERO = "EXIT_NONZERO"
    EXECUTOR_START_FAILED = "EXECUTOR_START_FAILED"
    OFFER_UNENCODABLE = "OFFER_UNENCODABLE"
    EXECUTION_CANCELLED = "EXECUTION_CANCELLED"
    EXECUTION_TIMED_OUT = "EXECUTION_TIMED_OUT"
    RECOVERY_UNSTARTED_CLAIM = "RECOVERY_UNSTARTED_CLAIM"
    RECOVERY_PROCESS_EXITED_WITHOUT_RECEIPT = "RECOVERY_PROCESS_EXITED_WITHOUT_RECEIPT"
    RECOVERY_IDENTITY_MISSING = "RECOVERY_IDENTITY_MISSING"
    # Cluster recovery, one per kind of trusted not-running evidence (domain/recovery_evidence.py).
    RECOVERY_PROCESS_STOPPED = "RECOVERY_PROCESS_STOPPED"
    RECOVERY_PROCESS_ENDED_WITH_RECEIPT = "RECOVERY_PROCESS_ENDED_WITH_RECEIPT"
    RECOVERY_NEVER_LAUNCHED = "RECOVERY_NEVER_LAUNCHED"
    RECOVERY_HOST_REBOOTED = "RECOVERY_HOST_REBOOTED"
    RECOVERY_WORKER_RETIRED = "RECOVERY_WORKER_RETIRED"
    RECOVERY_CONFIRMED_STOPPED = "RECOVERY_CONFIRMED_STOPPED"
    RECOVERY_SESSION_ENDED = "RECOVERY_SESSION_ENDED"
    RUN_LOST_RETRY_DISABLED = "RUN_LOST_RETRY_DISABLED"
    RUN_LOST_RETRY_UNSAFE = "RUN_LOST_RETRY_UNSAFE"
    RUN_LOST_RETRY_EXHAUSTED = "RUN_LOST_RETRY_EXHAUSTED"


@dataclass(frozen=True, slots=True)
class RunSnapshot:
    """What a transition needs to know about a run, as read inside the transaction."""

    id: str
    status: RunStatus
    version: int
    event_sequence: int
    cancel_reason: CancelReason | None = None


@dataclass(frozen=True, slots=True)
class AttemptSnapshot:
    """What a transition needs to know about the run's current attempt."""

    id: str
    number: int
    status: AttemptStatus
    callback_sequence: int = 0


@dataclass(frozen=True, slots=True)
class PlannedEvent:
    """One event to append: its per-run sequence, type, attempt and small payload."""

    sequence: int
    type: str
    attempt_id: str | None = None
    payload: Mapping[str, Any] = field(default_factory=dict)
    by_system: bool = False  # the runtime's own step, whoever asked for the change (`attempt.claimed`)


@dataclass(frozen=True, slots=True)
class Plan:
    """A planned change of one run (and at most one attempt) in one transaction."""

    run_id: str
    run_from: RunStatus | None
    run_to: RunStatus
    attempt_id: str | None
    attempt_from: AttemptStatus | None
    attempt_to: AttemptStatus | None
    expected_version: int
    version: int
    event_sequence: int
    events: tuple[PlannedEvent, ...]
    error_code: str | None = None
    cancel_reason: CancelReason | None = None

    @property
    def changes_run(self) -> bool:
        return self.run_from != self.run_to

    @property
    def changes_attempt(self) -> bool:
        return self.attempt_from != self.attempt_to


def check_run(frm: RunStatus, to: RunStatus) -> None:
    """Raise InvalidTransition unless the run table allows `frm -> to`."""
    if to not in RUN_TRANSITIONS[R(frm)]:
        raise InvalidTransition(f"run cannot go from {R(frm).value} to {R(to).value}")


def check_attempt(frm: AttemptStatus, to: AttemptStatus) -> None:
    """Raise InvalidTransition unless the attempt table allows `frm -> to`."""
    if to not in ATTEMPT_TRANSITIONS[A(frm)]:
        raise InvalidTransition(f"attempt cannot go from {A(frm).value} to {A(to).value}")


def _events(start_seq: int, specs: list[tuple[str, str | None, Mapping[str, Any]]]) -> tuple[PlannedEvent, ...]:
    return tuple(
        PlannedEvent(sequence=start_seq + i + 1, type=t, attempt_id=a, payload=dict(p))
        for i, (t, a, p) in enumerate(specs)
    )


def transition(
    run: RunSnapshot,
    attempt: AttemptSnapshot | None,
    *,
    run_to: RunStatus | None = None,
    attempt_to: AttemptStatus | None = None,
    error_code: str | None = None,
    cancel_reason: CancelReason | None = None,
    payload: Mapping[str, Any] | None = None,
    lead_events: tuple[str, ...] = (),
) -> Plan:
    """The general builder: validate both changes and plan one event per change.

    `lead_events` are appended before the status events (e.g. `run.cancel_requested`).
    Attempt events come before the run event: the attempt ends, then the run does.
    """
    run_to = R(run_to) if run_to is not None else run.status
    if run_to != run.status:
        check_run(run.status, run_to)
    elif run.status.terminal:
        raise InvalidTransition(f"run is already {run.status.value}")
    attempt_from = attempt.status if attempt else None
    if attempt_to is not None:
        if attempt is None:
            raise InvalidTransition("no attempt to change")
        attempt_to = A(attempt_to)
        if attempt_to != attempt.status:
            check_attempt(attempt.status, attempt_to)
    else:
        attempt_to = attempt_from
    body = dict(payload or {})
    specs: list[tuple[str, str | None, Mapping[str, Any]]] = [
        (t, attempt.id if attempt else None, body) for t in lead_events
    ]
    if attempt is not None and attempt_to != attempt_from:
        specs.append((attempt_event(attempt_to), attempt.id, body))
    if run_to != run.status:
        specs.append((run_event(run_to), attempt.id if attempt else None, body))
    if not specs:
        raise InvalidTransition("a transition must change something")
    events = _events(run.event_sequence, specs)
    return Plan(
        run_id=run.id,
        run_from=run.status,
        run_to=run_to,
        attempt_id=attempt.id if attempt else None,
        attempt_from=attempt_from,
        attempt_to=attempt_to,
        expected_version=run.version,
        version=run.version + len(events),
        event_sequence=run.event_sequence + len(events),
        events=events,
        error_code=error_code,
        cancel_reason=cancel_reason,
    )


def plan_admission(run_id: str, attempt_id: str, payload: Mapping[str, Any] | None = None) -> Plan:
    """A new run: `run.created`, `run.queued` and Attempt 1 `attempt.claimed`, version 3."""
    body = dict(payload or {})
    events = _events(0, [(RUN_CREATED, None, body), (run_event(R.QUEUED), None, {})]) + (
        PlannedEvent(sequence=3, type=attempt_event(A.CLAIMED), attempt_id=attempt_id, by_system=True),)
    return Plan(run_id=run_id, run_from=None, run_to=R.QUEUED, attempt_id=attempt_id,
                attempt_from=None, attempt_to=A.CLAIMED, expected_version=0,
                version=len(events), event_sequence=len(events), events=events)


def outcome_of_cancel(reason: CancelReason) -> tuple[RunStatus, AttemptStatus, str]:
    """What a committed cancel intent turns a run into, and its error code."""
    if CancelReason(reason) is CancelReason.TIMEOUT:
        return R.TIMED_OUT, A.TIMED_OUT, ErrorCode.EXECUTION_TIMED_OUT
    return R.CANCELLED, A.CANCELLED, ErrorCode.EXECUTION_CANCELLED


def has_live_process(run: RunSnapshot, attempt: AttemptSnapshot | None) -> bool:
    """True when the run's attempt may own a process (so a cancel must wait for it to stop)."""
    return (run.status in (R.DISPATCHING, R.RUNNING)
            and attempt is not None and attempt.status in (A.STARTING, A.RUNNING))


def plan_cancel(run: RunSnapshot, attempt: AttemptSnapshot | None, reason: CancelReason) -> Plan | None:
    """Record a cancel intent; end the run at once when no process can be running.

    Returns None when there is nothing to do: the run is terminal, or an intent is already
    recorded (the first committed reason sticks, and a second cancel adds no event).
    """
    reason = CancelReason(reason)
    if run.status.terminal or run.cancel_reason is not None:
        return None
    payload = {"reason": reason.value}
    if has_live_process(run, attempt):
        return transition(run, attempt, cancel_reason=reason, payload=payload,
                          lead_events=(RUN_CANCEL_REQUESTED,))
    run_to, attempt_to, code = outcome_of_cancel(reason)
    live_attempt = attempt if attempt is not None and not attempt.status.terminal else None
    return transition(run, live_attempt, run_to=run_to,
                      attempt_to=attempt_to if live_attempt else None,
                      error_code=code, cancel_reason=reason, payload=payload,
                      lead_events=(RUN_CANCEL_REQUESTED,))


def plan_end_by_intent(run: RunSnapshot, attempt: AttemptSnapshot) -> Plan:
    """End a run whose process is conclusively gone, as its committed cancel intent says."""
    if run.cancel_reason is None:
        raise InvalidTransition("no cancel intent recorded")
    run_to, attempt_to, code = outcome_of_cancel(run.cancel_reason)
    return transition(run, attempt, run_to=run_to,
                      attempt_to=None if attempt.status.terminal else attempt_to,
                      error_code=code)


def plan_completion(
    run: RunSnapshot,
    attempt: AttemptSnapshot,
    *,
    exit_code: int,
    finished_at_ms: int,
    deadline_at_ms: int | None,
    cancel_requested_at_ms: int | None = None,
    output_open: bool = False,
    signalled: bool = False,
    finished_in_time: bool | None = None,
) -> Plan:
    """Complete from a verified receipt (SEMANTICS.md §5): the cancel intent decides first.

    A `timeout` intent yields `timed_out` unless the job finished by its deadline, in which case
    only the observation was late and it completes normally. "By its deadline" is judged on one
    clock: a cluster worker's own verdict (`finished_in_time`, its finish against the deadline it
    derived at activation; a job the executor signalled never finished in time), else the
    receipt's finish against `deadline_at_ms` (edge). Likewise another intent decides
    only if the job's main process had not ended before it was committed: a stop never replaces
    an exit the launcher already knew (§7). `signalled` (the executor sent the job's group a
    stop signal) rules "ended before" out: the launcher's clock and the commit's differ by up to
    a clock tick, and a job the cancel's own TERM killed must end `cancelled`. `output_open` (receipt schema 2) adds an
    `attempt.output_left_open` event ahead of the status events.
    """
    reason = run.cancel_reason
    if reason is CancelReason.TIMEOUT and finished_in_time is not None:
        # The worker's deadline (its activation + timeout) is later than the database's by the
        # activation's trip, and the control side's stop comes at the database's: a job that
        # stop signalled did not finish in time, whatever the worker's clock says.
        ended_first = finished_in_time and not signalled
    elif reason is CancelReason.TIMEOUT:
        ended_first = deadline_at_ms is None or finished_at_ms <= deadline_at_ms
    else:
        ended_first = (not signalled and cancel_requested_at_ms is not None
                       and finished_at_ms <= cancel_requested_at_ms)
    if reason is not None and not ended_first:
        run_to, attempt_to, code = outcome_of_cancel(reason)
    elif exit_code == 0:
        run_to, attempt_to, code = R.SUCCEEDED, A.SUCCEEDED, None
    else:
        run_to, attempt_to, code = R.FAILED, A.FAILED, ErrorCode.EXIT_NONZERO
    return transition(run, attempt, run_to=run_to, attempt_to=attempt_to, error_code=code,
                      payload={"exit_code": exit_code},
                      lead_events=(ATTEMPT_OUTPUT_LEFT_OPEN,) if output_open else ())


def stop_signal(sent: int | None, exit_code: int, outcome_from_stop: bool) -> int | None:
    """The `signal` of an attempt a runtime stop ended: the signal the runtime last sent, when the
    job's exit status says that signal killed it (128 + N, as the shell reports it); else None.

    A job that died of a signal nobody here sent, or that caught the stop and exited on its own,
    gets None: its exit code says what is known.
    """
    if sent is None or not outcome_from_stop or exit_code != 128 + sent:
        return None
    return sent


def plan_offer(run: RunSnapshot, attempt: AttemptSnapshot) -> Plan:
    """An offer made: run `queued -> dispatching`, the attempt stays `claimed`."""
    if attempt.status is not A.CLAIMED:
        raise InvalidTransition(f"attempt is {attempt.status.value}, not claimed")
    return transition(run, attempt, run_to=R.DISPATCHING)


def plan_activate(run: RunSnapshot, attempt: AttemptSnapshot) -> Plan:
    """Activation: attempt `claimed -> starting` while the run is `dispatching`."""
    if run.status is not R.DISPATCHING:
        raise InvalidTransition(f"run is {run.status.value}, not dispatching")
    if run.cancel_reason is not None:
        raise InvalidTransition("run has a cancel intent")
    return transition(run, attempt, attempt_to=A.STARTING)


def plan_started(run: RunSnapshot, attempt: AttemptSnapshot) -> Plan:
    """The process runs: attempt and run -> `running`."""
    return transition(run, attempt, run_to=R.RUNNING, attempt_to=A.RUNNING)


def plan_start_failed(run: RunSnapshot, attempt: AttemptSnapshot) -> Plan:
    """The launcher could not be spawned: attempt and run `failed`."""
    return transition(run, attempt, run_to=R.FAILED, attempt_to=A.FAILED,
                      error_code=ErrorCode.EXECUTOR_START_FAILED)


def plan_evidence_withdrawn(run: RunSnapshot, attempt: AttemptSnapshot, payload: Mapping[str, Any]) -> Plan:
    """A renewal proved the attempt's not-running fact wrong: one `attempt.evidence_withdrawn`
    event (what was said, by whom, when), no change of state."""
    return transition(run, attempt, payload=payload, lead_events=(ATTEMPT_EVIDENCE_WITHDRAWN,))


def plan_adopted(run: RunSnapshot, attempt: AttemptSnapshot, payload: Mapping[str, Any]) -> Plan:
    """A process that outlived its session re-bound to the current one: `attempt.adopted` (payload:
    `adoption_payload`), and the `running` a Started would have recorded if it was `starting`."""
    if attempt.status not in (A.STARTING, A.RUNNING):
        raise InvalidTransition(f"attempt is {attempt.status.value}: only a live one is adopted")
    return transition(run, attempt, run_to=R.RUNNING, attempt_to=A.RUNNING, payload=payload,
                      lead_events=(ATTEMPT_ADOPTED,))


def adoption_payload(generation: int, from_generation: int | None, worker_id: str, session_id: str) -> dict[str, Any]:
    """The lease generation the process is bound to now, the one before (None: none was live), and
    the worker and session that hold it."""
    return {"lease_generation": generation, "from_generation": from_generation, "worker_id": worker_id,
            "session_id": session_id}


def plan_offer_unencodable(run: RunSnapshot, attempt: AttemptSnapshot) -> Plan:
    """No offer can carry the pinned revision (it cannot be built or encoded): attempt and run `failed`.

    Only from a `dispatching` run whose attempt is still `claimed`: nothing was spawned.
    """
    if run.status is not R.DISPATCHING or attempt.status is not A.CLAIMED:
        raise InvalidTransition(f"run {run.status.value} / attempt {attempt.status.value}: "
                                "only an unstarted claim can fail as unencodable")
    return transition(run, attempt, run_to=R.FAILED, attempt_to=A.FAILED,
                      error_code=ErrorCode.OFFER_UNENCODABLE)


def plan_lost(run: RunSnapshot, attempt: AttemptSnapshot, error_code: str) -> Plan:
    """The attempt can no longer be vouched for: attempt and run `lost`."""
    return transition(run, attempt, run_to=R.LOST, attempt_to=A.LOST, error_code=error_code)


def plan_retry_wait(run: RunSnapshot, attempt: AttemptSnapshot, next_attempt_at_ms: int) -> Plan:
    """A lost run that its policy allows to retry waits for its backoff (a cancel intent wins)."""
    if run.cancel_reason is not None:
        raise InvalidTransition("run has a cancel intent: it ends by the intent, not by a retry")
    return transition(run, attempt, run_to=R.RETRY_WAIT,
                      payload={"next_attempt_at_ms": next_attempt_at_ms},
                      lead_events=(RUN_RETRY_SCHEDULED,))


def plan_lost_failed(run: RunSnapshot, attempt: AttemptSnapshot, error_code: str) -> Plan:
    """A lost run that may not be retried ends `failed` with the reason's code."""
    if run.status is not R.LOST:
        raise InvalidTransition(f"run is {run.status.value}, not lost")
    return transition(run, attempt, run_to=R.FAILED, error_code=error_code)


def plan_requeue(run: RunSnapshot, new_attempt_id: str, number: int) -> Plan:
    """Backoff over: run `retry_wait -> queued` with a fresh Attempt N+1 `claimed`."""
    check_run(run.status, R.QUEUED)
    events = _events(run.event_sequence, [(attempt_event(A.CLAIMED), new_attempt_id, {"number": number}),
                                          (run_event(R.QUEUED), new_attempt_id, {})])
    return Plan(run_id=run.id, run_from=run.status, run_to=R.QUEUED, attempt_id=new_attempt_id,
                attempt_from=None, attempt_to=A.CLAIMED, expected_version=run.version,
                version=run.version + len(events), event_sequence=run.event_sequence + len(events),
                events=events)
