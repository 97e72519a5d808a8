"""Store: the CompletionService: a verified receipt ends its attempt and run, one entry point for the fast
path and for recovery (SEMANTICS.md §5).

A receipt is authenticated by its callback token, not by a session or lease fence: it is the fact
of how the process ended, so it lands even after the executor that launched it was restarted or
replaced (a cluster worker's later session, SEMANTICS.md §9 Completion), as long as the attempt
is not terminal, not `lost` and not superseded by a later attempt of its run.
"""

from __future__ import annotations

import signal

from ...domain.receipt import Receipt, token_matches
from ...domain.results import Outcome, Result
from ...domain.states import AttemptStatus, LeaseStatus, RunStatus
from ...domain.transitions import plan_completion, stop_signal
from ...errors import BadInput
from ..engine import Store
from ..plans import (
    apply_plan,
    attempt_snapshot,
    end_held_lease,
    run_snapshot,
)
from .report_batch import alone
from .report_locks import HeldRows, LockRequest

# A completion's Outcome: `applied` or `already_terminal` (delete the receipt, then clear the
# journal row), or `refused` (nothing changed; quarantine the receipt if `detail` is a token
# failure). Why a receipt was refused (`detail`): unknown_run, unknown_attempt, wrong_run,
# wrong_executor, wrong_worker, receipt_mismatch, no_token, bad_token, wrong_sequence, attempt_<status>.
ACTOR = "completion"
EXECUTOR_TYPE = "local_process"
# What the executor last sent the job's group before its launcher ended (wire `stopped_by`).
_SENT = {"exit": None, "term": int(signal.SIGTERM), "kill": int(signal.SIGKILL)}


class CompletionService:
    """Applies completion receipts, each in one short transaction."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def complete(self, run_id: str, attempt_id: str, receipt: Receipt,
                 log_dropped_bytes: int | None = None, stopped_by: str = "exit", *,
                 worker_id: str | None = None, final_log_offset: int | None = None,
                 finished_in_time: bool | None = None) -> Outcome:
        """Apply `receipt` to its attempt; refusals change nothing (the caller quarantines).

        Checks, in order: the run exists and the attempt belongs to it, the executor type, the
        attempt's worker when `worker_id` (the authenticated worker id of a cluster Completed) is
        given, that the receipt names this run and attempt, and the token against the stored hash
        in constant time. Then an attempt already terminal with this callback sequence, a
        terminal run or a `lost` attempt replays as `already_terminal` with no event (an attempt
        superseded by a later one of its run is always one of these: the schema keeps at most
        one active attempt per run, and a retry starts only after its predecessor is `lost`);
        otherwise the sequence must be the stored one + 1. The lease, if still `leased`, becomes
        `completed` in the same transaction, and `final_log_offset` (the cluster log's end,
        SEMANTICS.md §13) is recorded when given. The committed cancel intent and the deadline
        decide before the exit code (`plan_completion`): a `timeout` intent yields `timed_out`
        unless the receipt's own `finishedAtMs` is at or before `deadline_at_ms` — or, from a
        cluster worker, unless its own verdict `finished_in_time` says so (one clock, §5).

        Times are clamped, never refused: the attempt keeps its committed `started_at_ms` (the
        receipt's, kept between the attempt's creation and now, only when none was committed,
        e.g. a fast job whose receipt beat its Started report); `finished_at_ms` is the
        receipt's, capped at now and never before that start. The run's start (if unset) and
        finish take the same values.

        `stopped_by` says what the executor last sent the job's group (`exit`: nothing). When the
        outcome comes from the stop and the exit code is 128 + that signal, the `signal` column
        records it (15 or 9); otherwise it stays NULL and the exit code says what is known. A
        receipt with `output_open` appends `attempt.output_left_open` and records no dropped
        byte count (the log-cap reader could not give one before the receipt).
        """
        locks = LockRequest(attempt_id, run_id if isinstance(run_id, str) else None, live_lease=True)
        return alone(self.store, locks, lambda conn, rows: self.complete_in(
            conn, rows, run_id, attempt_id, receipt, log_dropped_bytes, stopped_by, worker_id=worker_id,
            final_log_offset=final_log_offset, finished_in_time=finished_in_time))

    def complete_in(self, conn, rows: HeldRows, run_id: str, attempt_id: str, receipt: Receipt,
                    log_dropped_bytes: int | None = None, stopped_by: str = "exit", *,
                    worker_id: str | None = None, final_log_offset: int | None = None,
                    finished_in_time: bool | None = None) -> Outcome:
        """`complete` in a transaction holding `rows` (`report_locks.hold`, one report or a batch)."""
        _check_arguments(receipt, log_dropped_bytes, stopped_by, final_log_offset, finished_in_time)
        run = rows.runs.get(run_id) if isinstance(run_id, str) else None
        if run is None:
            return Outcome(Result.REFUSED, "unknown_run")
        attempt = rows.attempts.get(attempt_id)
        if attempt is None:
            return Outcome(Result.REFUSED, "unknown_attempt", run.status)
        refusal = _whose(run, attempt, receipt, worker_id)
        if refusal is not None:
            return Outcome(Result.REFUSED, refusal, run.status)
        a_status, r_status = AttemptStatus(attempt.status), RunStatus(run.status)
        if ((a_status.terminal and attempt.callback_sequence == receipt.callback_sequence)
                or r_status.terminal or a_status is AttemptStatus.LOST):
            return Outcome(Result.ALREADY_TERMINAL, None, run.status)
        if receipt.callback_sequence != attempt.callback_sequence + 1:
            return Outcome(Result.REFUSED, "wrong_sequence", run.status)
        if a_status not in (AttemptStatus.STARTING, AttemptStatus.RUNNING):
            return Outcome(Result.REFUSED, f"attempt_{a_status.value}", run.status)
        now = rows.now
        started = attempt.started_at_ms if attempt.started_at_ms is not None else min(
            max(receipt.started_at_ms, attempt.created_at_ms), now)
        finished = max(started, min(receipt.finished_at_ms, now))
        plan = plan_completion(run_snapshot(run), attempt_snapshot(attempt),
                               exit_code=receipt.exit_code, finished_at_ms=receipt.finished_at_ms,
                               deadline_at_ms=attempt.deadline_at_ms,
                               cancel_requested_at_ms=run.cancel_requested_at_ms,
                               output_open=bool(receipt.output_open),
                               signalled=stopped_by != "exit", finished_in_time=finished_in_time)
        from_stop = plan.run_to in (RunStatus.CANCELLED, RunStatus.TIMED_OUT)
        run_values = {"finished_at_ms": finished}
        if run.started_at_ms is None:
            run_values["started_at_ms"] = started
        lease = rows.live_leases.get(attempt.id)
        projection = {}
        if lease is not None:  # the lease becomes `completed`; the attempt's own update projects it
            version = end_held_lease(conn, lease, now, LeaseStatus.COMPLETED)
            if attempt.lease_generation == lease.lease_generation:
                projection["lease_version"] = version
        apply_plan(conn, plan, now, actor_type=ACTOR,
                   expected_callback_sequence=attempt.callback_sequence, run_values=run_values,
                   attempt_values=dict(exit_code=receipt.exit_code,
                                       callback_sequence=receipt.callback_sequence,
                                       started_at_ms=started, finished_at_ms=finished,
                                       signal=stop_signal(_SENT[stopped_by], receipt.exit_code, from_stop),
                                       log_dropped_bytes=None if receipt.output_open else log_dropped_bytes,
                                       **({} if final_log_offset is None
                                          else {"log_final_offset": final_log_offset}), **projection))
        return Outcome(Result.APPLIED, None, plan.run_to.value)


def _check_arguments(receipt: Receipt, log_dropped_bytes: int | None, stopped_by: str,
                     final_log_offset: int | None, finished_in_time: bool | None) -> None:
    """BadInput for a caller's value `complete` cannot take (nothing is read or written)."""
    if log_dropped_bytes is not None and (type(log_dropped_bytes) is not int or log_dropped_bytes < 0):
        raise BadInput("log_dropped_bytes must be a non-negative integer or None (unknown)")
    if stopped_by not in _SENT:
        raise BadInput(f"stopped_by must be one of {sorted(_SENT)}")
    if not isinstance(receipt, Receipt):
        raise BadInput("complete() takes a decoded Receipt")
    if final_log_offset is not None and (type(final_log_offset) is not int or final_log_offset < 0):
        raise BadInput("final_log_offset must be a non-negative integer or None")
    if finished_in_time not in (None, True, False):
        raise BadInput("finished_in_time must be a boolean or None")


def _whose(run, attempt, receipt: Receipt, worker_id: str | None) -> str | None:
    """Why the receipt is not this attempt's to complete (its detail word), or None."""
    if attempt.run_id != run.id:
        return "wrong_run"
    if attempt.executor_type != EXECUTOR_TYPE:
        return "wrong_executor"
    if worker_id is not None and attempt.worker_id != worker_id:
        return "wrong_worker"
    if receipt.run_id != run.id or receipt.attempt_id != attempt.id:
        return "receipt_mismatch"
    if attempt.callback_token_hash is None:
        return "no_token"
    if not token_matches(receipt.token, attempt.callback_token_hash):
        return "bad_token"
    return None
