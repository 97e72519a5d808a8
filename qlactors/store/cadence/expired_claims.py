"""Store: claims whose offer expired before activation (SEMANTICS.md §10 step 1, first case).

A `claimed` attempt whose lease expired was never started: activation refuses an expired lease,
so releasing it (`lease_expired`, version + 1) and offering the attempt again under a new lease
generation can never run anything twice. Pages are chosen with `limit + 1`, no cursor is kept.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import and_, bindparam, select

from ...domain.results import Outcome, Result
from ...domain.states import AttemptStatus, LeaseReleaseReason, LeaseStatus
from ..engine import Store
from ..plans import end_lease, load_open_pair
from ..schema import run_attempts, run_dispatch_leases

_EXPIRED = (
    select(run_dispatch_leases.c.run_id, run_dispatch_leases.c.attempt_id)
    .join(run_attempts, run_attempts.c.id == run_dispatch_leases.c.attempt_id)
    .where(and_(run_dispatch_leases.c.status == LeaseStatus.LEASED.value,
                run_dispatch_leases.c.expires_at_ms <= bindparam("now"),
                run_attempts.c.status == AttemptStatus.CLAIMED.value))
    .order_by(run_dispatch_leases.c.expires_at_ms, run_dispatch_leases.c.attempt_id)
    .limit(bindparam("limit")))
_LIVE_EXPIRY = select(run_dispatch_leases.c.expires_at_ms).where(and_(
    run_dispatch_leases.c.attempt_id == bindparam("attempt_id"),
    run_dispatch_leases.c.status == LeaseStatus.LEASED.value))


@dataclass(frozen=True, slots=True)
class ExpiredClaim:
    run_id: str
    attempt_id: str


class ExpiredClaims:
    def __init__(self, store: Store) -> None:
        self.store = store

    def page(self, limit: int) -> tuple[list[ExpiredClaim], bool]:
        """Up to `limit` expired never-activated claims (database time), and whether more remain."""
        with self.store.read() as conn:
            rows = conn.execute(_EXPIRED, {"now": self.store.now_ms(conn), "limit": limit + 1}).all()
        return [ExpiredClaim(r.run_id, r.attempt_id) for r in rows[:limit]], len(rows) > limit

    def release(self, claim: ExpiredClaim) -> Outcome:
        """Release the claim's lease if, under the attempt's lock, it is still `claimed` and expired."""
        with self.store.write() as conn:
            self.store.advisory_lock(conn, f"attempt:{claim.attempt_id}")
            run, attempt, ended = load_open_pair(conn, claim.run_id, claim.attempt_id)
            if ended is not None:
                return ended
            if attempt.status != AttemptStatus.CLAIMED.value:
                return Outcome(Result.REFUSED, f"attempt_{attempt.status}", run.status)
            now = self.store.now_ms(conn)
            expiry = conn.execute(_LIVE_EXPIRY, {"attempt_id": claim.attempt_id}).scalar()
            if expiry is None or expiry > now:
                return Outcome(Result.REFUSED, "lease_not_expired", run.status)
            end_lease(conn, claim.attempt_id, now, LeaseStatus.RELEASED, LeaseReleaseReason.LEASE_EXPIRED)
            return Outcome(Result.APPLIED, None, run.status)
