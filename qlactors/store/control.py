"""Control-side store operations of the cadence: timeouts, stops, lost attempts, recovery candidates
and re-binding survivors (SEMANTICS.md §6, §7, §10); the retry of lost runs is in lost_retry.py.

Every write is one short transaction per run; a page of work is a read that lists ids, then one
transaction per id that re-checks everything under its locks (so a page never holds locks for long
and one broken run cannot roll back the others' commits).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

from sqlalchemy import and_, func, or_, select

from ..domain.states import (
    AttemptStatus,
    CancelReason,
    LeaseReleaseReason,
    LeaseStatus,
    RunStatus,
)
from ..domain.transitions import (
    InvalidTransition,
    plan_cancel,
    plan_end_by_intent,
    plan_lost,
    plan_started,
)
from ..errors import BadInput, Conflict
from .records import (
    ALREADY_TERMINAL,
    APPLIED,
    FENCED,
    REFUSED,
    Fence,
    Identity,
    Outcome,
    Session,
    check_hash,
    check_id,
    same_hash,
)
from .engine import Store
from ..worker.journal_records import JournalEntry
from .plans import (
    apply_plan,
    attempt_snapshot,
    current_attempt,
    end_lease,
    load_open_pair,
    load_run,
    pinned_revision,
    run_snapshot,
)
from .schema import (
    executor_journal,
    run_attempts,
    run_dispatch_leases,
    run_retry_policies,
    runs,
    task_revisions,
    worker_sessions,
)

DEFAULT_PAGE = 16
MAX_PAGE = 64  # recovery and retry pages (SEMANTICS.md §10)
MAX_STOP_PAGE = 256  # timeouts and stops: each is tiny, and every one of them is due now

_A, _R, _L = AttemptStatus, RunStatus, LeaseStatus
_LIVE = [_A.STARTING.value, _A.RUNNING.value]
_ACTIVE = [_A.CLAIMED.value, _A.STARTING.value, _A.RUNNING.value]
_DISPATCHED = [_R.DISPATCHING.value, _R.RUNNING.value]
_ERROR_CODE = re.compile(r"[A-Z][A-Z0-9_]{0,63}")


@dataclass(frozen=True, slots=True)
class StopOrder:
    """Stop this attempt's process (by exact identity), then end it by its intent if no receipt comes."""

    run_id: str
    attempt_id: str
    reason: str
    """The committed cancel reason: user, policy, timeout or shutdown."""
    grace_ms: int
    """The pinned revision's stop grace between TERM and KILL."""
    boot_id: str | None
    pid: int | None
    pgid: int | None
    start_ticks: int | None
    attempt_status: str
    worker_id: str | None = None  # whose process it is (a cluster stop goes to that worker)

    @property
    def identity(self) -> Identity | None:
        """None while the attempt has no recorded identity (Started never committed)."""
        return Identity.from_row(self)


@dataclass(frozen=True, slots=True)
class Candidate:
    """An attempt recovery must judge: the database's facts, and the local journal's if any."""

    run_id: str
    attempt_id: str
    attempt_number: int
    attempt_status: str
    run_status: str
    cancel_reason: str | None
    deadline_at_ms: int | None
    boot_id: str | None
    pid: int | None
    pgid: int | None
    start_ticks: int | None
    callback_token_hash: str | None
    worker_id: str | None
    session_id: str | None
    session_generation: int | None
    offer_id: str | None
    lease_generation: int | None
    journal: JournalEntry | None
    """The executor_journal row (LEFT JOIN on attempt id); None when there is none."""

    @property
    def identity(self) -> Identity | None:
        return Identity.from_row(self)


@dataclass(frozen=True, slots=True)
class RebindResult:
    """The answer to `rebind`; on `applied`, `fence` is what the new session's reports quote."""

    result: str
    detail: str | None = None
    run_state: str | None = None
    fence: Fence | None = None


@dataclass(frozen=True, slots=True)
class StatusCounts:
    """What `qlactors status` shows: runs by state, live attempts by state."""

    runs: Mapping[str, int]
    attempts: Mapping[str, int]


def page_size(limit: Any, maximum: int = MAX_PAGE) -> int:
    if type(limit) is not int or not 1 <= limit <= maximum:
        raise BadInput(f"a page holds 1 to {maximum} entries")
    return limit


class Control:
    """Timeouts, stops, lost attempts, recovery candidates and re-binding."""

    def __init__(self, store: Store) -> None:
        self.store = store

    # -- deadlines and stops -----------------------------------------------------------------

    def next_deadline_ms(self) -> int | None:
        """The earliest deadline of a `starting|running` attempt whose run has no cancel intent."""
        with self.store.read() as conn:
            return conn.execute(select(func.min(run_attempts.c.deadline_at_ms)).select_from(
                run_attempts.join(runs, runs.c.id == run_attempts.c.run_id)).where(and_(
                    run_attempts.c.status.in_(_LIVE), run_attempts.c.deadline_at_ms.is_not(None),
                    runs.c.cancel_reason.is_(None)))).scalar_one()

    def next_due_ms(self) -> int | None:
        """When the cadence must wake next: the earliest attempt deadline or retry backoff end."""
        with self.store.read() as conn:
            retry = conn.execute(select(func.min(run_retry_policies.c.next_attempt_at_ms)).select_from(
                run_retry_policies.join(runs, runs.c.id == run_retry_policies.c.run_id)).where(
                    runs.c.status == _R.RETRY_WAIT.value)).scalar_one()
        due = [t for t in (self.next_deadline_ms(), retry) if t is not None]
        return min(due) if due else None

    def queued_waiting(self) -> bool:
        """True when a run waits for an offer (the Scheduler then nudges executors): one `queued`
        whose not-before time (a cron random delay) is not ahead, or a `dispatching` one whose
        `claimed` attempt holds no live lease (released unactivated)."""
        released = select(run_attempts.c.id).where(and_(
            run_attempts.c.run_id == runs.c.id, run_attempts.c.status == _A.CLAIMED.value, ~_live_lease()))
        with self.store.read() as conn:
            due = or_(runs.c.not_before_ms.is_(None), runs.c.not_before_ms <= self.store.now_ms(conn))
            return conn.execute(select(runs.c.id).where(and_(runs.c.cancel_reason.is_(None), or_(
                and_(runs.c.status == _R.QUEUED.value, due),
                and_(runs.c.status == _R.DISPATCHING.value, released.exists()))))
                .limit(1)).first() is not None

    def active_run_ids(self, limit: int = 1024) -> list[str]:
        """Runs that are not terminal (oldest first, bounded)."""
        with self.store.read() as conn:
            return list(conn.execute(select(runs.c.id).where(runs.c.status.in_(
                [s.value for s in RunStatus if not s.terminal])).order_by(runs.c.created_at_ms)
                .limit(limit)).scalars())

    def commit_timeouts(self, limit: int = DEFAULT_PAGE) -> list[StopOrder]:
        """Commit `cancel_reason=timeout` for attempts past their deadline; the stops to send.

        One transaction per run, each re-checking deadline (database time) and intent under the
        run lock, so a user's intent committed meanwhile is never overwritten. Only the runs this
        call gave an intent are returned; `pending_stops` lists every intent still to enforce.
        """
        page_size(limit, MAX_STOP_PAGE)
        with self.store.read() as conn:
            now = self.store.now_ms(conn)
            due = conn.execute(
                select(run_attempts.c.run_id, run_attempts.c.id)
                .join(runs, runs.c.id == run_attempts.c.run_id)
                .where(and_(run_attempts.c.status.in_(_LIVE), run_attempts.c.deadline_at_ms <= now,
                            runs.c.cancel_reason.is_(None), runs.c.status.in_(_DISPATCHED)))
                .order_by(run_attempts.c.deadline_at_ms, run_attempts.c.id).limit(limit)).all()
        orders = []
        for run_id, attempt_id in due:
            order = self._commit_timeout(run_id, attempt_id)
            if order is not None:
                orders.append(order)
        return orders

    def _commit_timeout(self, run_id: str, attempt_id: str) -> StopOrder | None:
        with self.store.write() as conn:
            self.store.advisory_lock(conn, f"attempt:{attempt_id}")
            run = load_run(conn, run_id)
            attempt = current_attempt(conn, run_id)
            if (run is None or attempt is None or attempt.id != attempt_id
                    or attempt.status not in _LIVE or run.cancel_reason is not None):
                return None
            now = self.store.now_ms(conn)
            if attempt.deadline_at_ms is None or attempt.deadline_at_ms > now:
                return None
            plan = plan_cancel(run_snapshot(run), attempt_snapshot(attempt), CancelReason.TIMEOUT)
            if plan is None:
                return None
            apply_plan(conn, plan, now, actor_type="scheduler",
                       expected_callback_sequence=attempt.callback_sequence)
            return _stop_order(run.id, attempt, CancelReason.TIMEOUT.value,
                               pinned_revision(conn, run).stop_grace_ms)

    def pending_stops(self, limit: int = DEFAULT_PAGE, *, worker_id: str | None = None) -> list[StopOrder]:
        """Runs with a committed cancel intent whose attempt is `starting|running`, oldest intent first.

        Re-sending StopRequested for them is idempotent, so this is also how stops survive a restart
        and how a stop committed by one replica reaches a worker talking to another (every
        heartbeat answer carries that worker's: `worker_id`).
        """
        page_size(limit, MAX_STOP_PAGE)
        where = and_(runs.c.cancel_reason.is_not(None), runs.c.status.in_(_DISPATCHED),
                     run_attempts.c.status.in_(_LIVE))
        if worker_id is not None:
            where = and_(where, run_attempts.c.worker_id == worker_id)
        query = (
            select(run_attempts, runs.c.cancel_reason, task_revisions.c.stop_grace_ms)
            .join(runs, runs.c.id == run_attempts.c.run_id)
            .join(task_revisions, and_(task_revisions.c.task_id == runs.c.task_id,
                                       task_revisions.c.revision == runs.c.task_revision))
            .where(where)
            .order_by(runs.c.cancel_requested_at_ms, runs.c.id).limit(limit))
        with self.store.read() as conn:
            return [_stop_order(r.run_id, r, r.cancel_reason, r.stop_grace_ms) for r in conn.execute(query)]

    def end_by_intent(self, run_id: str, attempt_id: str, *, actor_type: str = "scheduler") -> Outcome:
        """End a run whose process is conclusively gone with no receipt, as its cancel intent says.

        `exit_code` stays NULL. The live lease ends `released`: reason `shutdown` for a shutdown
        intent, else `declined` (the control side withdrew the attempt's authority; the lease
        vocabulary has no better word, and `completed` is kept for receipts).
        """
        with self.store.write() as conn:
            self.store.advisory_lock(conn, f"attempt:{attempt_id}")
            run = load_run(conn, run_id)
            if run is None:
                return Outcome(REFUSED, "unknown_run")
            if RunStatus(run.status).terminal:
                return Outcome(ALREADY_TERMINAL, None, run.status)
            attempt = current_attempt(conn, run_id)
            if attempt is None or attempt.id != attempt_id:
                return Outcome(REFUSED, "not_current_attempt", run.status)
            if run.cancel_reason is None:
                return Outcome(REFUSED, "no_intent", run.status)
            try:
                plan = plan_end_by_intent(run_snapshot(run), attempt_snapshot(attempt))
            except InvalidTransition:
                return Outcome(REFUSED, f"run_{run.status}", run.status)
            now = self.store.now_ms(conn)
            apply_plan(conn, plan, now, actor_type=actor_type,
                       expected_callback_sequence=attempt.callback_sequence)
            reason = (LeaseReleaseReason.SHUTDOWN if run.cancel_reason == CancelReason.SHUTDOWN.value
                      else LeaseReleaseReason.DECLINED)
            end_lease(conn, attempt.id, now, _L.RELEASED, reason)
            return Outcome(APPLIED, None, plan.run_to.value)

    # -- lost and recovery -------------------------------------------------------------------

    def mark_lost(self, run_id: str, attempt_id: str, error_code: str, *,
                  actor_type: str = "recovery") -> Outcome:
        """Attempt and run `lost`, and the live lease `released` (`lease_expired`), in one transaction.

        `refused` when the run has a cancel intent (recovery then calls `end_by_intent`), when
        the run is not `dispatching|running` (a `claimed` attempt of a `queued` run is backlog),
        or when the attempt is not the run's current one.
        """
        if type(error_code) is not str or _ERROR_CODE.fullmatch(error_code) is None:
            raise BadInput("an error code is 1 to 64 characters of A-Z, 0-9 and _")
        with self.store.write() as conn:
            self.store.advisory_lock(conn, f"attempt:{attempt_id}")
            run, attempt, ended = load_open_pair(conn, run_id, attempt_id)
            if ended is not None:
                return ended
            if run.cancel_reason is not None:
                return Outcome(REFUSED, "cancel_intent", run.status)
            if run.status not in _DISPATCHED:
                return Outcome(REFUSED, f"run_{run.status}", run.status)
            current = current_attempt(conn, run_id)
            if current.id != attempt.id:
                return Outcome(REFUSED, "not_current_attempt", run.status)
            now = self.store.now_ms(conn)
            plan = plan_lost(run_snapshot(run), attempt_snapshot(attempt), error_code)
            apply_plan(conn, plan, now, actor_type=actor_type,
                       expected_callback_sequence=attempt.callback_sequence)
            end_lease(conn, attempt.id, now, _L.RELEASED, LeaseReleaseReason.LEASE_EXPIRED)
            return Outcome(APPLIED, None, plan.run_to.value)

    def recovery_candidates(self, limit: int = DEFAULT_PAGE, after_attempt_id: str | None = None, *,
                            worker_id: str | None = None) -> tuple[list[Candidate], bool]:
        """One page of attempts to judge, ascending attempt id, and whether more remain (`limit + 1`).

        Attempts `claimed|starting|running` of runs `dispatching|running`. A `claimed` attempt
        counts only while it holds a live lease (offered, never activated): a `queued` run, or a
        declined offer waiting to be offered again, is backlog, never a candidate. `worker_id`
        narrows the page to attempts last leased by that worker.
        """
        page_size(limit)
        query = _candidate_select().where(and_(
            runs.c.status.in_(_DISPATCHED), run_attempts.c.status.in_(_ACTIVE),
            or_(run_attempts.c.status != _A.CLAIMED.value, _live_lease())))
        if after_attempt_id is not None:
            query = query.where(run_attempts.c.id > after_attempt_id)
        if worker_id is not None:
            query = query.where(run_attempts.c.worker_id == worker_id)
        query = query.order_by(run_attempts.c.id).limit(limit + 1)
        with self.store.read() as conn:
            rows = conn.execute(query).all()
        return [_candidate(r) for r in rows[:limit]], len(rows) > limit

    def candidates_for(self, attempt_ids: list[str]) -> list[Candidate]:
        """The candidates among `attempt_ids` (ids no longer in flight are simply absent)."""
        found = (self.candidate(attempt_id) for attempt_id in attempt_ids)
        return [c for c in found if c is not None]

    def candidate(self, attempt_id: str) -> Candidate | None:
        """The same facts for one attempt, whatever its state (for the continuous pass)."""
        with self.store.read() as conn:
            row = conn.execute(_candidate_select().where(run_attempts.c.id == attempt_id)).first()
        return _candidate(row) if row is not None else None

    def rebind(self, run_id: str, attempt_id: str, session: Session, identity: Any, *,
               offer_id: str, lease_token_hash: str, actor_type: str = "recovery") -> RebindResult:
        """Re-bind a process that survived a restart to the current local session.

        The old live lease ends `released` (`shutdown`); a new lease (next generation, the given
        offer id and token hash, version 1) is written for `session`, with the attempt's lease
        projection; `starting` is promoted to `running` (identity written, `started_at_ms` if
        unset). A recorded identity that differs is `refused`. Capacity is not checked: a survivor
        is adopted whatever the slots say. Repeating the call with the same offer id and token
        hash answers `applied` again. Returns the fence the new session's reports quote.
        """
        ident = Identity.of(identity)
        check_id("offer id", offer_id)
        check_hash("lease token hash", lease_token_hash)
        with self.store.write() as conn:
            self.store.advisory_lock(conn, f"attempt:{attempt_id}")
            srow = conn.execute(select(worker_sessions).where(
                worker_sessions.c.session_id == session.session_id).with_for_update()).first()
            if (srow is None or srow.worker_id != session.worker_id
                    or srow.generation != session.generation or srow.status != "online"):
                return RebindResult(FENCED, "session")
            run = load_run(conn, run_id)
            if run is None:
                return RebindResult(REFUSED, "unknown_run")
            attempt = current_attempt(conn, run_id)
            if attempt is None or attempt.id != attempt_id:
                return RebindResult(REFUSED, "not_current_attempt", run.status)
            if RunStatus(run.status).terminal or AttemptStatus(attempt.status).terminal:
                return RebindResult(ALREADY_TERMINAL, f"attempt_{attempt.status}", run.status)
            if attempt.status not in _LIVE or run.status not in _DISPATCHED:
                return RebindResult(REFUSED, f"attempt_{attempt.status}", run.status)
            stored = Identity.from_row(attempt)
            if stored is not None and stored != ident:
                return RebindResult(REFUSED, "identity_mismatch", run.status)
            live = conn.execute(select(run_dispatch_leases).where(and_(
                run_dispatch_leases.c.attempt_id == attempt_id,
                run_dispatch_leases.c.status == _L.LEASED.value)).with_for_update()).first()
            if (live is not None and live.offer_id == offer_id and live.session_id == session.session_id
                    and same_hash(live.token_hash, lease_token_hash) and attempt.status == _A.RUNNING.value):
                return RebindResult(APPLIED, "already_bound", run.status, _fence(session, run_id, live))
            if conn.execute(select(run_dispatch_leases.c.attempt_id).where(
                    run_dispatch_leases.c.offer_id == offer_id)).first() is not None:
                return RebindResult(REFUSED, "offer_id_taken", run.status)
            now = self.store.now_ms(conn)
            if live is not None:
                end_lease(conn, attempt_id, now, _L.RELEASED, LeaseReleaseReason.SHUTDOWN)
            generation = conn.execute(select(func.coalesce(func.max(run_dispatch_leases.c.lease_generation), 0))
                                      .where(run_dispatch_leases.c.attempt_id == attempt_id)).scalar_one() + 1
            lease = dict(attempt_id=attempt_id, lease_generation=generation, run_id=run_id,
                         status=_L.LEASED.value, version=1, worker_id=session.worker_id,
                         session_id=session.session_id, session_generation=session.generation,
                         token_hash=lease_token_hash, offer_id=offer_id, expires_at_ms=None,
                         release_reason=None, created_at_ms=now, updated_at_ms=now)
            if not self.store.insert_new(conn, run_dispatch_leases, lease):
                raise Conflict(f"attempt {attempt_id} was leased again meanwhile")
            values: dict[str, Any] = dict(
                offer_id=offer_id, lease_generation=generation, lease_version=1, lease_expires_at_ms=None,
                worker_id=session.worker_id, session_id=session.session_id,
                session_generation=session.generation, boot_id=ident.boot_id, pid=ident.pid,
                pgid=ident.pgid, start_ticks=ident.start_ticks)
            if attempt.started_at_ms is None:
                values["started_at_ms"] = now
            if attempt.status == _A.STARTING.value:
                plan = plan_started(run_snapshot(run), attempt_snapshot(attempt))
                apply_plan(conn, plan, now, actor_type=actor_type,
                           expected_callback_sequence=attempt.callback_sequence, attempt_values=values,
                           run_values={"started_at_ms": now} if run.started_at_ms is None else None)
            else:
                changed = conn.execute(run_attempts.update().where(and_(
                    run_attempts.c.id == attempt_id, run_attempts.c.status == attempt.status,
                    run_attempts.c.callback_sequence == attempt.callback_sequence))
                    .values(updated_at_ms=now, **values)).rowcount
                if changed != 1:
                    raise Conflict(f"attempt {attempt_id} changed meanwhile")
            fence = Fence(session.worker_id, session.session_id, session.generation, run_id, attempt_id,
                          offer_id, generation, lease_token_hash, 1)
            return RebindResult(APPLIED, None, _R.RUNNING.value, fence)

    # -- status ------------------------------------------------------------------------------

    def lost_count(self) -> int:
        with self.store.read() as conn:
            return conn.execute(select(func.count()).select_from(runs).where(
                runs.c.status == _R.LOST.value)).scalar_one()

    def status_counts(self) -> StatusCounts:
        """Runs by state (every state present, zero included) and live attempts by state."""
        with self.store.read() as conn:
            by_run = dict(conn.execute(select(runs.c.status, func.count()).group_by(runs.c.status)).all())
            by_attempt = dict(conn.execute(select(run_attempts.c.status, func.count())
                                           .where(run_attempts.c.status.in_(_ACTIVE))
                                           .group_by(run_attempts.c.status)).all())
        return StatusCounts(runs={s.value: by_run.get(s.value, 0) for s in RunStatus},
                            attempts={s: by_attempt.get(s, 0) for s in _ACTIVE})


def _stop_order(run_id: str, attempt, reason: str, grace_ms: int) -> StopOrder:
    return StopOrder(run_id=run_id, attempt_id=attempt.id, reason=reason, grace_ms=grace_ms,
                     boot_id=attempt.boot_id, pid=attempt.pid, pgid=attempt.pgid,
                     start_ticks=attempt.start_ticks, attempt_status=attempt.status,
                     worker_id=attempt.worker_id)


def _fence(session: Session, run_id: str, lease) -> Fence:
    return Fence(session.worker_id, session.session_id, session.generation, run_id, lease.attempt_id,
                 lease.offer_id, lease.lease_generation, lease.token_hash, lease.version)


def _live_lease():
    return (select(run_dispatch_leases.c.attempt_id).where(and_(
        run_dispatch_leases.c.attempt_id == run_attempts.c.id,
        run_dispatch_leases.c.status == _L.LEASED.value)).exists())


_JOURNAL_PREFIX = "j_"


def _candidate_select():
    journal_cols = [c.label(_JOURNAL_PREFIX + c.name) for c in executor_journal.c]
    return (select(run_attempts, runs.c.status.label("run_status"), runs.c.cancel_reason, *journal_cols)
            .select_from(run_attempts.join(runs, runs.c.id == run_attempts.c.run_id)
                         .outerjoin(executor_journal, executor_journal.c.attempt_id == run_attempts.c.id)))


def _candidate(row) -> Candidate:
    journal = None
    if getattr(row, _JOURNAL_PREFIX + "attempt_id") is not None:
        journal = JournalEntry.from_row(row, _JOURNAL_PREFIX)
    return Candidate(
        run_id=row.run_id, attempt_id=row.id, attempt_number=row.number, attempt_status=row.status,
        run_status=row.run_status, cancel_reason=row.cancel_reason, deadline_at_ms=row.deadline_at_ms,
        boot_id=row.boot_id, pid=row.pid, pgid=row.pgid, start_ticks=row.start_ticks,
        callback_token_hash=row.callback_token_hash, worker_id=row.worker_id, session_id=row.session_id,
        session_generation=row.session_generation, offer_id=row.offer_id,
        lease_generation=row.lease_generation, journal=journal)
