"""Store: the control cadence's records and row loaders: stop orders, recovery candidates, re-bind answers,
the page sizes of its reads, and the queries that turn rows into those records (SEMANTICS.md §6,
§7, §10). Nothing here writes; the operations that do are in stops.py, recovery_cases.py and
lost_retry.py, and control_status.py holds the reads behind `status` and the cadence's idle test.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, select

from ...domain.states import AttemptStatus, LeaseStatus, RunStatus
from ...errors import BadInput
from ..records import Identity
from ..schema import run_attempts, run_dispatch_leases, runs

DEFAULT_PAGE = 16
MAX_PAGE = 64  # recovery and retry pages (SEMANTICS.md §10)
MAX_STOP_PAGE = 256  # timeouts and stops: each is tiny, and every one of them is due now

_A, _R, _L = AttemptStatus, RunStatus, LeaseStatus
LIVE = [_A.STARTING.value, _A.RUNNING.value]
ACTIVE = [_A.CLAIMED.value, _A.STARTING.value, _A.RUNNING.value]
DISPATCHED = [_R.DISPATCHING.value, _R.RUNNING.value]


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
    """An attempt recovery must judge: the database's facts (edge's Recovery asks the executor side
    for its journal's, runtime/ports.py)."""

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

    @property
    def identity(self) -> Identity | None:
        return Identity.from_row(self)


def page_size(limit: Any, maximum: int = MAX_PAGE) -> int:
    if type(limit) is not int or not 1 <= limit <= maximum:
        raise BadInput(f"a page holds 1 to {maximum} entries")
    return limit


def stop_order(run_id: str, attempt, reason: str, grace_ms: int) -> StopOrder:
    return StopOrder(run_id=run_id, attempt_id=attempt.id, reason=reason, grace_ms=grace_ms,
                     boot_id=attempt.boot_id, pid=attempt.pid, pgid=attempt.pgid,
                     start_ticks=attempt.start_ticks, attempt_status=attempt.status,
                     worker_id=attempt.worker_id)


def live_lease():
    return (select(run_dispatch_leases.c.attempt_id).where(and_(
        run_dispatch_leases.c.attempt_id == run_attempts.c.id,
        run_dispatch_leases.c.status == _L.LEASED.value)).exists())


def candidate_select():
    return (select(run_attempts, runs.c.status.label("run_status"), runs.c.cancel_reason)
            .select_from(run_attempts.join(runs, runs.c.id == run_attempts.c.run_id)))


def candidate_from_row(row) -> Candidate:
    return Candidate(
        run_id=row.run_id, attempt_id=row.id, attempt_number=row.number, attempt_status=row.status,
        run_status=row.run_status, cancel_reason=row.cancel_reason, deadline_at_ms=row.deadline_at_ms,
        boot_id=row.boot_id, pid=row.pid, pgid=row.pgid, start_ticks=row.start_ticks,
        callback_token_hash=row.callback_token_hash, worker_id=row.worker_id, session_id=row.session_id,
        session_generation=row.session_generation, offer_id=row.offer_id,
        lease_generation=row.lease_generation)
