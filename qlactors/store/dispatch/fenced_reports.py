"""Store: fenced executor reports about an offered attempt: Activate, Started, start failure, decline
(SEMANTICS.md §4, §9 Fence), and the release of an offer nobody activated (§6, §10).

Every report quotes its `Fence` (worker, session and generation, run, attempt, offer id, lease
generation, lease token hash). Its transaction first takes the locks in the global order of §9
and reads its rows (`report_locks.hold`: the advisory locks `attempt:<id>` then `task:<id>`,
then the session row, then the run, attempt and lease rows, database time read once; for one
report or for a batch of them, `report_batch.py`); `check_fence` then answers `fenced` (nothing
changed) when:

- the session is not the worker's current one: unknown, another worker's, another generation,
  superseded or ended (`offline`, `ended_at_ms` set, its lease expired); a `draining` session
  still reports (it must start and finish what it holds);
- the lease is missing (another generation), `released` or `completed`, or its offer id,
  session or token hash differ (the token compared in constant time); a start failure or a
  decline may come from a later session of the lease's worker (re-made there when the lease's
  own session ended before it landed: its outcome never depends on that timing, issue 26);
- the attempt is `lost` or terminal;
- for Activate only, the lease has expired (an expired offer may be offered to someone else).

The lease version is never a reason: it is kept in the Fence for information only, so a renewal
committed while a Started is in flight never fences the Started. Answers: `applied`, `fenced`,
`refused` (the fence holds but the state forbids it), each an `Outcome` (an
Activate's carries its `Activation`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...domain.recovery_evidence import NEVER_LAUNCHED
from ...domain.results import Outcome, Result
from ...domain.states import AttemptStatus, LeaseReleaseReason, LeaseStatus, RunStatus
from ...domain.transitions import plan_activate, plan_end_by_intent, plan_start_failed, plan_started
from ...errors import BadInput, QlactorsError
from ..engine import Store
from ..plans import (
    apply_plan,
    attempt_snapshot,
    end_lease,
    load_open_pair,
    pinned_revision,
    run_snapshot,
)
from ..records import Activation, Fence, Identity, check_hash, check_id, same_hash
from .evidence import NO_EVIDENCE
from .report_batch import alone
from .report_locks import HeldRows, LockRequest
from .session_rules import session_mismatch

ACTOR = "executor"
MAX_ERROR_SUMMARY = 512

_A, _R, _L = AttemptStatus, RunStatus, LeaseStatus


class FenceMismatch(QlactorsError):
    """A report whose fence does not hold; `detail` is the short machine word the answer carries."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


@dataclass(frozen=True, slots=True)
class HeldFence:
    """The rows a holding fence locked, and the transaction's one database time."""

    run: object
    attempt: object
    lease: object
    now: int


class FencedReports:
    """Activate, Started, start failure, decline and the release of an unactivated offer."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def check_fence(self, held: HeldRows, fence: Fence, *, for_activate: bool,
                    from_later_session: bool = False) -> HeldFence:
        """Check everything `fence` quotes against the rows `held` locked (see the module's doc);
        raise FenceMismatch. `from_later_session` (a start failure, a decline): the report may come
        from a later session of the lease's worker than the lease's own (re-made there after the
        lease's session ended before it landed); offer id, generation and token must still match."""
        session = held.sessions.get(fence.session_id)
        run = held.runs.get(fence.run_id)
        attempt = held.attempts.get(fence.attempt_id)
        lease = held.leases.get((fence.attempt_id, fence.lease_generation))
        now = held.now
        detail = session_mismatch(session, fence.worker_id, fence.session_generation, now, online_only=False)
        if detail is not None:
            raise FenceMismatch(detail)
        if run is None:
            raise FenceMismatch("unknown_run")
        if attempt is None or attempt.run_id != run.id:
            raise FenceMismatch("wrong_attempt")
        if lease is None or lease.run_id != run.id:
            raise FenceMismatch("lease_generation")
        if lease.offer_id != fence.offer_id:
            raise FenceMismatch("offer_id")
        if lease.worker_id != fence.worker_id or not (
                (lease.session_id, lease.session_generation) == (fence.session_id, fence.session_generation)
                or (from_later_session and lease.session_generation < fence.session_generation)):
            raise FenceMismatch("lease_session")
        if not same_hash(lease.token_hash, fence.lease_token_hash):
            raise FenceMismatch("lease_token")
        if _A(attempt.status).terminal:  # lost, or ended (its lease ended with it)
            raise FenceMismatch(f"attempt_{attempt.status}")
        if lease.status != _L.LEASED.value:
            raise FenceMismatch(f"lease_{lease.status}")
        if for_activate and lease.expires_at_ms is not None and lease.expires_at_ms <= now:
            raise FenceMismatch("lease_expired")
        return HeldFence(run, attempt, lease, now)

    def alone(self, fence: Fence, apply, *, durable: bool = True, revision: bool = False):
        """One report in its own transaction: its locks and rows, then `apply(conn, rows)`."""
        return alone(self.store, LockRequest(fence.attempt_id, fence.run_id, fence, revision=revision), apply,
                     durable=durable)

    def activate(self, fence: Fence, callback_token_hash: str, log_artifact_id: str) -> Outcome[Activation]:
        """Attempt `claimed -> starting` with its token hash, log artifact and deadline; spawn only if applied.

        `refused` when the attempt is no longer `claimed`, the run not `dispatching`, or a cancel
        intent exists. The deadline (database time + the pinned timeout, NULL without one) is
        written here once and never replaced. A repeated Activate for an attempt already
        `starting` with the same token hash answers `applied` again, with the stored deadline.
        """
        return self.alone(fence, lambda conn, rows: self.activate_in(conn, rows, fence, callback_token_hash,
                                                                     log_artifact_id), revision=True)

    def activate_in(self, conn, rows: HeldRows, fence: Fence, callback_token_hash: str,
                    log_artifact_id: str) -> Outcome[Activation]:
        """`activate` in a transaction holding `rows` (`report_locks.hold`, one report or a batch)."""
        check_hash("callback token hash", callback_token_hash)
        check_id("log artifact id", log_artifact_id, 256)
        try:
            held = self.check_fence(rows, fence, for_activate=True)
        except FenceMismatch as mismatch:
            return Outcome(Result.FENCED, mismatch.detail)
        run, attempt, lease = held.run, held.attempt, held.lease
        status = _A(attempt.status)
        if status is _A.STARTING:
            if same_hash(attempt.callback_token_hash, callback_token_hash):
                return Outcome(Result.APPLIED, "already_starting",
                               value=Activation(attempt.deadline_at_ms, lease.version))
            return _refused_activation("activated_with_other_token", lease.version)
        if status is not _A.CLAIMED:
            return _refused_activation(f"attempt_{status.value}", lease.version)
        if run.status != _R.DISPATCHING.value:
            return _refused_activation(f"run_{run.status}", lease.version)
        if run.cancel_reason is not None:
            return _refused_activation("cancel_requested", lease.version)
        revision = rows.revisions.get((run.task_id, run.task_revision)) or pinned_revision(conn, run)
        timeout_ms = revision.timeout_ms
        deadline = held.now + timeout_ms if timeout_ms is not None else None
        # An activation clears the evidence: nothing known before it speaks of the process it starts.
        apply_plan(conn, plan_activate(run_snapshot(run), attempt_snapshot(attempt)), held.now,
                   actor_type=ACTOR, expected_callback_sequence=attempt.callback_sequence,
                   attempt_values=dict(NO_EVIDENCE, callback_token_hash=callback_token_hash,
                                       log_artifact_id=log_artifact_id, deadline_at_ms=deadline))
        return Outcome(Result.APPLIED, value=Activation(deadline, lease.version))

    def started(self, fence: Fence, boot_id: str, pid: int, pgid: int, start_ticks: int) -> Outcome:
        """Attempt and run `running` with the process identity and `started_at_ms` (database time).

        Idempotent: an attempt already `running` with the same identity answers `applied` (no
        event); another identity is `refused`, as is an attempt not yet activated.
        """
        return self.alone(fence, lambda conn, rows: self.started_in(conn, rows, fence, boot_id, pid, pgid,
                                                                    start_ticks), durable=False)

    def started_in(self, conn, rows: HeldRows, fence: Fence, boot_id: str, pid: int, pgid: int,
                   start_ticks: int) -> Outcome:
        """`started` in a transaction holding `rows` (`report_locks.hold`, one report or a batch)."""
        identity = Identity(boot_id, pid, pgid, start_ticks)
        try:
            held = self.check_fence(rows, fence, for_activate=False)
        except FenceMismatch as mismatch:
            return Outcome(Result.FENCED, mismatch.detail)
        run, attempt, now = held.run, held.attempt, held.now
        status = _A(attempt.status)
        if status is _A.RUNNING:
            if Identity.from_row(attempt) == identity:
                return Outcome(Result.APPLIED, "already_running", run.status)
            return Outcome(Result.REFUSED, "identity_mismatch", run.status)
        if status is not _A.STARTING:
            return Outcome(Result.REFUSED, f"attempt_{status.value}", run.status)
        plan = plan_started(run_snapshot(run), attempt_snapshot(attempt))
        # A launch proves a `never_launched` recorded before it wrong (SEMANTICS.md §9 Exchange:
        # a late answer must never undo a launch): it is void; any other fact still holds.
        void = NO_EVIDENCE if attempt.evidence == NEVER_LAUNCHED else {}
        apply_plan(conn, plan, now, actor_type=ACTOR,
                   expected_callback_sequence=attempt.callback_sequence,
                   run_values={"started_at_ms": now} if run.started_at_ms is None else None,
                   attempt_values=dict(void, boot_id=identity.boot_id, pid=identity.pid, pgid=identity.pgid,
                                       start_ticks=identity.start_ticks, started_at_ms=now))
        return Outcome(Result.APPLIED, None, plan.run_to.value)

    def start_failed(self, fence: Fence, reason: str) -> Outcome:
        """The launcher could not be spawned: attempt and run `failed` (EXECUTOR_START_FAILED).

        The caller checks for a receipt first (SEMANTICS.md §4). `error_summary` is the reason cut
        to 512 characters; the lease ends `released` (`start_failed`). A committed cancel intent
        wins, as everywhere: the run ends as the intent says, with the reason kept as its summary.
        """
        return self.alone(fence, lambda conn, rows: self.start_failed_in(conn, rows, fence, reason))

    def start_failed_in(self, conn, rows: HeldRows, fence: Fence, reason: str) -> Outcome:
        """`start_failed` in a transaction holding `rows` (`report_locks.hold`, one report or a batch)."""
        if type(reason) is not str:
            raise BadInput("a start failure reason is a string")
        summary = reason[:MAX_ERROR_SUMMARY]
        try:
            held = self.check_fence(rows, fence, for_activate=False, from_later_session=True)
        except FenceMismatch as mismatch:
            return Outcome(Result.FENCED, mismatch.detail)
        run, attempt, now = held.run, held.attempt, held.now
        if attempt.status != _A.STARTING.value:
            return Outcome(Result.REFUSED, f"attempt_{attempt.status}", run.status)
        run_s, attempt_s = run_snapshot(run), attempt_snapshot(attempt)
        plan = plan_end_by_intent(run_s, attempt_s) if run.cancel_reason else plan_start_failed(run_s, attempt_s)
        apply_plan(conn, plan, now, actor_type=ACTOR, expected_callback_sequence=attempt.callback_sequence,
                   run_values={"error_summary": summary}, attempt_values={"error_summary": summary})
        end_lease(conn, attempt.id, now, _L.RELEASED, LeaseReleaseReason.START_FAILED)
        return Outcome(Result.APPLIED, None, plan.run_to.value)

    def decline(self, fence: Fence, reason: LeaseReleaseReason | str = LeaseReleaseReason.DECLINED) -> Outcome:
        """The executor gives back an offer it never activated: its lease ends `released`.

        `reason` is `declined` (default) or `shutdown`; version + 1. The attempt stays `claimed`
        and the run `dispatching` (no `dispatching -> queued` edge exists); the next pull offers
        it again under a new lease generation. An activated attempt is `refused` (use
        `start_failed`); an ended lease is `fenced` like every other report.
        """
        return self.alone(fence, lambda conn, rows: self.decline_in(conn, rows, fence, reason))

    def decline_in(self, conn, rows: HeldRows, fence: Fence,
                   reason: LeaseReleaseReason | str = LeaseReleaseReason.DECLINED) -> Outcome:
        """`decline` in a transaction holding `rows` (`report_locks.hold`, one report or a batch)."""
        reason = LeaseReleaseReason(reason)
        if reason not in (LeaseReleaseReason.DECLINED, LeaseReleaseReason.SHUTDOWN):
            raise BadInput("an unstarted offer is released as declined or shutdown")
        try:
            held = self.check_fence(rows, fence, for_activate=False, from_later_session=True)
        except FenceMismatch as mismatch:
            return Outcome(Result.FENCED, mismatch.detail)
        if held.attempt.status != _A.CLAIMED.value:
            return Outcome(Result.REFUSED, f"attempt_{held.attempt.status}", held.run.status)
        end_lease(conn, held.attempt.id, held.now, _L.RELEASED, reason)
        return Outcome(Result.APPLIED, None, held.run.status)

    def release_unactivated(self, run_id: str, attempt_id: str) -> Outcome:
        """An attempt offered but never activated that no executor holds: its live lease ends
        `released` (`lease_expired`) and the attempt stays `claimed`, its run `dispatching`.

        It never started, so nothing can run twice: the next pull offers it again under a new
        lease generation (SEMANTICS.md §6 step 2). `refused` unless the attempt is still
        `claimed`; `detail` is `no_live_lease` when there was nothing to release.
        """
        with self.store.write() as conn:
            self.store.advisory_lock(conn, f"attempt:{attempt_id}")
            run, attempt, ended = load_open_pair(conn, run_id, attempt_id)
            if ended is not None:
                return ended
            if attempt.status != _A.CLAIMED.value:
                return Outcome(Result.REFUSED, f"attempt_{attempt.status}", run.status)
            version = end_lease(conn, attempt_id, self.store.now_ms(conn), _L.RELEASED,
                                LeaseReleaseReason.LEASE_EXPIRED)
            return Outcome(Result.APPLIED, None if version is not None else "no_live_lease", run.status)


def _refused_activation(detail: str, lease_version: int) -> Outcome[Activation]:
    """An Activate the fence let through but the attempt's state refuses: the lease version found."""
    return Outcome(Result.REFUSED, detail, value=Activation(lease_version=lease_version))
