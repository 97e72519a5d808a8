"""Executor-facing dispatch: worker sessions, offers (claim + run lease) and fenced executor reports.

SEMANTICS.md §4 and §9. Every method is one short transaction; `offer` and `started` commit
without an fsync (`Store.write(durable=False)`: losing one in a power failure changes no outcome,
see docs/semantics.md), `activate` and the rest durably. A pull whose session is dead raises
`Fenced`; a report (activate, started, start failure, release) answers an `Outcome` whose result is
`applied`, `fenced` (some quoted field no longer matches: nothing changed), `refused` (the fence
holds but the state forbids it: nothing changed) or `already_terminal`.

Lock order, the same in every operation so two transactions never wait on each other in a cycle:
the attempt's advisory lock (fenced reports), the worker-session row, the run row, the lease row.
`offer` cannot know its attempt before it claims it, so it takes no attempt lock: its claim is the
run row itself (`FOR UPDATE SKIP LOCKED`), which every report also locks.
"""

from __future__ import annotations

import json
import logging
from typing import Callable

from sqlalchemy.engine import Connection

from ..domain.model import Command, env_from_json
from ..domain.states import AttemptStatus, LeaseReleaseReason, LeaseStatus, RunStatus
from ..domain.transitions import (
    plan_activate,
    plan_end_by_intent,
    plan_offer,
    plan_offer_unencodable,
    plan_start_failed,
    plan_started,
)
from ..errors import BadInput, Conflict
from .records import (
    ALREADY_TERMINAL,
    APPLIED,
    FENCED,
    REFUSED,
    ActivateResult,
    Fence,
    Fenced,
    Identity,
    OfferView,
    Outcome,
    check_hash,
    check_id,
    same_hash,
)
from .plans import (
    apply_plan,
    attempt_snapshot,
    end_lease,
    load_attempt,
    load_open_pair,
    load_run,
    pinned_revision,
    run_snapshot,
)
from .dispatch_queries import (
    CANDIDATES,
    CLAIMED_ATTEMPT_UPDATE,
    LEASED_COUNT,
    LEASE_BY_OFFER,
    LEASE_LOCKED,
    MAX_GENERATION,
    OFFER_REVISION,
    SESSION_LOCKED,
    SESSION_SHARED,
    busy,
    candidate_query,
    dispatchable,
)
from .schema import run_dispatch_leases
from .session_rules import session_mismatch as _session_mismatch
from .sessions import Sessions
from .views import cwd_from_column

log = logging.getLogger("qlactors.dispatch")

ACTOR = "executor"
MAX_ERROR_SUMMARY = 512
# How many candidate runs one offer may look at before answering "nothing": each miss is a task
# found at its max_concurrent only after its lock was taken (a race), so a few are plenty.
_MAX_PICKS = 8

_A, _R, _L = AttemptStatus, RunStatus, LeaseStatus
# What `offer` answers for a pick that ended OFFER_UNENCODABLE: look at the next candidate.
_UNENCODABLE = object()
# The attempt's lease projection, as an offer quotes it.
_PROJECTION = ("offer_id", "lease_generation", "lease_version", "worker_id", "session_id",
               "session_generation")


class _Mismatch(Exception):
    """A fence field that does not match; `ended` carries the rows when only the lease has ended."""

    def __init__(self, detail: str, ended: tuple | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.ended = ended


def command_argv(command_json: str) -> tuple[str, ...]:
    """The argv to exec (`Command.exec_argv`); ValueError for a row it cannot read."""
    return Command.from_json(json.loads(command_json)).exec_argv()


class Dispatch(Sessions):
    """Sessions (sessions.py), offers and the fenced executor reports, each one short transaction."""

    # -- offer -------------------------------------------------------------------------------

    def offer(
        self,
        worker_id: str,
        session_id: str,
        session_generation: int,
        offer_id: str,
        lease_token_hash: str,
        *,
        log_cap_bytes: int,
        lease_ttl_ms: int | None = None,
        check: Callable[[OfferView], None] | None = None,
    ) -> OfferView | None:
        """Claim the oldest dispatchable run for this session, or None when there is none or no slot.

        Dispatchable: a run with no cancel intent whose attempt is `claimed`, whose task (by the
        run's pinned revision's `max_concurrent`) has room, and that is either `queued` or
        `dispatching` with no live lease. The second kind is a declined, never-activated offer:
        the run table has no `dispatching -> queued` edge, so the run stays `dispatching` and its
        attempt is offered again under a new `lease_generation`.

        Idempotent per `offer_id`: pulling again with the same id and token hash while the lease is
        still `leased` and its attempt `claimed` answers the same offer, with no second lease. An
        offer id already used for anything else yields None (pull with a fresh id). Raises `Fenced`
        when the session is unknown, superseded, expired or not online. `lease_ttl_ms` None: the
        lease lives as long as the runtime process (edge).

        Before a claim takes its lease, the offer is built from the pinned revision and given to
        `check` (the caller's encoder: it raises ValueError for an offer the wire cannot carry).
        A pick whose offer cannot be built or encoded ends in this transaction, attempt and run
        `failed` with OFFER_UNENCODABLE, taking no lease and no slot, and the next candidate is
        looked at instead (SEMANTICS.md §4): one bad revision never stops the others.
        """
        check_id("worker id", worker_id, 128)
        check_id("session id", session_id)
        check_id("offer id", offer_id)
        check_hash("lease token hash", lease_token_hash)
        if type(log_cap_bytes) is not int or log_cap_bytes < 0:
            raise BadInput("log_cap_bytes must be a non-negative integer")
        if lease_ttl_ms is not None and (type(lease_ttl_ms) is not int or lease_ttl_ms < 1):
            raise BadInput("lease_ttl_ms must be a positive integer or None")
        with self.store.write(durable=False) as conn:
            # Capacity is checked under the session row lock, so one session never oversells.
            session = conn.execute(SESSION_LOCKED, {"session_id": session_id}).first()
            now = self.store.now_ms(conn)
            detail = _session_mismatch(session, worker_id, session_generation, now, online_only=True)
            if detail is not None:
                raise Fenced(f"session {session_id} of worker {worker_id!r} cannot pull ({detail}); "
                             "register a new session")
            existing = conn.execute(LEASE_BY_OFFER, {"offer_id": offer_id}).first()
            if existing is not None:
                return self._replay(conn, existing, session, lease_token_hash, log_cap_bytes)
            if self._leased_count(conn, session_id) >= session.capacity:
                return None
            skip_runs: list[str] = []
            skip_tasks: list[str] = []
            for _ in range(_MAX_PICKS):
                pick = None
                for kind in ("dispatching", "queued"):  # a declined claim first: it was the oldest
                    query = (candidate_query(kind, skip_runs, skip_tasks) if skip_runs or skip_tasks
                             else CANDIDATES[kind])
                    pick = conn.execute(query, {"now": now}).first()
                    if pick is not None:
                        break
                if pick is None:
                    return None
                # The limit is counted per task; two offers picking two runs of one task must not
                # both see room. A task-scoped advisory lock serialises exactly that recount.
                self.store.advisory_lock(conn, f"task:{pick.task_id}")
                run = pick  # the run row itself, locked by the query (PostgreSQL: re-read at the lock)
                attempt = load_attempt(conn, pick.attempt_id)
                if not dispatchable(conn, run, attempt):
                    skip_runs.append(pick.id)  # changed between the query's snapshot and its lock
                elif busy(conn, run.task_id, run.id) >= pick.max_concurrent:
                    skip_tasks.append(run.task_id)
                else:
                    claimed = self._claim(conn, run, attempt, session, offer_id, lease_token_hash,
                                          log_cap_bytes, self.store.now_ms(conn), lease_ttl_ms, check)
                    if claimed is not _UNENCODABLE:
                        return claimed
                    skip_runs.append(run.id)
            return None

    def offer_batch(self, worker_id: str, session_id: str, session_generation: int,
                    pairs: list[tuple[str, str]], *, log_cap_bytes: int, lease_ttl_ms: int | None = None,
                    check: Callable[[OfferView], object] | None = None,
                    size: Callable[[OfferView], int] | None = None,
                    budget_bytes: int | None = None) -> list[OfferView]:
        """Up to one offer per (offer id, lease token hash) pair, within `budget_bytes` by `size`."""
        views: list[OfferView] = []
        used = 0
        for offer_id, token in pairs:
            view = self.offer(worker_id, session_id, session_generation, offer_id, token,
                              log_cap_bytes=log_cap_bytes, lease_ttl_ms=lease_ttl_ms, check=check)
            if view is None:
                break
            views.append(view)
            used += size(view) if size is not None else 0
            if budget_bytes is not None and used >= budget_bytes:
                break
        return views

    def decline(self, fence: Fence) -> Outcome:
        """The executor will not start this offer: its lease ends `released` (`declined`)."""
        return self.release_unstarted(fence, LeaseReleaseReason.DECLINED)

    def _leased_count(self, conn: Connection, session_id: str) -> int:
        """Live leases of the session; a lease whose attempt already ended holds no slot."""
        return conn.execute(LEASED_COUNT, {"session_id": session_id}).scalar_one()

    def _claim(self, conn, run, attempt, session, offer_id, token_hash, log_cap_bytes, now,
               lease_ttl_ms, check) -> OfferView | object | None:
        generation = conn.execute(MAX_GENERATION, {"attempt_id": attempt.id}).scalar_one() + 1
        expires = now + lease_ttl_ms if lease_ttl_ms is not None else None
        projection = dict(offer_id=offer_id, lease_generation=generation, lease_version=1,
                          lease_expires_at_ms=expires, worker_id=session.worker_id,
                          session_id=session.session_id, session_generation=session.generation)
        try:  # exactly the offer the lease below would grant
            view = self._build_view(conn, run, attempt, projection, log_cap_bytes)
            if check is not None:
                check(view)
        except ValueError as err:
            self._end_unencodable(conn, run, attempt, now, err)
            return _UNENCODABLE
        if not self.store.insert_new(conn, run_dispatch_leases, dict(
                attempt_id=attempt.id, lease_generation=generation, run_id=run.id,
                status=_L.LEASED.value, version=1, worker_id=session.worker_id,
                session_id=session.session_id, session_generation=session.generation,
                token_hash=token_hash, offer_id=offer_id, expires_at_ms=expires,
                release_reason=None, created_at_ms=now, updated_at_ms=now)):
            return None  # a concurrent pull used this offer id or leased the attempt first
        if run.status == _R.QUEUED.value:
            apply_plan(conn, plan_offer(run_snapshot(run), attempt_snapshot(attempt)), now,
                       actor_type=ACTOR, expected_callback_sequence=attempt.callback_sequence,
                       attempt_values=projection)
        else:  # a re-offer of a declined claim: the run is already `dispatching`, no status change
            changed = conn.execute(CLAIMED_ATTEMPT_UPDATE, dict(
                projection, updated_at_ms=now, w_id=attempt.id)).rowcount
            if changed != 1:
                raise Conflict(f"attempt {attempt.id} changed meanwhile")
        return view

    def _end_unencodable(self, conn, run, attempt, now: int, err: ValueError) -> None:
        """Attempt and run `failed` (OFFER_UNENCODABLE): the pick is offered through `dispatching`
        (the run table's only way out of `queued` but a cancel) and ends there, with no lease."""
        if run.status == _R.QUEUED.value:
            apply_plan(conn, plan_offer(run_snapshot(run), attempt_snapshot(attempt)), now,
                       actor_type=ACTOR, expected_callback_sequence=attempt.callback_sequence)
            run = load_run(conn, run.id)
        summary = f"no offer can carry this task revision: {err}"[:MAX_ERROR_SUMMARY]
        # The reason names the rule that failed, never a value (codec and posix errors never echo one).
        log.error("event=offer_unencodable run=%s attempt=%s task=%s revision=%s error=%s",
                  run.id, attempt.id, run.task_id, run.task_revision, err)
        apply_plan(conn, plan_offer_unencodable(run_snapshot(run), attempt_snapshot(attempt)), now,
                   actor_type=ACTOR, expected_callback_sequence=attempt.callback_sequence,
                   run_values={"error_summary": summary}, attempt_values={"error_summary": summary})

    def _replay(self, conn, lease, session, token_hash, log_cap_bytes) -> OfferView | None:
        """The same pull again (its answer was lost): the same offer, or None if it is no longer live."""
        if (lease.session_id != session.session_id or lease.status != _L.LEASED.value
                or not same_hash(lease.token_hash, token_hash)):
            return None
        attempt = load_attempt(conn, lease.attempt_id)
        run = load_run(conn, lease.run_id)
        if attempt.status != _A.CLAIMED.value or run.cancel_reason is not None:
            return None
        return self._view(conn, run, attempt.id, log_cap_bytes)

    def _view(self, conn: Connection, run, attempt_id: str, log_cap_bytes: int) -> OfferView:
        """The offer as the executor sees it: the attempt's lease projection and the pinned command."""
        attempt = load_attempt(conn, attempt_id)
        return self._build_view(conn, run, attempt, {name: getattr(attempt, name) for name in _PROJECTION},
                                log_cap_bytes)

    def _build_view(self, conn: Connection, run, attempt, projection: dict, log_cap_bytes: int) -> OfferView:
        """The offer of `attempt` under the lease `projection`; ValueError when the revision cannot be read."""
        rev = conn.execute(OFFER_REVISION, {"task_id": run.task_id, "revision": run.task_revision}).one()
        return OfferView(
            run_id=run.id, attempt_id=attempt.id, attempt_number=attempt.number,
            **{name: projection[name] for name in _PROJECTION},
            task=rev.task_name, argv=command_argv(rev.command_json), cwd=cwd_from_column(rev.cwd),
            env=env_from_json(json.loads(rev.env_json)),
            timeout_ms=rev.timeout_ms, stop_grace_ms=rev.stop_grace_ms, log_cap_bytes=log_cap_bytes,
            keep_leftovers=bool(rev.keep_leftovers))

    # -- fenced reports ----------------------------------------------------------------------

    def _check_fence(self, conn: Connection, fence: Fence):
        """Lock and check everything `fence` quotes; return (run, attempt, lease) rows or raise _Mismatch.

        Order (SEMANTICS.md §9): the attempt's advisory lock, the session row, the run and attempt
        rows, the lease row, then database time. The token hash is compared in constant time.
        """
        self.store.advisory_lock(conn, f"attempt:{fence.attempt_id}")
        session = conn.execute(SESSION_SHARED, {"session_id": fence.session_id}).first()
        run = load_run(conn, fence.run_id)
        attempt = load_attempt(conn, fence.attempt_id)
        lease = conn.execute(LEASE_LOCKED, {"attempt_id": fence.attempt_id,
                                             "generation": fence.lease_generation}).first()
        now = self.store.now_ms(conn)
        detail = _session_mismatch(session, fence.worker_id, fence.session_generation, now,
                                   online_only=False)
        if detail is not None:
            raise _Mismatch(detail)
        if run is None:
            raise _Mismatch("unknown_run")
        if attempt is None or attempt.run_id != run.id:
            raise _Mismatch("wrong_attempt")
        if lease is None or lease.run_id != run.id:
            raise _Mismatch("lease_generation")
        if lease.offer_id != fence.offer_id:
            raise _Mismatch("offer_id")
        if (lease.session_id != fence.session_id or lease.worker_id != fence.worker_id
                or lease.session_generation != fence.session_generation):
            raise _Mismatch("lease_session")
        if not same_hash(lease.token_hash, fence.lease_token_hash):
            raise _Mismatch("lease_token")
        if lease.status != _L.LEASED.value:
            # The caller proved it held this lease; it has ended (completed or released).
            raise _Mismatch(f"lease_{lease.status}", ended=(run, attempt, lease))
        if lease.version != fence.lease_version:
            raise _Mismatch("lease_version")
        if lease.expires_at_ms is not None and lease.expires_at_ms <= now:
            raise _Mismatch("lease_expired")
        return run, attempt, lease

    def activate(self, fence: Fence, callback_token_hash: str, log_artifact_id: str) -> ActivateResult:
        """Attempt `claimed -> starting` with its token hash, log artifact and deadline; spawn only if applied.

        `refused` when the attempt is no longer `claimed`, the run not `dispatching`, or a cancel
        intent exists (cancelled meanwhile: no spawn). The deadline (database time + the pinned
        timeout, NULL without one) is written here once and never replaced. A repeated Activate for
        an attempt already `starting` with the same token hash answers `applied` again, with the
        stored deadline.
        """
        check_hash("callback token hash", callback_token_hash)
        check_id("log artifact id", log_artifact_id, 256)
        with self.store.write() as conn:
            try:
                run, attempt, lease = self._check_fence(conn, fence)
            except _Mismatch as mismatch:
                if mismatch.ended is not None and _ended(*mismatch.ended[:2]):
                    # cancelled before activation: its lease ended with it (SEMANTICS.md §7)
                    ended_attempt = mismatch.ended[1]
                    return ActivateResult(REFUSED, detail=f"attempt_{ended_attempt.status}")
                return ActivateResult(FENCED, detail=mismatch.detail)
            status = _A(attempt.status)
            if status is _A.STARTING:
                if same_hash(attempt.callback_token_hash, callback_token_hash):
                    return ActivateResult(APPLIED, attempt.deadline_at_ms, lease.version, "already_starting")
                return ActivateResult(REFUSED, lease_version=lease.version, detail="activated_with_other_token")
            if status is not _A.CLAIMED:
                return ActivateResult(REFUSED, lease_version=lease.version, detail=f"attempt_{status.value}")
            if run.status != _R.DISPATCHING.value:
                return ActivateResult(REFUSED, lease_version=lease.version, detail=f"run_{run.status}")
            if run.cancel_reason is not None:
                return ActivateResult(REFUSED, lease_version=lease.version, detail="cancel_requested")
            timeout_ms = pinned_revision(conn, run).timeout_ms
            now = self.store.now_ms(conn)
            deadline = now + timeout_ms if timeout_ms is not None else None
            apply_plan(conn, plan_activate(run_snapshot(run), attempt_snapshot(attempt)), now,
                       actor_type=ACTOR, expected_callback_sequence=attempt.callback_sequence,
                       attempt_values=dict(callback_token_hash=callback_token_hash,
                                           log_artifact_id=log_artifact_id, deadline_at_ms=deadline))
            return ActivateResult(APPLIED, deadline, lease.version)

    def started(self, fence: Fence, boot_id: str, pid: int, pgid: int, start_ticks: int) -> Outcome:
        """Attempt and run `running` with the process identity and `started_at_ms` (database time).

        Idempotent: an attempt already `running` with the same identity answers `applied` (no
        event); another identity is `refused`. An attempt or run that already ended (a fast job's
        receipt landed first) answers `already_terminal`.
        """
        identity = Identity(boot_id, pid, pgid, start_ticks)
        with self.store.write(durable=False) as conn:
            try:
                run, attempt, _lease = self._check_fence(conn, fence)
            except _Mismatch as mismatch:
                return _fenced_or_ended(mismatch)
            if _ended(run, attempt):
                return Outcome(ALREADY_TERMINAL, f"attempt_{attempt.status}", run.status)
            status = _A(attempt.status)
            if status is _A.RUNNING:
                if Identity.from_row(attempt) == identity:
                    return Outcome(APPLIED, "already_running", run.status)
                return Outcome(REFUSED, "identity_mismatch", run.status)
            if status is not _A.STARTING:
                return Outcome(REFUSED, f"attempt_{status.value}", run.status)
            now = self.store.now_ms(conn)
            plan = plan_started(run_snapshot(run), attempt_snapshot(attempt))
            apply_plan(conn, plan, now, actor_type=ACTOR,
                       expected_callback_sequence=attempt.callback_sequence,
                       run_values={"started_at_ms": now} if run.started_at_ms is None else None,
                       attempt_values=dict(boot_id=identity.boot_id, pid=identity.pid, pgid=identity.pgid,
                                           start_ticks=identity.start_ticks, started_at_ms=now))
            return Outcome(APPLIED, None, plan.run_to.value)

    def start_failed(self, fence: Fence, reason: str) -> Outcome:
        """The launcher could not be spawned: attempt and run `failed` (EXECUTOR_START_FAILED).

        The caller checks for a receipt first (SEMANTICS.md §4). `error_summary` is the reason cut
        to 512 characters; the lease ends `released` (`start_failed`). A committed cancel intent
        wins, as everywhere: the run ends as the intent says, with the reason kept as its summary.
        """
        if type(reason) is not str:
            raise BadInput("a start failure reason is a string")
        summary = reason[:MAX_ERROR_SUMMARY]
        with self.store.write() as conn:
            try:
                run, attempt, _lease = self._check_fence(conn, fence)
            except _Mismatch as mismatch:
                return _fenced_or_ended(mismatch)
            if _ended(run, attempt):
                return Outcome(ALREADY_TERMINAL, f"attempt_{attempt.status}", run.status)
            if attempt.status != _A.STARTING.value:
                return Outcome(REFUSED, f"attempt_{attempt.status}", run.status)
            now = self.store.now_ms(conn)
            run_s, attempt_s = run_snapshot(run), attempt_snapshot(attempt)
            plan = plan_end_by_intent(run_s, attempt_s) if run.cancel_reason else plan_start_failed(run_s, attempt_s)
            apply_plan(conn, plan, now, actor_type=ACTOR, expected_callback_sequence=attempt.callback_sequence,
                       run_values={"error_summary": summary}, attempt_values={"error_summary": summary})
            end_lease(conn, attempt.id, now, _L.RELEASED, LeaseReleaseReason.START_FAILED)
            return Outcome(APPLIED, None, plan.run_to.value)

    def release_unstarted(self, fence: Fence, reason: LeaseReleaseReason | str) -> Outcome:
        """The executor declines an offer it never activated: its lease ends `released`.

        `reason` is `declined` or `shutdown`. The attempt stays `claimed` and the run `dispatching`
        (no `dispatching -> queued` edge exists); `offer` picks such a run again under a new lease
        generation. Also closes the lease of an attempt that ended meanwhile (e.g. cancelled before
        activation, after Activate was refused). An activated attempt is `refused`: use
        `start_failed`. A lease already ended answers `applied` again (`lease_already_ended`).
        """
        reason = LeaseReleaseReason(reason)
        if reason not in (LeaseReleaseReason.DECLINED, LeaseReleaseReason.SHUTDOWN):
            raise BadInput("an unstarted offer is released as declined or shutdown")
        with self.store.write() as conn:
            try:
                run, attempt, _lease = self._check_fence(conn, fence)
            except _Mismatch as mismatch:
                if mismatch.ended is not None:
                    return Outcome(APPLIED, "lease_already_ended", mismatch.ended[0].status)
                return Outcome(FENCED, mismatch.detail)
            status = _A(attempt.status)
            if status in (_A.STARTING, _A.RUNNING):
                return Outcome(REFUSED, f"attempt_{status.value}", run.status)
            end_lease(conn, attempt.id, self.store.now_ms(conn), _L.RELEASED, reason)
            return Outcome(APPLIED, "attempt_terminal" if status.terminal else None, run.status)

    def release_unactivated(self, run_id: str, attempt_id: str) -> Outcome:
        """An attempt offered but never activated that no executor holds: its live lease ends
        `released` (`lease_expired`) and the attempt stays `claimed`, its run `dispatching`.

        It never started, so nothing can run twice: `offer` picks it again under a new lease
        generation (SEMANTICS.md §6 step 2). `refused` unless the attempt is still `claimed`;
        `detail` is `no_live_lease` when there was nothing to release.
        """
        with self.store.write() as conn:
            self.store.advisory_lock(conn, f"attempt:{attempt_id}")
            run, attempt, ended = load_open_pair(conn, run_id, attempt_id)
            if ended is not None:
                return ended
            if attempt.status != _A.CLAIMED.value:
                return Outcome(REFUSED, f"attempt_{attempt.status}", run.status)
            version = end_lease(conn, attempt_id, self.store.now_ms(conn), _L.RELEASED,
                                LeaseReleaseReason.LEASE_EXPIRED)
            return Outcome(APPLIED, None if version is not None else "no_live_lease", run.status)


def _ended(run, attempt) -> bool:
    return RunStatus(run.status).terminal or AttemptStatus(attempt.status).terminal


def _fenced_or_ended(mismatch: _Mismatch) -> Outcome:
    """A report on a lease that has ended because its attempt ended is `already_terminal`, not fenced."""
    if mismatch.ended is not None:
        run, attempt, _lease = mismatch.ended
        if _ended(run, attempt):
            return Outcome(ALREADY_TERMINAL, mismatch.detail, run.status)
    return Outcome(FENCED, mismatch.detail)
