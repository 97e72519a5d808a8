"""Store: cluster recovery of `starting|running` attempts whose lease is missing or expired, on evidence
(SEMANTICS.md §10 step 1; never-activated claims are expired_claims.py's).

Expiry alone never proves a process stopped. The candidate query holds the evidence predicate,
so attempts still waiting for evidence never fill a page and starve the others; `waiting` lists
those, with the reason (for `status` and `show`). The evidence kind is one SQL expression, used
by the page, by `waiting` and by the re-check under the locks:

- a trusted recorded fact (`run_attempts.evidence`, domain/recovery_evidence.py TRUSTED_FACTS:
  what the worker attested, `rebooted` written at Register, `retired` written by
  `worker retire --confirm-stopped`, `confirmed_stopped` written by `confirm-stopped RUN`) about
  the attempt's current lease generation (`evidence_lease_generation` equals the
  `lease_generation` projection): a fact about an older lease never ends a newer one;
  `launch_unknown` is never trusted;
- `session_ended`: the run's safety is `idempotent|deduplicated` and the session named by the
  attempt's lease ended longer ago than the recovery grace (database time). A session ends when
  its lease expires, when a later generation supersedes it or `worker revoke` ends it
  (`ended_at_ms`); a drained session (`drained_at_ms`: a planned stop) counts as ended only a
  drain grace after it ended (went offline, or its lease expired), even once superseded.

`resolve` is one short transaction in the §9 lock order: the attempt's advisory lock, the
session row (shared), the run, then the live lease row; under them it re-reads the candidate,
and acts only when the lease is still missing or expired with the generation the page saw and
the evidence still holds. A cancel intent ends the run as intended; otherwise the attempt and
run go `lost` and the lease `released` (`lease_expired`, version + 1) together.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import BigInteger, and_, bindparam, case, func, literal_column, null, or_, select

from ...domain.recovery_evidence import (
    GRACE_SAFETIES,
    SESSION_ENDED,
    TRUSTED_FACTS,
    Waiting,
    WaitingFacts,
    error_code,
    waiting,
)
from ...domain.results import Outcome, Result
from ...domain.states import AttemptStatus, LeaseStatus, RunStatus
from ...errors import BadInput
from ..dispatch.dispatch_queries import SESSION_SHARED
from ..engine import Store
from ..plans import load_open_pair, sql_states
from ..schema import run_attempts, run_dispatch_leases, run_retry_policies, runs, worker_keys, worker_sessions
from .control_rows import page_size
from .recovery_cases import lost_in
from .stops import end_by_intent_in

ACTOR = "recovery"
WAITING_SHOWN = 20

_A, _L, _S, _P, _K = run_attempts, run_dispatch_leases, worker_sessions, run_retry_policies, worker_keys
_LIVE = sql_states(AttemptStatus.STARTING, AttemptStatus.RUNNING)
_RUNS = sql_states(RunStatus.DISPATCHING, RunStatus.RUNNING, RunStatus.LOST)


def _words(*words: str) -> list:
    """Constant words written into the SQL (as `sql_states`: the statements are built once)."""
    return [literal_column(repr(w)) for w in words]


_NOW = bindparam("now", type_=BigInteger)
# When the lease's session ended, as the idempotent rule counts it (NULL: it has not, or lives as
# long as its process: edge).
_SESSION_END = case(
    (_S.c.drained_at_ms.is_not(None), func.coalesce(_S.c.ended_at_ms, _S.c.lease_expires_at_ms)
     + bindparam("drain_grace_ms", type_=BigInteger)),
    (_S.c.status == "offline", _S.c.ended_at_ms),
    else_=_S.c.lease_expires_at_ms)
_KIND = case(
    (and_(_A.c.evidence.in_(_words(*TRUSTED_FACTS)), _A.c.evidence_lease_generation == _A.c.lease_generation),
     _A.c.evidence),
    (and_(_P.c.safety.in_(_words(*GRACE_SAFETIES)), _SESSION_END <= _NOW - bindparam("grace_ms", type_=BigInteger)),
     literal_column(repr(SESSION_ENDED))),
    else_=null())
# The lease's session was ended by `worker revoke` and the worker's key has not been allowed again:
# its results are held on the worker until an operator acts (issue 28).
_REVOKED = and_(_S.c.ended_by == "revoked", _K.c.worker_id.is_(None))
_SELECT = (
    select(_A.c.run_id, _A.c.id.label("attempt_id"), _A.c.status, _A.c.worker_id, _A.c.session_id,
           _A.c.session_generation, _A.c.evidence, _A.c.evidence_lease_generation,
           _A.c.lease_generation.label("attempt_lease_generation"),
           _L.c.lease_generation, _L.c.expires_at_ms.label("lease_expires_at_ms"), _P.c.safety,
           _S.c.status.label("session_status"), _S.c.lease_expires_at_ms.label("session_expires_at_ms"),
           _S.c.drained_at_ms.label("session_drained_at_ms"), runs.c.cancel_reason,
           _SESSION_END.label("session_end_ms"), _KIND.label("kind"), _REVOKED.label("worker_revoked"))
    .select_from(_A.join(runs, runs.c.id == _A.c.run_id)
                 .outerjoin(_L, and_(_L.c.attempt_id == _A.c.id, _L.c.status == LeaseStatus.LEASED.value))
                 .outerjoin(_S, _S.c.session_id == _A.c.session_id)
                 .outerjoin(_K, _K.c.worker_id == _A.c.worker_id)
                 .outerjoin(_P, _P.c.run_id == _A.c.run_id))
    .where(and_(_A.c.status.in_(_LIVE), runs.c.status.in_(_RUNS))))
_EXPIRED = or_(_L.c.attempt_id.is_(None), and_(_L.c.expires_at_ms.is_not(None), _L.c.expires_at_ms <= _NOW))
_BASE = _SELECT.where(_EXPIRED)
_ORDER = (func.coalesce(_L.c.expires_at_ms, _A.c.updated_at_ms), _A.c.id)
_PAGE = _BASE.where(_KIND.is_not(None)).order_by(*_ORDER).limit(bindparam("limit"))
# A revoked worker's attempts are listed at once, their lease still live or not: nothing it holds
# can come back until an operator allows its key again or retires it.
_WAITING = _SELECT.where(and_(or_(_EXPIRED, _REVOKED), _KIND.is_(None))).order_by(*_ORDER).limit(bindparam("limit"))
_ONE = _BASE.where(_A.c.id == bindparam("attempt_id"))
_ONE_WAITING = _SELECT.where(and_(or_(_EXPIRED, _REVOKED), _A.c.id == bindparam("attempt_id")))
_LIVE_LEASE_LOCKED = select(_L.c.lease_generation).where(and_(
    _L.c.attempt_id == bindparam("attempt_id"), _L.c.status == LeaseStatus.LEASED.value)).with_for_update()


@dataclass(frozen=True, slots=True)
class EvidenceCandidate:
    """An attempt the page found with evidence, as the page saw it."""

    run_id: str
    attempt_id: str
    session_id: str | None
    lease_generation: int | None
    """The live lease's generation; None when the attempt held no live lease."""
    kind: str
    """The evidence kind (domain/recovery_evidence.py EVIDENCE_KINDS)."""


@dataclass(frozen=True, slots=True)
class WaitingAttempt:
    """An attempt whose lease is missing or expired and that waits for evidence."""

    run_id: str
    attempt_id: str
    attempt_status: str
    worker_id: str | None
    session_generation: int | None
    lease_expires_at_ms: int | None
    """None: the attempt holds no live lease."""
    evidence: str | None
    """The recorded fact, if any (an untrusted one, or one about an older lease generation)."""
    reason: str
    eligible_at_ms: int | None
    """When recovery marks it lost (idempotent runs whose session has ended), else None."""

    def to_json(self) -> dict:
        return {"attempt_id": self.attempt_id, "run_id": self.run_id, "attempt_status": self.attempt_status,
                "worker_id": self.worker_id, "session_generation": self.session_generation,
                "expires_at_ms": self.lease_expires_at_ms, "evidence": self.evidence,
                "eligible_at_ms": self.eligible_at_ms, "why": self.reason}


class ClusterRecoveryCases:
    """The evidence page, the waiting list and the resolve of one candidate."""

    def __init__(self, store: Store, *, recovery_grace_ms: int, drain_grace_ms: int) -> None:
        for name, value in (("recovery_grace_ms", recovery_grace_ms), ("drain_grace_ms", drain_grace_ms)):
            if type(value) is not int or value < 0:
                raise BadInput(f"{name} is a non-negative integer of milliseconds")
        self.store = store
        self.recovery_grace_ms = recovery_grace_ms
        self.drain_grace_ms = drain_grace_ms

    def _params(self, now: int, **more) -> dict:
        return dict(now=now, grace_ms=self.recovery_grace_ms, drain_grace_ms=self.drain_grace_ms, **more)

    def page(self, limit: int) -> tuple[list[EvidenceCandidate], bool]:
        """Up to `limit` attempts with evidence (database time), oldest expiry first, and whether
        more remain (`limit + 1`; no cursor: a resolved attempt leaves the next page by itself)."""
        page_size(limit)
        with self.store.read() as conn:
            rows = conn.execute(_PAGE, self._params(self.store.now_ms(conn), limit=limit + 1)).all()
        found = [EvidenceCandidate(r.run_id, r.attempt_id, r.session_id, r.lease_generation, r.kind)
                 for r in rows[:limit]]
        return found, len(rows) > limit

    def waiting(self, limit: int = WAITING_SHOWN) -> tuple[int, list[WaitingAttempt]]:
        """Database time and up to `limit` attempts waiting for evidence, oldest expiry first."""
        with self.store.read() as conn:
            now = self.store.now_ms(conn)
            rows = conn.execute(_WAITING, self._params(now, limit=limit)).all()
        return now, [self._waiting(r, now) for r in rows]

    def waiting_for(self, attempt_id: str) -> WaitingAttempt | None:
        """The attempt's waiting reason, or None when it does not wait (no expired lease and no
        revoked worker, or it has evidence and recovery is about to act)."""
        with self.store.read() as conn:
            now = self.store.now_ms(conn)
            row = conn.execute(_ONE_WAITING, self._params(now, attempt_id=attempt_id)).first()
        return None if row is None or row.kind is not None else self._waiting(row, now)

    def _waiting(self, row, now: int) -> WaitingAttempt:
        over = row.session_status == "offline" or (row.session_expires_at_ms is not None
                                                     and row.session_expires_at_ms <= now)
        ended = row.session_end_ms if over else None  # as the rule counts it: maybe plus the drain grace
        why: Waiting = waiting(WaitingFacts(row.worker_id, row.lease_expires_at_ms, row.evidence, row.safety,
                                            ended, row.session_drained_at_ms is not None,
                                            row.evidence_lease_generation, row.attempt_lease_generation,
                                            row.run_id, row.cancel_reason, bool(row.worker_revoked)),
                               now, self.recovery_grace_ms)
        return WaitingAttempt(row.run_id, row.attempt_id, row.status, row.worker_id, row.session_generation,
                              row.lease_expires_at_ms, row.evidence, why.reason, why.eligible_at_ms)

    def resolve(self, candidate: EvidenceCandidate) -> Outcome:
        """Mark the candidate lost (or end it by its cancel intent) if, under its locks, its lease is
        still missing or expired with the generation the page saw and the evidence still holds.

        `refused` otherwise, changing nothing: `lease_live` (renewed, re-bound, or the attempt
        moved on), `lease_changed`, `session_changed`, `no_evidence`.
        """
        attempt_id = candidate.attempt_id
        with self.store.write() as conn:
            self.store.advisory_lock(conn, f"attempt:{attempt_id}")
            if candidate.session_id is not None:
                conn.execute(SESSION_SHARED, {"session_id": candidate.session_id}).first()
            run, attempt, ended = load_open_pair(conn, candidate.run_id, attempt_id)
            if ended is not None:
                return ended
            conn.execute(_LIVE_LEASE_LOCKED, {"attempt_id": attempt_id}).first()
            now = self.store.now_ms(conn)
            row = conn.execute(_ONE, self._params(now, attempt_id=attempt_id)).first()
            if row is None:
                return Outcome(Result.REFUSED, "lease_live", run.status)
            if row.lease_generation != candidate.lease_generation:
                return Outcome(Result.REFUSED, "lease_changed", run.status)
            if row.session_id != candidate.session_id:
                return Outcome(Result.REFUSED, "session_changed", run.status)
            if row.kind is None:
                return Outcome(Result.REFUSED, "no_evidence", run.status)
            if run.cancel_reason is not None:
                return end_by_intent_in(conn, run, attempt, now, actor_type=ACTOR)
            return lost_in(conn, run, attempt, error_code(row.kind), now, actor_type=ACTOR)
